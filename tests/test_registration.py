"""The registration directory is shared by every user of a host: hostile entries are refused."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from babysitter import registration


def _endpoint(url: str = "http://127.0.0.1:9450/metrics") -> registration.Endpoint:
    pid = os.getpid()
    return registration.Endpoint(pid, registration.process_start_time(pid), url, "run", 0, 0)


def test_live_endpoint_round_trips(tmp_path: Path) -> None:
    """What a tracker registers is what the agent lists, file mode 0644."""
    path = registration.register(tmp_path, _endpoint())
    assert registration.list_endpoints(tmp_path) == [_endpoint()]
    assert path.stat().st_mode & 0o777 == 0o644


def test_fifo_symlink_and_foreign_urls_are_skipped_without_blocking(tmp_path: Path) -> None:
    """A FIFO (which would block a plain open), a link to another file and a non-loopback URL are
    skipped; the one good registration is still found."""
    registration.register(tmp_path, _endpoint())
    os.mkfifo(tmp_path / "1-1.json")
    secret = tmp_path.parent / "secret.json"
    secret.write_text(json.dumps({"schema": 1, **_endpoint("http://127.0.0.1:1/metrics").__dict__}))
    (tmp_path / "2-2.json").symlink_to(secret)
    foreign = {"schema": 1, **_endpoint("http://10.0.0.1:9450/metrics").__dict__}
    (tmp_path / "3-3.json").write_text(json.dumps(foreign))
    result: list[list[registration.Endpoint]] = []
    worker = threading.Thread(
        target=lambda: result.append(registration.list_endpoints(tmp_path)), daemon=True
    )
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), "listing blocked on the FIFO"
    assert result == [[_endpoint()]]


def test_dead_process_registrations_are_pruned(tmp_path: Path) -> None:
    """A registration whose process is gone (or whose pid was reused) is dropped and, with prune, deleted."""
    stale = registration.Endpoint(os.getpid(), 1.0, "http://127.0.0.1:9/metrics", "old", 0, 0)
    path = registration.register(tmp_path, stale)
    assert registration.list_endpoints(tmp_path, prune=True) == []
    assert not path.exists()
