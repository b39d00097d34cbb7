"""Xid errors: the collector (``collector``) counts them from NVML events and the kernel log (``kmsg``),
buckets each code by the action it calls for (``codes``), and can keep counts across agent restarts
(``state``)."""
