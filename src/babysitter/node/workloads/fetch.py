"""Fetching the registered trainer endpoints: all at once, each within a total deadline.

Each fetch gets ``timeout`` seconds from connect to the last byte, however the peer drips its
bytes, and all endpoints are fetched concurrently on one event loop, so a slow or hostile endpoint
costs the others nothing and a whole round takes at most ``timeout``. The URL was checked when the
registration was read; it is checked again here against the address actually connected to (a
literal IP, ``localhost`` meaning 127.0.0.1: no resolver is consulted). Redirects are never
followed: any status but 200 is a failure. At most ``max_bytes`` are read; a compressed or chunked
body (not asked for) is refused.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass

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


class FetchError(Exception):
    """A failed fetch, with the reason label it is counted under."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


@dataclass(frozen=True)
class Fetched:
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

    def fetch_all(self, urls: Sequence[str]) -> list[Fetched]:
        """One :class:`Fetched` per URL, in order; returns within about ``timeout`` seconds."""
        if not urls:
            return []
        return asyncio.run(self._all(urls))

    async def _all(self, urls: Sequence[str]) -> list[Fetched]:
        return list(await asyncio.gather(*(self._one(url) for url in urls)))

    async def _one(self, url: str) -> Fetched:
        start = time.perf_counter()
        try:
            body = await asyncio.wait_for(self._get(url), self._timeout)
        except (asyncio.TimeoutError, TimeoutError):
            error = FetchError("timeout", f"no complete response within {self._timeout:g} s")
        except FetchError as exc:
            error = exc
        except ssl.SSLError as exc:
            error = FetchError("tls", f"{type(exc).__name__}: {exc}"[:200])
        except (OSError, EOFError, asyncio.IncompleteReadError) as exc:
            error = FetchError("connect", f"{type(exc).__name__}: {exc}"[:200])
        except asyncio.LimitOverrunError:
            error = FetchError("protocol", f"response head larger than {_MAX_HEAD} bytes")
        except Exception as exc:  # a peer must never break the round for the others
            error = FetchError("protocol", f"{type(exc).__name__}: {exc}"[:200])
        else:
            return Fetched(body, time.perf_counter() - start)
        return Fetched(b"", time.perf_counter() - start, error)

    async def _get(self, url: str) -> bytes:
        target = parse_target(url)
        address = target.address
        if not (address.is_loopback or any(address in net for net in self._networks)):
            raise FetchError("forbidden_target", f"{address} is not loopback nor in an allowed network")
        tls = self._ssl if target.scheme == "https" else None
        reader, writer = await asyncio.open_connection(
            str(address), target.port, ssl=tls, server_hostname=target.host if tls else None, limit=_MAX_HEAD
        )
        try:
            host = f"[{address}]" if address.version == 6 else str(address)
            writer.write(
                (
                    f"GET {target.path} HTTP/1.0\r\nHost: {host}:{target.port}\r\n"
                    "Accept: text/plain;version=0.0.4\r\nAccept-Encoding: identity\r\n"
                    "User-Agent: babysitter-node-agent\r\nConnection: close\r\n\r\n"
                ).encode("ascii")
            )
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            _check_head(head)
            chunks: list[bytes] = []
            size = 0
            while chunk := await reader.read(65536):
                size += len(chunk)
                if size > self._max_bytes:
                    raise FetchError("too_large", f"response larger than {self._max_bytes} bytes")
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            writer.transport.abort()


def _check_head(head: bytes) -> None:
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
