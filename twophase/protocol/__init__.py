"""The two-phase commit, one module per role.

Phase 1 on executors: :mod:`.stager` (rows staged as one write, lanes from :mod:`.lanes`,
repeated through an outage from :mod:`.spool`).
Phase 2 on the driver: :mod:`.committer` (a run's claim, which recovers what older runs left;
per epoch: recover, decide, promote), the vote and
the sink's runs in :mod:`.ledger` and :mod:`.transitions`, reading decided epochs back in
:mod:`.reader` and :mod:`.readahead`, :mod:`.promoter` (send, mark COMMITTED) with
:mod:`.deadletters`, background promotion in :mod:`.handoff`; for several InfluxDB targets,
:mod:`.fanout` (each epoch to every caught-up target at once), :mod:`.catchup` (a lagging
target's backlog, oldest first) and their state in :mod:`.targets`. Around them: :mod:`.gc`
(retention, orphans; after commits, when due, :mod:`.autogc`), :mod:`.runs` (a run's end),
and the operator's :mod:`.requeue` and :mod:`.resend`. :mod:`.runtime` wires the parts from
one configuration."""
