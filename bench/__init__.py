"""Benchmarks: twophase against a direct at-least-once write, in one run, with targets.

``python -m bench --quick`` from the repository root (see ``bench/README.md``).
"""

from __future__ import annotations
