"""Incidents: the evidence of a fault, gathered into the run directory before anything restarts it.

A bundle (``RUN_DIR/incidents/<id>/``) holds every live rank's stacks and flight recorder (asked from
inside the processes, :mod:`babysitter.training.incidents`), the alert, the ledger's last records, the
watchdog's hang dumps, the ranks' crash records and the culprit host's state from Prometheus
(:mod:`.gather`, :mod:`.host`); :mod:`.analyze` reads the stuck collective out of the answers,
:mod:`.read` reads a bundle back for ``babysitter incident``, and :mod:`.report` turns the incidents of
a window into the provider's report (``babysitter incidents``). docs/incidents.md.
"""
