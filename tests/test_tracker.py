"""The tracker's contract: sync-free hot path, never raising into training, checked input, exact math."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import babysitter
from babysitter import registration
from babysitter.catalog import selfmon as S
from babysitter.catalog import train as T
from babysitter.training.events import NullEvents
from babysitter.training.loss import LossReader
from babysitter.training.timing import CudaStepTimer


def _sample(tracker: babysitter.Tracker, name: str, **labels: str) -> float | None:
    return tracker.registry.get_sample_value(name, {"run": tracker.config.run, "rank": "0", **labels})


@pytest.fixture
def make_tracker() -> Iterator[Any]:
    made: list[babysitter.Tracker] = []

    def make(**kwargs: Any) -> babysitter.Tracker:
        kwargs.setdefault("run", "t")
        kwargs.setdefault("port", -1)
        kwargs.setdefault("peak_flops", 1e12)
        kwargs.setdefault("flush_interval", 3600.0)  # tests fold explicitly
        tracker = babysitter.watch(**kwargs)
        made.append(tracker)
        return tracker

    yield make
    for tracker in made:
        tracker.close()


class FakeClock:
    """Stands in for perf_counter_ns so windows and durations have exact expected values."""

    def __init__(self) -> None:
        self.ns = 1_000_000_000

    def __call__(self) -> int:
        return self.ns

    def advance(self, seconds: float) -> None:
        self.ns += round(seconds * 1e9)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr("babysitter.training.tracker._perf_ns", fake)
    return fake


class TestMath:
    def test_mfu_hfu_and_throughput_match_hand_computation(self, make_tracker: Any, clock: FakeClock) -> None:
        """100 steps of 0.5 s with 4096 tokens: 8192 tok/s; MFU = 8192 * fpt / peak exactly."""
        tracker = make_tracker(
            tokens_per_step=4096, flops_per_token=6e9, hardware_flops_per_token=8e9, peak_flops=1e15
        )
        for _ in range(101):
            clock.advance(0.5)
            tracker.step()
        snap = tracker.snapshot()
        assert snap.tokens_per_second == pytest.approx(8192.0)
        assert snap.mfu == pytest.approx(8192 * 6e9 / 1e15)
        assert snap.hfu == pytest.approx(8192 * 8e9 / 1e15)
        assert snap.model_flops == pytest.approx(101 * 4096 * 6e9)
        assert snap.hardware_flops == pytest.approx(101 * 4096 * 8e9)

    def test_window_covers_only_recent_steps(self, make_tracker: Any, clock: FakeClock) -> None:
        """After a slow stretch, a 10 s window reports the recent speed, not the average since start."""
        tracker = make_tracker(tokens_per_step=1000, flops_per_token=1.0, mfu_window=10.0)
        for _ in range(20):
            clock.advance(2.0)
            tracker.step()
        for _ in range(50):
            clock.advance(0.5)
            tracker.step()
        assert tracker.snapshot().tokens_per_second == pytest.approx(2000.0)

    def test_long_windows_hold_every_step_in_them(self, make_tracker: Any, clock: FakeClock) -> None:
        """A 120 s window over 9000 steps covers all of them (no silent cap on steps per window)."""
        tracker = make_tracker(tokens_per_step=1000, flops_per_token=1.0, mfu_window=120.0)
        for seconds, count in ((0.02, 3000), (0.01, 6000)):
            for _ in range(count):
                clock.advance(seconds)
                tracker.step()
        # From the first boundary (t = 0.02 s) to the last (t = 120 s): 8999 steps of 1000 tokens.
        assert tracker.snapshot().tokens_per_second == pytest.approx(8999 * 1000 / 119.98)

    def test_stall_pulls_mfu_down(self, make_tracker: Any, clock: FakeClock) -> None:
        """No step for much longer than usual: the window extends to now, so MFU falls."""
        tracker = make_tracker(tokens_per_step=1000, flops_per_token=1e6, peak_flops=1e10, mfu_window=10.0)
        for _ in range(21):
            clock.advance(0.5)
            tracker.step()
        healthy = tracker.snapshot().mfu
        clock.advance(10.0)
        stalled = tracker.snapshot().mfu
        assert healthy == pytest.approx(1000 / 0.5 * 1e6 / 1e10)
        assert stalled is not None and healthy is not None
        assert stalled == pytest.approx(healthy * 10.0 / 20.0)

    def test_checkpoint_and_phase_time_stay_out_of_step_time_and_mfu(
        self, make_tracker: Any, clock: FakeClock
    ) -> None:
        """A 30 s save and a 10 s eval between steps do not show up as a 40 s step."""
        tracker = make_tracker(tokens_per_step=100, flops_per_token=1.0)
        for _ in range(5):
            clock.advance(1.0)
            tracker.step()
        with tracker.checkpoint_save(step=5):
            clock.advance(30.0)
        with tracker.phase("eval"):
            clock.advance(10.0)
        clock.advance(1.0)
        tracker.step()
        snap = tracker.snapshot()
        assert snap.step_duration.count == 5
        assert snap.step_duration.sum == pytest.approx(5.0)
        assert snap.tokens_per_second == pytest.approx(100.0)
        assert snap.phase_seconds == {"eval": pytest.approx(10.0)}
        assert snap.checkpoint_save is not None and snap.checkpoint_save.sum == pytest.approx(30.0)

    def test_step_time_quantiles_on_rank_zero_sum_and_count_everywhere(
        self, make_tracker: Any, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Rank 0 exports the p50/p90 of its recent steps; every rank the sum and count, no buckets."""
        tracker = make_tracker()
        tracker.step()
        for seconds in (0.25, 0.3, 1.0, 200.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5):
            clock.advance(seconds)
            tracker.step()
        name = T.STEP_DURATION.name
        assert _sample(tracker, name, quantile="0.5") == 0.5
        assert _sample(tracker, name, quantile="0.9") == 1.0
        assert _sample(tracker, name + "_count") == 10
        assert _sample(tracker, name + "_sum") == pytest.approx(204.55)
        assert (
            tracker.registry.get_sample_value(name + "_bucket", {"run": "t", "rank": "0", "le": "+Inf"})
            is None
        )

        monkeypatch.setenv("RANK", "1")
        monkeypatch.setenv("WORLD_SIZE", "2")
        other = make_tracker()
        other.step()
        clock.advance(0.5)
        other.step()
        labels = {"run": "t", "rank": "1"}
        assert other.registry.get_sample_value(name + "_count", labels) == 1
        assert other.registry.get_sample_value(name, {**labels, "quantile": "0.5"}) is None

    def test_step_time_quantiles_come_from_device_times_on_cuda(self, make_tracker: Any) -> None:
        """With the CUDA event timer, the quantiles are of the device step times it drains (250 ms),
        the ones the sum and count hold, not of host times."""

        class FakeEvent:
            def record(self) -> None:
                pass

            def query(self) -> bool:
                return True

            def elapsed_time(self, end: Any) -> float:
                return 250.0  # milliseconds, as torch.cuda.Event reports

        tracker = make_tracker()
        tracker._timer = CudaStepTimer(FakeEvent, size=64)
        for _ in range(6):
            tracker.step()
        tracker.fold()
        name = T.STEP_DURATION.name
        count = _sample(tracker, name + "_count")
        assert count is not None and count >= 4
        assert _sample(tracker, name, quantile="0.5") == 0.25
        assert _sample(tracker, name, quantile="0.9") == 0.25
        assert _sample(tracker, name + "_sum") == pytest.approx(0.25 * count)

    def test_only_rank_zero_exports_the_runs_view(
        self, make_tracker: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Series the catalog marks rank-0-only are absent on rank 1; the per-rank ones are there."""
        monkeypatch.setenv("RANK", "1")
        monkeypatch.setenv("WORLD_SIZE", "2")
        tracker = make_tracker(tokens_per_step=10, flops_per_token=1.0)
        for _ in range(3):
            tracker.step(loss=1.0)
        tracker.fold()
        exposed = {s.name for f in tracker.registry.collect() for s in f.samples}
        rank0_only = {spec.name for spec in T.METRICS if spec.ranks == "rank0"}
        assert not exposed & rank0_only, exposed & rank0_only
        assert {T.STEPS.name, T.TOKENS.name, T.MODEL_FLOPS.name, T.PEAK_FLOPS.name} <= exposed
        # No recomputation declared: hardware FLOPs would repeat model FLOPs.
        assert T.HARDWARE_FLOPS.name not in exposed

    def test_checkpoint_load_sets_the_step_and_failed_save_counts(self, make_tracker: Any) -> None:
        """Resuming from step 700 continues at 701; a save that raises is a failure and propagates."""
        tracker = make_tracker()
        with tracker.checkpoint_load(step=700):
            pass
        tracker.step()
        assert tracker.global_step == 701
        with pytest.raises(OSError, match="disk"), tracker.checkpoint_save(step=701):
            raise OSError("disk on fire")
        with tracker.checkpoint_save(step=701) as ckpt:
            ckpt.nbytes = 4096
        assert _sample(tracker, T.CKPT_FAILURES.name) == 1
        assert _sample(tracker, T.CKPT_BYTES.name) == 4096
        assert _sample(tracker, T.CKPT_SAVE_DURATION.name + "_count") == 2
        assert _sample(tracker, T.CKPT_LAST_SUCCESS.name) == pytest.approx(time.time(), abs=5)


class TestNoSync:
    FORBIDDEN = ("synchronize", "item", "cpu", "tolist", "__float__", "__int__", "__bool__", "numpy")

    def test_hot_path_makes_no_device_sync_or_host_read(
        self, make_tracker: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """step() and data() on the training thread never call synchronize/item/cpu/tolist on anything."""
        calls: list[str] = []
        training = threading.get_ident()

        def spy(name: str, original: Any) -> Any:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                if threading.get_ident() == training and _in_tracker():
                    calls.append(name)
                return original(*args, **kwargs)

            return wrapper

        for name in self.FORBIDDEN:
            if name == "synchronize":
                monkeypatch.setattr(
                    torch.cuda, "synchronize", spy("cuda.synchronize", torch.cuda.synchronize)
                )
            else:
                monkeypatch.setattr(torch.Tensor, name, spy(f"Tensor.{name}", getattr(torch.Tensor, name)))

        class FakeEvent:
            def record(self) -> None:
                pass

            def query(self) -> bool:
                return True

            def elapsed_time(self, end: Any) -> float:
                return 10.0

        tracker = make_tracker(tokens_per_step=64, flops_per_token=1e6)
        tracker._timer = CudaStepTimer(FakeEvent, size=64)  # exercise the CUDA path too
        loader = [torch.ones(2, 32) for _ in range(20)]
        for batch in tracker.data(loader):
            loss = (batch * 2).sum()
            tracker.step(tokens=batch.numel(), samples=batch.shape[0], loss=loss)
        assert calls == []
        tracker.housekeep()  # off the hot path, the loss may now be read
        assert tracker.snapshot().loss == pytest.approx(128.0)

    def test_tensor_token_counts_are_refused_not_read(self, make_tracker: Any) -> None:
        """A tensor passed as tokens would need a device read: it is skipped and counted."""
        tracker = make_tracker()
        tracker.step(tokens=torch.tensor(5))  # type: ignore[arg-type]
        assert tracker.snapshot().tokens == 0
        assert _sample(tracker, S.INPUT_REJECTED.name, reason="tokens_is_tensor") == 1


def _in_tracker() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if "babysitter" in frame.f_code.co_filename:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


class Explodes(NullEvents):
    def __getattribute__(self, name: str) -> Any:
        if name.startswith("__"):
            return object.__getattribute__(self, name)

        def boom(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"ledger exploded in {name}")

        return boom


class TestNeverRaises:
    def test_failures_inside_the_tracker_never_reach_the_loop(self, make_tracker: Any, caplog: Any) -> None:
        """A broken ledger, a broken ring and a broken timer are counted and logged once; training goes on."""
        tracker = make_tracker(tokens_per_step=10, flops_per_token=1.0)
        tracker._events = Explodes()

        class BrokenTimer:
            def mark(self, index: int) -> None:
                raise ValueError("timer broke")

            def drain(self) -> list[float]:
                raise ValueError("drain broke")

        with caplog.at_level(logging.WARNING, logger="babysitter"):
            tracker._timer = BrokenTimer()
            for _ in range(50):
                tracker.step(loss=1.0)
            tracker._timer = None
            with tracker.checkpoint_save(step=1):
                pass
            with tracker.phase("eval"):
                pass
            tracker.housekeep()
            tracker._r_t = None  # the ring itself is gone
            for _ in range(50):
                tracker.step()
            body = _scrape_text(tracker)
        errors = tracker.errors.counts()
        assert errors["step"] == 100
        assert errors["ledger"] >= 2
        assert "checkpoint" in errors
        assert S.INTERNAL_ERRORS.name in body
        logged = [
            r for r in caplog.records if "step" in r.getMessage() and "internal error" in r.getMessage()
        ]
        assert len(logged) == 1  # one line, however many failures

    def test_bad_loss_objects_are_counted(self, make_tracker: Any) -> None:
        """A non-scalar or non-numeric loss is skipped at read time and counted."""
        tracker = make_tracker()
        tracker.step(loss=torch.ones(3))
        tracker.housekeep()
        tracker.step(loss="high")
        tracker.housekeep()
        assert tracker.errors.counts()["loss"] == 2
        tracker.step(loss=float("nan"))
        tracker.housekeep()
        assert tracker.snapshot().nonfinite_loss == 1


def _scrape_text(tracker: babysitter.Tracker) -> str:
    from prometheus_client import generate_latest

    return generate_latest(tracker.registry).decode()


class TestBadInput:
    @pytest.mark.parametrize(
        ("kwargs", "error", "match"),
        [
            ({"tokens_per_step": -1}, ValueError, "tokens_per_step"),
            ({"tokens_per_step": 1.5}, TypeError, "tokens_per_step"),
            ({"flops_per_token": float("nan")}, ValueError, "flops_per_token"),
            ({"flops_per_token": -5.0}, ValueError, "flops_per_token"),
            ({"flops_per_token": 10.0, "hardware_flops_per_token": 5.0}, ValueError, "recomputation"),
            ({"peak_flops": 0}, ValueError, "peak_flops"),
            ({"port": 70000}, ValueError, "port"),
            ({"port": "9450"}, TypeError, "port"),
            ({"labels": {"rank": "x"}}, ValueError, "reserved"),
            ({"labels": {"bad-name": "x"}}, ValueError, "invalid label name"),
            ({"labels": {"cluster": ""}}, ValueError, "empty"),
            ({"labels": {f"l{i}": "x" for i in range(20)}}, ValueError, "at most"),
            ({"mfu_window": 0}, ValueError, "mfu_window"),
            ({"timing": "gpu"}, ValueError, "timing"),
            ({"seq_len": 0}, ValueError, "seq_len"),
        ],
    )
    def test_setup_errors_are_clear(self, kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
        """Every wrong argument fails at watch() with a message naming it."""
        kwargs = {"port": -1, "peak_flops": 1e12, **kwargs}
        with pytest.raises(error, match=match):
            babysitter.watch(**kwargs)

    def test_bad_rank_environment_is_a_setup_error(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """RANK=abc is caught at setup, naming the variable."""
        monkeypatch.setenv("RANK", "abc")
        with pytest.raises(ValueError, match="RANK"):
            babysitter.watch(port=-1, peak_flops=1e12)

    def test_run_time_skips_are_counted_and_logged_once(self, make_tracker: Any, caplog: Any) -> None:
        """Negative, NaN and non-integral tokens, steps going backwards: skipped, counted, one log line each."""
        tracker = make_tracker(tokens_per_step=10)
        with caplog.at_level(logging.WARNING, logger="babysitter"):
            tracker.step(step=100)
            for _ in range(3):
                tracker.step(tokens=-5)
                tracker.step(tokens=float("nan"))
                tracker.step(tokens=2.5)
                tracker.step(samples=-1)
                tracker.step(step=50)
            tracker.step(tokens=7.0)  # an integral float is fine
        snap = tracker.snapshot()
        # Steps without tokens= count tokens_per_step (10): step=100, 3x samples=-1, 3x step=50; then 7.
        assert snap.tokens == 10 + 3 * 10 + 3 * 10 + 7
        assert snap.step == 100 + 16
        assert snap.input_rejected == {
            "tokens_negative": 3,
            "tokens_not_finite": 3,
            "tokens_not_integral": 3,
            "samples_negative": 3,
            "step_not_increasing": 3,
        }
        assert len([r for r in caplog.records if "invalid input" in r.getMessage()]) == 5


class TestEndpoint:
    def test_port_in_use_falls_back_and_reports(self, make_tracker: Any) -> None:
        """A taken port is not fatal: another port is served, and the metrics say which."""
        with socket.socket() as holder:
            holder.bind(("127.0.0.1", 0))
            holder.listen()
            busy = holder.getsockname()[1]
            tracker = make_tracker(port=busy)
            assert tracker.metrics_url is not None
            served = int(tracker.metrics_url.rsplit(":", 1)[1].split("/")[0])
            assert served != busy
            body = urllib.request.urlopen(tracker.metrics_url, timeout=5).read().decode()  # noqa: S310
        assert f'{S.EXPORTER_PORT.name}{{rank="0",requested="{busy}",run="t"}} {served}.0' in body
        assert tracker.errors.counts()["port_in_use"] == 1

    def test_endpoint_registers_and_unregisters(self, make_tracker: Any, tmp_path: Path) -> None:
        """The node agent finds the endpoint in the registration directory until close()."""
        reg = tmp_path / "reg"
        tracker = make_tracker(port=0, registry_dir=reg, run="regrun")
        found = registration.list_endpoints(reg)
        assert [(e.run, e.rank, e.url, e.pid) for e in found] == [
            ("regrun", 0, tracker.metrics_url, os.getpid())
        ]
        tracker.close()
        assert registration.list_endpoints(reg) == []

    def test_unwritable_registration_dir_is_not_fatal(self, make_tracker: Any, tmp_path: Path) -> None:
        """A registration directory that cannot be created is counted; metrics are still served."""
        blocker = tmp_path / "file"
        blocker.write_text("not a dir")
        tracker = make_tracker(port=0, registry_dir=blocker / "sub")
        tracker.step()
        assert tracker.errors.counts()["registration"] == 1
        assert tracker.metrics_url is not None
        urllib.request.urlopen(tracker.metrics_url, timeout=5).read()  # noqa: S310

    def test_rank_and_local_rank_from_the_launcher(
        self, make_tracker: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """torchrun's variables give the rank label and the default port base + local rank."""
        monkeypatch.setenv("RANK", "5")
        monkeypatch.setenv("LOCAL_RANK", "1")
        monkeypatch.setenv("WORLD_SIZE", "8")
        monkeypatch.setenv("BABYSITTER_PORT", "0")
        tracker = make_tracker(port=None)
        assert (tracker.config.rank.rank, tracker.config.rank.local_rank, tracker.config.rank.world_size) == (
            5,
            1,
            8,
        )
        assert tracker.registry.get_sample_value(T.STEPS.name, {"run": "t", "rank": "5"}) == 0.0

    def test_tls(self, make_tracker: Any, tmp_path: Path) -> None:
        """With a certificate, metrics are served over HTTPS only."""
        import ssl

        cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=127.0.0.1",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
                "-keyout",
                str(key),
                "-out",
                str(cert),
            ],
            check=True,
            capture_output=True,
        )
        tracker = make_tracker(port=0, tls=babysitter.TLSConfig(certfile=str(cert), keyfile=str(key)))
        assert tracker.metrics_url is not None and tracker.metrics_url.startswith("https://")
        context = ssl.create_default_context(cafile=str(cert))
        body = urllib.request.urlopen(tracker.metrics_url, context=context, timeout=5).read().decode()  # noqa: S310
        assert T.STEPS.name in body


class TestTiming:
    def test_cuda_timer_reads_completed_events_in_order_and_never_waits(self) -> None:
        """Only events the device has passed are read; the rest wait for a later drain."""

        class Event:
            def __init__(self) -> None:
                self.at = 0.0
                self.done = False

            def record(self) -> None:
                self.done = False

            def query(self) -> bool:
                return self.done

            def elapsed_time(self, end: Event) -> float:
                return (end.at - self.at) * 1000.0

        events: list[Event] = []

        def make() -> Event:
            events.append(Event())
            return events[-1]

        timer = CudaStepTimer(make, size=8)
        for i in range(4):
            timer.mark(i)
        for i, at in enumerate((0.0, 0.5, 1.25)):
            events[i].at, events[i].done = at, True
        assert timer.drain() == [0.5, 0.75]
        events[3].at, events[3].done = 2.0, True
        assert timer.drain() == [0.75]
        assert timer.drain() == []

    def test_loss_reader_handles_numbers_cpu_tensors_and_nonfinite(self) -> None:
        """Numbers and CPU tensors are read directly; NaN and inf are counted."""
        reader = LossReader()
        reader.poll(2.5)
        assert reader.value == 2.5
        reader.poll(torch.tensor([[3.0]]))
        assert reader.value == 3.0
        reader.poll(torch.tensor(float("inf")))
        assert reader.nonfinite == 1


def test_import_does_not_import_torch() -> None:
    """The core never imports torch: a CPU-only agent or a JAX user pays nothing for it."""
    code = "import babysitter, babysitter.cli, sys; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


class TestExtensionPoints:
    def test_step_age_and_recent_durations_exclude_pauses(self, make_tracker: Any, clock: FakeClock) -> None:
        """The watchdog's view: age since the last step and recent step times, without checkpoint time."""
        tracker = make_tracker()
        tracker.step()
        for seconds in (1.0, 2.0, 3.0):
            clock.advance(seconds)
            tracker.step()
        with tracker.checkpoint_save(step=4):
            clock.advance(100.0)
            assert tracker.seconds_since_last_step() is None  # a checkpoint is not a hang
        clock.advance(5.0)
        assert tracker.seconds_since_last_step() == pytest.approx(5.0)
        assert tracker.recent_step_seconds(2) == [pytest.approx(2.0), pytest.approx(3.0)]

    def test_hooks_and_metric_sources_are_guarded(self, make_tracker: Any) -> None:
        """A failing hook or metrics source is counted; the others still run and render."""
        from prometheus_client.core import GaugeMetricFamily

        tracker = make_tracker()
        seen: list[int] = []
        tracker.add_housekeeping_hook(lambda t: 1 / 0)
        tracker.add_housekeeping_hook(lambda t: seen.append(t.steps))

        def broken(names: list[str], values: list[str]) -> list[Any]:
            raise KeyError("source broke")

        tracker.add_metrics_source(broken)

        def source(names: list[str], values: list[str]) -> list[Any]:
            family = GaugeMetricFamily("ext_test_gauge", "test", labels=names)
            family.add_metric(values, 7.0)
            return [family]

        tracker.add_metrics_source(source)
        tracker.step()
        tracker.housekeep()
        assert seen == [1]
        assert _sample(tracker, "ext_test_gauge") == 7.0
        assert tracker.errors.counts()["housekeeping_hook"] == 1
        assert tracker.errors.counts()["metrics_source"] >= 1


def test_data_wait_from_a_callback(make_tracker: Any) -> None:
    """Callbacks that cannot wrap the loader add their measured wait; bad values are skipped and counted."""
    tracker = make_tracker()
    tracker.add_data_wait(0.25)
    tracker.add_data_wait(-1.0)
    tracker.add_data_wait(float("nan"))  # NaN fails the >= 0 check
    assert tracker.snapshot().data_wait_seconds == pytest.approx(0.25)
    assert tracker.rejected.counts() == {"data_wait_invalid": 2}
