"""On a machine with an NVIDIA GPU: ProcessGroupNCCL's flight recorder, read the way babysitter reads it.

A one-rank NCCL process group (world size 1 is enough for the API and the fields) runs all_reduces on
the GPU with ``TORCH_NCCL_ENABLE_TIMING=1``, then:

* ``_dump_nccl_trace_json(includeCollectives, onlyActive)`` exists (PyTorch's
  ``torch/csrc/distributed/c10d/init.cpp`` defines it under ``USE_C10D_NCCL``) and parses: entries
  with ``profiling_name`` ``nccl:all_reduce``, the group's name, sequence numbers, sizes, a finite
  ``duration_ms`` (the GPU time the arrival lag reads on NCCL), and ``pg_status`` counters;
* the NCCL collectives are in the NCCL recorder, not in the generic one (recorded for the report);
* ``flight.Recorder`` reads both and the collectives monitor keeps a straggler round's capture in
  duration mode (arrival value = minus the GPU duration).

Written from PyTorch's source; not yet run on hardware (no GPU was lent when it was written).
Skipped elsewhere, saying why.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

import babysitter
from babysitter.training import flight
from babysitter.training.collectives import CollectiveMonitor
from babysitter.training.flight import Recorder, parse
from gpu_helpers import record, requires_gpu

pytestmark = requires_gpu

COLLECTIVES = 8


@pytest.fixture(scope="module")
def nccl() -> Iterator[Any]:
    os.environ.setdefault("TORCH_NCCL_ENABLE_TIMING", "1")
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29613")
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    try:
        t = torch.ones(1 << 20, device="cuda")
        for _ in range(COLLECTIVES):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        time.sleep(1.0)  # the NCCL watchdog retires completed work (and computes durations) on its own
        yield dist
    finally:
        dist.destroy_process_group()


def test_the_nccl_recorder_holds_the_collectives_with_their_gpu_durations(nccl: Any) -> None:
    import torch

    c10d = torch._C._distributed_c10d
    assert callable(getattr(c10d, "_dump_nccl_trace_json", None)), "this CUDA build has no NCCL recorder dump"
    raw = c10d._dump_nccl_trace_json(True, False)
    data = json.loads(raw)
    entries = [e for e in data.get("entries", []) if e.get("profiling_name") == "nccl:all_reduce"]
    generic = json.loads(c10d._dump_fr_trace_json(True, False)).get("entries", [])
    record(
        "flight_recorder_nccl",
        version=data.get("version"),
        entries=len(entries),
        generic_entries=len(generic),
        states=sorted({e.get("state") for e in entries}),
        durations_ms=[e.get("duration_ms") for e in entries][:COLLECTIVES],
        pg_status=data.get("pg_status"),
    )
    assert len(entries) >= COLLECTIVES
    last = entries[-1]
    assert last["process_group"][0] == "0" and last["input_sizes"] == [[1 << 20]]
    assert last["collective_seq_id"] >= COLLECTIVES
    durations = [e.get("duration_ms") for e in entries[-COLLECTIVES:]]
    assert all(isinstance(d, float) and d >= 0 for d in durations), durations
    status = next(iter(data["pg_status"].values()))
    assert int(status["last_enqueued_collective"]) >= COLLECTIVES
    assert int(status["last_completed_collective"]) == int(status["last_enqueued_collective"])
    capture = parse(raw)
    assert {e.backend for e in capture.entries if e.pg == "0"} == {"nccl"}
    assert all(e.duration is not None for e in capture.entries[-COLLECTIVES:])


def test_babysitter_reads_both_recorders_and_keeps_a_round_in_duration_mode(nccl: Any) -> None:
    recorder = Recorder()
    assert set(recorder.api) == {"nccl", "generic"}
    tracker = babysitter.watch(run="gpu-fr", port=-1, hang_timeout=None, flight_recorder=False)
    try:
        monitor = CollectiveMonitor(tracker, recorder=recorder)
        monitor.request_capture(1, flight.wall_ns())
        monitor.poll()
        capture = monitor.round_capture(1)
        assert monitor.info() == "on"
        assert capture is not None and capture.mode == "duration" and capture.x is not None
        assert capture.arrivals and all(v <= 0 for v in capture.arrivals.values())
        record(
            "flight_recorder_round", x=capture.x, arrivals=len(capture.arrivals), dump_seconds=capture.seconds
        )
    finally:
        tracker.close()
