"""The node agent and the tracker's endpoint under the attacks of issue 12: before/after numbers.

Scenarios, each in fresh processes (so RSS is the agent's own):

- flood: one registered endpoint serves 120,000 short series (1.6 MB, under the old 4 MiB cap) next
  to an honest one; one scrape of the trainers collector through ``Agent.collect`` (collection only,
  no rendering): wall time, agent peak RSS growth, whether the honest and the flood's series are served.
- drip: twelve endpoints send their headers, then one byte every 0.2 s forever, next to an honest one;
  two scrapes (trainer timeout 2 s, collector timeout 10 s): wall time of each, whether the honest
  series is served, the trainers collector's success.
- slowloris: a tracker (``watch(port=0)``) and a node agent, each with RLIMIT_NOFILE 1024 (the usual
  default), receive 1,100 idle connections (half of them send half a request line), then one scrape
  with a 30 s timeout: whether it is answered, and how long it took.
- aggregate (issue 21, point 3): 4 users (uids 60001-60004 through setpriv when run as root; one
  user otherwise) each register 64 endpoints of 1,999 series (in families of 100), each within the
  per-endpoint caps, next to root's honest trainer; two full scrapes (collection and rendering, what
  Prometheus waits for): wall time, bytes and series served, series served per user, agent RSS.

The script only uses APIs that exist before and after the fix, so the same file measures both:
``PYTHONPATH=<old checkout>/src python benchmarks/bench_agent_hostile.py`` for "before".

Usage: python benchmarks/bench_agent_hostile.py [--out FILE] [--label TEXT]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

SERVER = textwrap.dedent(
    """
    import os, socket, sys, threading, time
    from pathlib import Path
    from babysitter import registration
    kind, reg, run, count = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    if kind == "flood":
        body = "".join(f'bulk_x{{i="{i}"}} 1\\n' for i in range(120000)).encode()
    else:
        body = f'train_steps_total{{run="{run}",rank="0"}} 1\\n'.encode()
    def serve(conn):
        try:
            conn.recv(65536)
            if kind == "drip":
                conn.sendall(b"HTTP/1.0 200 OK\\r\\nContent-Type: text/plain\\r\\n\\r\\n")
                while True:
                    conn.sendall(b"#")
                    time.sleep(0.2)
            conn.sendall(b"HTTP/1.0 200 OK\\r\\nContent-Type: text/plain\\r\\n\\r\\n" + body)
        except OSError:
            pass
        finally:
            conn.close()
    def accept(sock):
        while True:
            conn, _ = sock.accept()
            threading.Thread(target=serve, args=(conn,), daemon=True).start()
    pid = os.getpid()
    for i in range(count):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        threading.Thread(target=accept, args=(sock,), daemon=True).start()
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/metrics"
        name = run if count == 1 else f"{run}{i}"
        started = registration.process_start_time(pid)
        registration.register(reg, registration.Endpoint(pid, started, url, name, 0, 0))
    print("ready", flush=True)
    time.sleep(3600)
    """
)

AGENT_SIDE = textwrap.dedent(
    """
    import json, os, resource, sys, time
    from pathlib import Path
    from babysitter.node.agent import Agent
    from babysitter.node.workloads.trainers import TrainersCollector
    reg, scrapes = Path(sys.argv[1]), int(sys.argv[2])
    agent = Agent([TrainersCollector(reg, timeout=2.0)], collector_timeout=10.0)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = []
    for _ in range(scrapes):
        t0 = time.perf_counter()
        samples = [s for f in agent.collect() for s in f.samples]
        wall = time.perf_counter() - t0
        ok = [s.value for s in samples if s.name == "babysitter_collector_success"]
        out.append({
            "wall_s": round(wall, 3),
            "honest": any(s.name == "train_steps_total" and s.labels.get("run") == "honest" for s in samples),
            "flood_series": sum(1 for s in samples if s.name == "bulk_x"),
            "collector_success": ok[0] if ok else None,
        })
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = {"scrapes": out, "rss_before_mib": rss0 / 1024, "rss_after_mib": rss1 / 1024}
    print(json.dumps(result), flush=True)
    os._exit(0)  # before the fix, fetch threads stuck on a drip-feeding endpoint kept the process alive
    """
)

TRACKER = textwrap.dedent(
    """
    import resource, sys, time
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
    import babysitter
    t = babysitter.watch(port=0, registry_dir=sys.argv[1], ledger=False, hang_timeout=None, run="loris")
    t.step(tokens=1)
    print(t.metrics_url, flush=True)
    time.sleep(3600)
    """
)

BULK = textwrap.dedent(
    """
    import os, socket, sys, threading, time
    from pathlib import Path
    from babysitter import registration
    reg, user, count, series = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    def body(run):
        out, done, f = [], 0, 0
        while done < series:
            n = min(100, series - done)
            out.append(f"# HELP bulk_{f} filler\\n# TYPE bulk_{f} gauge\\n")
            out.extend(f'bulk_{f}{{run="{run}",rank="0",i="{i}"}} 1\\n' for i in range(n))
            done, f = done + n, f + 1
        return ("HTTP/1.0 200 OK\\r\\nContent-Type: text/plain\\r\\n\\r\\n" + "".join(out)).encode()
    def serve(sock, payload):
        while True:
            conn, _ = sock.accept()
            try:
                conn.recv(65536)
                conn.sendall(payload)
            except OSError:
                pass
            finally:
                conn.close()
    pid = os.getpid()
    for i in range(count):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        run = f"{user}-{i}"
        threading.Thread(target=serve, args=(sock, body(run)), daemon=True).start()
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/metrics"
        started = registration.process_start_time(pid)
        registration.register(reg, registration.Endpoint(pid, started, url, run, 0, 0))
    print("ready", flush=True)
    time.sleep(3600)
    """
)

AGGREGATE_AGENT = textwrap.dedent(
    """
    import collections, json, os, resource, sys, time
    from pathlib import Path
    from babysitter.node.agent import Agent
    from babysitter.node.workloads.trainers import TrainersCollector
    from prometheus_client.parser import text_string_to_metric_families
    reg, scrapes = Path(sys.argv[1]), int(sys.argv[2])
    agent = Agent([TrainersCollector(reg, timeout=10.0)], collector_timeout=11.0)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = []
    for _ in range(scrapes):
        t0 = time.perf_counter()
        body = agent.render()
        wall = time.perf_counter() - t0
        per_user = collections.Counter()
        honest = False
        for family in text_string_to_metric_families(body.decode()):
            for s in family.samples:
                if s.name.startswith("bulk_"):
                    per_user[s.labels["run"].split("-")[0]] += 1
                honest = honest or (s.name == "train_steps_total" and s.labels.get("run") == "honest")
        out.append({"wall_s": round(wall, 3), "bytes": len(body), "trainer_series": sum(per_user.values()),
                    "per_user": dict(sorted(per_user.items())), "honest": honest})
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = {"scrapes": out, "rss_before_mib": rss0 / 1024, "rss_after_mib": rss1 / 1024}
    print(json.dumps(result), flush=True)
    os._exit(0)
    """
)

NODE_AGENT = textwrap.dedent(
    """
    import resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
    from babysitter.cli import main
    sys.exit(main(["node-agent", "--port", "0", "--port-file", sys.argv[1], "--gpu-backend", "none",
                   "--no-collector.xid", "--no-collector.trainers"]))
    """
)


def _start(script: str, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc


def _agent_side(reg: Path, scrapes: int) -> dict[str, object]:
    command = [sys.executable, "-c", AGENT_SIDE, str(reg), str(scrapes)]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1][:300]}
    result: dict[str, object] = json.loads(done.stdout)
    return result


def _with_servers(servers: list[tuple[str, str, int]], scrapes: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        reg = Path(tmp) / "reg"
        procs = [_start(SERVER, kind, str(reg), run, str(count)) for kind, run, count in servers]
        try:
            for proc in procs:
                assert proc.stdout is not None
                assert proc.stdout.readline().strip() == "ready"
            return _agent_side(reg, scrapes)
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()


def _as_user(uid: int | None) -> list[str]:
    if uid is None:
        return [sys.executable, "-c"]
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", sys.executable, "-c"]


def aggregate(users: int = 4, endpoints: int = 64, series: int = 1999) -> dict[str, object]:
    """The issue's worst case: ``users`` x ``endpoints`` x ``series`` next to one honest trainer."""
    distinct = os.geteuid() == 0 and shutil.which("setpriv") is not None
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)  # noqa: S103 - the other users must reach the registration directory
        reg = Path(tmp) / "reg"
        procs = [
            _start(SERVER, "honest", str(reg), "honest", "1")
        ]  # creates reg, sticky, as the agent's user
        assert procs[0].stdout is not None
        assert procs[0].stdout.readline().strip() == "ready"
        for u in range(users):
            argv = [
                *_as_user(60001 + u if distinct else None),
                BULK,
                str(reg),
                f"user{u}",
                str(endpoints),
                str(series),
            ]
            procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd="/"))
        try:
            for proc in procs[1:]:
                assert proc.stdout is not None
                assert proc.stdout.readline().strip() == "ready"
            done = subprocess.run(
                [sys.executable, "-c", AGGREGATE_AGENT, str(reg), "2"],
                check=False,
                capture_output=True,
                text=True,
                timeout=900,
            )
            if done.returncode != 0:
                return {"error": done.stderr.strip().splitlines()[-1][:300]}
            result: dict[str, object] = json.loads(done.stdout)
            result["setup"] = (
                f"{users} users ({'distinct uids' if distinct else 'one uid'}) x {endpoints} x {series}"
            )
            return result
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()


def _flood_connections(host: str, port: int, count: int) -> list[socket.socket]:
    held: list[socket.socket] = []
    failures = 0
    for i in range(count):
        sock = socket.socket()
        sock.settimeout(2.0)
        try:
            sock.connect((host, port))
            if i % 2:
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        except OSError:
            sock.close()
            failures += 1
            if failures >= 5 and len(held) >= 1024:
                break
            continue
        held.append(sock)
    return held


def _scrape_flooded(url: str) -> dict[str, object]:
    host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    held = _flood_connections(host, int(port), 1100)
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 (loopback)
            response.read()
        outcome = {"answered": True, "seconds": round(time.perf_counter() - t0, 3)}
    except OSError as exc:
        outcome = {"answered": False, "seconds": round(time.perf_counter() - t0, 3), "error": str(exc)[:120]}
    finally:
        for sock in held:
            sock.close()
    outcome["connections_opened"] = len(held)
    return outcome


def slowloris() -> dict[str, object]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tracker = _start(TRACKER, str(Path(tmp) / "reg"))
        try:
            assert tracker.stdout is not None
            results["tracker"] = _scrape_flooded(tracker.stdout.readline().strip())
        finally:
            tracker.kill()
            tracker.wait()
        port_file = Path(tmp) / "port"
        command = [sys.executable, "-c", NODE_AGENT, str(port_file)]
        agent = subprocess.Popen(command, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while not (port_file.exists() and port_file.read_text().strip()) and time.monotonic() < deadline:
                time.sleep(0.1)
            results["agent"] = _scrape_flooded(f"http://{port_file.read_text().strip()}/metrics")
        finally:
            agent.kill()
            agent.wait()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="append a Markdown section to this file")
    parser.add_argument("--label", default="this checkout", help="what was measured (e.g. a commit)")
    parser.add_argument("--only", choices=["flood", "drip", "slowloris", "aggregate"], help="one scenario")
    args = parser.parse_args()
    scenarios = {
        "flood": lambda: _with_servers([("flood", "flood", 1), ("honest", "honest", 1)], scrapes=1),
        "drip": lambda: _with_servers([("drip", "drip", 12), ("honest", "honest", 1)], scrapes=2),
        "slowloris": slowloris,
        "aggregate": aggregate,
    }
    results = {name: run() for name, run in scenarios.items() if args.only in (None, name)}
    text = json.dumps(results, indent=1)
    print(text)
    if args.out is not None:
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        with args.out.open("a") as out:
            out.write(
                f"\n## {now}, {args.label}\n\nMachine: {platform.machine()}, {os.cpu_count()} logical CPUs, "
                f"Python {platform.python_version()}, Linux {platform.release()}.\n\n```json\n{text}\n```\n"
            )


if __name__ == "__main__":
    main()
