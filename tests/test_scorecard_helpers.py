"""Synthetic clusters for the scorecard tests: 30 days of series, backfilled into a real Prometheus.

A :class:`SimCluster` describes a cluster by the numbers the scorecard should find (MFU, goodput,
restart interval, Xid counts, checkpoint bandwidth, storage latency); :func:`openmetrics_days`
renders its series as OpenMetrics text with timestamps, one file per day (promtool 2.42 re-reads
its whole input once per 2-hour block, so day-sized files keep the backfill fast), and
:func:`backfilled_prometheus` runs ``promtool tsdb create-blocks-from openmetrics`` and starts
Prometheus on the result with a retention that keeps 30 days. The expected numbers are computed
here from the same parameters, independently of the scorecard's PromQL.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from babysitter.catalog import goodput as G
from babysitter.catalog import node as N
from babysitter.catalog import probe as P
from babysitter.catalog import runtime as R
from babysitter.catalog import storage as S
from babysitter.catalog import train as T
from promkit import PROMETHEUS, PROMTOOL, free_port, require_binary

__all__ = ["DAY", "MODEL", "SimCluster", "backfilled_prometheus", "openmetrics_days", "rule_stages"]

DAY = 86400
PEAK = 1e15
MODEL = "llama3-8b"


@dataclass(frozen=True)
class SimCluster:
    """One simulated cluster: 2 hosts x 2 GPUs, one 4-rank run, 30 days."""

    name: str
    mfu: float
    goodput: float
    restart_every_hours: int
    xids: dict[str, int]  # action -> errors in the window
    checkpoint_bytes_per_second: float
    storage_seconds: float
    probe_peak_ratio: float
    probe_busbw: float = 100e9
    probe_storage_write: float = 1e9
    probe_lemons: int = 0
    other_model_mfu: float | None = None
    #: Share of the wall time lost to slow steps (the rest of the badput is failures), and the rank
    #: that straggles meanwhile (its straggler score 1.5: the likely cause), None for no culprit.
    slowdown: float = 0.0
    straggler_rank: int | None = None
    ranks: int = 4
    hosts: tuple[str, ...] = ("h0", "h1")
    gpus_per_host: int = 2
    xid_codes: dict[str, str] = field(
        default_factory=lambda: {"reset_gpu": "79", "restart_app": "13", "reboot": "48"}
    )

    @property
    def gpus(self) -> int:
        return len(self.hosts) * self.gpus_per_host


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _series(name: str, labels: dict[str, str], points: list[tuple[float, float]]) -> list[tuple[float, str]]:
    text = _labels(**labels)
    return [(t, f"{name}{text} {v:.6g} {t:.0f}") for t, v in points]


def _cluster_lines(c: SimCluster, start: float, end: float, step: float) -> list[tuple[float, str]]:
    times = [start + i * step for i in range(int((end - start) // step) + 1)]
    lines: list[tuple[float, str]] = []
    run = f"run-{c.name}"
    for rank in range(c.ranks):
        base = {"cluster": c.name, "run": run, "rank": str(rank), "model": MODEL}
        lines += _series(T.MODEL_FLOPS.name, base, [(t, c.mfu * PEAK * (t - start)) for t in times])
        lines += _series(T.PEAK_FLOPS.name, base, [(t, PEAK) for t in times])
        lines += _series(T.STEPS.name, base, [(t, (t - start) // 2) for t in times])
    if c.other_model_mfu is not None:  # a run of another model: must not enter a model-matched MFU
        other = {"cluster": c.name, "run": f"{run}-other", "rank": "0", "model": "tiny-100m"}
        lines += _series(
            T.MODEL_FLOPS.name, other, [(t, c.other_model_mfu * PEAK * (t - start)) for t in times]
        )
        lines += _series(T.PEAK_FLOPS.name, other, [(t, PEAK) for t in times])
    base = {"cluster": c.name, "run": run, "rank": "0", "model": MODEL}  # a run's constant labels
    lines += _series(G.PRODUCTIVE_SECONDS.name, base, [(t, c.goodput * (t - start)) for t in times])
    failures = 1 - c.goodput - c.slowdown
    for cause, share in (
        ("downtime", 0.6 * failures),
        ("lost_progress", 0.4 * failures),
        ("slowdown", c.slowdown),
    ):
        lines += _series(
            G.BADPUT_SECONDS.name,
            {**base, "cause": cause},
            [(t, share * (t - start)) for t in times],
        )
    for rank in range(c.ranks):
        score = 1.5 if rank == c.straggler_rank else 1.0
        lines += _series(R.STRAGGLER_SCORE.name, {**base, "rank": str(rank)}, [(t, score) for t in times])
    every = c.restart_every_hours * 3600
    lines += _series(G.RESTARTS.name, base, [(t, (t - start) // every) for t in times])
    ckpt_bytes = 10e9  # one 10 GB save per hour per rank
    for rank in range(c.ranks):
        rb = {**base, "rank": str(rank)}
        saves = [(t, (t - start) // 3600) for t in times]
        lines += _series(T.CKPT_BYTES.name, rb, [(t, n * ckpt_bytes) for t, n in saves])
        lines += _series(
            T.CKPT_SAVE_DURATION.name + "_sum",
            rb,
            [(t, n * ckpt_bytes / c.checkpoint_bytes_per_second) for t, n in saves],
        )
    # The probe ran a day before the end; from then on the node agents serve its results at every scrape.
    probed = [t for t in times if t >= end - DAY]
    for h, host in enumerate(c.hosts):
        instance = f"{c.name}-{host}:9946"
        for g in range(c.gpus_per_host):
            gl = {"cluster": c.name, "instance": instance, "gpu": str(g), "model": "NVIDIA H100 80GB HBM3"}
            lines += _series(N.GPU_UP.name, gl, [(t, 1.0) for t in times])
            lines += _series(
                P.PROBE_MATMUL_PEAK.name, {**gl, "dtype": "bf16"}, [(t, c.probe_peak_ratio) for t in probed]
            )
            lemon = 1.0 if h * c.gpus_per_host + g < c.probe_lemons else 0.0
            lines += _series(
                P.PROBE_DEVICE_LEMON.name, {**gl, "check": "matmul"}, [(t, lemon) for t in probed]
            )
        sl = {"cluster": c.name, "instance": instance, "path": "/ckpt"}
        bl = {"cluster": c.name, "instance": instance, "backend": "nccl", "world_size": str(c.gpus)}
        lines += _series(P.PROBE_ALLREDUCE_BUS_BANDWIDTH.name, bl, [(t, c.probe_busbw) for t in probed])
        lines += _series(
            P.PROBE_STORAGE_WRITE_BANDWIDTH.name, sl, [(t, c.probe_storage_write) for t in probed]
        )
        lines += _series(S.STORAGE_PROBE_WRITE.name, sl, [(t, c.storage_seconds * 0.7) for t in times])
        lines += _series(S.STORAGE_PROBE_FSYNC.name, sl, [(t, c.storage_seconds * 0.3) for t in times])
    # Xid errors: spread evenly over the window on GPU 0 of host 0; each series is born at its first error.
    gl = {
        "cluster": c.name,
        "instance": f"{c.name}-{c.hosts[0]}:9946",
        "gpu": "0",
        "model": "NVIDIA H100 80GB HBM3",
    }
    for action, count in c.xids.items():
        if count <= 0:
            continue
        first = end - (end - start) * 0.9
        gap = (end - first) / count
        points = [(t, float(min(count, int((t - first) // gap) + 1))) for t in times if t >= first]
        lines += _series(N.GPU_XID_ERRORS.name, {**gl, "xid": c.xid_codes[action], "action": action}, points)
    return lines


def openmetrics_days(
    clusters: list[SimCluster], directory: Path, *, end: float, days: int, step: float
) -> list[Path]:
    """Write the clusters' series as one OpenMetrics file per day; every series sorted by time."""
    start = end - days * DAY - 2 * 3600  # a little history before the window
    lines = [item for c in clusters for item in _cluster_lines(c, start, end, step)]
    files: list[Path] = []
    day_start = start
    index = 0
    while day_start <= end:
        day_end = day_start + DAY
        chunk = [text for t, text in lines if day_start <= t < day_end]
        if chunk:
            path = directory / f"day-{index:03d}.om"
            # Lines keep series order within a metric name; every name is declared once per file.
            by_name: dict[str, list[str]] = {}
            for text in chunk:
                by_name.setdefault(text.split("{", 1)[0], []).append(text)
            body = []
            for name, texts in by_name.items():
                body.append(f"# TYPE {name} gauge")
                body.extend(texts)
            path.write_text("\n".join(body) + "\n# EOF\n")
            files.append(path)
        day_start = day_end
        index += 1
    return files


def expected_rank_hours(c: SimCluster, days: int) -> float:
    return c.ranks * days * 24.0


def expected_interruptions(c: SimCluster, days: int) -> float:
    return 1000.0 * math.floor(days * 24 / c.restart_every_hours) / expected_rank_hours(c, days)


@contextlib.contextmanager
def _serve(data: Path, workdir: Path, name: str, lookback: str) -> Iterator[str]:
    """Prometheus on ``data`` (30 days kept), on a loopback port, until the block ends; yields the URL."""
    port = free_port()
    config = workdir / "prometheus.yml"
    config.write_text(json.dumps({"global": {"scrape_interval": "1m"}, "scrape_configs": []}))
    log = (workdir / f"prometheus-{name}.log").open("wb")
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={data}",
            "--storage.tsdb.retention.time=400d",
            # No level compaction (2 h blocks into longer ones) while promtool or a test queries.
            "--storage.tsdb.min-block-duration=2h",
            "--storage.tsdb.max-block-duration=2h",
            f"--query.lookback-delta={lookback}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError((workdir / f"prometheus-{name}.log").read_text()[-2000:])
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as response:  # noqa: S310 - loopback
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("prometheus did not become ready in 60 s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        log.close()


def rule_stages(groups: Sequence[dict[str, Any]], queries: Sequence[str]) -> list[list[dict[str, Any]]]:
    """The recording rules that ``queries`` read, directly or through other rules, in backfill stages.

    A rule goes in the stage after the last rule it reads (stage 0: it reads only raw series), so
    each ``promtool tsdb create-blocks-from rules`` run finds its inputs already in the TSDB. Rules
    nothing reads are left out: a backfill costs one range query per rule per 2 h block. Stage 0 reads
    only the raw blocks, which never overlap, so no compaction merges blocks under its queries."""
    rules = {r["record"]: r for g in groups for r in g["rules"] if "record" in r}

    def reads(text: str) -> set[str]:
        return {name for name in rules if re.search(rf"(?<![\w:]){re.escape(name)}(?![\w:])", text)}

    needed: set[str] = set()
    todo = [name for q in queries for name in reads(q)]
    while todo:
        name = todo.pop()
        if name not in needed:
            needed.add(name)
            todo += reads(rules[name]["expr"])
    stage: dict[str, int] = {}

    def depth(name: str) -> int:
        if name not in stage:
            stage[name] = 1 + max((depth(d) for d in reads(rules[name]["expr"]) - {name}), default=-1)
        return stage[name]

    out: list[list[dict[str, Any]]] = [[] for _ in range(1 + max((depth(n) for n in needed), default=0))]
    for name in sorted(needed):
        out[depth(name)].append(rules[name])
    return out


@contextlib.contextmanager
def backfilled_prometheus(
    workdir: Path,
    files: list[Path],
    rule_stages: Sequence[Path] = (),
    *,
    start: float = 0.0,
    end: float = 0.0,
    eval_interval: str = "30m",
    lookback: str = "5m",
) -> Iterator[str]:
    """Backfill ``files`` into a TSDB, then the recording rules of each of ``rule_stages`` over
    [start, end] (``promtool tsdb create-blocks-from rules``, in order: a stage may read the results
    of the ones before it), and serve the result with Prometheus on a loopback port; yields the URL.

    This is what a Prometheus that evaluated the rules over those 30 days would hold, less one thing:
    backfilled rules carry no staleness markers, so a rule series that stops (a ``> 0`` filter, an
    Xid window that closes) stays visible for ``lookback`` after its last sample, where a live
    Prometheus would have marked it stale. With samples sparser than a scrape interval, give a
    ``lookback`` equal to ``eval_interval`` and to the raw samples' spacing, not above: instant
    selectors then see each sample until the next, as they would with 15 s scrapes, and a stopped
    rule series no longer than that."""
    require_binary(PROMTOOL, "promtool")
    require_binary(PROMETHEUS, "prometheus")
    data = workdir / "tsdb"
    data.mkdir()
    for path in files:
        subprocess.run(
            [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", "-q", str(path), str(data)],
            check=True,
            capture_output=True,
            timeout=120,
        )
    for index, rules in enumerate(rule_stages):
        out = workdir / f"rule-blocks-{index}"
        with _serve(data, workdir, f"rules-{index}", lookback) as url:
            subprocess.run(
                [
                    PROMTOOL,
                    *("tsdb", "create-blocks-from", "rules"),
                    f"--start={int(start)}",
                    f"--end={int(end)}",
                    f"--url={url}",
                    f"--output-dir={out}",
                    f"--eval-interval={eval_interval}",
                    # Relative: Prometheus offsets a group's evaluations within the interval by a hash
                    # of its name and file path, and a temp dir's path would make that offset random.
                    os.path.relpath(rules, workdir),
                ],
                cwd=workdir,
                check=True,
                capture_output=True,
                timeout=600,
            )
        for block in out.iterdir():
            if block.is_dir():
                block.rename(data / block.name)
    with _serve(data, workdir, "serve", lookback) as url:
        yield url
