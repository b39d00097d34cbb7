"""What a person reads: terminal tables, live screens and PNG charts over numbers computed elsewhere.

``top`` (live runs and nodes, from Prometheus or ``/metrics``), ``report`` (a run's goodput from its
ledger summary), ``scorecard`` (clusters side by side), ``probe`` (an allocation's qualification) and
``flops`` (a model's FLOPs and the throughput an MFU target needs). rich and matplotlib are imported
only when something is drawn, so the packages that compute the numbers never need them.
"""
