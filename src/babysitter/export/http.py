"""The per-process metrics endpoint: explicit bind address, optional TLS, a busy port never fatal."""

from __future__ import annotations

import errno
import logging
import threading
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

__all__ = ["Endpoint", "TLSConfig", "serve"]

log = logging.getLogger("babysitter")


@dataclass(frozen=True)
class TLSConfig:
    """Server certificate and key (PEM files); optional CA file to require client certificates."""

    certfile: str
    keyfile: str
    client_cafile: str | None = None


@dataclass
class Endpoint:
    """A running HTTP endpoint."""

    addr: str
    port: int
    requested_port: int
    tls: bool
    _server: Any
    _thread: threading.Thread

    @property
    def url(self) -> str:
        """The URL to scrape (loopback spelled ``127.0.0.1`` when bound to all addresses)."""
        host = "127.0.0.1" if self.addr in ("", "0.0.0.0") else self.addr
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        scheme = "https" if self.tls else "http"
        return f"{scheme}://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()


def serve(registry: CollectorRegistry, *, addr: str, port: int, tls: TLSConfig | None = None) -> Endpoint:
    """Serve ``registry`` on ``addr:port``; when the port is taken, fall back to an ephemeral port.

    A fallback is logged once with both ports; the agent finds the endpoint through the registration
    directory either way. Other OSErrors (bad address, TLS files unreadable) propagate to the caller.
    """
    kwargs: dict[str, Any] = {}
    if tls is not None:
        kwargs = {
            "certfile": tls.certfile,
            "keyfile": tls.keyfile,
            "client_cafile": tls.client_cafile,
            "client_auth_required": tls.client_cafile is not None,
        }
    try:
        server, thread = start_http_server(port, addr=addr, registry=registry, **kwargs)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE or port == 0:
            raise
        server, thread = start_http_server(0, addr=addr, registry=registry, **kwargs)
        log.warning(
            "babysitter: port %d on %s is in use; serving metrics on port %d instead",
            port,
            addr,
            server.server_port,
        )
    return Endpoint(addr, int(server.server_port), port, tls is not None, server, thread)
