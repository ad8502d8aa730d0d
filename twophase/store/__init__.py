"""The PostgreSQL staging store: connections and transactions
([`twophase.store.database`][twophase.store.database]), its tables
([`twophase.store.schema`][twophase.store.schema], the source the Alembic revisions in
``migrations/`` are written from) and the operators' read-only views
([`twophase.store.views`][twophase.store.views]). Its URLs are settings, checked
and masked in [`twophase.config.urls`][twophase.config.urls]."""
