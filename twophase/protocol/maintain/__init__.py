"""Keeping the staging store small, run on the driver (or by the operator's `gc`).

[`gc`][twophase.protocol.maintain.gc] (retention, orphans, discard),
[`compaction`][twophase.protocol.maintain.compaction] (old epoch records) and
[`autogc`][twophase.protocol.maintain.autogc] (a collection after commits, when due).
"""
