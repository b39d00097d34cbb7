"""The demo trainer's input pipeline: the same batch for a step after a restart, and a scripted stall
that makes each batch wait (what the tracker's ``data()`` counts as data wait)."""

from __future__ import annotations

import itertools

import pytest

from babysitter.demo import trainer
from babysitter.demo.trainer import Loader


def test_batches_are_seeded_by_step_and_a_stall_waits_until_it_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    clock = [1000.0]
    waits: list[float] = []

    def fake_sleep(seconds: float) -> None:
        waits.append(seconds)
        clock[0] += seconds

    monkeypatch.setattr(trainer.time, "time", lambda: clock[0])
    monkeypatch.setattr(trainer.time, "sleep", fake_sleep)
    loader = Loader(256, 2, 8, step=5)
    batches = iter(loader)
    first = next(batches)
    assert first.shape == (2, 9)
    assert waits == [], "no stall scripted: no wait"
    again = next(iter(Loader(256, 2, 8, step=5)))
    assert torch.equal(first, again), "a restarted process gets step 5's batch again"
    loader.step = 6
    assert not torch.equal(next(batches), first)
    loader.stall(until=1000.25, wait=0.1)
    list(itertools.islice(batches, 5))
    assert waits == pytest.approx([0.1, 0.1, 0.1]), "each batch waits while the stall lasts, then none"


def test_eval_runs_forward_passes_inside_the_eval_phase() -> None:
    """The scripted eval is marked ``phase("eval")`` (the ledger books it as eval badput) and runs the
    model without gradients until its seconds are over."""
    import contextlib
    import threading
    from collections.abc import Iterator

    pytest.importorskip("torch")
    calls: list[tuple[str, bool]] = []

    class Tracker:
        @contextlib.contextmanager
        def phase(self, name: str) -> Iterator[None]:
            calls.append((f"begin {name}", False))
            yield
            calls.append((f"end {name}", False))

    model = trainer.build_model(trainer.TinyConfig())
    forward = model.forward

    def counted(idx: object) -> object:
        import torch

        calls.append(("forward", torch.is_grad_enabled()))
        return forward(idx)

    model.forward = counted
    trainer._evaluate(Tracker(), model, Loader(256, 2, 8), seconds=0.05, pace=0.01, stop=threading.Event())
    assert calls[0] == ("begin eval", False) and calls[-1] == ("end eval", False)
    passes = calls[1:-1]
    assert passes and all(c == ("forward", False) for c in passes), calls


def test_a_bad_loss_stretch_spikes_or_is_nan_and_skips_the_update() -> None:
    """``loss_spike`` and ``nan_loss``: the loss the tracker reads is far above the normal one (over the
    1.5x explain calls a spike) or NaN, and the model is not updated (as a spike guard would)."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = trainer.build_model(trainer.TinyConfig())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    data = next(iter(Loader(256, 4, 16)))

    def params() -> list[object]:
        return [p.detach().clone() for p in model.parameters()]

    before = params()
    spike = trainer.train_step(model, opt, data, scale=trainer.SPIKE_SCALE)
    nan = trainer.train_step(model, opt, data, scale=float("nan"))
    assert all(torch.equal(a, b) for a, b in zip(before, params(), strict=True)), "no update in a bad stretch"
    normal = trainer.train_step(model, opt, data)
    assert not all(torch.equal(a, b) for a, b in zip(before, params(), strict=True)), "a normal step updates"
    assert spike.item() > 1.5 * normal.item()
    assert torch.isnan(nan).item()
