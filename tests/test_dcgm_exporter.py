"""dcgm-exporter mode: real dcgm-exporter exposition text, scraped by a real Prometheus that evaluates
the generated mapping rules, recording rules and alerts.

Target A serves ``tests/data/dcgm-exporter/rtx6000ada.prom`` (recorded by NVIDIA's AIPerf, see its
header). Target B serves the same text with three changes made here, each to exercise one rule: another
UUID (a second GPU), a bus id with hex letters (``00000000:AB:00.0``, to check the lower-casing), and
the memory temperature line of NVIDIA's dcgm-exporter README (value 9223372036854775794, DCGM's
"not supported" blank). A third target serves a rank's ``train_info`` naming GPU A.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from babysitter.catalog import node as N
from babysitter.catalog import train as T
from babysitter.generate import GenerateConfig
from babysitter.generate.dcgm import DCGM_DROPPED_LABELS
from babysitter.generate.rules import Records
from babysitter.generate.writer import ALERT_RULES, DCGM_RULES, RECORDING_RULES, render, write
from promkit import PrometheusServer

pytestmark = pytest.mark.prometheus

FIXTURE = Path(__file__).parent / "data/dcgm-exporter/rtx6000ada.prom"
UUID_A = "GPU-ef6ef310-f8e2-cef9-036e-8f12d59b5ffc"
UUID_B = "GPU-ef6ef310-f8e2-cef9-036e-8f12d59b5ffd"
MODEL = "NVIDIA RTX 6000 Ada Generation"
XID_LINE_A = 'Hostname="ed7e7a5e585f"} 0\n# HELP DCGM_FI_DEV_POWER_VIOLATION'


class _Text:
    """A loopback HTTP server answering every GET with ``body`` (changeable while it runs)."""

    def __init__(self, body: str) -> None:
        self.body = body
        text = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                data = text.body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.target = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _variant_b(real: str) -> str:
    body = real.replace(UUID_A, UUID_B).replace("00000000:02:00.0", "00000000:AB:00.0")
    labels = f'gpu="0",UUID="{UUID_B}",pci_bus_id="00000000:AB:00.0",device="nvidia0",modelName="{MODEL}"'
    return body + f'DCGM_FI_DEV_MEMORY_TEMP{{{labels},Hostname="ed7e7a5e585f"}} 9223372036854775794\n'


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrometheusServer, _Text, _Text]]:
    tmp = tmp_path_factory.mktemp("dcgm")
    # The paging groups evaluate every 15 s in production; this Prometheus evaluates every second.
    write(tmp / "gen", render(GenerateConfig(page_eval_interval="1s")))
    real = FIXTURE.read_text()
    assert XID_LINE_A in real
    a, b = _Text(real), _Text(_variant_b(real))
    rank = _Text(f'{T.INFO.name}{{run="r",rank="0",uuid="{UUID_A}",pci_bus_id="0000:02:00"}} 1\n')
    rules = [tmp / "gen" / rel for rel in (DCGM_RULES, RECORDING_RULES, ALERT_RULES)]
    try:
        with PrometheusServer(tmp, targets=[a.target, b.target, rank.target], rule_files=rules) as prom:
            yield prom, a, b
    finally:
        for server in (a, b, rank):
            server.close()


def test_mapped_series_carry_the_node_agents_names_units_and_labels(
    stack: tuple[PrometheusServer, _Text, _Text],
) -> None:
    """SM clock in Hz, memory in bytes, energy in J, utilization as a ratio; uuid/model/pci_bus_id."""
    prom, a, _ = stack
    sel = f'uuid="{UUID_A}", pci_bus_id="0000:02:00", model="{MODEL}", gpu="0", instance="{a.target}"'
    prom.wait_for(f"{N.GPU_SM_CLOCK.name}{{{sel}}} == 210e6")
    # Each mapped name is its own recording rule: under load the first evaluations land apart.
    for spec in (N.GPU_MEMORY_USED, N.GPU_MEMORY_TOTAL, N.GPU_ENERGY, N.GPU_UTILIZATION, N.GPU_POWER):
        prom.wait_for(f"{spec.name}{{{sel}}}")
    for spec in (N.GPU_POWER_LIMIT, N.GPU_UP):
        prom.wait_for(f"{spec.name}{{{sel}}}")
    assert prom.query_value(f"{N.GPU_MEMORY_USED.name}{{{sel}}}") == 46614 * 1024**2
    assert prom.query_value(f"{N.GPU_MEMORY_TOTAL.name}{{{sel}}}") == 48662 * 1024**2
    assert prom.query_value(f"{N.GPU_ENERGY.name}{{{sel}}}") == pytest.approx(955287.014)
    assert prom.query_value(f"{N.GPU_UTILIZATION.name}{{{sel}}}") == pytest.approx(0.01)
    assert prom.query_value(f"{N.GPU_POWER.name}{{{sel}}}") == pytest.approx(22.582)
    assert prom.query_value(f"{N.GPU_POWER_LIMIT.name}{{{sel}}}") == 300.0
    assert prom.query_value(f"{N.GPU_TEMPERATURE.name}{{{sel}}}") is None  # not in this recording
    assert prom.query_value(f"{N.GPU_UP.name}{{{sel}}}") == 1.0  # from the fields it reads
    labels = set(prom.query(f"{N.GPU_SM_CLOCK.name}{{{sel}}}")[0]["metric"])
    assert labels == {"__name__", "instance", "job", *N.GPU_LABELS}
    assert not labels & set(DCGM_DROPPED_LABELS)


def test_bus_id_lower_cased_and_blank_values_dropped(stack: tuple[PrometheusServer, _Text, _Text]) -> None:
    """00000000:AB:00.0 becomes 0000:ab:00 (the agent's spelling); DCGM's blank memory temperature is
    not mapped to a temperature of 9.2e18 degrees."""
    prom, _, b = stack
    prom.wait_for(f'{N.GPU_SM_CLOCK.name}{{uuid="{UUID_B}", pci_bus_id="0000:ab:00"}} == 210e6')
    assert prom.query(f'{{__name__=~"gpu_.*", uuid="{UUID_B}", pci_bus_id!="0000:ab:00"}}') == []
    assert prom.query(f'{N.GPU_TEMPERATURE.name}{{instance="{b.target}"}}') == []


def test_an_xid_pages_with_its_action_and_joins_to_the_rank(
    stack: tuple[PrometheusServer, _Text, _Text],
) -> None:
    """Xid 79 appearing in DCGM_FI_DEV_XID_ERRORS fires GpuXidCritical (action reboot, from the agent's Xid
    catalog) for that GPU, and the rank on it sees the Xid and its SM clock through the uuid join."""
    prom, a, _ = stack
    r = Records(GenerateConfig())
    prom.wait_for(f'{N.GPU_SM_CLOCK.name}{{uuid="{UUID_A}"}}')
    assert prom.query(N.GPU_XID_ERRORS.name) == []  # 0 means no Xid yet
    prom.wait_for(
        f'{r.rank_gpu_sm_clock}{{run="r", rank="0", uuid="{UUID_A}", instance="{a.target}"}} == 210e6'
    )
    a.body = a.body.replace(XID_LINE_A, XID_LINE_A.replace("} 0\n", "} 79\n"))
    prom.wait_for(f'{N.GPU_XID_ERRORS.name}{{uuid="{UUID_A}", xid="79", action="reboot"}} == 1')
    fired = prom.wait_for(
        f'ALERTS{{alertname="GpuXidCritical", alertstate="firing", uuid="{UUID_A}", xid="79"}}', timeout=30
    )
    assert fired[0]["metric"]["pci_bus_id"] == "0000:02:00"
    prom.wait_for(f'{r.rank_gpu_xid_new}{{run="r", rank="0"}} == 1')
    assert prom.query(f'ALERTS{{alertname="GpuXidError", uuid="{UUID_A}"}}') == []


def _promtool_case(
    tmp_path: Path, cfg: GenerateConfig, series: list[tuple[str, str]], expect: dict[str, list]
) -> str:
    """promtool's verdict on the mapping rules of ``cfg`` over ``series`` (evaluated at 2m)."""
    from babysitter.generate.dcgm import dcgm_groups
    from babysitter.generate.yamlout import dump
    from gen_helpers import promtool, require_promtool

    require_promtool()
    (tmp_path / "rules.yaml").write_text(
        dump({"groups": dcgm_groups(cfg, {79: "reboot", 13: "restart_app"})})
    )
    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": name, "values": values} for name, values in series],
                "promql_expr_test": [
                    {"expr": expr, "eval_time": "2m", "exp_samples": samples}
                    for expr, samples in expect.items()
                ],
            }
        ],
    }
    (tmp_path / "test.yaml").write_text(dump(tests))
    result = promtool(["test", "rules", "test.yaml"], cwd=tmp_path)
    return result.stdout + result.stderr


_GPU = 'gpu="1", UUID="GPU-x", pci_bus_id="00000000:1B:00.0", modelName="NVIDIA H100 80GB HBM3", Hostname="h"'
_OUT = {"gpu": "1", "uuid": "GPU-x", "pci_bus_id": "0000:1b:00", "model": "NVIDIA H100 80GB HBM3"}


def _labels(**extra: str) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in {**_OUT, **extra}.items()) + "}"


def test_clock_event_bitmask_ecc_and_exp_xids(tmp_path: Path) -> None:
    """Fields outside the recording: the clock-event bitmask (both DCGM names) split into the agent's
    reasons, ECC counters by type and scope, and DCGM_EXP_XID_ERRORS_COUNT's xid label (``exp`` mode)."""
    series = [
        # hw_slowdown (0x8) and hw_thermal_slowdown (0x40); the old field name on another GPU: sw_power_cap.
        (f"DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{_GPU}}}", "72x3"),
        (
            'DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{gpu="2", UUID="GPU-y", pci_bus_id="00000000:2C:00.0", modelName="m"}',
            "4x3",
        ),
        (f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{_GPU}}}", "0 0 3 3"),
        (f'DCGM_EXP_XID_ERRORS_COUNT{{{_GPU}, xid="79"}}', "_ 2 2 2"),
    ]
    reason = N.GPU_CLOCK_EVENT_ACTIVE.name
    expect: dict[str, list] = {
        f'{reason}{{uuid="GPU-x"}}': [
            {"labels": f"{reason}" + _labels(reason=name), "value": value}
            for name, value in (
                ("sw_power_cap", 0),
                ("hw_slowdown", 1),
                ("sw_thermal_slowdown", 0),
                ("hw_thermal_slowdown", 1),
                ("hw_power_brake_slowdown", 0),
            )
        ],
        f'{reason}{{uuid="GPU-y", reason="sw_power_cap"}}': [
            {
                "labels": f'{reason}{{gpu="2", uuid="GPU-y", pci_bus_id="0000:2c:00", model="m", reason="sw_power_cap"}}',
                "value": 1,
            }
        ],
        N.GPU_ECC_ERRORS.name: [
            {"labels": N.GPU_ECC_ERRORS.name + _labels(type="uncorrected", scope="volatile"), "value": 3}
        ],
        N.GPU_XID_ERRORS.name: [
            {"labels": N.GPU_XID_ERRORS.name + _labels(xid="79", action="reboot"), "value": 1}
        ],
    }
    verdict = _promtool_case(tmp_path, GenerateConfig(dcgm_xid_source="exp"), series, expect)
    assert "SUCCESS" in verdict, verdict
