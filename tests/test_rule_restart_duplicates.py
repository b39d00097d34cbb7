"""Recording rules whose consumers join one labelled series per run hold up across a Prometheus restart.

A Prometheus that restarts has forgotten the series its rules wrote before, so it never marks them
stale when their label changes: for the lookback (5 m) a run has two. The campaign's restarted
Prometheus failed TrainingMfuDrop and the slowdown-by-cause rule so, many-to-many, for 5 minutes
(benchmarks/results/campaign.md). The stall's team join is in test_alert_team_held.py; here the
GPU-seconds lost per cause, promtool evaluating the one rule over hand-made inputs.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from babysitter.generate import GenerateConfig
from babysitter.generate.rules import Records
from babysitter.generate.rules_slowdown import slowdown_rules
from gen_helpers import promtool, require_promtool


def test_the_slowdown_by_cause_follows_the_newest_cause(tmp_path: Path) -> None:
    require_promtool()
    cfg = GenerateConfig()
    r = Records(cfg)
    s = r.slowdown
    rule = next(x for x in slowdown_rules(cfg, r, s) if x["record"] == s.gpu_rate_by_cause)
    (tmp_path / "rule.yaml").write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [rule]}]}))
    run = 'cluster="c1", run="r1"'
    test = {
        "rule_files": ["rule.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    # Two ranks, each losing 6 s a minute to slow steps.
                    *(
                        {
                            "series": f'train_badput_seconds_total{{{run}, rank="{k}", cause="slowdown"}}',
                            "values": "0+6x30",
                        }
                        for k in (0, 1)
                    ),
                    {"series": f"{s.ranks}{{{run}}}", "values": "2+0x30"},
                    # Before the restart at 13m: a straggler, never marked stale (it lingers to 17m).
                    {
                        "series": f'{s.cause}{{{run}, slowdown_cause="straggler", rank="1"}}',
                        "values": "1+0x12",
                    },
                    # After it: nothing names a cause.
                    {"series": f'{s.cause}{{{run}, slowdown_cause="unknown"}}', "values": "_x13 1+0x17"},
                ],
                "promql_expr_test": [
                    {
                        "expr": f"count by (slowdown_cause) ({s.gpu_rate_by_cause})",
                        "eval_time": at,
                        "exp_samples": [{"labels": f'{{slowdown_cause="{cause}"}}', "value": 1}],
                    }
                    for at, cause in (("10m", "straggler"), ("15m", "unknown"), ("20m", "unknown"))
                ],
            }
        ],
    }
    (tmp_path / "test.yaml").write_text(json.dumps(test))
    result = promtool(["test", "rules", "test.yaml"], tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
