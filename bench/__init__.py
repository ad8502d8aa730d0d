"""Benchmarks: twophase against a direct at-least-once write, in one run, with targets.

``python -m bench --quick`` from the repository root (see ``bench/README.md``); every
part runs through that one command (``python -m bench PART``, ``bench/__main__.py``).
"""
