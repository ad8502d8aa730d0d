"""The epochs' and the targets' state in the staging store, changed on the driver.

[`epoch_ledger`][twophase.protocol.ledger.epoch_ledger] (runs, fencing, the decision, marks,
aborts, resets) and [`target_ledger`][twophase.protocol.ledger.target_ledger] (each target's
cursor, deliveries and place) take their steps through
[`transitions`][twophase.protocol.ledger.transitions];
[`runs`][twophase.protocol.ledger.runs] records a run's end.
"""
