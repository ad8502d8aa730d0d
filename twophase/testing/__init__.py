"""Testing a kind of target: the conformance kit a kind's tests run against its server.

* [`twophase.testing.conformance`][twophase.testing.conformance]: ``TargetConformance``,
  the checks a kind's test class inherits (it imports pytest, a test-time dependency:
  it is loaded only when ``TargetConformance`` is first asked for);
* [`twophase.testing.support`][twophase.testing.support]: what the checks build on
  (their points, a target read back in one comparable form, a scratch staging store,
  a target's settings pointed at a port nothing listens on);
* [`twophase.testing.crash`][twophase.testing.crash]: the child process the crash
  checks SIGKILL.

See the guide to writing a kind of target (``docs/targets/write-your-own.md``), and
its complete example, a package of its own in the repository
(``examples/sqlite-target``: points in a SQLite file) whose tests run this kit.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from twophase.testing.conformance import TargetConformance
    from twophase.testing.support import Case, expected, held, normalized, unreachable

__all__ = ["Case", "TargetConformance", "expected", "held", "normalized", "unreachable"]

_SUITE = "twophase.testing.conformance"
_WHERE = {
    "TargetConformance": _SUITE,
    "Case": "twophase.testing.support",
    "expected": "twophase.testing.support",
    "held": "twophase.testing.support",
    "normalized": "twophase.testing.support",
    "unreachable": "twophase.testing.support",
}


def __getattr__(name: str) -> Any:
    """The names of ``__all__``, each imported on first use (PEP 562): importing
    twophase.testing needs no pytest."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if module == _SUITE and module not in sys.modules:
        import pytest

        # the checks' asserts explained as a test module's are (before its first import)
        pytest.register_assert_rewrite(_SUITE)
    return getattr(importlib.import_module(module), name)
