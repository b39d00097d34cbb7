"""The fabric alerts' knobs that the committed promtool tests (default config) do not exercise: a port
slower than the rate expected for the host's SKU, when ``fabric_expected_rate_gbps`` is set."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from babysitter.catalog import fabric as F
from babysitter.generate.config import GenerateConfig
from babysitter.generate.writer import render, write
from gen_helpers import promtool, require_promtool


def _series(name: str, **labels: str) -> str:
    return name + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def test_a_port_below_the_expected_rate_fires_even_without_slower_peers(tmp_path: Path) -> None:
    """Expected 400 Gb/s: host n1's only port trained at 200 fires (no peer is faster); host n2's at 400
    stays quiet. With the default (0: peers only) neither would fire."""
    require_promtool()
    cfg = replace(GenerateConfig(), fabric_expected_rate_gbps=400.0)
    write(tmp_path, render(cfg))
    series = []
    for host, rate in (("n1:9400", "2.5e10"), ("n2:9400", "5e10")):
        port = {"cluster": "c1", "instance": host, "job": "babysitter-node", "device": "mlx5_0", "port": "1"}
        series += [
            {"series": _series(F.IB_PORT_RATE.name, **port), "values": f"{rate}+0x30"},
            {"series": _series(F.IB_PORT_STATE.name, **port), "values": "4+0x30"},
            {"series": _series(F.IB_PORT_INFO.name, **port, link_layer="InfiniBand"), "values": "1+0x30"},
        ]
    test = {
        "rule_files": ["babysitter-rules.yaml", "babysitter-alerts.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": "5m", "alertname": "InfinibandPortSlow", "exp_alerts": []},  # before for:
                    {
                        "eval_time": "20m",
                        "alertname": "InfinibandPortSlow",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "cluster": "c1",
                                    "instance": "n1:9400",
                                    "device": "mlx5_0",
                                    "port": "1",
                                    "link_layer": "InfiniBand",
                                    "severity": "warning",
                                    "component": "fabric",
                                },
                                "exp_annotations": {
                                    "summary": "Fabric port mlx5_0/1 on n1:9400 runs slower than it should.",
                                    "description": "mlx5_0 port 1 on n1:9400 (cluster c1) trained at 25GB/s, "
                                    "slower than the fastest active InfiniBand port of the host or below the "
                                    "expected 400 Gb/s, for 10m. Collectives through it run at its pace; reseat "
                                    "or replace the cable, or check the switch port's speed.",
                                    "runbook_url": cfg.runbook_url("InfinibandPortSlow"),
                                },
                            }
                        ],
                    },
                ],
            }
        ],
    }
    (tmp_path / "alerts/expected-rate.yaml").write_text(json.dumps(test))  # JSON is YAML
    result = promtool(["test", "rules", "expected-rate.yaml"], tmp_path / "alerts")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
