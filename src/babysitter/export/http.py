"""The per-process metrics endpoint: explicit bind address, optional TLS, a busy port never fatal.

Served by :class:`~babysitter.export.server.MetricsServer` (bounded connections and threads, read
and write deadlines), never by a thread per connection: a training process must not run out of file
descriptors because someone opened connections to its metrics port.
"""

from __future__ import annotations

import errno
import logging
import ssl
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from babysitter.export.server import MetricsServer, tls_context

__all__ = ["Endpoint", "TLSConfig", "serve"]

log = logging.getLogger("babysitter")


@dataclass(frozen=True)
class TLSConfig:
    """Server certificate and key (PEM files); optional CA file to require client certificates."""

    certfile: str
    keyfile: str
    client_cafile: str | None = None

    def context(self) -> ssl.SSLContext:
        """The server TLS context; OSError/ssl.SSLError naming the file that cannot be loaded."""
        return tls_context(self.certfile, self.keyfile, self.client_cafile)


@dataclass
class Endpoint:
    """A running HTTP endpoint."""

    addr: str
    port: int
    requested_port: int
    tls: bool
    _server: MetricsServer

    @property
    def url(self) -> str:
        """The URL to scrape: the address bound (a name resolved), loopback when bound to all."""
        bound = self._server.address
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(bound, bound)
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        scheme = "https" if self.tls else "http"
        return f"{scheme}://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.close()


def serve(registry: CollectorRegistry, *, addr: str, port: int, tls: TLSConfig | None = None) -> Endpoint:
    """Serve ``registry`` on ``addr:port``; when the port is taken, fall back to an ephemeral port.

    A fallback is logged once with both ports; the agent finds the endpoint through the registration
    directory either way. Other OSErrors (bad address, TLS files unreadable) propagate to the caller.
    """
    context = tls.context() if tls is not None else None
    try:
        server = MetricsServer(registry, addr, port, ssl_context=context, name="babysitter-metrics")
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE or port == 0:
            raise
        server = MetricsServer(registry, addr, 0, ssl_context=context, name="babysitter-metrics")
        log.warning(
            "babysitter: port %d on %s is in use; serving metrics on port %d instead", port, addr, server.port
        )
    server.start()
    return Endpoint(addr, server.port, port, tls is not None, server)
