"""Former names, kept for a while after a rename: each warns when used, naming what
replaced it and the version it goes in (the changelog lists them)."""

from __future__ import annotations

import warnings

# Former names stay for two minor versions after the one that renamed them.
REMOVED_IN = "0.12.0"


def warn_deprecated(old: str, new: str, *, stacklevel: int) -> None:
    """Warn that ``old`` is deprecated, naming ``new``. ``stacklevel`` is counted as
    ``warnings.warn`` counts it where this is called, so that the warning names the code
    that used the former name (warning filters match its module)."""
    warnings.warn(
        f"{old} is deprecated and goes in twophase {REMOVED_IN}: use {new}",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )
