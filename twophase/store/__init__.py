"""The PostgreSQL staging store: connections and transactions (:mod:`.database`), its
tables (:mod:`.schema`, the source the Alembic revisions in ``migrations/`` are written
from) and the operators' read-only views (:mod:`.views`). Its URLs are settings, checked
and masked in :mod:`twophase.config.urls`."""
