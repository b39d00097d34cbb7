"""The parts of the replica check and of the first non-finite step that need no process group: who
compares with whom under each parallel layout, who is the odd one out, the fingerprint itself, and
every step's loss read off the hot path (the 4-rank torchrun run is tests/test_integrity_torchrun.py)."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest

import babysitter
from babysitter.catalog import integrity as I
from babysitter.flops.parallel import ParallelLayout
from babysitter.training.nonfinite import RING
from babysitter.training.replicas import (
    ReplicaChecker,
    _explicit,
    default_replicas,
    dtensor_replicas,
    odd_ones,
    validate_every,
)
from node_helpers import Scrape

torch = pytest.importorskip("torch")


@pytest.mark.parametrize(
    ("layout", "rank", "replicas"),
    [
        (ParallelLayout(dp=4), 2, [0, 1, 2, 3]),
        # tp=2 fastest: rank 5 = (dp 2, tp 1); its replicas are the tp-1 ranks of every dp index.
        (ParallelLayout(tp=2, dp=4), 5, [1, 3, 5, 7]),
        # tp=2, cp=2, dp=2, pp=2 (16 ranks): rank 13 = pp 1, dp 1, cp 0, tp 1.
        (ParallelLayout(tp=2, cp=2, pp=2, dp=2), 13, [9, 13]),
        (ParallelLayout(tp=8, dp=1), 3, [3]),  # tensor parallel only: no replica
    ],
)
def test_only_ranks_holding_the_same_shard_compare(
    layout: ParallelLayout, rank: int, replicas: list[int]
) -> None:
    assert default_replicas(rank, layout) == replicas
    # every rank of a group computes the same group
    assert all(default_replicas(r, layout) == replicas for r in replicas)


def test_the_odd_one_is_the_minority_and_a_tie_names_everyone() -> None:
    assert odd_ones({0: (1, 1), 1: (1, 1), 2: (9, 9), 3: (1, 1)}) == [2]
    assert odd_ones({0: (1, 1), 1: (1, 1)}) == []
    assert odd_ones({0: (1, 1), 1: (2, 2)}) == [0, 1]  # two replicas: nobody can tell which
    assert odd_ones({0: (1, 1), 1: (1, 1), 2: (2, 2), 3: (2, 2)}) == [0, 1, 2, 3]


class _Placement:
    def __init__(self, replicate: bool) -> None:
        self._replicate = replicate

    def is_replicate(self) -> bool:
        return self._replicate


def test_dtensor_placements_say_who_the_replicas_are(monkeypatch: pytest.MonkeyPatch) -> None:
    """HSDP on a (dp_replicate=2, dp_shard=2) mesh: parameters replicated along dim 0, sharded along
    dim 1; rank 3 = (1, 1) compares with rank 1 = (0, 1). Fully sharded: no replica at all."""
    import sys

    class FakeDTensor:
        def __init__(self, mesh: object, placements: tuple[_Placement, ...]) -> None:
            self.device_mesh, self.placements = mesh, placements

    mesh = SimpleNamespace(mesh=torch.arange(4).reshape(2, 2), get_coordinate=lambda: [1, 1])
    monkeypatch.setitem(sys.modules, "torch.distributed.tensor", SimpleNamespace(DTensor=FakeDTensor))
    hsdp = SimpleNamespace(parameters=lambda: [FakeDTensor(mesh, (_Placement(True), _Placement(False)))] * 3)
    assert dtensor_replicas(hsdp, 3) == [1, 3]
    fsdp = SimpleNamespace(parameters=lambda: [FakeDTensor(mesh, (_Placement(False), _Placement(False)))])
    assert dtensor_replicas(fsdp, 3) == [3]
    assert dtensor_replicas(torch.nn.Linear(2, 2), 0) is None  # no DTensors: the layout decides


def test_bad_options_fail_at_setup() -> None:
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="replica_check_every"):
            validate_every(bad)
    with pytest.raises(ValueError, match="replica_check_every"):
        babysitter.watch(run="r", port=-1, hang_timeout=None, replica_check_every=0)
    with pytest.raises(TypeError, match="needs the model"):
        babysitter.watch(run="r", port=-1, hang_timeout=None, replica_check_every=5)
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="include this rank"):  # rank 0 here
        babysitter.watch(
            model,
            run="r",
            port=-1,
            hang_timeout=None,
            flops_per_token=1.0,
            replica_check_every=5,
            replica_ranks=[1],
        )
    with pytest.raises(ValueError, match="include this rank"):
        _explicit([1, 2], 0)
    assert _explicit(SimpleNamespace(mesh=torch.tensor([4, 0, 2]), ndim=1), 2) == [0, 2, 4]


def test_without_a_process_group_the_check_is_off_and_training_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = torch.nn.Linear(4, 4)
    with caplog.at_level(logging.INFO, logger="babysitter"):
        t = babysitter.watch(
            model, run="r", port=-1, hang_timeout=None, flops_per_token=1.0, replica_check_every=2
        )
    try:
        for _ in range(6):
            t.step(loss=1.0)
        assert t.steps == 6
        assert "replica check off: torch.distributed is not initialized" in caplog.text
    finally:
        t.close()


def test_one_flipped_bit_changes_the_fingerprint_and_nothing_else_does() -> None:
    """The fingerprint a check computes: equal for equal bits (any dtype), different after one flip."""
    checker = ReplicaChecker.__new__(ReplicaChecker)
    checker._torch, checker._fp = torch, None
    checker.tracker = SimpleNamespace(global_step=7)  # type: ignore[assignment]

    def fingerprint(params: list[object]) -> tuple[int, int, int]:
        checker._params = params
        checker._fingerprint()
        found = checker._ready()
        assert found is not None
        return found

    a = [torch.randn(33, 5), torch.randn(7).to(torch.bfloat16), torch.arange(5, dtype=torch.int64)]
    b = [p.clone() for p in a]
    assert fingerprint(a) == fingerprint(b)
    for i, p in enumerate(b):
        flipped = [q.clone() for q in b]
        words = flipped[i].view(-1).view({4: torch.int32, 2: torch.int16, 8: torch.int64}[p.element_size()])
        words[len(words) // 2] ^= 1  # the lowest bit: the smallest change there is
        assert fingerprint(flipped) != fingerprint(b), p.dtype
    assert fingerprint(a)[0] == 7  # the step it was taken at


def _first(t: babysitter.Tracker) -> dict[str, float]:
    t.housekeep()
    s = Scrape(t.event_metrics(["run", "rank"], ["nf", "0"]))
    return {x.labels["signal"]: x.value for x in s.samples if x.name == I.NONFINITE_FIRST_STEP.name}


def test_every_steps_loss_and_grad_norm_is_looked_at_not_a_sample(caplog: pytest.LogCaptureFixture) -> None:
    """A NaN in one step between two housekeeping passes is found at its step, whatever came after."""
    t = babysitter.watch(run="nf", port=-1, hang_timeout=None, flush_interval=60.0)
    try:
        for step in range(1, 41):
            loss = torch.tensor(float("nan") if step == 17 else 1.0)
            norm = math.inf if step == 23 else 2.0
            t.step(loss=loss, grad_norm=norm, step=step)
        with caplog.at_level(logging.ERROR, logger="babysitter"):
            assert _first(t) == {"loss": 17.0, "grad_norm": 23.0}
        assert "rank 0 of run 'nf'" in caplog.text and "not finite at step 17" in caplog.text
        for step in range(41, 51):
            t.step(loss=float("nan"), step=step)
        assert _first(t)["loss"] == 17.0  # the first stays the first
        with t.checkpoint_load(step=10):
            pass
        assert _first(t) == {}  # a rollback starts over
        t.step(loss=float("-inf"), step=11)
        assert _first(t) == {"loss": 11.0}
    finally:
        t.close()


def test_more_steps_than_the_ring_between_passes_drop_the_oldest_counted() -> None:
    t = babysitter.watch(run="nf", port=-1, hang_timeout=None, flush_interval=60.0)
    try:
        for step in range(1, RING + 101):
            t.step(loss=float("nan") if step in (50, RING + 50) else 1.0, step=step)
        assert _first(t) == {"loss": RING + 50.0}  # step 50 fell out of the ring
        assert t._nonfinite.dropped == 100
    finally:
        t.close()
