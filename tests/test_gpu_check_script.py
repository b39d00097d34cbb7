"""``make gpu-check`` off a GPU machine, and the report it writes from pytest's own JUnit output."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from gpu_helpers import GPU_SKIP_REASON, parse_smi_xml

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(GPU_SKIP_REASON is None, reason="this machine has a GPU: the check would run for real")
def test_without_a_gpu_it_says_why_exits_0_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "gpu.md"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--artifacts", str(tmp_path / "a")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "gpu-check: skipped:" in proc.stdout
    # The same reason the GPU tests give when they skip.
    assert GPU_SKIP_REASON.split(": ", 1)[1] in proc.stdout
    assert not out.exists() and not (tmp_path / "a").exists()


def test_report_lists_each_test_outcome_and_each_recorded_measurement(tmp_path: Path) -> None:
    """A real pytest run of three tests (pass, fail, skip) and two recorded measurements."""
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n"
        "def test_ok():\n    pass\n"
        "def test_bad():\n    assert 1 == 2, 'off by one'\n"
        "@pytest.mark.skip(reason='no device here')\n"
        "def test_skipped():\n    pass\n"
    )
    junit = tmp_path / "junit.xml"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={junit}",
            "test_sample.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        timeout=120,
        check=False,
    )
    records = tmp_path / "records.jsonl"
    records.write_text(
        json.dumps({"check": "step_timing", "sum_error": 0.00123, "steps": 60})
        + "\n"
        + json.dumps({"check": "probe_matmul", "ratio": 0.987, "where": ["a.py:1", "b.py:2"]})
        + "\n"
        + '{"check": "torn'  # a test killed mid-write leaves a torn line: skipped
    )
    gpu_check = _script()
    tests = gpu_check.junit_results(junit)
    outcomes = {t["name"].split("::")[-1]: t["outcome"] for t in tests}
    assert outcomes == {"test_ok": "passed", "test_bad": "failed", "test_skipped": "skipped"}
    recs = gpu_check.read_records(records)
    assert [r["check"] for r in recs] == ["step_timing", "probe_matmul"]
    report = gpu_check.render(
        when="2026-12-01 00:00 UTC",
        machine_info={"gpus": "NVIDIA H200", "driver": "580.1"},
        tests=tests,
        records=recs,
        wall_seconds=12.3,
        command="make gpu-check",
    )
    assert "3 tests, 1 failed, 1 skipped" in report
    assert "| NVIDIA H200 |" in report
    assert "| `test_sample::test_bad` | failed |" in report and "off by one" in report
    assert "### step_timing" in report and "| sum_error | 0.00123 |" in report
    assert "| where | a.py:1<br>b.py:2 |" in report


def test_smi_parser_reads_both_ecc_layouts_and_clock_event_tags() -> None:
    new = """<nvidia_smi_log><driver_version>580.1</driver_version><cuda_version>13.0</cuda_version>
    <gpu id="00000000:01:00.0"><product_name>NVIDIA H200</product_name><uuid>GPU-1</uuid>
    <pci><pci_bus_id>00000000:01:00.0</pci_bus_id><replay_counter>3</replay_counter></pci>
    <clocks_event_reasons><clocks_event_reason_gpu_idle>Active</clocks_event_reason_gpu_idle>
    <clocks_event_reason_display_clocks_setting>Not Active</clocks_event_reason_display_clocks_setting>
    </clocks_event_reasons>
    <fb_memory_usage><total>143771 MiB</total><reserved>555 MiB</reserved><used>1 MiB</used></fb_memory_usage>
    <ecc_errors><volatile><sram_correctable>2</sram_correctable><sram_uncorrectable_parity>1</sram_uncorrectable_parity>
    <sram_uncorrectable_secded>0</sram_uncorrectable_secded><dram_correctable>5</dram_correctable>
    <dram_uncorrectable>N/A</dram_uncorrectable></volatile></ecc_errors>
    <temperature><gpu_temp>31 C</gpu_temp><memory_temp>N/A</memory_temp></temperature>
    <remapped_rows><remapped_row_pending>No</remapped_row_pending></remapped_rows>
    </gpu></nvidia_smi_log>"""
    info, (gpu,) = parse_smi_xml(new)
    assert info == {"driver_version": "580.1", "cuda_version": "13.0"}
    assert gpu.bus_id == "00000000:01:00.0" and gpu.text("uuid") == "GPU-1"
    assert gpu.number("fb_memory_usage/total") == 143771.0
    assert gpu.number("temperature/gpu_temp") == 31.0 and gpu.number("temperature/memory_temp") is None
    assert gpu.number("pci/replay_counter") == 3.0
    assert gpu.flag("remapped_rows/remapped_row_pending") is False
    assert gpu.clock_events() == {"gpu_idle": True, "display_clock_setting": False}
    assert gpu.ecc("volatile") == {"corrected": 7.0, "uncorrected": 1.0}
    assert gpu.ecc("aggregate") is None
    old = """<nvidia_smi_log><gpu id="0000:3B:00.0"><ecc_errors><aggregate>
    <single_bit><device_memory>4</device_memory><total>4</total></single_bit>
    <double_bit><device_memory>0</device_memory><total>0</total></double_bit></aggregate></ecc_errors>
    <clocks_throttle_reasons><clocks_throttle_reason_hw_slowdown>Active</clocks_throttle_reason_hw_slowdown>
    </clocks_throttle_reasons></gpu></nvidia_smi_log>"""
    _, (gpu,) = parse_smi_xml(old)
    assert gpu.ecc("aggregate") == {"corrected": 4.0, "uncorrected": 0.0}
    assert gpu.clock_events() == {"hw_slowdown": True}
    assert gpu.bus_id == "0000:3B:00.0"


def test_smi_readings_from_a_real_h200() -> None:
    """``nvidia-smi -q -x`` captured on an idle H200 (driver 580.159.04) by ``make gpu-check``: every
    reading the collector is compared with is found where it exists, and N/A where the GPU has none."""
    text = (ROOT / "tests" / "data" / "nvidia-smi" / "h200-580.159.04.xml").read_text()
    info, (gpu,) = parse_smi_xml(text)
    assert info == {"driver_version": "580.159.04", "cuda_version": "13.0"}
    assert gpu.text("product_name") == "NVIDIA H200" and gpu.bus_id == "00000000:00:06.0"
    r = gpu.readings()
    assert (r["memory_total_mib"], r["memory_reserved_mib"], r["memory_used_mib"]) == (143771, 616, 4)
    assert (r["power_w"], r["power_limit_w"]) == (78.82, 700.0)  # the average, not the instant draw
    assert (r["temp_gpu_c"], r["temp_memory_c"], r["sm_clock_mhz"], r["mem_clock_mhz"]) == (32, 34, 345, 3201)
    assert r["util_ratio"] == 0.0 and r["pcie_replays"] == 0.0
    events = {k.split(":", 1)[1]: v for k, v in r.items() if k.startswith("clock_event:")}
    assert events == {label: float(label == "gpu_idle") for label in events} and len(events) == 9
    assert all(
        r[f"ecc:{k}:{s}"] == 0.0 for k in ("corrected", "uncorrected") for s in ("volatile", "aggregate")
    )
    assert [r[f"remapped:{s}"] for s in ("correctable", "uncorrectable", "pending", "failure")] == [
        0,
        0,
        0,
        0,
    ]
    # Hopper remaps rows instead of retiring pages: nvidia-smi says N/A, and so must the parser.
    assert r["retired:double_bit_ecc"] is None and r["retired_pending"] is None
