"""The webhook receiver: Alertmanager POSTs notifications, one worker thread acts on them in order.

HTTP is the shared bounded server (:class:`babysitter.export.server.MetricsServer`, the one the
tracker and the node agent use): one selector thread reads every request within ``request_timeout``
seconds in total, at most ``max_connections`` wait for their request at once (a new one evicts the
oldest), a fixed pool of workers answers, and responses have a write deadline. This module is its
:class:`~babysitter.export.server.Handler`: a request head is checked before a byte of its body is
read (the path, the bearer token compared in constant time, a ``Content-Length`` of 1 B to 1 MiB),
so an unauthenticated client never makes the receiver buffer a body. Accepted notifications wait in
a bounded queue (full: 503, so Alertmanager retries later) for the one thread that decides, so the
rails see one decision at a time. Loopback by default; TLS, and with a client CA mutual TLS, as
options. It refuses to be built without authentication (a token, or TLS that requires client
certificates) unless told ``insecure_no_auth``, and then only on a loopback address. ``GET /metrics``
serves the remediator's metrics and ``GET /-/healthy`` answers 200; neither needs the token.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import json
import logging
import queue
import ssl
import sys
import threading
from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from babysitter._version import __version__
from babysitter.catalog import remediate as M
from babysitter.catalog import selfmon as S
from babysitter.catalog.remediate import NOTIFICATION_RESULTS
from babysitter.export.server import MetricsServer, Request, Response
from babysitter.remediate.alerts import Notification, PayloadError, parse_notification
from babysitter.remediate.engine import Remediator

__all__ = ["MAX_BODY", "WebhookServer", "is_loopback"]

log = logging.getLogger(__name__)

#: Largest notification accepted (Alertmanager's are a few KiB per alert).
MAX_BODY = 1024 * 1024
_TICK = 1.0
_OK = Response(200, b"ok\n")
_NOT_FOUND = Response(404, b"not found\n")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a bind address) is a loopback address; ``localhost`` counts."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class WebhookServer:
    """Serves ``remediator`` on ``host:port``; binding happens here (OSError for a taken port)."""

    max_body = MAX_BODY

    def __init__(
        self,
        remediator: Remediator,
        host: str = "127.0.0.1",
        port: int = 9097,
        *,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        path: str = "/alerts",
        max_connections: int = 32,
        request_timeout: float = 10.0,
        queue_size: int = 64,
        insecure_no_auth: bool = False,
    ) -> None:
        mtls = ssl_context is not None and ssl_context.verify_mode == ssl.CERT_REQUIRED
        if not (token or mtls or insecure_no_auth):
            raise ValueError("the webhook receiver needs a token or client certificates (mTLS)")
        if insecure_no_auth and not is_loopback(host):
            raise ValueError(f"serving without authentication is for loopback addresses only, not {host}")
        self.remediator = remediator
        self.path = path
        self._token = token.encode() if token else None
        self._queue: queue.Queue[Notification | None] = queue.Queue(queue_size)
        self._stopped = threading.Event()
        self.notifications = dict.fromkeys(NOTIFICATION_RESULTS, 0)
        self._count_lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        self._http = MetricsServer(
            self.registry,
            host,
            port,
            ssl_context=ssl_context,
            max_connections=max_connections,
            request_timeout=request_timeout,
            name="remediate-http",
            handler=self,
        )
        self.host = host
        self.port = self._http.port
        self.scheme = "https" if ssl_context is not None else "http"
        self._worker = threading.Thread(target=self._work, name="remediate-worker", daemon=True)

    @property
    def url(self) -> str:
        """The webhook URL to give Alertmanager."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.path}"

    def start(self) -> WebhookServer:
        """Serve and work in the background."""
        self._http.start()
        self._worker.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Stop accepting, let the worker finish the notification at hand, release the port."""
        self._stopped.set()
        self._http.close()
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)
        if self._worker.is_alive():
            self._worker.join(timeout)

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until every accepted notification has been acted on (tests, shutdown)."""
        done = threading.Event()

        def waiter() -> None:
            self._queue.join()
            done.set()

        threading.Thread(target=waiter, daemon=True).start()
        return done.wait(timeout)

    def _count(self, result: str) -> None:
        with self._count_lock:
            self.notifications[result] += 1

    def counts(self) -> dict[str, int]:
        """Notifications by result; failed TLS handshakes count as unauthorized."""
        with self._count_lock:
            out = dict(self.notifications)
        out["unauthorized"] += self._http.tls_failures
        return out

    def authorized(self, header: str | None) -> bool:
        """Whether the Authorization header carries the token (always, when no token is set)."""
        if self._token is None:
            return True
        scheme, _, given = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self._token)

    def submit(self, notification: Notification) -> bool:
        """Queue a notification for the worker; False when the queue is full."""
        try:
            self._queue.put_nowait(notification)
        except queue.Full:
            return False
        return True

    # ------------------------------------------------------------------ HTTP (the server's Handler)

    def check(self, request: Request) -> Response | None:
        """A request head, before its body is read: the path, the method, the token, the length."""
        if request.method in ("GET", "HEAD"):
            return None
        if request.method != "POST":
            return Response(405, b"method not allowed\n", headers=(("Allow", "GET, HEAD, POST"),))
        if request.path != self.path:
            return _NOT_FOUND
        if not self.authorized(request.headers.get("authorization")):
            self._count("unauthorized")
            return Response(401, b"unauthorized\n", headers=(("WWW-Authenticate", "Bearer"),))
        length = request.content_length
        if length is None or not 0 < length <= MAX_BODY or "transfer-encoding" in request.headers:
            self._count("rejected")
            status = 413 if length is not None and length > MAX_BODY else 411
            return Response(status, b"a body of 1 B to 1 MiB with its length\n")
        return None

    def answer(self, request: Request) -> Response | None:
        """A complete request: a notification to queue, health, or None for the metrics."""
        if request.method == "POST":
            try:
                notification = parse_notification(json.loads(request.body))
            except (PayloadError, ValueError, UnicodeDecodeError, RecursionError) as exc:
                self._count("rejected")
                return Response(400, f"{exc}\n".encode()[:500])
            if not self.submit(notification):
                self._count("busy")
                return Response(503, b"busy\n")
            self._count("accepted")
            return Response(200, b"accepted\n")
        if request.path == "/metrics":
            return None
        if request.path in ("/-/healthy", "/-/ready"):
            return _OK
        return _NOT_FOUND

    # ------------------------------------------------------------------ the deciding thread

    def _work(self) -> None:
        while not self._stopped.is_set():
            try:
                item = self._queue.get(timeout=_TICK)
            except queue.Empty:
                item = None
            else:
                try:
                    if item is not None:
                        self.remediator.handle(item)
                except Exception:
                    log.exception("babysitter remediate: a notification failed")
                finally:
                    self._queue.task_done()
            try:
                self.remediator.tick()
            except Exception:
                log.exception("babysitter remediate: deferred alerts failed")


class _Collector:
    """The remediator's metrics, from the catalog."""

    def __init__(self, server: WebhookServer) -> None:
        self._server = server

    def collect(self) -> Iterable[Metric]:
        snap = self._server.remediator.snapshot()
        actions = M.ACTIONS.family()
        for (action, result), value in sorted(snap["actions"].items()):
            actions.add_metric([action, result], value)  # type: ignore[attr-defined]
        refusals = M.REFUSALS.family()
        for (action, reason), value in sorted(snap["refusals"].items()):
            refusals.add_metric([action, reason], value)  # type: ignore[attr-defined]
        notes = M.NOTIFICATIONS.family()
        for result, value in self._server.counts().items():
            notes.add_metric([result], value)  # type: ignore[attr-defined]
        drained = M.DRAINED_NODES.family()
        drained.add_metric([], snap["drained"])  # type: ignore[attr-defined]
        families: list[Metric] = [actions, refusals, notes, drained]
        cap = snap.get("cap")
        if cap is not None:
            cap_family = M.DRAIN_CAP_NODES.family()
            cap_family.add_metric([], cap)  # type: ignore[attr-defined]
            families.append(cap_family)
        build = S.BUILD_INFO.family()
        build.add_metric([], {"version": __version__, "python": sys.version.split()[0]})  # type: ignore[attr-defined]
        families.append(build)
        return families
