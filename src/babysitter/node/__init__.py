"""The node agent: one process per host exporting GPU health, Xid errors, storage and checkpoint checks,
and the metrics of the host's training processes, on one scrape target.

``daemon`` builds the collectors from ``config`` and runs ``agent`` (the HTTP server and a scrape that
runs every collector, each reporting its own success and duration: ``collector``). The collectors, by
concern: ``gpu/`` (NVML or DCGM backends, a fake and a simulator for tests and the demo), ``xid/`` (Xid
errors from NVML events and the kernel log), ``storage/`` (the storage probe and the checkpoint
sentinel), ``workloads/`` (what else runs on the host: training processes, the batch job map, the
probe's result files).
"""
