"""A metrics HTTP server with bounded resources, for the tracker's endpoint and the node agent.

prometheus_client's server starts a thread per connection and reads with no timeout: 1024 idle
connections exhaust the default descriptor limit and the process stops serving (slowloris). Here
one selector thread accepts every connection and reads requests without blocking; at most
``max_connections`` may be waiting for their request at once (a new one evicts the oldest), each
gets ``request_timeout`` seconds in total to send it, and complete requests go to a small fixed
pool of daemon worker threads through a bounded queue (full: 503). Responses are written with a
total deadline too. A process at its descriptor limit drops its oldest waiting connection to accept
a new one, so a scraper that sends its request promptly is served however many idle connections
arrive.

HTTP/1.1 with ``Connection: close``, GET and HEAD; the body is what prometheus_client renders for
the Accept header (text or OpenMetrics), gzip when the client accepts it, ``name[]`` filtering.

After ``os.fork()`` the child holds copies of the server's sockets: they are closed in the child
(without a shutdown, which would stop the parent's socket too), and the child's server is inert.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import gzip
import logging
import os
import queue
import selectors
import socket
import ssl
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

__all__ = ["MetricsServer", "tls_context"]

log = logging.getLogger("babysitter")

_MAX_REQUEST_BYTES = 8192
_ACCEPT_PAUSE = 0.1  # seconds the listener rests when the process has no descriptor left at all
_LIVE: weakref.WeakSet[MetricsServer] = weakref.WeakSet()


def tls_context(certfile: str, keyfile: str, client_cafile: str | None = None) -> ssl.SSLContext:
    """A server TLS context; with ``client_cafile`` clients must present a certificate it signed.

    Raises OSError or ssl.SSLError naming the file that cannot be loaded.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certfile=certfile, keyfile=keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise type(exc)(f"cannot load TLS certificate {certfile!r} with key {keyfile!r}: {exc}") from exc
    if client_cafile is not None:
        try:
            context.load_verify_locations(cafile=client_cafile)
        except (OSError, ssl.SSLError) as exc:
            raise type(exc)(f"cannot load TLS client CA file {client_cafile!r}: {exc}") from exc
        context.verify_mode = ssl.CERT_REQUIRED
    return context


@dataclass
class _Conn:
    sock: socket.socket
    deadline: float
    handshaking: bool
    buf: bytearray = field(default_factory=bytearray)


@dataclass(frozen=True)
class _Request:
    method: str
    target: str
    headers: dict[str, str]


class MetricsServer:
    """Serve ``registry`` on ``host:port`` (port 0: ephemeral) until :meth:`close`.

    Binding happens in the constructor, so a taken port or a bad address raises OSError there.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        workers: int = 2,
        max_connections: int = 64,
        max_queued: int = 16,
        request_timeout: float = 10.0,
        write_timeout: float = 30.0,
        name: str = "babysitter-http",
    ) -> None:
        if workers < 1 or max_connections < 1 or max_queued < 1:
            raise ValueError("workers, max_connections and max_queued must be >= 1")
        if not (request_timeout > 0 and write_timeout > 0):
            raise ValueError("request and write timeouts must be positive")
        self.registry = registry
        self._ssl = ssl_context
        self._max_connections = max_connections
        self._request_timeout = request_timeout
        self._write_timeout = write_timeout
        family, address = _bind_address(host, port)
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind(address)
            self._listener.listen(socket.SOMAXCONN)
            self._listener.setblocking(False)
        except BaseException:
            self._listener.close()
            raise
        self.host = host
        bound = self._listener.getsockname()
        #: The literal address bound (``host`` may be a name).
        self.address = str(bound[0])
        self.port = int(bound[1])
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._listener, selectors.EVENT_READ, "listener")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._waiting: collections.OrderedDict[int, _Conn] = collections.OrderedDict()
        self._busy: set[socket.socket] = set()
        self._busy_lock = threading.Lock()
        self._queue: queue.Queue[tuple[socket.socket, _Request] | None] = queue.Queue(max_queued)
        self._listener_paused_until = 0.0
        self._stopped = threading.Event()
        self._forked = False
        self._errors_logged: set[str] = set()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._workers = [
            threading.Thread(target=self._work, name=f"{name}-worker", daemon=True) for _ in range(workers)
        ]
        _LIVE.add(self)

    def start(self) -> MetricsServer:
        """Start the selector and worker threads; returns self."""
        self._thread.start()
        for worker in self._workers:
            worker.start()
        return self

    @property
    def connections(self) -> int:
        """Connections currently held: waiting for their request, or being answered."""
        with self._busy_lock:
            return len(self._waiting) + len(self._busy)

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving and release the port; waits up to ``timeout`` for the selector thread."""
        if self._forked or self._stopped.is_set():
            return
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        for _ in self._workers:
            with contextlib.suppress(queue.Full):
                self._queue.put_nowait(None)
        self._close_sockets()

    # ------------------------------------------------------------------ selector thread

    def _loop(self) -> None:
        try:
            while not self._stopped.is_set():
                self._poll()
        except Exception as exc:  # a bug here must not take the process down, only the endpoint
            log.error("babysitter: metrics server on port %d stopped: %s", self.port, exc)

    def _poll(self) -> None:
        now = time.monotonic()
        if self._listener_paused_until and now >= self._listener_paused_until:
            self._listener_paused_until = 0.0
            self._selector.register(self._listener, selectors.EVENT_READ, "listener")
        timeout = 1.0
        if self._waiting:
            oldest = min(conn.deadline for conn in self._waiting.values())
            timeout = min(timeout, max(oldest - now, 0.0))
        if self._listener_paused_until:
            timeout = min(timeout, max(self._listener_paused_until - now, 0.0))
        for key, _ in self._selector.select(timeout):
            if key.data == "listener":
                self._accept()
            elif key.data == "wake":
                with contextlib.suppress(OSError):
                    self._wake_r.recv(64)
            elif isinstance(key.data, _Conn):
                self._readable(key.data)
        now = time.monotonic()
        for conn in [c for c in self._waiting.values() if c.deadline <= now]:
            self._drop(conn)

    def _accept(self) -> None:
        for _ in range(64):  # then let reads and deadlines run
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Out of descriptors: the oldest waiting connection makes room for the new one.
                    if self._waiting:
                        self._drop(next(iter(self._waiting.values())))
                        continue
                    self._log_once("fds", f"no file descriptor left to accept a connection ({exc})")
                    self._selector.unregister(self._listener)
                    self._listener_paused_until = time.monotonic() + _ACCEPT_PAUSE
                    return
                continue  # ECONNABORTED and friends: that client is gone
            if len(self._waiting) >= self._max_connections:
                self._drop(next(iter(self._waiting.values())))
            self._admit(sock)

    def _admit(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        handshaking = False
        if self._ssl is not None:
            try:
                sock = self._ssl.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            except (OSError, ValueError):
                sock.close()
                return
            handshaking = True
        conn = _Conn(sock, time.monotonic() + self._request_timeout, handshaking)
        self._waiting[sock.fileno()] = conn
        try:
            self._selector.register(sock, selectors.EVENT_READ, conn)
        except (OSError, ValueError):
            self._drop(conn)

    def _readable(self, conn: _Conn) -> None:
        try:
            if conn.handshaking:
                try:
                    conn.sock.do_handshake()  # type: ignore[attr-defined]
                except ssl.SSLWantReadError:
                    self._selector.modify(conn.sock, selectors.EVENT_READ, conn)
                    return
                except ssl.SSLWantWriteError:
                    self._selector.modify(conn.sock, selectors.EVENT_WRITE, conn)
                    return
                conn.handshaking = False
                self._selector.modify(conn.sock, selectors.EVENT_READ, conn)
            while True:
                try:
                    chunk = conn.sock.recv(4096)
                except (ssl.SSLWantReadError, BlockingIOError, InterruptedError):
                    return
                if not chunk:
                    self._drop(conn)
                    return
                conn.buf += chunk
                end = conn.buf.find(b"\r\n\r\n")
                if end > _MAX_REQUEST_BYTES or (end < 0 and len(conn.buf) > _MAX_REQUEST_BYTES):
                    self._drop(conn)
                    return
                if end >= 0:
                    self._dispatch(conn, bytes(conn.buf[:end]))
                    return
        except (OSError, ValueError):
            self._drop(conn)

    def _dispatch(self, conn: _Conn, head: bytes) -> None:
        self._forget(conn)
        request = _parse(head)
        with self._busy_lock:
            self._busy.add(conn.sock)
        if request is None:
            self._finish(conn.sock, _response(400, b"bad request\n"), deadline=_short())
            return
        try:
            self._queue.put_nowait((conn.sock, request))
        except queue.Full:
            self._finish(conn.sock, _response(503, b"busy\n"), deadline=_short())

    def _forget(self, conn: _Conn) -> None:
        self._waiting.pop(conn.sock.fileno(), None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(conn.sock)

    def _drop(self, conn: _Conn) -> None:
        self._forget(conn)
        with contextlib.suppress(OSError):
            conn.sock.close()

    # ------------------------------------------------------------------ workers

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None or self._stopped.is_set():
                if item is not None:
                    self._finish(item[0], b"", deadline=_short())
                return
            sock, request = item
            try:
                payload = self._answer(request)
            except Exception as exc:
                self._log_once(f"render:{type(exc).__name__}", f"rendering metrics failed: {exc!r}")
                payload = _response(500, b"error rendering metrics\n")
            self._finish(sock, payload, deadline=time.monotonic() + self._write_timeout)

    def _answer(self, request: _Request) -> bytes:
        if request.method not in ("GET", "HEAD"):
            return _response(405, b"method not allowed\n", extra=(("Allow", "GET, HEAD"),))
        url = urlsplit(request.target)
        if url.path == "/favicon.ico":
            return _response(404, b"not found\n")
        registry: Any = self.registry
        names = parse_qs(url.query).get("name[]")
        if names:
            registry = registry.restricted_registry(names)
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        body = bytes(encoder(registry))
        extra: list[tuple[str, str]] = []
        if "gzip" in request.headers.get("accept-encoding", "").lower():
            body = gzip.compress(body, compresslevel=6)
            extra.append(("Content-Encoding", "gzip"))
        return _response(200, body, content_type=content_type, extra=extra, head=request.method == "HEAD")

    def _finish(self, sock: socket.socket, payload: bytes, *, deadline: float) -> None:
        """Write ``payload`` within ``deadline`` (a client that does not read is cut off) and close."""
        try:
            sock.setblocking(True)
            view = memoryview(payload)
            while view:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                sock.settimeout(remaining)
                sent = sock.send(view[:65536])
                view = view[sent:]
        except (OSError, ValueError):
            pass
        finally:
            with self._busy_lock:
                self._busy.discard(sock)
            with contextlib.suppress(OSError):
                sock.close()

    # ------------------------------------------------------------------ housekeeping

    def _log_once(self, key: str, message: str) -> None:
        if key not in self._errors_logged and len(self._errors_logged) < 100:
            self._errors_logged.add(key)
            log.warning("babysitter: metrics server on port %d: %s", self.port, message)

    def _close_sockets(self) -> None:
        with self._busy_lock:
            socks = [c.sock for c in self._waiting.values()]
            self._waiting.clear()
        for sock in [*socks, self._listener, self._wake_r, self._wake_w]:
            with contextlib.suppress(OSError):
                sock.close()
        with contextlib.suppress(OSError, ValueError):
            self._selector.close()

    def _after_fork_in_child(self) -> None:
        """The child must neither serve nor hang in :meth:`close`: drop its copies of the sockets.

        Only ``close(2)`` on the copies: a ``shutdown`` would end the parent's connections too. A
        lock a parent thread held at the fork stays held in the child, so it is replaced first.
        """
        self._forked = True
        self._busy_lock = threading.Lock()
        for sock in list(self._busy):
            with contextlib.suppress(OSError):
                sock.close()
        self._busy.clear()
        self._close_sockets()


def _after_fork_in_child() -> None:
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _short() -> float:
    return time.monotonic() + 2.0


def _bind_address(host: str, port: int) -> tuple[socket.AddressFamily, tuple[Any, ...]]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = infos[0]
    return family, sockaddr


def _parse(head: bytes) -> _Request | None:
    try:
        lines = head.decode("ascii").split("\r\n")
    except UnicodeDecodeError:
        return None
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[1].startswith("/"):
        return None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            return None
        headers[name.strip().lower()] = value.strip()
    return _Request(parts[0], parts[1], headers)


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def _response(
    status: int,
    body: bytes,
    *,
    content_type: str = "text/plain; charset=utf-8",
    extra: tuple[tuple[str, str], ...] | list[tuple[str, str]] = (),
    head: bool = False,
) -> bytes:
    lines = [
        f"HTTP/1.1 {status} {_REASONS[status]}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in extra),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + (b"" if head else body)
