"""The staging schema's Alembic revisions, shipped in the wheel as ``twophase.migrations``.

Run from a checkout with ``alembic upgrade head``, or from an installed package with
``twophase db upgrade``."""
