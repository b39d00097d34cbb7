"""A real CPU training loop with watch(), scraped by a real Prometheus."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

import babysitter
from babysitter.catalog import goodput as G
from babysitter.catalog import train as T
from promkit import PrometheusServer
from tinygpt import TinyConfig, TinyGPT, batches, palm_flops_per_token, train_step

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

SEQ, BATCH = 32, 8


def test_promql_mfu_agrees_with_tracker_and_every_train_metric_is_exported(tmp_path: Path) -> None:
    """rate(train_model_flops_total[20s]) / train_peak_flops_per_second matches train_mfu_ratio within 5%,
    and every train_* family of the catalog reaches Prometheus."""
    torch.manual_seed(0)
    cfg = TinyConfig()
    model = TinyGPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fpt = palm_flops_per_token(model, SEQ)
    tracker = babysitter.watch(
        model,
        run="promql-mfu",
        tokens_per_step=BATCH * SEQ,
        samples_per_step=BATCH,
        flops_per_token=fpt,
        hardware_flops_per_token=fpt * 4 / 3,  # as if the forward were recomputed once
        peak_flops=2e10,
        port=0,
        run_dir=tmp_path / "run",
        labels={"cluster": "test-cluster"},
        mfu_window=20.0,
        flush_interval=0.2,
    )
    assert tracker.metrics_url is not None
    target = tracker.metrics_url.split("//", 1)[1].split("/", 1)[0]
    data = batches(cfg, BATCH, SEQ)
    try:
        with PrometheusServer(tmp_path, targets=[target], scrape_interval="1s") as prom:
            with tracker.checkpoint_load(step=0):
                pass
            # Train until Prometheus has scraped the target, then 23 s more, so that the
            # [20s] window holds steady-state steps only (rate() extrapolates poorly over a series
            # younger than its window).
            for x, y in tracker.data(data):
                tracker.step(loss=train_step(model, opt, x, y))
                if tracker.steps % 10 == 0 and prom.query(f"{T.STEPS.name} > 0"):
                    break
            deadline = time.monotonic() + 23
            for x, y in tracker.data(data):
                tracker.step(loss=train_step(model, opt, x, y))
                if time.monotonic() > deadline:
                    break
            loop_end = time.time()
            with tracker.phase("eval"):
                time.sleep(0.05)
            with tracker.checkpoint_save(step=tracker.global_step) as ckpt:
                ckpt.nbytes = 1000
            time.sleep(2.5)  # two more scrapes
            # The tracker's MFU is over the 20 s before the scrape that took it: PromQL's window is
            # made to end at that scrape, not up to a second later (0.202 against 0.236 was seen in a
            # CI run on a loaded machine with the windows offset so).
            scraped = prom.query_value(f"timestamp({T.MFU.name})", at=loop_end - 1.0)
            assert scraped is not None
            at = scraped + 0.001
            promql = prom.query_value(f"rate({T.MODEL_FLOPS.name}[20s]) / {T.PEAK_FLOPS.name}", at=at)
            tracker_mfu = prom.query_value(T.MFU.name, at=at)
            assert promql is not None and tracker_mfu is not None
            assert tracker_mfu > 0
            # A sample's timestamp is its scrape's start; its values are read when the tracker's
            # collector runs, up to the scrape's duration later (a loaded machine holds the exporter
            # thread off the GIL for a second: 0.219 against 0.233 was seen in CI so). Each end of
            # rate()'s 20 s window may be off by that much, so the bound grows by it.
            slowest = prom.query_value('max_over_time(scrape_duration_seconds{job="test"}[21s])', at=at)
            assert slowest is not None
            bound = 0.05 + 2 * slowest / 20.0
            assert abs(promql - tracker_mfu) / tracker_mfu < bound, (promql, tracker_mfu, slowest)
            hfu = prom.query_value(T.HFU.name)
            mfu = prom.query_value(T.MFU.name)
            assert hfu is not None and mfu is not None and hfu == pytest.approx(mfu * 4 / 3, rel=1e-6)

            names = {r["metric"]["__name__"] for r in prom.query('{__name__=~"train_.*"}')}
            exported = {n.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum") for n in names}
            # The checkpoint advice needs two saves and enough interruptions (or a cluster rate): this
            # run has neither, so those three are absent here; test_advisor.py shows them exported.
            advice = {G.CKPT_INTERVAL.name, G.CKPT_INTERVAL_RECOMMENDED.name, G.CKPT_EXPECTED_GOODPUT.name}
            expected = {
                spec.name for spec in (*T.METRICS, *G.METRICS) if spec.name.startswith("train_")
            } - advice
            assert not advice & exported, "advice without the data it needs"
            assert expected <= exported, sorted(expected - exported)
            labels = prom.query(T.STEPS.name)[0]["metric"]
            assert labels["run"] == "promql-mfu"
            assert labels["rank"] == "0"
            assert labels["cluster"] == "test-cluster"
    finally:
        tracker.close()
