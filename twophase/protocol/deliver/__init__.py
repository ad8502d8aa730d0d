"""One decided epoch read back, checked and sent to one target, run on the driver.

[`reader`][twophase.protocol.deliver.reader] reads it back in promotion order,
[`readahead`][twophase.protocol.deliver.readahead] ahead of the sends,
[`broadcast`][twophase.protocol.deliver.broadcast] once for several targets;
[`delivery`][twophase.protocol.deliver.delivery] checks and sends it over the target's lanes,
[`deadletters`][twophase.protocol.deliver.deadletters] records what the target refused, and
[`pacing`][twophase.protocol.deliver.pacing] paces a catch-up. Nothing here changes an
epoch's or a target's state: that is the ledger's, above.
"""
