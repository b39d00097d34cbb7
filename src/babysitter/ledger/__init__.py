"""The goodput ledger: a crash-safe JSON Lines record of a run, and the accounting computed from it.

Rank 0's tracker writes it (:class:`LedgerWriter`) into the run directory on shared storage; the
report (``babysitter report``) and the node agent's checkpoint sentinel (:func:`completed_checkpoints`)
read it. The report also reads the notes ``babysitter remediate`` leaves next to it (:func:`read_notes`).
"""

from __future__ import annotations

from babysitter.ledger.accounting import Accountant, Accounting
from babysitter.ledger.lock import LedgerLockedError
from babysitter.ledger.reader import (
    DEFAULT_FILE_NAME,
    CheckpointRecord,
    LedgerFile,
    completed_checkpoints,
    read_ledger,
)
from babysitter.ledger.records import SCHEMA_VERSION
from babysitter.ledger.remediations import RemediationNote, read_notes
from babysitter.ledger.summary import RestartSummary, RunSummary, summarize
from babysitter.ledger.timeline import Timeline
from babysitter.ledger.writer import LedgerWriter

__all__ = [
    "DEFAULT_FILE_NAME",
    "SCHEMA_VERSION",
    "Accountant",
    "Accounting",
    "CheckpointRecord",
    "LedgerFile",
    "LedgerLockedError",
    "LedgerWriter",
    "RemediationNote",
    "RestartSummary",
    "RunSummary",
    "Timeline",
    "completed_checkpoints",
    "read_ledger",
    "read_notes",
    "summarize",
]
