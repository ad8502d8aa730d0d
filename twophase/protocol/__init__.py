"""The two-phase commit, in layers by where the code runs and what it owns.

From the bottom up, each layer importing only those below it:

* [`stage`][twophase.protocol.stage]: phase 1 on executors, a task's rows staged as one write;
* [`deliver`][twophase.protocol.deliver]: one decided epoch read back, checked and sent to one
  target (no state change);
* [`ledger`][twophase.protocol.ledger]: the epochs' and the targets' state in the store;
* [`maintain`][twophase.protocol.maintain]: garbage collection and compaction;
* [`commit`][twophase.protocol.commit]: the driver's orchestration, a run's claim and per
  epoch recover, decide, promote;
  [`runtime`][twophase.protocol.commit.runtime] wires the parts from one configuration.

The operator's flows built on them (requeue, resend, a target's removal) are in
[`twophase.operations`][twophase.operations].

The modules' loggers keep the names they had before the layers (``twophase.protocol.promoter``,
not ``twophase.protocol.commit.promoter``): log configurations and alerts name them."""
