"""Serving metrics over HTTP: one bounded server (``server``) for every process that babysitter runs
(a training rank's endpoint, the node agent, the remediation webhook), and a training rank's
endpoint on it (``http``: explicit bind address, optional TLS, a busy port never fatal)."""
