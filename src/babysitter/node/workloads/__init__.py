"""What else runs on the host: training processes found through the registration directory and fetched
within bounds (``trainers``, ``fetch``), the batch job that holds each GPU (``jobs``), and the probe's
result files (``probe_results``)."""
