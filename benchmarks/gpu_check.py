"""The GPU check: every test marked ``gpu`` on a real NVIDIA GPU, and a short report of what it measured.

    make gpu-check                      # or: PYTHONPATH=src python benchmarks/gpu_check.py

On a machine without an NVIDIA GPU it prints why and exits 0, writing nothing. On a GPU machine it
runs ``pytest -m gpu`` (the NVML collector against ``nvidia-smi -q -x``, CUDA-event step times against
synchronized timing, sync debug mode over a tracked loop and the Lightning and Hugging Face callbacks,
``babysitter probe`` against a plain matmul loop, the replica fingerprint on CUDA (no sync, equal to the
CPU's, its cost per check against a training step) and every step's CUDA loss read without a sync
(``tests/test_gpu_integrity.py``), ProcessGroupNCCL's flight recorder read on a one-rank NCCL group:
its dump API, fields and GPU durations; none yet run on hardware), collects the numbers each test
recorded and writes ``benchmarks/results/gpu.md`` with the machine. Exit status: 0 when every check
passed, 1 otherwise. It is sized to finish within 8 minutes on one GPU (``--budget``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "gpu.md"
RESULTS_ENV = "BABYSITTER_GPU_RESULTS"


def skip_reason() -> str | None:
    """Why the check cannot run here (None when it can)."""
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA GPU: nvidia-smi is not on PATH"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    return None


def machine(smi_xml: str) -> dict[str, str]:
    """The machine, as the report records it (no host name: reports are committed)."""
    import torch

    out: dict[str, str] = {}
    try:
        root = ET.fromstring(smi_xml)  # noqa: S314  # nvidia-smi's own output
        gpus = root.findall("gpu")
        out["gpus"] = ", ".join(sorted({(g.findtext("product_name") or "?").strip() for g in gpus}))
        out["gpu count"] = str(len(gpus))
        out["driver"] = (root.findtext("driver_version") or "").strip()
        out["CUDA (driver)"] = (root.findtext("cuda_version") or "").strip()
        if gpus:
            out["memory"] = (gpus[0].findtext("fb_memory_usage/total") or "").strip()
            out["power limit"] = (
                gpus[0].findtext("gpu_power_readings/current_power_limit")
                or gpus[0].findtext("power_readings/power_limit")
                or ""
            ).strip()
            out["MIG mode"] = (gpus[0].findtext("mig_mode/current_mig") or "").strip()
    except ET.ParseError as exc:
        out["nvidia-smi"] = f"unparseable XML: {exc}"
    out["commit"] = _commit()
    out["torch"] = f"{torch.__version__} (CUDA {torch.version.cuda})"
    from importlib import metadata

    for package in ("lightning", "transformers", "nvidia-ml-py"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = "not installed"
    out["python"] = platform.python_version()
    out["kernel"] = platform.release()
    out["CPU"] = _cpu_model()
    out["CPU cores"] = str(os.cpu_count())
    return out


def _commit() -> str:
    """The checkout's commit, ``+dirty`` when it has changes (``unknown`` outside a git checkout)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    return head + ("+dirty" if dirty else "")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def gpu_test_files() -> list[str]:
    """The test modules that hold tests marked ``gpu`` (relative to the repository)."""
    out = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        text = path.read_text()
        if "requires_gpu" in text or "mark.gpu" in text:
            out.append(str(path.relative_to(ROOT)))
    return out


def junit_results(path: Path) -> list[dict[str, Any]]:
    """One dict per test case of a JUnit XML file: name, outcome, seconds, message."""
    if not path.exists():
        return []
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):  # noqa: S314  # pytest's own output
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (node.get("message") or node.text or "").strip()
                break
        out.append(
            {
                "name": f"{case.get('classname', '')}::{case.get('name', '')}",
                "outcome": outcome,
                "seconds": float(case.get("time") or 0.0),
                "message": message,
            }
        )
    return out


def read_records(path: Path) -> list[dict[str, Any]]:
    """The JSON lines the tests recorded (a torn last line, from a test killed mid-write, is skipped)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return "; ".join(f"{k}: {_fmt(v)}" for k, v in value.items()) or "—"
    if isinstance(value, list):
        return "<br>".join(_fmt(v) for v in value) or "—"
    return str(value).replace("|", "\\|").replace("\n", " ")


def render(
    *,
    when: str,
    machine_info: dict[str, str],
    tests: list[dict[str, Any]],
    records: list[dict[str, Any]],
    wall_seconds: float,
    command: str,
    note: str = "",
) -> str:
    """The Markdown report."""
    failed = [t for t in tests if t["outcome"] in ("failed", "error")]
    lines = [
        "# GPU check",
        "",
        f"Run {when} with `{command}`; {len(tests)} tests, {len(failed)} failed, "
        f"{sum(t['outcome'] == 'skipped' for t in tests)} skipped; {wall_seconds:.0f} s in all.",
        "Written by `benchmarks/gpu_check.py`; every number below was measured in that run.",
        "",
        "## Machine",
        "",
        "| | |",
        "|---|---|",
        *(f"| {k} | {_fmt(v)} |" for k, v in machine_info.items()),
        "",
        "## Tests",
        "",
        "| test | outcome | seconds | message |",
        "|---|---|---|---|",
        *(
            f"| `{t['name']}` | {t['outcome']} | {t['seconds']:.1f} | {_fmt(t['message'][:300])} |"
            for t in tests
        ),
        "",
        "## Measurements",
        "",
    ]
    if note:
        lines[4:4] = [note, ""]
    if not records:
        lines.append("No test recorded a measurement.")
    for rec in records:
        lines += [f"### {rec.get('check', '?')}", "", "| | |", "|---|---|"]
        lines += [f"| {k} | {_fmt(v)} |" for k, v in rec.items() if k != "check"]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"the report (default {DEFAULT_OUT})")
    parser.add_argument(
        "--artifacts", type=Path, default=None, help="also keep nvidia-smi XML, the log, JUnit"
    )
    parser.add_argument(
        "--budget", type=float, default=480.0, help="seconds for the whole check (default 480)"
    )
    parser.add_argument(
        "-k", dest="keyword", default=None, help="only tests matching this pytest -k expression"
    )
    args = parser.parse_args(argv)

    reason = skip_reason()
    if reason is not None:
        print(f"gpu-check: skipped: {reason}. Nothing was run or written.")
        return 0
    t0 = time.monotonic()
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    smi = subprocess.run(
        ["nvidia-smi", "-q", "-x"], check=False, capture_output=True, text=True, timeout=60
    ).stdout
    info = machine(smi)
    print("gpu-check: " + ", ".join(f"{k} {v}" for k, v in info.items()), flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        junit, results, log_path = work / "junit.xml", work / "records.jsonl", work / "pytest.log"
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-m",
            "gpu",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rA",
            f"--junitxml={junit}",
            # A test module that cannot be imported on this machine (an optional package missing)
            # must not stop the GPU tests: only the files holding them are collected.
            "--continue-on-collection-errors",
            *gpu_test_files(),
        ]
        if args.keyword:
            cmd += ["-k", args.keyword]
        import importlib.util

        if importlib.util.find_spec("pytest_timeout") is not None:
            cmd.append(f"--timeout={int(max(60, args.budget / 2))}")
        env = {**os.environ, RESULTS_ENV: str(results), "PYTHONUNBUFFERED": "1"}
        src = str(ROOT / "src")
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        with log_path.open("w") as log:
            proc = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            assert proc.stdout is not None
            # A silent hang must not outlive the budget: a timer kills the run, the report still comes.
            killer = threading.Timer(max(1.0, t0 + args.budget - 15 - time.monotonic()), proc.kill)
            killer.start()
            for line in proc.stdout:
                sys.stdout.write(line)
                log.write(line)
            rc = proc.wait()
            killer.cancel()
        note = ""
        if rc < 0:
            note = f"**The test run was stopped at the {args.budget:.0f} s budget; the list is partial.**"
        tests = junit_results(junit)
        records = read_records(results)
        wall = time.monotonic() - t0
        report = render(
            when=when,
            machine_info=info,
            tests=tests,
            records=records,
            wall_seconds=wall,
            command="make gpu-check",
            note=note,
        )
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)
        if args.artifacts is not None:
            args.artifacts.mkdir(parents=True, exist_ok=True)
            (args.artifacts / "nvidia-smi-q-x.xml").write_text(smi)
            for path in (junit, results, log_path):
                if path.exists():
                    shutil.copy(path, args.artifacts / path.name)
    ok = rc == 0 and not note and tests and all(t["outcome"] in ("passed", "skipped") for t in tests)
    print(f"gpu-check: {'passed' if ok else 'FAILED'} in {wall:.0f} s; report: {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
