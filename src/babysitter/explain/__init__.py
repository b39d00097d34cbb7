"""``babysitter explain``: why a run's MFU or tokens/s dropped, as ranked causes with their evidence.

:mod:`.queries` holds the PromQL (from the catalog and the recording rules), :mod:`.engine` compares a
window with the baseline before it and scores each cause in seconds of the window it accounts for.
The CLI, ``babysitter top``'s hint and the JSON output all come from :func:`explain`.
"""

from __future__ import annotations

from babysitter.explain.engine import CAUSES, TEAMS, Cause, Evidence, Explanation, explain
from babysitter.explain.queries import ExplainQueries

__all__ = ["CAUSES", "TEAMS", "Cause", "Evidence", "ExplainQueries", "Explanation", "explain"]
