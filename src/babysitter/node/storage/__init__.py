"""Checkpoint storage: the storage probe (``probe``: write, fsync, read back in each checkpoint
directory) and the checkpoint sentinel (``sentinel``: the checkpoints the ledger records still exist)."""
