"""MFU and tokens under tensor, pipeline, context and expert parallelism: the layout and its arithmetic.

A simulated job is one tracker per rank in this process, each with the ``RANK``/``WORLD_SIZE`` a
launcher would give it, stepped in lockstep on a fake clock, so every expected number is exact.
The real multi-process runs (DTensor tensor parallel, torch.distributed.pipelining, all-to-all
expert parallel, scraped by a real Prometheus) are in test_parallel_torchrun.py.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import babysitter
from babysitter import flops
from babysitter.catalog import train as T
from babysitter.flops.parallel import DIMS, ParallelLayout, resolve_layout
from babysitter.training.events import NullEvents

PEAK = 1e12
FPT = 2e8  # model FLOPs per token of the whole model
STEP_SECONDS = 0.5


class FakeClock:
    """Stands in for perf_counter_ns: every tracker of the simulated job reads the same clock."""

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


@pytest.fixture
def job(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``job(world, **watch_kwargs)``: one tracker per rank, as torchrun would start them."""
    made: list[babysitter.Tracker] = []

    def start(world: int, **kwargs: Any) -> list[babysitter.Tracker]:
        ranks = []
        for rank in range(world):
            monkeypatch.setenv("RANK", str(rank))
            monkeypatch.setenv("WORLD_SIZE", str(world))
            monkeypatch.setenv("LOCAL_RANK", str(rank % 8))
            kwargs.setdefault("run", "parallel")
            kwargs.setdefault("port", -1)
            kwargs.setdefault("peak_flops", PEAK)
            kwargs.setdefault("flush_interval", 3600.0)
            kwargs.setdefault("hang_timeout", None)
            tracker = babysitter.watch(**kwargs)
            made.append(tracker)
            ranks.append(tracker)
        return ranks

    yield start
    for tracker in made:
        tracker.close()


def _lockstep(ranks: list[babysitter.Tracker], clock: FakeClock, steps: int, tokens: Any = None) -> None:
    """``steps`` optimizer steps of STEP_SECONDS; ``tokens(tracker)`` gives each rank's replica tokens."""
    for _ in range(steps):
        clock.advance(STEP_SECONDS)
        for tracker in ranks:
            tracker.step(tokens=None if tokens is None else tokens(tracker))


class TestLayout:
    def test_mapping_gives_degrees_and_data_parallel_is_the_rest(self) -> None:
        """tp x pp x cp ranks share a batch; the world size over that is the data-parallel degree."""
        layout = resolve_layout({"tp": 8, "pp": 4, "cp": 2, "ep": 8}, world_size=512)
        assert (layout.tp, layout.pp, layout.cp, layout.ep, layout.dp) == (8, 4, 2, 8, 8)
        assert layout.ranks_per_replica == 64
        assert layout.world_size == 512
        assert layout.source == "explicit"
        assert str(layout) == "tp=8,pp=4,cp=2,ep=8,dp=8"

    def test_default_is_data_parallel_only(self) -> None:
        """Nothing said and no DTensor model: every rank brings its own tokens (the old behaviour)."""
        layout = resolve_layout(None, world_size=16)
        assert layout == ParallelLayout(dp=16)
        assert layout.share(4096) == 4096

    @pytest.mark.parametrize(
        ("parallelism", "world", "error", "match"),
        [
            ({"tp": 3}, 8, ValueError, "does not divide the world size 8"),
            ({"tp": 2, "pp": 2}, 2, ValueError, "4 ranks per data-parallel replica"),
            ({"tp": 2, "dp": 3}, 8, ValueError, "dp=3 but world size 8"),
            ({"ep": 3}, 8, ValueError, "ep=3 must divide"),
            ({"pp": 4, "ep": 4}, 8, ValueError, "ep=4 must divide the ranks of one pipeline stage"),
            ({"tensor": 2}, 8, ValueError, "unknown keys"),
            ({"tp": 0}, 8, ValueError, ">= 1"),
            ({"tp": 2.0}, 8, TypeError, "must be an int"),
            ({"tp": True}, 8, TypeError, "must be an int"),
            ([("tp", 2)], 8, TypeError, "mapping"),
        ],
    )
    def test_layouts_that_do_not_fit_fail_at_setup(
        self, parallelism: object, world: int, error: type[Exception], match: str
    ) -> None:
        """A layout that cannot be the job's fails before training, saying why."""
        with pytest.raises(error, match=match):
            resolve_layout(parallelism, world_size=world)

    def test_watch_checks_the_layout_against_the_launcher_world_size(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """watch(parallelism=...) fails at setup when torchrun's WORLD_SIZE cannot hold the layout."""
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", "6")
        with pytest.raises(ValueError, match="does not divide the world size 6"):
            babysitter.watch(parallelism={"tp": 4}, port=-1, flops_per_token=FPT, peak_flops=PEAK)


class TestInvariants:
    def test_per_rank_mfu_is_the_job_mfu(self, job: Any, clock: FakeClock) -> None:
        """(a) TP=2 x CP=2 x PP=2 x DP=2: each of the 16 ranks reports the job's MFU, not 8x it."""
        replica_tokens = 4096
        ranks = job(
            16, parallelism={"tp": 2, "cp": 2, "pp": 2}, tokens_per_step=replica_tokens, flops_per_token=FPT
        )
        _lockstep(ranks, clock, 40)
        dp = 2
        job_tokens_per_second = dp * replica_tokens / STEP_SECONDS
        job_mfu = job_tokens_per_second * FPT / (16 * PEAK)
        assert job_mfu == pytest.approx(0.2048)  # by hand: 16384 tok/s x 0.2 GFLOP / 16 TFLOP/s
        for tracker in ranks:
            snap = tracker.snapshot()
            assert snap.mfu == pytest.approx(job_mfu)
            assert snap.tokens_per_second == pytest.approx(job_tokens_per_second / 16)

    def test_sums_over_ranks_count_every_flop_and_token_once(self, job: Any, clock: FakeClock) -> None:
        """(b), (c): sum(rate(flops)) / sum(peak) is the job's MFU and sum(rate(tokens)) its tokens/s,
        with replicas of different batch sizes so that no per-rank shortcut can pass."""
        ranks = job(8, parallelism={"tp": 2, "pp": 2}, flops_per_token=FPT)
        replica_of = {id(t): t.config.rank.rank // 4 for t in ranks}  # ranks 0-3: replica 0, 4-7: replica 1
        batch = {0: 4096, 1: 1024}

        def tokens(tracker: babysitter.Tracker) -> int:
            return batch[replica_of[id(tracker)]]

        _lockstep(ranks, clock, 5, tokens)
        before = [t.snapshot() for t in ranks]
        _lockstep(ranks, clock, 20, tokens)
        after = [t.snapshot() for t in ranks]
        seconds = 20 * STEP_SECONDS
        job_tokens = 20 * (4096 + 1024)
        true_mfu = job_tokens * FPT / seconds / (8 * PEAK)
        flops_rate = (
            sum((a.model_flops or 0) - (b.model_flops or 0) for a, b in zip(after, before, strict=True))
            / seconds
        )
        tokens_rate = sum(a.tokens - b.tokens for a, b in zip(after, before, strict=True)) / seconds
        assert flops_rate / sum(a.peak_flops or 0 for a in after) == pytest.approx(true_mfu)
        assert tokens_rate == pytest.approx(job_tokens / seconds)
        # what a rank exports is its share of its replica: 1/4 here
        assert after[0].tokens == pytest.approx(25 * 4096 / 4)
        assert after[7].model_flops == pytest.approx(25 * 1024 * FPT / 4)

    def test_moe_with_expert_parallelism_counts_active_parameters_once_per_token(
        self, job: Any, clock: FakeClock
    ) -> None:
        """(d) EP=4 on 4 ranks: each rank brings its own tokens; FLOPs per token are the active
        experts' (top-2 of 8), counted once per token, neither divided by nor multiplied by EP."""
        transformers = pytest.importorskip("transformers")
        config = transformers.MixtralConfig(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_local_experts=8,
            num_experts_per_tok=2,
        )
        seq = 128
        active = flops.estimate(config, seq_len=seq).model
        counts = flops.parameter_counts(config)
        assert active < 6 * (counts.total - counts.embedding)  # not every expert's parameters
        ranks = job(4, model=config, seq_len=seq, parallelism={"ep": 4}, tokens_per_step=8 * seq)
        assert all(t.config.parallel.ep == 4 and t.config.parallel.dp == 4 for t in ranks)
        _lockstep(ranks, clock, 10)
        snaps = [t.snapshot() for t in ranks]
        job_tokens = 4 * 10 * 8 * seq
        assert sum(s.model_flops or 0 for s in snaps) == pytest.approx(job_tokens * active)
        assert sum(s.tokens for s in snaps) == job_tokens

    def test_pipeline_bubble_lowers_mfu_and_never_discounts_flops(self, job: Any, clock: FakeClock) -> None:
        """(e) the same PP=2 steps, once without and once with a 50% bubble: the FLOPs credited per
        step are the same, MFU falls by the time the bubble adds."""
        results = []
        for step_seconds in (STEP_SECONDS, 1.5 * STEP_SECONDS):
            ranks = job(2, parallelism={"pp": 2}, tokens_per_step=4096, flops_per_token=FPT)
            for _ in range(30):
                clock.advance(step_seconds)
                for tracker in ranks:
                    tracker.step()
            results.append([t.snapshot() for t in ranks])
            for tracker in ranks:
                tracker.close()
        no_bubble, bubble = results
        for a, b in zip(no_bubble, bubble, strict=True):
            assert a.model_flops == b.model_flops == pytest.approx(30 * 4096 * FPT / 2)
            assert b.mfu == pytest.approx((a.mfu or 0) / 1.5)

    def test_hardware_flops_and_samples_are_shared_like_tokens(self, job: Any, clock: FakeClock) -> None:
        """HFU's numerator and the sample counter follow the same share."""
        ranks = job(
            4,
            parallelism={"tp": 4},
            tokens_per_step=4096,
            samples_per_step=8,
            flops_per_token=FPT,
            hardware_flops_per_token=1.5 * FPT,
        )
        _lockstep(ranks, clock, 10)
        snap = ranks[2].snapshot()
        assert snap.samples == pytest.approx(10 * 8 / 4)
        assert snap.hardware_flops == pytest.approx(10 * 4096 * 1.5 * FPT / 4)
        assert snap.hfu == pytest.approx(1.5 * (snap.mfu or 0))


class TestExport:
    def test_counters_and_info_carry_the_share_and_the_layout(self, job: Any, clock: FakeClock) -> None:
        """What Prometheus scrapes: shared counters and the degrees as train_info labels."""
        (tracker,) = job(1, parallelism={"dp": 1}, tokens_per_step=3, flops_per_token=FPT)
        ranks = job(6, parallelism={"tp": 3}, tokens_per_step=3, flops_per_token=FPT)
        _lockstep([tracker, *ranks], clock, 2)
        labels = {"run": "parallel", "rank": "4"}
        registry = ranks[4].registry
        assert registry.get_sample_value(T.TOKENS.name, labels) == pytest.approx(2.0)
        assert registry.get_sample_value(T.MODEL_FLOPS.name, labels) == pytest.approx(2 * FPT)
        info = {"run": "parallel", "rank": "4", "tp": "3", "pp": "1", "cp": "1", "ep": "1", "dp": "2"}
        matching = [
            s
            for metric in registry.collect()
            for s in metric.samples
            if s.name == T.INFO.name and all(s.labels.get(k) == v for k, v in info.items())
        ]
        assert len(matching) == 1
        assert T.PARALLEL_LABELS == DIMS  # the mapping's keys are the labels' names
        # a lone process without a layout keeps integer token counts
        assert tracker.snapshot().tokens == 6

    def test_the_ledger_gets_this_rank_share_so_the_report_mfu_is_the_job_mfu(
        self, job: Any, clock: FakeClock, tmp_path: Path
    ) -> None:
        """Rank 0 writes the ledger with its own peak: its FLOPs must be its share, or the report's
        MFU reads tp x pp x cp times too high."""
        from babysitter.ledger import summarize
        from babysitter.ledger.spans import step_points

        ranks = job(
            4, parallelism={"tp": 2, "pp": 2}, tokens_per_step=4096, flops_per_token=FPT, run_dir=tmp_path
        )
        _lockstep(ranks, clock, 30)
        for tracker in ranks:
            tracker.close()
        summary = summarize(tmp_path)
        (incarnation,) = summary.timeline.incarnations
        assert incarnation.start.info["parallelism"] == "tp=2,pp=2,cp=1,ep=1,dp=1"
        points = [p.mfu for p in step_points(incarnation) if p.mfu is not None]
        job_mfu = 4096 / STEP_SECONDS * FPT / (4 * PEAK)
        assert points
        assert points == pytest.approx([job_mfu] * len(points))


class _Progress(NullEvents):
    def __init__(self) -> None:
        self.flops: list[float] = []

    def progress(self, **kwargs: Any) -> None:  # type: ignore[override]
        self.flops.append(kwargs["model_flops"])


class TestMesh:
    """A real DeviceMesh needs a process group; torch's own ``fake`` backend gives one of any size in
    this process (it fakes the collectives, not the mesh). The gloo runs use real ones."""

    @pytest.fixture
    def world(self) -> Iterator[Any]:
        torch_dist = pytest.importorskip("torch.distributed")
        from torch.testing._internal.distributed.fake_pg import FakeStore

        def init(size: int, rank: int = 0) -> Any:
            torch_dist.init_process_group("fake", rank=rank, world_size=size, store=FakeStore())
            from torch.distributed.device_mesh import init_device_mesh

            return init_device_mesh

        yield init
        if torch_dist.is_initialized():
            torch_dist.destroy_process_group()

    def test_torchtitan_mesh_is_read_by_dimension_name(self, world: Any) -> None:
        """pp x dp_replicate x dp_shard x cp x tp = 2 x 2 x 2 x 2 x 2: tp, pp, cp 2 each, dp 4."""
        init_device_mesh = world(32, rank=5)
        mesh = init_device_mesh(
            "cpu", (2, 2, 2, 2, 2), mesh_dim_names=("pp", "dp_replicate", "dp_shard", "cp", "tp")
        )
        layout = resolve_layout(mesh, world_size=32)
        assert (layout.tp, layout.pp, layout.cp, layout.dp, layout.source) == (2, 2, 2, 4, "mesh")
        # a slice says the same: the whole mesh is read
        assert resolve_layout(mesh["tp"], world_size=32) == layout

    def test_unflattened_mesh_is_read_as_given_not_through_its_world_root(
        self, world: Any, caplog: Any
    ) -> None:
        """Newer torchtitan cuts its meshes out of one flattened ``world`` dim with ``_unflatten``; that
        root says nothing, so the mesh given is read. A DTensor slice of it (a TP weight's ``tp`` mesh)
        cannot see the pipeline dim: the rest is taken as data parallel, with a warning saying so."""
        torch = pytest.importorskip("torch")
        from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

        init_device_mesh = world(16, rank=3)
        dense = init_device_mesh("cpu", (16,), mesh_dim_names=("world",))._unflatten(
            0, (2, 2, 4), ("pp", "fsdp", "tp")
        )
        layout = resolve_layout(dense, world_size=16)
        assert (layout.tp, layout.pp, layout.dp) == (4, 2, 2)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8))
        parallelize_module(model, dense["tp"], {"0": ColwiseParallel()})
        with caplog.at_level(logging.WARNING, logger="babysitter"):
            from_model = resolve_layout(None, world_size=16, model=model)
        assert (from_model.tp, from_model.pp, from_model.dp, from_model.source) == (4, 1, 4, "model")
        assert "spans 4 of 16 ranks" in caplog.text and "pp=" in caplog.text

    def test_lightning_model_parallel_names(self, world: Any) -> None:
        """Lightning's ModelParallelStrategy names its dims data_parallel and tensor_parallel."""
        init_device_mesh = world(8)
        mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("data_parallel", "tensor_parallel"))
        tracker = babysitter.watch(parallelism=mesh, port=-1, flops_per_token=FPT, peak_flops=PEAK)
        try:
            assert str(tracker.config.parallel) == "tp=4,pp=1,cp=1,ep=1,dp=2"
        finally:
            tracker.close()

    def test_dtensor_model_gives_the_layout_without_arguments(self, world: Any) -> None:
        """A model sharded with torch.distributed.tensor.parallel carries its mesh: watch(model) reads it."""
        torch = pytest.importorskip("torch")
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        init_device_mesh = world(8, rank=3)
        mesh = init_device_mesh("cpu", (4, 2), mesh_dim_names=("dp", "tp"))
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
        parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        tracker = babysitter.watch(model, port=-1, flops_per_token=FPT, peak_flops=PEAK)
        try:
            layout = tracker.config.parallel
            assert (layout.tp, layout.dp, layout.source) == (2, 4, "model")
        finally:
            tracker.close()

    def test_expert_dimension_brings_its_own_tokens(self, world: Any) -> None:
        """An ``ep`` mesh dim holds ranks with their own batches: it divides nothing."""
        init_device_mesh = world(8)
        mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("tp", "ep"))
        layout = resolve_layout(mesh, world_size=8)
        assert (layout.tp, layout.ep, layout.dp, layout.ranks_per_replica) == (2, 4, 4, 2)

    def test_mesh_smaller_than_the_world_leaves_the_rest_data_parallel(self, world: Any) -> None:
        """A TP mesh of 2 in a world of 8 (DDP over a separate group): tp 2, dp 4."""
        init_device_mesh = world(8)
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
        layout = resolve_layout(mesh, world_size=8)
        assert (layout.tp, layout.dp) == (2, 4)

    def test_unnamed_or_unknown_dims_are_refused_when_passed(self, world: Any) -> None:
        """A mesh given explicitly must say what its dims are: refused at setup, not guessed."""
        init_device_mesh = world(4)
        with pytest.raises(ValueError, match="no dimension names"):
            resolve_layout(init_device_mesh("cpu", (2, 2)), world_size=4)
        with pytest.raises(ValueError, match="'model' is not one babysitter knows"):
            resolve_layout(init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "model")), world_size=4)

    def test_ambiguous_model_mesh_warns_and_assumes_data_parallel(self, world: Any, caplog: Any) -> None:
        """Read from a model, an unnamed multi-dim mesh cannot be told apart: one warning, no guess."""
        torch = pytest.importorskip("torch")
        from torch.distributed.tensor import Replicate, distribute_tensor

        init_device_mesh = world(4)
        mesh = init_device_mesh("cpu", (2, 2))
        model = torch.nn.Linear(8, 8)
        model.weight = torch.nn.Parameter(distribute_tensor(model.weight, mesh, [Replicate(), Replicate()]))
        with caplog.at_level(logging.WARNING, logger="babysitter"):
            layout = resolve_layout(None, world_size=4, model=model)
        assert layout == ParallelLayout(dp=4)
        assert "cannot tell the parallel layout" in caplog.text


class TestHuggingFace:
    """The Hugging Face callback's layout comes from accelerate's ParallelismConfig; real TP/CP
    Trainer runs need several GPUs (accelerate's CP is CUDA-only), so the hooks are driven here with
    real TrainingArguments and a real model, in a world of 8 ranks."""

    def test_parallelism_config_gives_the_layout_and_sequence_shards_are_scaled_back(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        """tp=2, cp=2: the forward sees half of each sequence; the callback counts the replica's
        tokens and sequence length, and credits this rank a quarter of them."""
        pytest.importorskip("accelerate")
        torch = pytest.importorskip("torch")
        from accelerate import ParallelismConfig
        from transformers import TrainerControl, TrainerState, TrainingArguments

        from babysitter.integrations.hf import Babysitter
        from integ_helpers import tiny_gpt2

        args = TrainingArguments(
            output_dir=str(tmp_path),
            use_cpu=True,
            report_to=[],
            bf16=True,
            parallelism_config=ParallelismConfig(tp_size=2, cp_size=2),
        )
        monkeypatch.setenv("RANK", "0")  # after the arguments: accelerate would set up a real group
        monkeypatch.setenv("WORLD_SIZE", "8")
        callback = Babysitter(run="hf-cp", port=-1, peak_flops=PEAK, hang_timeout=None, straggler_every=None)
        model = tiny_gpt2()
        state, control = TrainerState(), TrainerControl()
        callback.on_train_begin(args, state, control, model=model)
        seen = torch.randint(0, 128, (4, 8))  # this rank's half of four 16-token sequences
        for _ in range(2):  # two micro-batches
            model(input_ids=seen)
        state.global_step = 1
        callback.on_step_end(args, state, control)
        tracker = callback.tracker
        assert tracker is not None
        try:
            assert str(tracker.config.parallel) == "tp=2,pp=1,cp=2,ep=1,dp=2"
            assert tracker.config.flops.model == flops.estimate(model.config, seq_len=16).model
            snap = tracker.snapshot()
            assert snap.tokens == 2 * 4 * 16 / 4
            assert snap.model_flops == pytest.approx(
                2 * 4 * 16 / 4 * flops.estimate(model.config, seq_len=16).model
            )
        finally:
            callback.on_train_end(args, state, control)

    def test_explicit_parallelism_wins_over_the_trainer(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        """parallelism= given to the callback overrides what the Trainer says."""
        pytest.importorskip("accelerate")
        from accelerate import ParallelismConfig
        from transformers import TrainerControl, TrainerState, TrainingArguments

        from babysitter.integrations.hf import Babysitter
        from integ_helpers import tiny_gpt2

        args = TrainingArguments(
            output_dir=str(tmp_path),
            use_cpu=True,
            report_to=[],
            parallelism_config=ParallelismConfig(tp_size=2),
        )
        monkeypatch.setenv("WORLD_SIZE", "8")
        callback = Babysitter(
            run="hf-tp",
            port=-1,
            peak_flops=PEAK,
            flops_per_token=FPT,
            hang_timeout=None,
            straggler_every=None,
            parallelism={"tp": 4},
        )
        callback.on_train_begin(args, TrainerState(), TrainerControl(), model=tiny_gpt2())
        try:
            assert callback.tracker is not None
            assert (callback.tracker.config.parallel.tp, callback.tracker.config.parallel.dp) == (4, 2)
        finally:
            callback.on_train_end(args, TrainerState(), TrainerControl())
