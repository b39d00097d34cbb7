"""The fail-slow alert: a run that loses a share of its time to slow steps for a sustained window.

A warning (chat), not a page: the run still makes progress, only slower; the likely cause
(``generate/rules_slowdown.py``) is named in the notification when there is one.
"""

from __future__ import annotations

from babysitter.catalog import goodput as G
from babysitter.catalog import node as N
from babysitter.catalog import runtime as R
from babysitter.catalog import train as T
from babysitter.generate.alerts._common import (
    _TRAIN,
    _VP,
    Alert,
    AlertTest,
    _l,
    _run_labels,
    _series,
    _with,
)
from babysitter.generate.config import GenerateConfig
from babysitter.generate.rules import Records
from babysitter.generate.rules_slowdown import slowdown_cause_text

__all__ = ["slowdown_alerts"]


def slowdown_alerts(cfg: GenerateConfig, r: Records) -> list[Alert]:
    """``TrainingSlowdown``."""
    s, c = r.slowdown, cfg.cluster_label
    cause = slowdown_cause_text(s, c)
    gpu = {"cluster": "c1", "instance": "h2:9400", "job": "gpu", "gpu": "1", "pci_bus_id": "0000:28:00"}
    gpu |= {"uuid": "GPU-b2", "model": "NVIDIA H100 80GB HBM3"}
    return [
        Alert(
            name="TrainingSlowdown",
            expr=f"{s.ratio} > {cfg.slowdown_share:g}",
            severity="warning",
            component="training",
            summary=f"Run {_l('run')} lost {_VP} of its time to slow steps over {cfg.slowdown_window}"
            f"{cause}.",
            description=(
                f"Run {_l('run')} on cluster {_l(c)} spent {_VP} of the last {cfg.slowdown_window} in step "
                f"time beyond its ideal step time (badput cause slowdown; alert above "
                f"{cfg.slowdown_share:.0%}){cause}. `babysitter report RUN_DIR --prometheus URL` splits it "
                f"by cause and names the slow stretches."
            ),
            for_=cfg.slowdown_for,
            test=AlertTest(
                series=(
                    # r1 loses 12 s a minute (20%) to slow steps: its rank 2 straggles (score 1.4) on a
                    # GPU that throttles (host h2). r2 loses 3 s a minute (5%): under the threshold.
                    (_series(G.BADPUT_SECONDS, _with(_TRAIN, cause="slowdown")), "0+12x60"),
                    (_series(G.BADPUT_SECONDS, _with(_TRAIN, run="r2", cause="slowdown")), "0+3x60"),
                    *(
                        (_series(T.STEPS, _with(_TRAIN, rank=n)), "0+60x60")
                        for n in "012"  # the run's three ranks
                    ),
                    *(
                        (_series(R.STRAGGLER_SCORE, _with(_TRAIN, rank=n)), f"{v}+0x60")
                        for n, v in (("0", "1"), ("1", "1"), ("2", "1.4"))
                    ),
                    (_series(T.INFO, _with(_TRAIN, rank="2", uuid="GPU-b2")), "1+0x60"),
                    (_series(N.GPU_UP, gpu), "1+0x60"),
                    (_series(N.GPU_CLOCK_EVENT_ACTIVE, {**gpu, "reason": "hw_thermal_slowdown"}), "1+0x60"),
                ),
                # At 15m the 30m window holds 180 s of 1800: 10%, not above it yet; at 25m 15 minutes
                # above it have not passed.
                quiet=(("15m", "10% of the window: at the threshold"), ("25m", "before for:")),
                fire_at="35m",
                fire_labels=(_run_labels(),),
                fire_text=(
                    (
                        "Run r1 lost 20% of its time to slow steps over 30m: likely gpu throttling of "
                        "rank 2 on host h2:9400.",
                        "Run r1 on cluster c1 spent 20% of the last 30m in step time beyond its ideal step "
                        "time (badput cause slowdown; alert above 10%): likely gpu throttling of rank 2 "
                        "on host h2:9400. `babysitter report RUN_DIR --prometheus URL` splits it by cause "
                        "and names the slow stretches.",
                    ),
                ),
            ),
        )
    ]
