"""Run overview: is the run making progress, how efficiently, and where does the wall time go."""

from __future__ import annotations

from babysitter.catalog import MetricSpec
from babysitter.catalog import goodput as G
from babysitter.catalog import node as N
from babysitter.catalog import runtime as R
from babysitter.catalog import train as T
from babysitter.generate.config import GenerateConfig
from babysitter.generate.dashboards._builder import Annotation, Dashboard, Panel, Row, Target
from babysitter.generate.dashboards._common import (
    checkpoint_age_steps,
    goodput_steps,
    mfu_steps,
    rec,
    run_filter,
    run_matchers,
    run_variables,
    var_matcher,
)
from babysitter.generate.dashboards.fabric import run_overview_fabric
from babysitter.generate.dashboards.integrity import integrity_row
from babysitter.generate.promql import by, join_matchers, new_or_increased, select
from babysitter.generate.rules import Records

__all__ = ["FILE_NAME", "dashboard"]

FILE_NAME = "babysitter-run-overview.json"


def dashboard(cfg: GenerateConfig) -> Dashboard:
    """The run overview dashboard for ``cfg``."""
    r = Records(cfg)
    m, f = run_matchers(cfg), run_filter(cfg)
    run = by(r.run_key)
    ri = "$__rate_interval"

    def s(spec: MetricSpec, suffix: str = "") -> str:
        return select(spec, m, suffix=suffix)

    items: list[Panel | Row] = [
        Row("Progress and efficiency"),
        Panel(
            "MFU",
            (Target(rec(r.mfu, f), "{{run}}"),),
            kind="stat",
            unit="percentunit",
            width=4,
            height=5,
            thresholds=mfu_steps(cfg),
            description=f"Red below {cfg.mfu_poor:.0%}, green from {cfg.mfu_good:.0%}. "
            "Model FLOP/s of all ranks over their summed dense peak, over the last "
            f"{cfg.rate_window} (recording rule {r.mfu}). Each rank counts its share of its data-parallel "
            "replica's FLOPs (1/(tp x pp x cp)), so the sum is the job's FLOPs under any parallel layout.",
        ),
        Panel(
            "Goodput",
            (Target(f"max {run} ({s(G.GOODPUT)})", "{{run}}"),),
            kind="stat",
            unit="percentunit",
            width=4,
            height=5,
            thresholds=goodput_steps(cfg),
            description="Productive step time over wall time since the run first started (ledger). "
            f"Red below {cfg.goodput_poor:.0%}, amber below the {cfg.goodput_target:.0%} target of "
            "TrainingGoodputLow.",
        ),
        Panel(
            "Tokens / s",
            (Target(rec(r.tokens_rate, f), "{{run}}"),),
            kind="stat",
            unit="short",
            width=4,
            height=5,
            description="The job's tokens/s: every rank exports its share of its replica's tokens, so the "
            "sum over ranks counts each token once, whatever the tensor/pipeline/context parallel layout.",
        ),
        Panel(
            "Step time p50",
            (Target(rec(r.step_quantile(0.5), f), "{{run}}"),),
            kind="stat",
            unit="s",
            width=4,
            height=5,
        ),
        Panel(
            "Last checkpoint age",
            (Target(f"time() - max {run} ({s(T.CKPT_LAST_SUCCESS)} > 0)", "{{run}}"),),
            kind="stat",
            unit="s",
            width=4,
            height=5,
            thresholds=checkpoint_age_steps(cfg),
            description="Seconds since the last successful checkpoint save; a crash loses this much. "
            f"Amber from {cfg.checkpoint_age_warn_seconds}s, red from {cfg.checkpoint_overdue_max_seconds}s "
            "(where CheckpointOverdue fires at the latest).",
        ),
        Panel(
            "Restarts",
            (Target(f"max {run} ({s(G.RESTARTS)})", "{{run}}"),),
            kind="stat",
            width=4,
            height=5,
            red_above=1,
            description="Incarnations of the run after the first, from the ledger.",
        ),
        Panel(
            "MFU and HFU",
            (
                Target(rec(r.mfu, f), "{{run}} MFU"),
                Target(rec(r.hfu, f), "{{run}} HFU"),
                Target(f"max {run} ({s(T.MFU)})", "{{run}} MFU (rank 0, in-process window)"),
            ),
            unit="percentunit",
            min=0,
            thresholds=mfu_steps(cfg),
            description="MFU from the FLOP counters (any window, all ranks) and "
            "the tracker's own sliding-window MFU; HFU counts activation recomputation.",
        ),
        Panel(
            "Goodput",
            (
                Target(f"max {run} ({s(G.GOODPUT)})", "{{run}} since the start"),
                Target(
                    f"max {by((*r.run_key, 'window'))} ({s(G.ROLLING_GOODPUT)})", "{{run}} last {{window}}"
                ),
            ),
            unit="percentunit",
            min=0,
            max=1,
            thresholds=goodput_steps(cfg),
            description="Goodput since the run first started, continued across restarts, and over the last "
            "15 minutes (MLGM's rolling window, as babysitter report accounts it).",
        ),
        Panel(
            "Where the wall time goes",
            (
                Target(f"sum {run} (rate({s(G.PRODUCTIVE_SECONDS)}[{ri}]))", "{{run}} productive"),
                Target(
                    f"sum {by((*r.run_key, 'cause'))} (rate({s(G.BADPUT_SECONDS)}[{ri}]))",
                    "{{run}} {{cause}}",
                ),
            ),
            unit="percentunit",
            stack=True,
            width=16,
            description="Seconds per second of wall time: "
            "productive time plus badput by cause adds up to 1 (the ledger's accounting).",
        ),
        Panel(
            "Badput by cause (total)",
            (Target(f"sum by (cause) ({s(G.BADPUT_SECONDS)})", "{{cause}}", mode="instant"),),
            kind="bargauge",
            unit="s",
            width=8,
            description="Wall time lost since the run first started.",
        ),
        Row("Steps"),
        Panel(
            "Step time p50 / p90",
            (
                Target(rec(r.step_quantile(0.5), f), "{{run}} p50"),
                Target(rec(r.step_quantile(0.9), f), "{{run}} p90"),
            ),
            unit="s",
            min=0,
            description=f"Rank 0's step-time quantiles over its last {T.STEP_QUANTILE_STEPS} steps (ranks "
            "step in lockstep; the Stragglers dashboard compares the ranks' means).",
        ),
        Panel(
            "Step time vs ideal",
            (
                Target(rec(r.step_quantile(0.5), f), "{{run}} p50"),
                Target(f"max {run} ({s(G.IDEAL_STEP)})", "{{run}} ideal"),
                Target(f"max {run} ({s(G.STEP_DEVIATION)})", "{{run}} mean |step - ideal|"),
            ),
            unit="s",
            min=0,
            description="The run's ideal step time at its current work (healthy steps within median +- 3 "
            "MAD) and MLGM's step-time deviation; a step beyond the ideal's tolerance books its extra "
            "time as badput slowdown.",
        ),
        Panel(
            "Step time by rank",
            (Target(rec(r.rank_step_mean, f), "{{run}} rank {{rank}}"),),
            unit="s",
            min=0,
            description="Mean step time of each rank; the Stragglers dashboard compares them.",
        ),
        Panel(
            "Tokens / s",
            (
                Target(rec(r.tokens_rate, f), "{{run}}"),
                Target(f"avg {run} (rate({s(T.TOKENS)}[{ri}]))", "{{run}} per rank"),
            ),
            unit="short",
            min=0,
            width=8,
            description="The job's tokens/s, and per rank (the job's over its ranks: torchtitan's tps, "
            "comparable between runs of different sizes and layouts).",
        ),
        Panel("Steps / s", (Target(rec(r.steps_rate, f), "{{run}}"),), unit="short", min=0, width=8),
        Panel(
            "Data wait",
            (
                Target(rec(r.data_wait_mean, f), "{{run}} rank mean"),
                Target(rec(r.data_wait_worst, f), "{{run}} worst rank"),
            ),
            unit="percentunit",
            min=0,
            width=8,
            description="Fraction of wall time the training loop waited for the next batch.",
        ),
        Panel(
            "Stall clock and hang threshold",
            (
                Target(f"max {run} ({s(R.STALLED_SECONDS)})", "{{run}} seconds since a step (worst rank)"),
                Target(f"max {run} ({s(R.HANG_THRESHOLD)})", "{{run}} hang threshold"),
                Target(f"sum {run} (increase({s(R.HANGS)}[{ri}]))", "{{run}} hangs detected"),
            ),
            unit="s",
            min=0,
            width=12,
            description="The tracker's watchdog: seconds since the last step (paused during checkpoints and "
            "marked phases) against its threshold; a hang is counted (and stacks dumped) when it crosses.",
        ),
        Panel("Loss", (Target(f"avg {run} ({s(T.LOSS)})", "{{run}}"),), width=12),
        Panel(
            "Non-finite losses",
            (Target(f"sum {run} (increase({s(T.NONFINITE_LOSS)}[{ri}]))", "{{run}}"),),
            bars=True,
            width=12,
            red_above=0.5,
            description="NaN or infinite loss values read.",
        ),
        Row("Checkpoints"),
        Panel(
            "Checkpoint save time",
            (
                Target(
                    _mean(run, s(T.CKPT_SAVE_DURATION, "_sum"), s(T.CKPT_SAVE_DURATION, "_count")),
                    "{{run}} mean save (1h)",
                ),
                # One load per incarnation: a rate would miss it (the series appears with it), so show the
                # mean since the process started, which is that load's duration.
                Target(
                    f"max {run} ("
                    f"{s(T.CKPT_LOAD_DURATION, '_sum')} / {s(T.CKPT_LOAD_DURATION, '_count')} > 0)",
                    "{{run}} load (this incarnation)",
                ),
            ),
            unit="s",
            min=0,
            red_above=cfg.checkpoint_save_slow_seconds,
            width=8,
            description="Blocking save time (and load time after restarts), slowest rank.",
        ),
        Panel(
            "Last checkpoint age",
            (Target(f"time() - max {run} ({s(T.CKPT_LAST_SUCCESS)} > 0)", "{{run}}"),),
            unit="s",
            min=0,
            width=8,
            thresholds=checkpoint_age_steps(cfg),
        ),
        Panel(
            "Checkpoint throughput and failures",
            (
                Target(f"sum {run} (rate({s(T.CKPT_BYTES)}[{ri}]))", "{{run}} bytes/s written"),
                Target(f"sum {run} (increase({s(T.CKPT_FAILURES)}[{ri}]))", "{{run}} failed saves"),
            ),
            unit="short",
            min=0,
            width=8,
        ),
        Panel(
            "Checkpoint interval: current vs advised",
            (
                Target(f"max {run} ({s(G.CKPT_INTERVAL)})", "{{run}} current"),
                Target(f"max {run} ({s(G.CKPT_INTERVAL_RECOMMENDED)})", "{{run}} advised"),
                Target(
                    f"{cfg.checkpoint_advice_factor:g} * max {run} ({s(G.CKPT_INTERVAL_RECOMMENDED)})",
                    "{{run}} alert above",
                ),
                Target(
                    f"max {run} ({s(G.CKPT_INTERVAL_RECOMMENDED)}) / {cfg.checkpoint_advice_factor:g}",
                    "{{run}} alert below",
                ),
            ),
            unit="s",
            min=0,
            width=12,
            description="The run's checkpoint interval (save end to next save begin) and the one that "
            "maximises expected goodput (Daly's optimum from the ledger's save cost, restart cost and "
            "interruption rate; absent while the rate rests on too little data). Outside the band for "
            f"{cfg.checkpoint_advice_for} with a material gain: CheckpointIntervalOffAdvice. "
            "See docs/checkpoint-interval.md.",
        ),
        Panel(
            "Expected goodput: current vs advised interval",
            (
                Target(
                    f"max {by((*r.run_key, 'interval'))} ({s(G.CKPT_EXPECTED_GOODPUT)})",
                    "{{run}} {{interval}}",
                ),
            ),
            unit="percentunit",
            min=0,
            max=1,
            width=12,
            description="Expected goodput (Daly's model, from the measured inputs) at the current and at "
            "the advised checkpoint interval; the gap is what changing the interval is worth. "
            "`babysitter report` prints the inputs and their confidence.",
        ),
        *integrity_row(cfg, r, m),
        Row("Slowest ranks and their GPUs"),
        _slowest_ranks_gpus(cfg, r, f),
        *run_overview_fabric(cfg, r),
        Row("Restarts and layout"),
        Panel("Restarts", (Target(f"max {run} ({s(G.RESTARTS)})", "{{run}}"),), width=8),
        Panel(
            "Time since this incarnation started",
            (Target(f"time() - max {run} ({s(T.RUN_START_TIMESTAMP)})", "{{run}}"),),
            unit="s",
            width=8,
        ),
        Panel(
            "Ranks by parallel layout",
            (
                Target(
                    f"count {by((*r.run_key, *T.PARALLEL_LABELS))} ({s(T.INFO)})",
                    "{{run}} " + " ".join(f"{k}={{{{{k}}}}}" for k in T.PARALLEL_LABELS),
                ),
            ),
            kind="stat",
            width=8,
            description="Ranks reporting, by the tensor/pipeline/context/expert/data parallel degrees they "
            "were given (watch(parallelism=...) or read from the DeviceMesh). Tokens and FLOPs are shared "
            "among the tp x pp x cp ranks of a replica; ranks of one run should all show one layout.",
        ),
    ]
    return Dashboard(
        title="babysitter / Run overview",
        file_name=FILE_NAME,
        description="MFU, goodput and badput by cause, step time, tokens/s, checkpoints, data wait, loss and "
        "restarts of training runs.",
        variables=run_variables(cfg),
        items=tuple(items),
        annotations=_annotations(cfg, r),
    )


#: Step and window of the annotation queries: each event is marked once per step it falls in.
_EVENT_STEP = "1m"


def _annotations(cfg: GenerateConfig, r: Records) -> tuple[Annotation, ...]:
    """Restarts, checkpoint saves, Xids on the run's hosts and hangs, drawn on every time series panel.

    Each counter or timestamp is read with :func:`new_or_increased`, so the first event of a series
    (a new incarnation's first save, a GPU's first Xid) is marked too, not only the later ones."""
    m, f, c = run_matchers(cfg), run_filter(cfg), cfg.cluster_label
    run = by(r.run_key)
    w = _EVENT_STEP

    def grew(selector: str) -> str:
        return new_or_increased(selector, w)

    xids = select(N.GPU_XID_ERRORS, join_matchers(cfg.node_selector, var_matcher(c, "cluster")))
    run_hosts = f"max by ({c}, instance) ({select(T.STEPS, m)})"
    return (
        Annotation(
            "Restarts",
            f"max {run} ({grew(rec(r.restarts_total, f))})",
            "red",
            "Restart of {{run}}",
            "A new incarnation of run {{run}} started (restart counter of the ledger).",
            ("run",),
            w,
        ),
        Annotation(
            "Checkpoint saves",
            f"max {run} ({grew(select(T.CKPT_LAST_SUCCESS, m))})",
            "green",
            "Checkpoint saved",
            "Run {{run}} saved a checkpoint successfully.",
            ("run",),
            w,
        ),
        Annotation(
            "Xid errors",
            f"max by ({c}, instance, gpu, xid, action) ({grew(xids)})\nand on ({c}, instance)\n{run_hosts}",
            "orange",
            "Xid {{xid}} on GPU {{gpu}}",
            "Host {{instance}}, recovery action {{action}} (a host this run trains on).",
            ("instance", "gpu", "xid", "action"),
            w,
        ),
        Annotation(
            "Hangs",
            f"max {run} ({grew(select(R.HANGS, m))})",
            "purple",
            "Hang of {{run}}",
            "The in-process watchdog saw no step for longer than its hang threshold.",
            ("run",),
            w,
        ),
    )


def _mean(run: str, total: str, count: str, window: str = "1h") -> str:
    """Mean of a histogram over ``window``, slowest rank first (saves are rare: a short window is empty)."""
    return f"max {run} (rate({total}[{window}]) / rate({count}[{window}]))"


#: Ranks the slowest ranks' table shows per run.
SLOWEST_RANKS = 5


def _slowest_ranks_gpus(cfg: GenerateConfig, r: Records, f: str) -> Panel:
    """A table of each run's slowest ranks with their GPU's state (the rank-to-GPU join records)."""
    rank = ", ".join(r.rank_key)
    slowest = f"topk by ({cfg.cluster_label}, run) ({SLOWEST_RANKS}, {rec(r.rank_gpu_step_ratio, f)})"

    def of(record: str, without: str = "") -> Target:
        # Aggregating drops __name__, so the table's merge lines the queries up by their labels.
        agg = f"sum without ({without})" if without else "max without ()"
        return Target(f"{agg} ({rec(record, f)} and on ({rank}) {slowest})", mode="instant")

    return Panel(
        f"Slowest {SLOWEST_RANKS} ranks per run and their GPUs",
        (
            Target(f"max without () ({slowest})", mode="instant"),
            of(r.rank_gpu_sm_clock),
            of(r.rank_gpu_temperature),
            of(r.rank_gpu_throttle, "reason"),
            of(r.rank_gpu_xid_new),
            of(r.rank_gpu_ecc_new),
        ),
        kind="table",
        width=24,
        height=8,
        columns=(
            ("Value #A", "step time / median rank"),
            ("Value #B", "SM clock (Hz)"),
            ("Value #C", "temperature (C)"),
            ("Value #D", "throttle reasons active"),
            ("Value #E", f"Xids ({cfg.xid_window})"),
            ("Value #F", f"uncorrectable ECC ({cfg.rate_window})"),
        ),
        description="Each run's slowest ranks by mean step time over the median rank "
        f"({r.rank_gpu_step_ratio}), with their GPU joined on uuid ({T.INFO.name} carries it per rank): SM "
        f"clock, core temperature, how many of the throttling clock-event reasons "
        f"({', '.join(cfg.throttle_reasons)}) are active, and new Xid and uncorrectable ECC errors. "
        "A slow rank on a hot, throttled GPU is the GPU's fault; a slow rank on a healthy GPU points "
        f"elsewhere (input, host, network). Empty for ranks without a GPU in {T.INFO.name} (CPU, NVML down).",
    )
