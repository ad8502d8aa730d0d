"""Phase 2, the driver's orchestration: a run's claim, then per epoch recover, decide, promote.

[`committer`][twophase.protocol.commit.committer] is the entry point,
[`promoter`][twophase.protocol.commit.promoter] sends an epoch to the sink's targets,
[`catchup`][twophase.protocol.commit.catchup] brings a lagging target up to date,
[`handoff`][twophase.protocol.commit.handoff] promotes in the background, and
[`runtime`][twophase.protocol.commit.runtime] wires the parts from one configuration.
The top layer of the protocol.
"""
