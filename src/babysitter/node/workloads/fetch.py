"""Fetching the registered trainer endpoints: all at once, each within a total deadline.

Each fetch gets ``timeout`` seconds from connect to the last byte, however the peer drips its
bytes, and all endpoints are fetched concurrently on one non-blocking ``selectors`` loop, so a slow or
hostile endpoint costs the others nothing and a whole round takes at most ``timeout``. The URL was
checked when the registration was read; it is checked again here against the address actually
connected to (a literal IP, ``localhost`` meaning 127.0.0.1: no resolver is consulted). Redirects are
never followed: any status but 200 is a failure. At most ``max_bytes`` are read; a compressed or
chunked body (not asked for) is refused.

Why a bare loop, not asyncio: the agent fetches every local rank at every scrape, and an asyncio round
(a new event loop, tasks, streams) cost 2.6 ms of CPU for 8 trainers against 0.6 ms for the same
sockets on one ``selectors`` loop (``benchmarks/bench_trainer_fetch.py``): the largest part of the
agent's CPU per scrape.
"""

from __future__ import annotations

import contextlib
import errno
import selectors
import socket
import ssl
import time
from collections.abc import Sequence
from typing import NamedTuple

from babysitter.registration import Network, parse_target

__all__ = ["FETCH_ERRORS", "FetchError", "Fetched", "Fetcher"]

#: Why a fetch failed; the values of the ``reason`` label (the trainers collector adds its own).
FETCH_ERRORS = (
    "timeout",
    "connect",
    "tls",
    "redirect",
    "http_status",
    "too_large",
    "protocol",
    "forbidden_target",
)
_MAX_HEAD = 64 * 1024
_CHUNK = 65536
_MAX_PLANS = 4096
_READ, _WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE


class FetchError(Exception):
    """A failed fetch, with the reason label it is counted under."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class Fetched(NamedTuple):
    """One endpoint's response body, or why there is none; and how long it took."""

    body: bytes
    seconds: float
    error: FetchError | None = None


class Fetcher:
    """Fetches URLs concurrently, each within ``timeout`` seconds and ``max_bytes``."""

    def __init__(
        self,
        *,
        timeout: float,
        max_bytes: int,
        ssl_context: ssl.SSLContext | None = None,
        networks: Sequence[Network] = (),
    ) -> None:
        if not timeout > 0 or max_bytes <= 0:
            raise ValueError("fetch timeout and max_bytes must be positive")
        self._timeout = timeout
        self._max_bytes = max_bytes
        self._ssl = ssl_context if ssl_context is not None else ssl.create_default_context()
        self._networks = tuple(networks)
        self._plans: dict[str, tuple[int, tuple[str, int], bytes, str | None]] = {}

    def fetch_all(
        self,
        urls: Sequence[str],
        *,
        timeout: float | None = None,
        max_bytes: Sequence[int] | None = None,
    ) -> list[Fetched]:
        """One :class:`Fetched` per URL, in order; returns within about ``timeout`` seconds (default:
        the fetcher's). ``max_bytes`` gives each URL its own read limit (at most the fetcher's)."""
        if not urls:
            return []
        deadline = self._timeout if timeout is None else min(max(timeout, 0.001), self._timeout)
        limits = [self._max_bytes] * len(urls) if max_bytes is None else list(max_bytes)
        if len(limits) != len(urls):
            raise ValueError("one byte limit per URL")
        start = time.perf_counter()
        conns = [self._open(url, min(n, self._max_bytes), start) for url, n in zip(urls, limits, strict=True)]
        with selectors.DefaultSelector() as sel:
            try:
                for conn in conns:
                    if conn.result is None:
                        # By descriptor: a TLS connection's socket object is replaced by its wrapper.
                        sel.register(conn.sock.fileno(), conn.wants, conn)  # type: ignore[union-attr]
                end = start + deadline
                while sel.get_map():
                    left = end - time.perf_counter()
                    if left <= 0:
                        break
                    for key, _ in sel.select(left):
                        conn = key.data
                        conn.advance()
                        if conn.result is not None:
                            sel.unregister(key.fileobj)
                        elif conn.wants != key.events:
                            sel.modify(key.fileobj, conn.wants, conn)
            finally:
                for conn in conns:
                    if conn.result is None:
                        conn.fail(FetchError("timeout", f"no complete response within {deadline:g} s"))
        return [conn.result for conn in conns]  # type: ignore[misc]

    def _plan(self, url: str) -> tuple[int, tuple[str, int], bytes, str | None]:
        """(socket family, address, request, TLS server name or None) of a URL, checked; remembered
        (the same endpoints are fetched every scrape; a URL is checked the same way every time)."""
        plan = self._plans.get(url)
        if plan is not None:
            return plan
        target = parse_target(url)
        address = target.address
        if not (address.is_loopback or any(address in net for net in self._networks)):
            raise FetchError("forbidden_target", f"{address} is not loopback nor in an allowed network")
        host = f"[{address}]" if address.version == 6 else str(address)
        request = (
            f"GET {target.path} HTTP/1.0\r\nHost: {host}:{target.port}\r\n"
            "Accept: text/plain;version=0.0.4\r\nAccept-Encoding: identity\r\n"
            "User-Agent: babysitter-node-agent\r\nConnection: close\r\n\r\n"
        ).encode("ascii")
        family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
        plan = (
            family,
            (str(address), target.port),
            request,
            target.host if target.scheme == "https" else None,
        )
        if len(self._plans) >= _MAX_PLANS:
            self._plans.clear()
        self._plans[url] = plan
        return plan

    def _open(self, url: str, limit: int, start: float) -> _Conn:
        conn = _Conn(limit, start)
        try:
            family, address, conn.request, server_name = self._plan(url)
            if server_name is not None:
                conn.tls = (self._ssl, server_name)
            conn.sock = socket.socket(family, socket.SOCK_STREAM)
            conn.sock.setblocking(False)
            code = conn.sock.connect_ex(address)
            if code not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN):
                raise OSError(code, f"connect: {errno.errorcode.get(code, code)}")
        except Exception as exc:  # a bad URL or a refused connect costs only its own fetch
            conn.fail(exc)
        return conn


class _Conn:
    """One fetch's state: connect, (TLS handshake), send the request, read the head, read the body."""

    def __init__(self, limit: int, start: float) -> None:
        self.limit = limit
        self.start = start
        self.sock: socket.socket | None = None
        self.tls: tuple[ssl.SSLContext, str] | None = None
        self.request = b""
        self.stage = "connect"
        self.wants = _WRITE
        self.head = bytearray()
        self.chunks: list[bytes] = []
        self.size = 0
        self.result: Fetched | None = None

    def advance(self) -> None:
        """Do what the socket is ready for; on any failure the fetch ends with its reason."""
        try:
            if self.stage == "connect":
                self._connected()
            if self.stage == "handshake":
                self._handshake()
            if self.stage == "send":
                self._send()
            if self.stage in ("head", "body"):
                self._read()
        except ssl.SSLWantReadError:
            self.wants = _READ
        except ssl.SSLWantWriteError:
            self.wants = _WRITE
        except (BlockingIOError, InterruptedError):
            pass
        except Exception as exc:
            self.fail(exc)

    def _connected(self) -> None:
        assert self.sock is not None
        code = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            raise OSError(code, f"connect: {errno.errorcode.get(code, code)}")
        if self.tls is not None:
            context, hostname = self.tls
            self.sock = context.wrap_socket(
                self.sock, server_hostname=hostname, do_handshake_on_connect=False
            )
            self.stage = "handshake"
        else:
            self.stage = "send"

    def _handshake(self) -> None:
        assert isinstance(self.sock, ssl.SSLSocket)
        self.sock.do_handshake()
        self.stage = "send"
        self.wants = _WRITE

    def _send(self) -> None:
        assert self.sock is not None
        while self.request:
            sent = self.sock.send(self.request)
            self.request = self.request[sent:]
        self.stage = "head"
        self.wants = _READ

    def _read(self) -> None:
        assert self.sock is not None
        while True:
            chunk = self.sock.recv(_CHUNK)
            if not chunk:
                self._eof()
                return
            if self.stage == "head":
                # Searched from where the last read ended: a head dripped a byte at a time is not
                # searched again from its start at every byte.
                begin = max(0, len(self.head) - 3)
                self.head += chunk
                end = self.head.find(b"\r\n\r\n", begin)
                if end < 0:
                    if len(self.head) > _MAX_HEAD:
                        raise FetchError("protocol", f"response head larger than {_MAX_HEAD} bytes")
                    continue
                if end + 4 > _MAX_HEAD:
                    raise FetchError("protocol", f"response head larger than {_MAX_HEAD} bytes")
                _check_head(bytes(self.head[: end + 4]))
                chunk = bytes(self.head[end + 4 :])
                self.head.clear()
                self.stage = "body"
                if not chunk:
                    continue
            self.size += len(chunk)
            if self.size > self.limit:
                raise FetchError("too_large", f"response larger than {self.limit} bytes")
            self.chunks.append(chunk)

    def _eof(self) -> None:
        if self.stage == "head":
            raise FetchError(
                "connect", f"connection closed after {len(self.head)} bytes of the response head"
            )
        self._finish(Fetched(b"".join(self.chunks), time.perf_counter() - self.start))

    def fail(self, exc: BaseException) -> None:
        if isinstance(exc, FetchError):
            error = exc
        elif isinstance(exc, ssl.SSLError | ssl.CertificateError):
            error = FetchError("tls", f"{type(exc).__name__}: {exc}"[:200])
        elif isinstance(exc, OSError | EOFError):
            error = FetchError("connect", f"{type(exc).__name__}: {exc}"[:200])
        else:  # a peer must never break the round for the others
            error = FetchError("protocol", f"{type(exc).__name__}: {exc}"[:200])
        self._finish(Fetched(b"", time.perf_counter() - self.start, error))

    def _finish(self, result: Fetched) -> None:
        self.result = result
        self.chunks = []
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()


_PLAIN_OK = (b"HTTP/1.1 200 OK\r\n", b"HTTP/1.0 200 OK\r\n")


def _check_head(head: bytes) -> None:
    if head.startswith(_PLAIN_OK):
        lower = head.lower()
        if b"encoding" not in lower:
            return  # a 200 with no content or transfer encoding: every tracker's answer
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise FetchError("protocol", f"not an HTTP response: {lines[0][:80]!r}")
    status = int(parts[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if 300 <= status < 400:
        location = headers.get("location", "")[:120]
        raise FetchError("redirect", f"HTTP {status} to {location!r}: redirects are never followed")
    if status != 200:
        raise FetchError("http_status", f"HTTP {status}")
    if headers.get("content-encoding", "identity").lower() not in ("", "identity"):
        raise FetchError("protocol", f"content encoding {headers['content-encoding'][:40]!r} not asked for")
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise FetchError("protocol", "chunked body to an HTTP/1.0 request")
