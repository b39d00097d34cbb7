"""Stragglers: which rank holds the run back, and whether its host is to blame."""

from __future__ import annotations

from babysitter.catalog import runtime as R
from babysitter.catalog import train as T
from babysitter.generate.config import GenerateConfig
from babysitter.generate.dashboards._builder import Dashboard, Panel, Row, Target
from babysitter.generate.dashboards._common import rec, run_filter, run_matchers, run_variables
from babysitter.generate.promql import select
from babysitter.generate.rules import Records

__all__ = ["FILE_NAME", "dashboard"]

FILE_NAME = "babysitter-stragglers.json"


def dashboard(cfg: GenerateConfig) -> Dashboard:
    """The stragglers dashboard for ``cfg``."""
    r = Records(cfg)
    m, f = run_matchers(cfg), run_filter(cfg)
    rank_key = ", ".join(r.rank_key)
    ri = "$__rate_interval"
    # The host of each rank, joined onto rank-level recording rules (which drop instance).
    # topk keeps one host per rank when a restart moved it (the old series lingers for 5 min).
    host = f"(0 * topk by ({rank_key}) (1, max by ({rank_key}, instance) ({select(T.STEPS, m)})) + 1)"
    items: list[Panel | Row] = [
        Row("Per-rank step time"),
        Panel(
            "Step time by rank (heatmap)",
            (Target(rec(r.rank_step_mean, f), "{{rank}}"),),
            kind="heatmap",
            unit="s",
            width=24,
            height=10,
            description=f"Mean step time of each rank over {cfg.rate_window}, one row per rank: a "
            "straggler is a row that stays hotter than the others.",
        ),
        Panel(
            "Step time / median rank",
            (Target(rec(r.rank_step_ratio, f), "{{run}} rank {{rank}}"),),
            unit="short",
            red_above=cfg.straggler_ratio,
            width=16,
            description=f"1 is the median rank; the straggler alert fires above {cfg.straggler_ratio:g} "
            f"for {cfg.straggler_for}.",
        ),
        Panel(
            "Slowest ranks",
            (
                Target(
                    f"topk(10, {rec(r.rank_step_ratio, f)} * on ({rank_key}) group_left (instance) {host})",
                    mode="instant",
                ),
            ),
            kind="table",
            width=8,
            columns=(("Value", "step time / median"),),
            description="The ten slowest ranks and the host each runs on.",
        ),
        Row("Collective arrival and hangs (torch's flight recorder)"),
        Panel(
            "Collective lag by rank",
            (Target(select(R.COLLECTIVE_LAG, m), "{{run}} rank {{rank}}"),),
            unit="s",
            width=12,
            description="How much later than the median rank each rank enqueues the default group's "
            "collectives (clock offsets removed): the other ranks wait about that long for it at each "
            "one. In lockstep training step times are equal on every rank; this is where a slow rank "
            "shows. Exported where the straggler exchange runs and the flight recorder is on.",
        ),
        Panel(
            "Straggler score by rank",
            (Target(select(R.STRAGGLER_SCORE, m), "{{run}} rank {{rank}}"),),
            unit="short",
            red_above=cfg.straggler_ratio,
            width=12,
            description="Each rank's own work between collectives over the median rank's (from collective "
            "arrival; step or work time where the recorder is off). TrainingStragglerRank fires above "
            f"{cfg.straggler_ratio:g} for {cfg.straggler_for}.",
        ),
        Panel(
            "Culprit of the last hang",
            (Target(f"last_over_time({rec(r.collectives.culprit, f)}[$__range])", mode="instant"),),
            kind="table",
            width=14,
            columns=(("Value", "collective #"),),
            description="The ranks the last hang in the dashboard's range waited for, with their host and "
            "GPU: behind (never reached the collective the others wait in), not_answering (its node "
            "agent cannot fetch it: stopped or hard-hung), gone (exited). The hosts TrainingStalled "
            "names and babysitter remediate can drain.",
        ),
        Panel(
            "Ranks waiting in the last hang",
            (Target(f"last_over_time({rec(r.collectives.waiting, f)}[$__range])", mode="instant"),),
            kind="table",
            width=10,
            columns=(("Value", "waits in #"),),
            description="Ranks that reported the collective they wait in (group, operation, size, last "
            "completed) while stalled: victims, never culprits.",
        ),
        Row("Causes"),
        Panel(
            "Data wait by rank",
            (Target(f"sum by ({rank_key}) (rate({select(T.DATA_WAIT, m)}[{ri}]))", "{{run}} rank {{rank}}"),),
            unit="percentunit",
            min=0,
            width=12,
            description="A rank starved by its input pipeline makes every other rank wait at the next "
            "collective.",
        ),
        Panel(
            "MFU by rank",
            (
                Target(
                    f"sum by ({rank_key}) (rate({select(T.MODEL_FLOPS, m)}[{ri}]))\n/\n"
                    f"sum by ({rank_key}) ({select(T.PEAK_FLOPS, m)})",
                    "{{run}} rank {{rank}}",
                ),
            ),
            unit="percentunit",
            min=0,
            width=12,
            description="Model FLOP/s of each rank over its device's dense peak. Ranks of a lockstep job sit "
            "together; one apart does less work per step (uneven sharding) or runs alone.",
        ),
        Panel(
            "Step time p50 / p90 (rank 0)",
            (
                Target(rec(r.step_quantile(0.5), f), "{{run}} p50"),
                Target(rec(r.step_quantile(0.9), f), "{{run}} p90"),
            ),
            unit="s",
            min=0,
            width=24,
            description="A p90 far above p50 means some steps are slow (a straggling rank delays every "
            "rank's step in a lockstep job; the ratio panel above names it).",
        ),
    ]
    return Dashboard(
        title="babysitter / Stragglers",
        file_name=FILE_NAME,
        description="Per-rank step time as a heatmap and as a ratio to the median rank, with the hosts "
        "of the slowest ranks; collective lag and straggler scores from torch's flight recorder (which "
        "lockstep step times cannot show), the culprit of the last hang, and the usual causes.",
        variables=run_variables(cfg),
        items=tuple(items),
    )
