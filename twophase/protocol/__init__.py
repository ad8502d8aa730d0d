"""The two-phase commit, one module per role.

Phase 1 on executors: [`twophase.protocol.stager`][twophase.protocol.stager] (rows staged as one
write, lanes from [`twophase.protocol.lanes`][twophase.protocol.lanes],
repeated through an outage from [`twophase.protocol.spool`][twophase.protocol.spool]).
Phase 2 on the driver: [`twophase.protocol.committer`][twophase.protocol.committer] (a run's claim,
which recovers what older runs left;
per epoch: recover, decide, promote), the vote and
the sink's runs in [`twophase.protocol.ledger`][twophase.protocol.ledger] and
[`twophase.protocol.transitions`][twophase.protocol.transitions], reading decided epochs back in
[`twophase.protocol.reader`][twophase.protocol.reader] and
[`twophase.protocol.readahead`][twophase.protocol.readahead],
[`twophase.protocol.promoter`][twophase.protocol.promoter] (an epoch to the sink's targets, one
or several, then COMMITTED) through each target's
[`twophase.protocol.delivery`][twophase.protocol.delivery] (read back, check, send; one read
for several targets through [`twophase.protocol.broadcast`][twophase.protocol.broadcast]) with
[`twophase.protocol.deadletters`][twophase.protocol.deadletters], background promotion in
[`twophase.protocol.handoff`][twophase.protocol.handoff];
[`twophase.protocol.catchup`][twophase.protocol.catchup] (a lagging
target's backlog, oldest first, at its pace:
[`twophase.protocol.pacing`][twophase.protocol.pacing]) and the targets' state in
[`twophase.protocol.targets`][twophase.protocol.targets]. Around them:
[`twophase.protocol.gc`][twophase.protocol.gc]
(retention, orphans; after commits, when due,
[`twophase.protocol.autogc`][twophase.protocol.autogc]),
[`twophase.protocol.runs`][twophase.protocol.runs] (a run's end),
and the operator's [`twophase.protocol.requeue`][twophase.protocol.requeue],
[`twophase.protocol.resend`][twophase.protocol.resend] and
[`twophase.protocol.decommission`][twophase.protocol.decommission] (a target removed from its sink).
[`twophase.protocol.runtime`][twophase.protocol.runtime] wires the parts from
one configuration."""
