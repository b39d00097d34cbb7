"""os.fork() after watch(): the child neither serves nor hangs at exit; the parent is untouched."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time, urllib.request
    from pathlib import Path
    import psutil
    import babysitter
    from babysitter import registration

    reg = Path(sys.argv[1])
    t = babysitter.watch(port=0, registry_dir=reg, ledger=False, hang_timeout=None, run="forky")
    t.step(tokens=1)
    port = int(t.metrics_url.rsplit(":", 1)[1].split("/")[0])
    # a scrape in flight at the fork: its connection must not be held open by the child
    pid = os.fork()
    if pid == 0:
        listening = [c for c in psutil.Process().net_connections("tcp")
                     if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
        with open(sys.argv[2], "w") as out:
            json.dump({"listening": len(listening), "url": t.metrics_url, "closed": t.closed}, out)
        t.step(tokens=1)  # still harmless in the child
        sys.exit(0)  # atexit runs tracker.close()
    deadline = time.monotonic() + 30
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            status = None
            break
        time.sleep(0.05)
    body = urllib.request.urlopen(t.metrics_url, timeout=10).read().decode()
    urls = [e.url for e in registration.list_endpoints(reg)]
    print(json.dumps({
        "child_exit": None if status is None else os.waitstatus_to_exitcode(status),
        "parent_serves": 'train_steps_total{rank="0",run="forky"} 1.0' in body,
        "parent_registered": t.metrics_url in urls,
    }))
    """
)


def test_forked_child_exits_and_parent_keeps_serving(tmp_path: Path) -> None:
    """The child exits at once (no hang in the server's shutdown), holds no listening socket and
    exports nothing; the parent still serves its metrics and keeps its registration."""
    child_out = tmp_path / "child.json"
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(tmp_path / "reg"), str(child_out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    parent = json.loads(proc.stdout.strip().splitlines()[-1])
    assert parent == {"child_exit": 0, "parent_serves": True, "parent_registered": True}
    child = json.loads(child_out.read_text())
    assert child == {"listening": 0, "url": None, "closed": True}
