"""HTTP GETs and POSTs that end by a deadline, however slowly the server sends its bytes.

urllib's ``timeout`` bounds each socket operation, not the request: a server that sends one byte
every 0.2 s keeps a 3 s timeout waiting forever (a Prometheus that drips made ``explain --timeout 3``
run 120 s). Here each request has one deadline for everything, from connect to the last byte: the
sockets urllib uses are given a timeout that shrinks to what is left before every send and receive
(and the TLS handshake is driven without blocking past it), so the request fails with TimeoutError at
the deadline. A :class:`Deadline` is a command's: the requests of one command share it, each getting
what is left (and at most its own timeout).

The name lookup (``getaddrinfo``) cannot be interrupted: it runs on a daemon thread that the request
stops waiting for at the deadline (a hung resolver then holds that thread until its own timeouts end
it); a literal address is not looked up.
Proxies from the environment and redirects work as with ``urllib.request.urlopen``.
"""

from __future__ import annotations

import functools
import http.client
import ipaddress
import math
import select
import socket
import ssl
import threading
import time
import urllib.request
from typing import Any

__all__ = ["Deadline", "open_until"]


class Deadline:
    """A moment (monotonic clock) by which every request of one command must have ended."""

    def __init__(self, seconds: float) -> None:
        if not seconds > 0 or not math.isfinite(seconds):
            raise ValueError(f"a deadline must be a positive number of seconds, got {seconds}")
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def remaining(self) -> float:
        """Seconds left (negative once passed)."""
        return self.at - time.monotonic()


def _arm(sock: socket.socket, end: float) -> None:
    left = end - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out: the request's deadline passed")
    sock.settimeout(left)


class _Socket(socket.socket):
    """A TCP socket whose every send and receive waits at most until ``end``."""

    end: float = math.inf

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        _arm(self, self.end)
        return super().recv(bufsize, flags)

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        _arm(self, self.end)
        return super().recv_into(buffer, nbytes, flags)

    def send(self, data: Any, flags: int = 0) -> int:
        _arm(self, self.end)
        return super().send(data, flags)

    def sendall(self, data: Any, flags: int = 0) -> None:
        _arm(self, self.end)
        super().sendall(data, flags)


class _TLSSocket(ssl.SSLSocket):
    """The same over TLS (the context's ``sslsocket_class``)."""

    end: float = math.inf

    def recv(self, buflen: int = 1024, flags: int = 0) -> bytes:
        _arm(self, self.end)
        return super().recv(buflen, flags)

    def recv_into(self, buffer: Any, nbytes: int | None = None, flags: int = 0) -> int:
        _arm(self, self.end)
        return super().recv_into(buffer, nbytes, flags)

    def read(self, len: int = 1024, buffer: Any = None) -> Any:
        _arm(self, self.end)
        return super().read(len, buffer)

    def sendall(self, data: Any, flags: int = 0) -> None:
        _arm(self, self.end)
        super().sendall(data, flags)

    def handshake_until(self, end: float) -> None:
        """The TLS handshake, non-blocking, waiting for the socket at most until ``end``."""
        self.setblocking(False)
        while True:
            try:
                super().do_handshake()
                return
            except ssl.SSLWantReadError:
                wanted: tuple[list[socket.socket], list[socket.socket]] = ([self], [])
            except ssl.SSLWantWriteError:
                wanted = ([], [self])
            left = end - time.monotonic()
            if left <= 0 or not any(select.select(*wanted, [], left)):
                raise TimeoutError("timed out: the TLS handshake's deadline passed")


def _lookup(host: str, port: int, end: float) -> list[Any]:
    """``getaddrinfo(host, port)`` for stream sockets, given up at ``end``."""
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    else:  # a literal address: no resolver involved, nothing to wait for
        return socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
    found: list[Any] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            found.extend(socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM))
        except BaseException as exc:  # handed to the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=run, name="babysitter-lookup", daemon=True)
    thread.start()
    thread.join(max(0.0, end - time.monotonic()))
    if thread.is_alive():
        raise TimeoutError(f"timed out: the name lookup of {host!r} outlasted the deadline")
    if failed:
        raise failed[0]
    return found


def _connect(address: tuple[str, int], timeout: object, source: Any = None, *, end: float) -> socket.socket:
    """``socket.create_connection`` with the deadline socket, each address tried within what is left."""
    host, port = address
    error: OSError | None = None
    for family, kind, proto, _, sockaddr in _lookup(host, port, end):
        sock = _Socket(family, kind, proto)
        sock.end = end
        try:
            _arm(sock, end)
            if source:
                sock.bind(source)
            sock.connect(sockaddr)
            return sock
        except OSError as exc:
            error = exc
            sock.close()
    raise error or OSError(f"cannot resolve {host}")


class _HTTP(http.client.HTTPConnection):
    def __init__(self, *args: Any, end: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = functools.partial(_connect, end=end)


class _HTTPS(http.client.HTTPSConnection):
    def __init__(self, *args: Any, end: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._end = end
        self._create_connection = functools.partial(_connect, end=end)

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)  # TCP (and a proxy's CONNECT), within the deadline
        hostname = getattr(self, "_tunnel_host", None) or self.host
        context: ssl.SSLContext = self._context  # type: ignore[attr-defined]
        tls = context.wrap_socket(self.sock, server_hostname=hostname, do_handshake_on_connect=False)
        assert isinstance(tls, _TLSSocket)
        tls.end = self._end
        tls.handshake_until(self._end)
        self.sock = tls


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, end: float) -> None:
        super().__init__()
        self._end = end

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(_HTTP, end=self._end), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, end: float, context: ssl.SSLContext) -> None:
        super().__init__(context=context)
        self._end = end
        self._ctx = context

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(_HTTPS, end=self._end), req, context=self._ctx)


def tls_context(cafile: str | None = None) -> ssl.SSLContext:
    """A verifying client context whose sockets keep a request's deadline."""
    context = ssl.create_default_context(cafile=cafile)
    context.sslsocket_class = _TLSSocket
    return context


_DEFAULT_TLS = tls_context()


def open_until(
    request: urllib.request.Request,
    seconds: float,
    *,
    max_bytes: int,
    context: ssl.SSLContext | None = None,
) -> tuple[int, bytes]:
    """``(status, body)`` of ``request``, at most ``max_bytes + 1`` of the body read, all of it within
    ``seconds``: TimeoutError at the deadline, urllib's errors otherwise (HTTPError for a status)."""
    end = time.monotonic() + seconds
    ctx = context if context is not None else _DEFAULT_TLS
    if ctx.sslsocket_class is not _TLSSocket:
        raise ValueError("use prom.deadline.tls_context() for a context that keeps the deadline")
    opener = urllib.request.build_opener(_HTTPHandler(end), _HTTPSHandler(end, ctx))
    with opener.open(request, timeout=max(seconds, 0.001)) as response:
        return int(response.status), response.read(max_bytes + 1)
