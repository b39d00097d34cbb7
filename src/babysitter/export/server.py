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
the Accept header (text or OpenMetrics), or always the text format from the server's own ``render``
(the node agent: :mod:`babysitter.export.text`), gzip when the client accepts it, ``name[]`` filtering.

A :class:`Handler` (the remediator's webhook) adds other paths and methods: it sees each request head
in the selector thread first and may answer it at once (a missing token, a length it will not take)
before a byte of the body is read; a body is read only with a ``Content-Length`` of at most the
handler's ``max_body``, within the same request deadline as the head, and then the handler answers
in a worker (or leaves the request to the metrics).

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
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from babysitter.export.text import CONTENT_TYPE as TEXT_CONTENT_TYPE

__all__ = ["Handler", "MetricsServer", "Request", "Response", "bind_hint", "tls_context"]

log = logging.getLogger("babysitter")

_MAX_REQUEST_BYTES = 8192
#: An early answer's connection stays open this long (at most) to swallow the body it declined.
_LINGER_SECONDS = 2.0
_LINGER_BYTES = 4 * 1024 * 1024
_ACCEPT_PAUSE = 0.1  # seconds the listener rests when the process has no descriptor left at all
_LIVE: weakref.WeakSet[MetricsServer] = weakref.WeakSet()


def bind_hint(exc: OSError, port: int, *, elsewhere: str) -> str:
    """What to do when binding ``port`` failed with ``exc`` ("" when there is nothing to say);
    ``elsewhere`` names the flags that choose another address or port."""
    if exc.errno == errno.EADDRINUSE:
        return (
            f"port {port} is taken by another process (`ss -ltnp 'sport = :{port}'` names it): stop it, or "
            f"serve elsewhere with {elsewhere}; port 0 takes any free port"
        )
    if exc.errno == errno.EACCES and 0 < port < 1024:
        return f"ports below 1024 need root: pick a higher one with {elsewhere}"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"this host has no such address: give one of its own (0.0.0.0: all) with {elsewhere}"
    return ""


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


@dataclass(frozen=True)
class Request:
    """One request: its method, target (path and query), headers (names lower-cased) and body (empty
    until read; a head seen by :meth:`Handler.check` has none yet)."""

    method: str
    target: str
    headers: dict[str, str]
    body: bytes = b""

    @property
    def path(self) -> str:
        """The target without its query."""
        return urlsplit(self.target).path

    @property
    def content_length(self) -> int | None:
        """The declared body length; None when absent or not a plain non-negative integer."""
        text = self.headers.get("content-length", "")
        return int(text) if text.isdigit() and len(text) <= 18 else None


@dataclass(frozen=True)
class Response:
    """What to answer."""

    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()

    def encode(self, *, head: bool = False) -> bytes:
        """The bytes on the wire (``Connection: close``)."""
        return _response(
            self.status, self.body, content_type=self.content_type, extra=self.headers, head=head
        )


class Handler(Protocol):
    """Requests besides the metrics: :meth:`check` sees each head in the selector thread (it must not
    block), :meth:`answer` each complete request in a worker thread."""

    #: Largest body read; a request that declares more is answered 413 without reading it.
    max_body: int

    def check(self, request: Request) -> Response | None:
        """A response to send at once, without reading the body; None to go on."""
        ...

    def answer(self, request: Request) -> Response | None:
        """The response to a complete request; None to serve the metrics."""
        ...


@dataclass
class _Conn:
    sock: socket.socket
    deadline: float
    handshaking: bool
    buf: bytearray = field(default_factory=bytearray)
    #: The parsed head and the buffer length at which its body is complete (reading the body).
    request: Request | None = None
    need: int = 0
    #: Answered early: bytes of the unread body still to discard before closing (see _linger).
    discard: int = 0


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
        handler: Handler | None = None,
        render: Callable[[], bytes] | None = None,
    ) -> None:
        if workers < 1 or max_connections < 1 or max_queued < 1:
            raise ValueError("workers, max_connections and max_queued must be >= 1")
        if not (request_timeout > 0 and write_timeout > 0):
            raise ValueError("request and write timeouts must be positive")
        self.registry = registry
        self.handler = handler
        #: When given, every unfiltered metrics response is what it returns, in the text format 0.0.4.
        self.render = render
        #: TLS handshakes that failed (no or a bad client certificate, plain HTTP on a TLS port).
        self.tls_failures = 0
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
        self._queue: queue.Queue[tuple[socket.socket, Request] | None] = queue.Queue(max_queued)
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
        if conn.discard:
            self._swallow(conn)
            return
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
                except ssl.SSLError:
                    self.tls_failures += 1
                    raise
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
                if conn.request is not None:  # reading the body
                    if len(conn.buf) >= conn.need:
                        body = bytes(conn.buf[conn.need - (conn.request.content_length or 0) : conn.need])
                        self._dispatch(conn, replace(conn.request, body=body))
                        return
                    continue
                end = conn.buf.find(b"\r\n\r\n")
                if end > _MAX_REQUEST_BYTES or (end < 0 and len(conn.buf) > _MAX_REQUEST_BYTES):
                    self._drop(conn)
                    return
                if end >= 0:
                    self._head(conn, bytes(conn.buf[:end]), end + 4)
                    return
        except (OSError, ValueError):
            self._drop(conn)

    def _head(self, conn: _Conn, head: bytes, body_at: int) -> None:
        """A complete head: answer at once, read its body, or hand it to a worker."""
        request = _parse(head)
        if request is None:
            self._refuse(conn, Response(400, b"bad request\n"))
            return
        handler = self.handler
        if handler is None:
            self._dispatch(conn, request)  # GET and HEAD take no body; anything else is 405
            return
        try:
            early = handler.check(request)
        except Exception as exc:
            self._log_once(f"check:{type(exc).__name__}", f"checking a request failed: {exc!r}")
            early = Response(500, b"error\n")
        if early is not None:
            self._refuse(conn, early, request)
            return
        length = request.content_length
        if "transfer-encoding" in request.headers or (length is None and "content-length" in request.headers):
            self._refuse(conn, Response(411, b"a body needs a plain Content-Length\n"), request)
            return
        if not length:
            self._dispatch(conn, request)
            return
        if length > handler.max_body:
            self._refuse(conn, Response(413, b"body too large\n"), request)
            return
        conn.request, conn.need = request, body_at + length
        if len(conn.buf) >= conn.need:
            self._dispatch(conn, replace(request, body=bytes(conn.buf[body_at : conn.need])))
        # else: the selector goes on reading into conn.buf until need, within the same deadline

    def _refuse(self, conn: _Conn, response: Response, request: Request | None = None) -> None:
        """Answer from the selector thread without reading the body (a small response, a short deadline).

        A client still sending the declined body would get a reset instead of the answer if the
        socket closed on unread data, so the connection lingers: half-closed, its body read and
        dropped, for at most ``_LINGER_SECONDS`` and ``_LINGER_BYTES``, still counted among the
        waiting connections (evictable, like any).
        """
        self._forget(conn)
        pending = 0
        if request is not None and request.method not in ("GET", "HEAD"):
            declared = request.content_length
            pending = _LINGER_BYTES if declared is None else min(declared, _LINGER_BYTES)
            pending -= len(conn.buf) - conn.buf.find(b"\r\n\r\n") - 4
        with self._busy_lock:
            self._busy.add(conn.sock)
        if pending <= 0:
            self._finish(conn.sock, response.encode(), deadline=_short())
            return
        sent = self._send(conn.sock, response.encode(), deadline=_short())
        with self._busy_lock:
            self._busy.discard(conn.sock)
        if not sent:
            with contextlib.suppress(OSError):
                conn.sock.close()
            return
        self._linger(conn, pending)

    def _linger(self, conn: _Conn, pending: int) -> None:
        try:
            conn.sock.shutdown(socket.SHUT_WR)
            conn.sock.setblocking(False)
        except OSError:
            self._drop(conn)
            return
        conn.discard = pending
        conn.deadline = min(conn.deadline, time.monotonic() + _LINGER_SECONDS)
        conn.buf = bytearray()
        self._waiting[conn.sock.fileno()] = conn
        try:
            self._selector.register(conn.sock, selectors.EVENT_READ, conn)
        except (OSError, ValueError):
            self._drop(conn)

    def _swallow(self, conn: _Conn) -> None:
        """Read and drop what a lingering connection still sends; close at its end or the budget's."""
        try:
            while conn.discard > 0:
                chunk = conn.sock.recv(65536)
                if not chunk:
                    break
                conn.discard -= len(chunk)
        except (ssl.SSLWantReadError, BlockingIOError, InterruptedError):
            return
        except (OSError, ValueError):
            pass
        self._drop(conn)

    def _dispatch(self, conn: _Conn, request: Request) -> None:
        self._forget(conn)
        with self._busy_lock:
            self._busy.add(conn.sock)
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
                self._log_once(f"render:{type(exc).__name__}", f"answering a request failed: {exc!r}")
                payload = _response(500, b"error\n")
            self._finish(sock, payload, deadline=time.monotonic() + self._write_timeout)

    def _answer(self, request: Request) -> bytes:
        if self.handler is not None:
            response = self.handler.answer(request)
            if response is not None:
                return response.encode(head=request.method == "HEAD")
        if request.method not in ("GET", "HEAD"):
            return _response(405, b"method not allowed\n", extra=(("Allow", "GET, HEAD"),))
        url = urlsplit(request.target)
        if url.path == "/favicon.ico":
            return _response(404, b"not found\n")
        registry: Any = self.registry
        names = parse_qs(url.query).get("name[]")
        if names:
            registry = registry.restricted_registry(names)
        if self.render is not None and not names:
            body, content_type = self.render(), TEXT_CONTENT_TYPE
        else:
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
            self._send(sock, payload, deadline=deadline)
        finally:
            with self._busy_lock:
                self._busy.discard(sock)
            with contextlib.suppress(OSError):
                sock.close()

    @staticmethod
    def _send(sock: socket.socket, payload: bytes, *, deadline: float) -> bool:
        """Write ``payload`` within ``deadline``; whether all of it went out."""
        try:
            sock.setblocking(True)
            view = memoryview(payload)
            while view:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                sock.settimeout(remaining)
                sent = sock.send(view[:65536])
                view = view[sent:]
        except (OSError, ValueError):
            return False
        return True

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


def _parse(head: bytes) -> Request | None:
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
    return Request(parts[0], parts[1], headers)


_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    411: "Length Required",
    413: "Content Too Large",
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
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in extra),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + (b"" if head else body)
