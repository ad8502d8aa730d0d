"""The PostgreSQL staging store: connections and transactions (:mod:`.database`), its URLs
(:mod:`.urls`), its tables (:mod:`.schema`, the source the Alembic revisions in
``migrations/`` are written from) and the operators' read-only views (:mod:`.views`)."""
