"""Benchmarks: twophase against what a user writes instead, one harness, one scenario a run.

``python -m bench SCENARIO [--quick]`` from the repository root (see ``bench/README.md``).
"""
