"""The demo's pager: an Alertmanager webhook receiver on loopback that hands every page to a callback.

Alertmanager POSTs a JSON document per notification (a group of alerts, firing or resolved); each alert
in it becomes a :class:`Page`, which keeps the receiver the notification was for (the payload's
``receiver``: the demo points every receiver of the shipped routing here, ``/<receiver>`` each).
Bodies are bounded and malformed ones are answered 400 and logged once per kind, so a confused
sender cannot take the demo down.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Page", "PagerServer"]

log = logging.getLogger(__name__)

_MAX_BODY = 1024 * 1024


@dataclass(frozen=True)
class Page:
    """One alert of one Alertmanager notification."""

    received: float
    status: str  # firing | resolved
    name: str
    severity: str
    labels: dict[str, str] = field(default_factory=dict)
    summary: str = ""
    receiver: str = ""
    #: Which notification (webhook request) it came in, numbered from 1 as they arrive: alerts that
    #: Alertmanager grouped into one notification share it.
    notification: int = 0
    #: The alert's annotations (bounded), for a reader that looks past the summary.
    annotations: dict[str, str] = field(default_factory=dict)
    #: When the alert started firing (its ``startsAt``, Unix seconds; 0 when absent or unreadable):
    #: a notification Alertmanager's grouping sends minutes later is still about that moment.
    starts_at: float = 0.0

    def subject(self) -> str:
        """The labels that say what the page is about."""
        keys = ("run", "instance", "gpu", "xid", "path", "step")
        return " ".join(f"{k}={self.labels[k]}" for k in keys if k in self.labels)


def parse_notification(body: object, received: float, notification: int = 0) -> list[Page]:
    """The pages in an Alertmanager webhook payload (version 4); ValueError when it is not one."""
    if not isinstance(body, dict) or not isinstance(body.get("alerts"), list):
        raise ValueError("not an Alertmanager webhook payload (no 'alerts' list)")
    pages = []
    receiver = str(body.get("receiver") or "")[:100]
    for alert in body["alerts"]:
        if not isinstance(alert, dict):
            raise ValueError("an alert is not an object")
        raw_labels, annotations = alert.get("labels") or {}, alert.get("annotations") or {}
        if not isinstance(raw_labels, dict) or not isinstance(annotations, dict):
            raise ValueError("an alert's labels or annotations are not an object")
        labels = {str(k): str(v)[:200] for k, v in raw_labels.items()}
        pages.append(
            Page(
                received=received,
                status=str(alert.get("status", body.get("status", "firing"))),
                name=labels.get("alertname", "?"),
                severity=labels.get("severity", ""),
                labels=labels,
                summary=str(annotations.get("summary", ""))[:500],
                receiver=receiver,
                notification=notification,
                annotations={str(k)[:100]: str(v)[:2000] for k, v in list(annotations.items())[:20]},
                starts_at=_unix(alert.get("startsAt")),
            )
        )
    return pages


def _unix(text: object) -> float:
    """An RFC 3339 time as Alertmanager writes it (nanoseconds, ``Z``) in Unix seconds; 0.0 if not one."""
    if not isinstance(text, str):
        return 0.0
    match = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", text.strip())
    if not match:
        return 0.0
    whole, fraction, zone = match.groups()
    try:
        stamp = datetime.fromisoformat(whole + ("+00:00" if zone == "Z" else zone)).timestamp()
    except ValueError:
        return 0.0
    return max(stamp + (float("0" + fraction) if fraction else 0.0), 0.0)  # Go's zero time: none


class PagerServer:
    """A webhook receiver on ``127.0.0.1`` (ephemeral port); ``on_page`` runs on the server's thread."""

    def __init__(self, on_page: Callable[[Page], None], *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.pages: list[Page] = []
        self._lock = threading.Lock()
        self._on_page = on_page
        self.rejected = 0
        self._notifications = 0
        pager = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if not 0 < length <= _MAX_BODY:
                    self._answer(413 if length else 400)
                    return
                try:
                    body = json.loads(self.rfile.read(length))
                    pages = parse_notification(body, time.time(), pager._number())
                except (ValueError, UnicodeDecodeError) as exc:
                    pager._reject(exc)
                    self._answer(400)
                    return
                for page in pages:
                    pager._deliver(page)
                self._answer(200)

            def _answer(self, code: int) -> None:
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._host = host
        self.url = self.url_for("pager")
        self._thread = threading.Thread(target=self._server.serve_forever, name="demo-pager", daemon=True)

    def url_for(self, receiver: str) -> str:
        """The webhook URL the demo gives Alertmanager's receiver ``receiver``."""
        return f"http://{self._host}:{self.port}/{urllib.parse.quote(receiver, safe='')}"

    def start(self) -> PagerServer:
        """Serve in the background."""
        self._thread.start()
        return self

    def _number(self) -> int:
        with self._lock:
            self._notifications += 1
            return self._notifications

    def _reject(self, exc: Exception) -> None:
        with self._lock:
            self.rejected += 1
            first = self.rejected == 1
        if first:
            log.warning("demo pager: rejected a malformed notification: %s", exc)

    def _deliver(self, page: Page) -> None:
        with self._lock:
            self.pages.append(page)
        try:
            self._on_page(page)
        except Exception as exc:  # printing must not break the receiver
            log.warning("demo pager: page callback failed: %s", exc)

    def snapshot(self) -> list[Page]:
        """The pages received so far."""
        with self._lock:
            return list(self.pages)

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
