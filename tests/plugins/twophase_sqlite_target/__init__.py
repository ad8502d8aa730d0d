"""The example SQLite kinds of ``twophase.testing.example_sqlite`` as a package of
their own: twophase finds them only through this package's entry points
(``twophase_sqlite_target-0.1.dist-info``), as it finds any kind a user installs."""

from twophase.testing.example_sqlite import KIND, TX_KIND

__all__ = ["KIND", "TX_KIND"]
