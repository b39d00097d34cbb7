"""A page keeps the team it was sent to: TrainingStalled (and TrainingMfuDrop) hold the ``team`` they
fired with while they fire, though the run's likely team changes meanwhile.

The campaign (benchmarks/results/campaign.md) saw a hang paged to infra, then 4 s later resolved there
and paged again to the training team: ``team`` is part of an alert's identity, and the likely cause
moved during the hang. Here promtool evaluates the generated alert rules over hand-made recording
rule series (the alert file alone), so that the likely team flips exactly when the test says.
"""

from __future__ import annotations

import json
from pathlib import Path

from babysitter.generate import GenerateConfig
from babysitter.generate.writer import render, write
from gen_helpers import promtool, require_promtool

RUN = {"cluster": "c1", "run": "r1"}


def _series(name: str, **labels: str) -> str:
    inner = ", ".join(f'{k}="{v}"' for k, v in {**RUN, **labels}.items())
    return f"{name}{{{inner}}}"


RANK = {"rank": "0", "instance": "n1:9400", "job": "babysitter-node"}


def _stall_pages(
    tmp_path: Path, stops_at: int, teams: list[tuple[str, str]], team: str, at: list[str]
) -> None:
    """promtool over the generated alert file: r1 stops stepping at ``stops_at`` minutes, its likely
    team series are ``teams`` ((team, promtool values)); TrainingStalled fires with ``team`` at ``at``."""
    require_promtool()
    write(tmp_path, render(GenerateConfig()))
    left = 30 - stops_at
    test = {
        "rule_files": ["babysitter-alerts.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {
                        "series": _series("train_stalled_seconds", **RANK),
                        "values": f"0+0x{stops_at} 60+60x{left}",
                    },
                    {
                        "series": _series("run:train_last_step_timestamp_seconds:max"),
                        "values": f"0+60x{stops_at} {60 * stops_at}+0x{left}",
                    },
                    {"series": _series("run:train_step_duration_seconds:mean1h"), "values": "1+0x30"},
                    *(
                        {"series": _series("run:train_mfu_ratio:likely_team", team=name), "values": values}
                        for name, values in teams
                    ),
                ],
                "promql_expr_test": [
                    {
                        "expr": 'ALERTS{alertname="TrainingStalled", alertstate="firing"}',
                        "eval_time": t,
                        "exp_samples": [
                            {
                                "labels": (
                                    'ALERTS{alertname="TrainingStalled", alertstate="firing", cluster="c1", '
                                    f'component="training", run="r1", severity="critical", team="{team}"}}'
                                ),
                                "value": 1,
                            }
                        ],
                    }
                    for t in at
                ],
            }
        ],
    }
    (tmp_path / "alerts/case.yaml").write_text(json.dumps(test))
    result = promtool(["test", "rules", "case.yaml"], tmp_path / "alerts")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


def test_a_stall_keeps_the_team_it_paged(tmp_path: Path) -> None:
    # r1 stops stepping at 10m: its stall clock passes the 60 s minimum at 12m. Its likely team is
    # infra until 17m, then training: the page keeps infra.
    teams = [("infra", "1+0x16 stale"), ("training", "_x17 1+0x13")]
    _stall_pages(tmp_path, 10, teams, "infra", ["16m", "20m", "29m"])


def test_a_stall_pages_after_a_prometheus_restart_left_two_likely_teams(tmp_path: Path) -> None:
    """A Prometheus that restarts never marks its old rule outputs stale: for 5 m the run has two
    likely-team series, and the team join failed to evaluate (many-to-many), so the stall paged nobody
    (the campaign's restarted Prometheus, benchmarks/results/campaign.md). The newest series holds."""
    # Before the restart at 13m: infra, never marked stale (it lingers to 17m); after it: training.
    # r1 stops stepping at 14m, after the restart: stalled past the 60 s minimum at 16m.
    teams = [("infra", "1+0x12"), ("training", "_x13 1+0x17")]
    _stall_pages(tmp_path, 14, teams, "training", ["16m", "20m"])
