"""What a checkpoint sentinel pass over several run directories costs: wall time and CPU per pass, and
the memory of the agent process and of the sentinel's per-run workers (issue 31).

Eight run directories (``--runs``), each with a ledger and three checkpoints made as the tracker makes
them (a single file with a sidecar manifest, a directory of 64 files with its manifest, a
``.safetensors`` file), owned by uid 65534 when run as root (so the sentinel verifies as that user,
as it would a real user's run). Passes are driven with ``check_now()`` (what the sentinel's thread
runs): the first pass (ledgers, manifests and headers read), then steady passes with sizes only
(``verify_bytes=0``) and with a digest budget. CPU counts the agent process and, after the fix, its
workers (``/proc/<pid>/stat``); memory is each process's RSS and USS (``/proc/<pid>/smaps_rollup``:
pages only it holds, i.e. what a worker forked without exec really costs).

Run it against another checkout with ``PYTHONPATH=<checkout>/src python benchmarks/bench_sentinel.py``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from babysitter.checkpoints import build_manifest
from babysitter.ledger import DEFAULT_FILE_NAME
from babysitter.ledger.records import CheckpointEnd, Start, encode, to_us
from babysitter.node.storage.sentinel import CheckpointSentinelCollector
from machine import cpu_model

MIB = 1 << 20
NOBODY = 65534
_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """utime + stime of one process (its own threads; children not included): ``getrusage`` for this
    one (microseconds), ``/proc/<pid>/stat`` for a worker (clock ticks; summed over passes)."""
    if pid == os.getpid():
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def _memory(pid: int) -> dict[str, float]:
    """RSS and USS (private clean + dirty) in MiB, from smaps_rollup."""
    values: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
            values[parts[0][:-1]] = int(parts[1])
    uss = values.get("Private_Clean", 0) + values.get("Private_Dirty", 0)
    return {"rss_mib": round(values.get("Rss", 0) / 1024, 1), "uss_mib": round(uss / 1024, 1)}


def _workers(collector: object) -> list[int]:
    pids = getattr(collector, "worker_pids", None)
    return list(pids()) if callable(pids) else []


def make_run(root: Path, index: int, now: float) -> Path:
    """A run directory with three checkpoints and their manifests, and the ledger naming them."""
    run = root / f"run-{index}"
    run.mkdir()
    one = run / "ckpt-100.pt"
    one.write_bytes(os.urandom(4 * MIB))
    many = run / "ckpt-200"
    many.mkdir()
    for k in range(64):
        (many / f"shard-{k:03d}.bin").write_bytes(os.urandom(64 << 10))
    tensors = run / "ckpt-300.safetensors"
    header = json.dumps({"w": {"dtype": "U8", "shape": [MIB], "data_offsets": [0, MIB]}}).encode()
    tensors.write_bytes(len(header).to_bytes(8, "little") + header + os.urandom(MIB))
    lines = [
        encode(
            Start(t=to_us(now - 900), pst=to_us(now - 900), id=f"i{index}", host="h", pid=1, run=f"r{index}")
        )
    ]
    for step, path in ((100, one), (200, many), (300, tensors)):
        assert build_manifest(path, run=f"r{index}", step=step).kind == "manifest"
        size = path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.iterdir())
        end = CheckpointEnd(
            t=to_us(now - 600 + step),
            op="save",
            step=step,
            ok=True,
            nbytes=size,
            path=str(path),
            manifest=True,
        )
        lines.append(encode(end))
    (run / DEFAULT_FILE_NAME).write_bytes(b"".join(lines))
    if os.geteuid() == 0:
        for dirpath, _, files in os.walk(run):
            os.chown(dirpath, NOBODY, NOBODY)
            for name in files:
                os.chown(os.path.join(dirpath, name), NOBODY, NOBODY)
    return run


def passes(runs: list[Path], count: int, **options: object) -> dict[str, object]:
    """Wall and CPU of the first pass and the mean of ``count`` steady ones; memory after them."""
    me = os.getpid()
    c = CheckpointSentinelCollector(runs, refresh_seconds=0.0, wait_seconds=120.0, **options)  # type: ignore[arg-type]
    try:
        samples = []
        for i in range(count + 1):
            pids = [me, *_workers(c)]
            cpu0 = {p: _cpu_seconds(p) for p in pids}
            t0 = time.perf_counter()
            results = c.check_now()
            wall = time.perf_counter() - t0
            pids = [me, *_workers(c)]
            cpu = sum(_cpu_seconds(p) - cpu0.get(p, 0.0) for p in pids)
            samples.append((wall, cpu))
            if i == 0:
                verified = sum(1 for r in results for x in r.checks if x.verified)
        workers = _workers(c)
        steady = samples[1:]
        return {
            "verified_checkpoints": verified,
            "first_pass_wall_ms": round(samples[0][0] * 1e3, 1),
            "first_pass_cpu_ms": round(samples[0][1] * 1e3, 1),
            "steady_pass_wall_ms": round(statistics.mean(w for w, _ in steady) * 1e3, 1),
            "steady_pass_cpu_ms": round(statistics.mean(c for _, c in steady) * 1e3, 1),
            "agent": _memory(me),
            "workers": len(workers),
            "worker_memory": [_memory(p) for p in workers],
        }
    finally:
        c.close()


def stopped(runs: list[Path], timeout: float) -> dict[str, object]:
    """One run's worker stopped (``kill -STOP``, what its owner can do): the pass that meets it, the
    next one (that run waits out its backoff), and whether the other runs were checked in both."""
    c = CheckpointSentinelCollector(
        runs, refresh_seconds=30.0, wait_seconds=120.0, verify_bytes=0, run_timeout=timeout
    )  # type: ignore[call-arg]
    try:
        c.check_now()
        os.kill(_workers(c)[0], signal.SIGSTOP)
        out: dict[str, object] = {"run_timeout_s": timeout}
        for name in ("pass_meeting_it", "next_pass"):
            t0 = time.perf_counter()
            results = c.check_now()
            out[name] = {
                "wall_ms": round((time.perf_counter() - t0) * 1e3, 1),
                "failing": [r.run for r in results if r.failure],
                "others_checked": sum(1 for r in results if not r.failure and r.complete),
            }
        return out
    finally:
        c.close()


_MANIFEST_MEMORY = """
import json, os, resource, sys
from pathlib import Path
from babysitter.checkpoints.verify import ChunkVerifier, load_manifest
page = os.sysconf("SC_PAGE_SIZE")
def resident():
    return int(Path("/proc/self/statm").read_text().split()[1]) * page
before = resident()
manifest, mid, problem = load_manifest(Path(sys.argv[1]))
verifier = ChunkVerifier(Path(sys.argv[1]), manifest, seed=mid)
held = resident() - before
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
out = {"held_mib": held / 2**20, "peak_mib": peak / 2**20, "chunks": len(verifier.order)}
print(json.dumps({k: round(v, 1) for k, v in out.items()}))
"""


def manifest_memory(tmp: Path, terabytes: float) -> dict[str, object]:
    """Peak memory a worker spends on the manifest of a checkpoint of ``terabytes`` (64 files, a SHA-256
    per 16 MiB chunk: what the tracker writes), parsed and ordered for digests, in a fresh process."""
    chunks = int(terabytes * (1 << 40)) // (16 * MIB)
    per_file = chunks // 64
    files = [
        {
            "path": f"shard-{k:02d}.bin",
            "size": per_file * 16 * MIB,
            "chunks": [hashlib.sha256(f"{k}.{i}".encode()).hexdigest() for i in range(per_file)],
        }
        for k in range(64)
    ]
    checkpoint = tmp / f"manifest-{terabytes:g}tb"
    checkpoint.mkdir()
    manifest = {
        "format": "babysitter-checkpoint-manifest",
        "v": 1,
        "run": "r",
        "step": 1,
        "layout": "files",
        "created": 0,
        "host": "h",
        "alg": "sha256",
        "chunk": 16 * MIB,
        "files": files,
    }
    data = json.dumps(manifest, separators=(",", ":")).encode()
    (checkpoint / "babysitter-manifest.json").write_bytes(data)
    done = subprocess.run(
        [sys.executable, "-c", _MANIFEST_MEMORY, str(checkpoint)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    out: dict[str, object] = json.loads(done.stdout)
    out["terabytes"] = terabytes
    out["manifest_mib"] = round(len(data) / MIB, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--passes", type=int, default=10)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-sentinel-"))
    tmp.chmod(0o755)
    try:
        now = time.time()
        runs = [make_run(tmp, i, now) for i in range(args.runs)]
        out = {
            "label": args.label,
            "machine": {
                "cpu": cpu_model(),
                "logical_cpus": os.cpu_count(),
                "python": platform.python_version(),
                "kernel": platform.release(),
                "euid": os.geteuid(),
            },
            "runs": args.runs,
            "sizes_only": passes(runs, args.passes, verify_bytes=0),
            "digests_64mib": passes(runs, args.passes, verify_bytes=64 * MIB, reverify_seconds=0.0),
        }
        if callable(getattr(CheckpointSentinelCollector, "worker_pids", None)):  # no workers before the fix
            out["one_worker_stopped"] = stopped(runs, timeout=5.0)
        out["manifest_memory"] = [manifest_memory(tmp, tb) for tb in (1, 10)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
