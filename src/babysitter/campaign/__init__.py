"""Grade the babysitter as a babysitter: seeded fault campaigns on a simulated cluster.

A campaign starts a small cluster (node agents with simulated GPUs and fake sysfs trees, a lockstep
gloo job under ``torchrun`` whose ranks register on them, real Prometheus and Alertmanager with the
rules and routing under test, ``babysitter remediate --dry-run``), plays a seeded schedule of faults
drawn from published failure tables with healthy noise between them, and grades what reached the
receivers: which faults were caught, how fast, naming the right place, how often something paged for
nothing, how many notifications each fault cost, what the remediator would have done.

``faults`` (what can go wrong), ``schedule`` (when), ``cluster`` (the stack), ``rank`` (one rank of the
job), ``play`` (the player), ``score`` (the grade), ``report`` (markdown and JSON);
``python -m babysitter.campaign`` runs one, ``benchmarks/campaign.py`` the published ones
(docs/campaign.md).
"""
