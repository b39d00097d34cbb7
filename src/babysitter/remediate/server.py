"""The webhook receiver: Alertmanager POSTs notifications, one worker thread acts on them in order.

Bounded on every side: a connection has ``request_timeout`` seconds in total to send its request
(then its socket is shut), at most ``max_connections`` are served at once (more are closed at once),
bodies are at most 1 MiB and must say their length, and accepted notifications wait in a bounded
queue (full: 503, so Alertmanager retries later). Loopback by default; TLS, and with a client CA
mutual TLS, as options; a shared bearer token (Alertmanager's ``http_config.authorization``) is
compared in constant time. ``GET /metrics`` serves the remediator's metrics and ``GET /-/healthy``
answers 200; neither needs the token.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import queue
import socket
import ssl
import sys
import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from babysitter import __version__
from babysitter.catalog import remediate as M
from babysitter.catalog import selfmon as S
from babysitter.catalog.remediate import NOTIFICATION_RESULTS
from babysitter.remediate.alerts import Notification, PayloadError, parse_notification
from babysitter.remediate.engine import Remediator

__all__ = ["WebhookServer"]

log = logging.getLogger(__name__)

MAX_BODY = 1024 * 1024
_TICK = 1.0


class WebhookServer:
    """Serves ``remediator`` on ``host:port``; binding happens here (OSError for a taken port)."""

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
    ) -> None:
        self.remediator = remediator
        self.path = path
        self._token = token.encode() if token else None
        self._queue: queue.Queue[Notification | None] = queue.Queue(queue_size)
        self._slots = threading.BoundedSemaphore(max_connections)
        self._timeout = request_timeout
        self._stopped = threading.Event()
        self.notifications = dict.fromkeys(NOTIFICATION_RESULTS, 0)
        self._count_lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        server = self
        family = socket.AF_INET6 if ":" in host else socket.AF_INET

        class Http(ThreadingHTTPServer):
            address_family = family
            daemon_threads = True
            request_queue_size = 64

            def process_request(self, request: Any, client_address: Any) -> None:
                if not server._slots.acquire(blocking=False):
                    self.shutdown_request(request)  # over the connection limit: closed at once
                    return
                try:
                    super().process_request(request, client_address)
                except BaseException:
                    server._slots.release()
                    raise

            def process_request_thread(self, request: Any, client_address: Any) -> None:
                timer = threading.Timer(server._timeout, _cut, (request,))
                timer.daemon = True
                timer.start()
                try:
                    super().process_request_thread(request, client_address)
                finally:
                    timer.cancel()
                    server._slots.release()

        self._http = Http((host, port), _handler(self))
        if ssl_context is not None:
            self._http.socket = ssl_context.wrap_socket(
                self._http.socket, server_side=True, do_handshake_on_connect=False
            )
        self.host = host
        self.port = int(self._http.server_address[1])
        self.scheme = "https" if ssl_context is not None else "http"
        self._threads = [
            threading.Thread(target=self._http.serve_forever, name="remediate-http", daemon=True),
            threading.Thread(target=self._work, name="remediate-worker", daemon=True),
        ]

    @property
    def url(self) -> str:
        """The webhook URL to give Alertmanager."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.path}"

    def start(self) -> WebhookServer:
        """Serve and work in the background."""
        for thread in self._threads:
            thread.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Stop accepting, let the worker finish the notification at hand, release the port."""
        self._stopped.set()
        self._http.shutdown()
        self._http.server_close()
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)
        self._threads[1].join(timeout)

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


def _cut(sock: socket.socket) -> None:
    """The connection's time is up: shut its socket so the handler's blocked read returns."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _handler(server: WebhookServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"
        server_version = "babysitter-remediate"
        sys_version = ""

        def setup(self) -> None:
            self.request.settimeout(server._timeout)
            if isinstance(self.request, ssl.SSLSocket):
                try:
                    self.request.do_handshake()
                except (OSError, ssl.SSLError):
                    server._count("unauthorized")
                    raise
            super().setup()

        def handle(self) -> None:
            with contextlib.suppress(OSError, ssl.SSLError):
                super().handle()

        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._answer(
                    200, generate_latest(server.registry), "text/plain; version=0.0.4; charset=utf-8"
                )
            elif self.path in ("/-/healthy", "/-/ready"):
                self._answer(200, b"ok\n")
            else:
                self._answer(404, b"not found\n")

        def do_POST(self) -> None:
            if self.path != server.path:
                self._answer(404, b"not found\n")
                return
            if not server.authorized(self.headers.get("Authorization")):
                server._count("unauthorized")
                self._answer(401, b"unauthorized\n", extra={"WWW-Authenticate": "Bearer"})
                return
            length_text = self.headers.get("Content-Length")
            try:
                length = int(length_text or "")
            except ValueError:
                length = -1
            if not 0 < length <= MAX_BODY:
                server._count("rejected")
                self._answer(413 if length > MAX_BODY else 411, b"a body of 1 B to 1 MiB with its length\n")
                return
            try:
                notification = parse_notification(json.loads(self.rfile.read(length)))
            except (PayloadError, ValueError, UnicodeDecodeError) as exc:
                server._count("rejected")
                self._answer(400, f"{exc}\n".encode()[:500])
                return
            if not server.submit(notification):
                server._count("busy")
                self._answer(503, b"busy\n")
                return
            server._count("accepted")
            self._answer(200, b"accepted\n")

        def _answer(
            self,
            code: int,
            body: bytes,
            content_type: str = "text/plain; charset=utf-8",
            extra: dict[str, str] | None = None,
        ) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in (extra or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("babysitter remediate: %s %s", self.address_string(), format % args)

    return Handler


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
        with self._server._count_lock:
            for result, value in self._server.notifications.items():
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
