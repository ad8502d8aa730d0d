"""Phase 1, run on executors: a task's rows staged as one write.

[`stager`][twophase.protocol.stage.stager] copies a write's chunks into the staging store
(repeated through an outage from [`spool`][twophase.protocol.stage.spool]), each line in the
lane [`lanes`][twophase.protocol.stage.lanes] chose for it. The lowest layer of the protocol:
it imports nothing of the driver's side (no SQLAlchemy, no ledger, no target's writer), which
every Python worker would otherwise pay for.
"""
