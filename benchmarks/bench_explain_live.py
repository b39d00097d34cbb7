"""``babysitter explain`` on live data: each fault injected alone into the real demo, explain asked why.

For every scenario below, ``babysitter demo`` runs as it does for a user (node agent with simulated
GPUs, the tiny GPT training on CPU with the tracker and its goodput ledger, Prometheus 2.42 with the
generated rules in the fast profile, Alertmanager), with ONE scripted fault (or two, for the
combinations, or none, for the control) at ``FAULT_AT`` seconds. Once the window after the fault has
passed (plus ``LAG`` seconds for the last scrape and rule evaluation), this script calls
:func:`babysitter.explain.explain` in-process against that live Prometheus, exactly as the demo's own
explainer does (``demo/explainer.py``: the demo's ``GenerateConfig``, run ``demo``, cluster ``demo``),
over ``[fault, fault + WINDOW]`` against the ``BASELINE`` seconds before it, and records the causes
ranked first and second. The demo then ends on its own (its scenario lasts ``FAULT_AT + WINDOW + TAIL``)
and the next scenario starts in a fresh work directory.

Everything binds to 127.0.0.1; every wait is bounded (a demo that overruns is sent SIGTERM, then
SIGKILL). About 100 s per scenario on a 2-core VM; all of them take about 18 minutes.

The newcomer's sequence (issue 22) is one more case: the demo's default scenario as ``babysitter
demo --keep`` plays it, then explain asked as a new user asked it at the end, with the CLI's defaults
(``--since 10m``, ``--since 2m --baseline 2m``, the rules' names read from the Prometheus), each
answer checked for agreeing with itself: its headline against what its causes account for, the
throttle the GPU was under (GpuThrottled firing) found, no cause that did not grow.

Usage: python benchmarks/bench_explain_live.py [--only NAME ...] [--out FILE] [--keep DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from babysitter.demo.runner import CLUSTER, RUN_NAME, demo_generate_config
from babysitter.demo.scenario import DEFAULT_SCENARIO
from babysitter.explain import Explanation, explain
from babysitter.explain.rules import detect_rules
from babysitter.prom import PromClient
from machine import cpu_model

#: Seconds after the demo's start at which the fault is played: the startup (~10-15 s) plus a baseline.
FAULT_AT = 50.0
#: The window explained: the fault's first seconds.
WINDOW = 20.0
#: The baseline before the window.
BASELINE = 30.0
#: Seconds the scenario runs after the window (explain is asked within them, before the demo stops).
TAIL = 8.0
#: Seconds after the window's end before explain is asked (1 s scrape + 1 s rule evaluation, twice).
LAG = 4.0
#: The simulated GPU the training claims: the demo's rule (the first throttled GPU, else 0).
GPU = 0


@dataclass(frozen=True)
class Case:
    """One scenario: its faults (``at`` relative to :data:`FAULT_AT`) and the causes expected first."""

    name: str
    expected: tuple[str, ...]  # the cause expected first, then (combinations) the one expected second
    events: tuple[dict[str, Any], ...]
    what: str


CASES: tuple[Case, ...] = (
    Case("none", ("none",), (), "no fault (control)"),
    Case(
        "throttle",
        ("gpu_throttling",),
        ({"at": 0, "event": "throttle", "gpu": GPU, "reasons": ["hw_slowdown", "hw_thermal_slowdown"]},),
        "the training's GPU throttles (hw_slowdown + hw_thermal_slowdown)",
    ),
    Case(
        "xid",
        ("gpu_fault",),
        ({"at": 0, "event": "xid", "gpu": GPU, "xid": 13},),
        "Xid 13 (non-fatal) on the training's GPU",
    ),
    Case(
        "xid79_kill",
        ("gpu_fault",),
        (
            {"at": 0, "event": "xid79", "gpu": GPU},
            {"at": 2, "event": "kill", "restart_after": 4},
        ),
        "Xid 79 on the training's GPU, the training killed 2 s later and restarted after 4 s",
    ),
    Case(
        "kill",
        ("restart",),
        ({"at": 0, "event": "kill", "restart_after": 4},),
        "training killed (SIGKILL), restarted after 4 s from its last checkpoint",
    ),
    Case(
        "slow_checkpoint",
        ("checkpoint",),
        ({"at": 0, "event": "slow_checkpoint", "seconds": 6},),
        "the next checkpoint save blocks 6 s",
    ),
    Case("hang", ("hang",), ({"at": 0, "event": "hang", "seconds": 12},), "training hangs 12 s"),
    Case(
        "slow_data",
        ("data_wait",),
        ({"at": 0, "event": "slow_data", "seconds": WINDOW, "wait": 0.1},),
        "each batch waits 0.1 s for the input pipeline (steps ~0.1 s) for the whole window",
    ),
    Case("eval", ("phase",), ({"at": 0, "event": "eval", "seconds": 8},), "an 8 s eval phase"),
    Case(
        "loss_spike",
        ("loss",),
        ({"at": 0, "event": "loss_spike", "seconds": 5},),
        "the loss spikes for 5 s (logits 30x, those updates skipped)",
    ),
    Case(
        "nan_loss",
        ("loss",),
        ({"at": 0, "event": "nan_loss", "seconds": 5},),
        "the loss is NaN for 5 s (those updates skipped)",
    ),
    Case(
        "throttle+slow_checkpoint",
        ("checkpoint", "gpu_throttling"),
        (
            {"at": 0, "event": "throttle", "gpu": GPU, "reasons": ["hw_slowdown"]},
            {"at": 2, "event": "slow_checkpoint", "seconds": 10},
        ),
        "GPU throttles (the training's steps slow to its 70% clock) + a 10 s checkpoint save",
    ),
    Case(
        "slow_data+eval",
        ("data_wait", "phase"),
        (
            {"at": 0, "event": "slow_data", "seconds": WINDOW, "wait": 0.1},
            {"at": 12, "event": "eval", "seconds": 4},
        ),
        "input pipeline slow (0.1 s per batch, whole window) + a 4 s eval phase",
    ),
)


@dataclass
class Result:
    """What explain said for one case."""

    case: Case
    first: str = "error"
    second: str = "-"
    lines: list[str] = field(default_factory=list)
    lost_seconds: float | None = None
    tokens_change: float | None = None
    error: str = ""
    seconds: float = 0.0

    @property
    def right(self) -> bool:
        return (self.first, self.second)[: len(self.case.expected)] == self.case.expected


def _scenario(case: Case) -> dict[str, Any]:
    return {
        "description": f"bench_explain_live: {case.what}",
        "duration": FAULT_AT + WINDOW + TAIL,
        "gpus": 8,
        "gpu_model": "H100",
        "events": [{**e, "at": FAULT_AT + e["at"], "expect": []} for e in case.events],
    }


def _stack(workdir: Path, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> dict[str, Any]:
    path = workdir / "stack.json"
    deadline = time.monotonic() + timeout
    while True:
        if path.exists():
            data: dict[str, Any] = json.loads(path.read_text())
            return data
        if proc.poll() is not None:
            raise RuntimeError(f"the demo exited ({proc.returncode}) before its stack was up")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {path} after {timeout:g} s")
        time.sleep(0.5)


def _stop(proc: subprocess.Popen[bytes], timeout: float) -> None:
    try:
        proc.wait(timeout=timeout)
        return
    except subprocess.TimeoutExpired:
        pass
    proc.send_signal(signal.SIGTERM)  # the demo stops everything it started on SIGTERM
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _demo(args: list[str], log: Any) -> subprocess.Popen[bytes]:
    """``babysitter demo ARGS``, its output to ``log`` (piped: whole lines, 160 columns)."""
    return subprocess.Popen(
        [sys.executable, "-m", "babysitter", "demo", *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "COLUMNS": "160", "TERM": "dumb"},
    )


def run_case(case: Case, root: Path) -> Result:
    """Play one case in the real demo and ask explain about the window after its fault."""
    result = Result(case)
    workdir = root / case.name.replace("+", "_")
    workdir.mkdir(parents=True)
    scenario = workdir.parent / f"{workdir.name}.json"
    scenario.write_text(json.dumps(_scenario(case)))
    started = time.monotonic()
    with (workdir.parent / f"{workdir.name}.log").open("wb") as log:
        proc = _demo(["--scenario", str(scenario), "--workdir", str(workdir)], log)
        try:
            stack = _stack(workdir, proc)
            t0, url = float(stack["t0"]), stack["prometheus"]
            if not url:
                raise RuntimeError("the demo runs without Prometheus (prometheus binary missing?)")
            end = t0 + FAULT_AT + WINDOW
            time.sleep(max(0.0, end + LAG - time.time()))
            if proc.poll() is not None:
                raise RuntimeError(f"the demo exited ({proc.returncode}) before the window was explained")
            answer: Explanation = explain(
                PromClient(url, timeout=10.0),
                RUN_NAME,
                end=end,
                window=WINDOW,
                baseline=BASELINE,
                cluster=CLUSTER,
                cfg=demo_generate_config(),
            )
            keys = [c.key for c in answer.causes]
            result.first = keys[0] if keys else "none"
            result.second = keys[1] if len(keys) > 1 else "-"
            result.lines = answer.lines()
            result.lost_seconds = answer.lost_seconds
            if answer.tokens_per_second is not None and answer.baseline_tokens_per_second:
                result.tokens_change = answer.tokens_per_second / answer.baseline_tokens_per_second - 1
            (workdir / "explain.json").write_text(json.dumps(answer.to_dict(), indent=1))
        except Exception as exc:  # one broken case is a row of the table, not the end of the bench
            result.error = f"{type(exc).__name__}: {exc}"
        finally:
            _stop(proc, timeout=FAULT_AT + WINDOW + TAIL + 90.0)
    result.seconds = time.monotonic() - started
    return result


#: What the newcomer asked after ``babysitter demo --keep`` (issue 22): (label, window, baseline).
NEWCOMER = (("--since 10m", 600.0, 3600.0), ("--since 2m --baseline 2m", 120.0, 120.0))


@dataclass
class Asked:
    """One of the newcomer's questions and whether the answer agreed with itself."""

    label: str
    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def self_check(answer: Explanation, *, throttled: bool) -> list[str]:
    """Where an answer contradicts itself (empty: it does not)."""
    problems = []
    head, accounted, lost = answer.headline(), answer.accounted_seconds, answer.lost_seconds
    slack = max(1.0, 0.02 * (answer.window_covered or answer.window_seconds))
    if not answer.baseline_tokens_per_second:
        if not head.startswith("no baseline"):
            problems.append(f"no baseline, yet the headline says: {head}")
    elif accounted > lost * 1.1 + slack and "because" not in head:
        problems.append(f"the causes cost {accounted:.0f} s of {lost:.0f} s lost, unexplained")
    elif accounted <= lost * 1.1 + slack and answer.causes and "account for" not in head:
        problems.append(f"the headline does not say what the causes account for: {head}")
    keys = [c.key for c in answer.causes]
    if throttled and "gpu_throttling" not in keys:
        problems.append(
            f"GpuThrottled fired, yet throttling was not found ({answer.checked.get('gpu_throttling')})"
        )
    for cause in answer.causes:
        if cause.key == "checkpoint" and cause.seconds > 0:
            blocked = cause.evidence[0]
            if (
                blocked.baseline is not None
                and blocked.value is not None
                and blocked.value <= blocked.baseline
            ):
                problems.append("checkpoints listed though they blocked no more than before")
    if "profile" not in answer.rules and "rate window" not in answer.rules:
        problems.append(f"the rules' names were not read from the Prometheus: {answer.rules!r}")
    return problems


def run_newcomer(root: Path) -> list[Asked]:
    """The default scenario under ``demo --keep``, then the newcomer's questions at its end."""
    workdir = root / "newcomer"
    workdir.mkdir(parents=True)
    duration = float(DEFAULT_SCENARIO["duration"])
    asked = [Asked(label) for label, _, _ in NEWCOMER] + [Asked("the demo's own line")]
    with (root / "newcomer.log").open("wb") as log:
        proc = _demo(["--keep", "--workdir", str(workdir)], log)
        try:
            stack = _stack(workdir, proc)
            t0, url = float(stack["t0"]), stack["prometheus"]
            end = t0 + duration + LAG
            time.sleep(max(0.0, end - time.time()))
            client = PromClient(url, timeout=10.0)
            rules = detect_rules(client, end)
            for item, (_, window, baseline) in zip(asked, NEWCOMER, strict=False):
                answer = explain(
                    client,
                    RUN_NAME,
                    end=end,
                    window=window,
                    baseline=baseline,
                    cfg=rules.cfg,
                    rules=rules.how,
                )
                item.lines, item.problems = answer.lines(), self_check(answer, throttled=True)
            throttle = next(e for e in DEFAULT_SCENARIO["events"] if e["event"] == "throttle")
            from babysitter.demo.explainer import EXPLAIN_WINDOW

            at = t0 + float(throttle["at"]) + EXPLAIN_WINDOW
            answer = explain(
                client, RUN_NAME, end=at, window=EXPLAIN_WINDOW, baseline=30.0, cfg=rules.cfg, rules=rules.how
            )
            own = asked[-1]
            own.lines, own.problems = answer.lines(), self_check(answer, throttled=False)
            if not answer.top or answer.top.key != "gpu_throttling":
                own.problems.append("the throttle is not ranked first")
        except Exception as exc:
            for item in asked:
                item.problems.append(f"{type(exc).__name__}: {exc}")
        finally:
            proc.send_signal(signal.SIGTERM)
            _stop(proc, timeout=60.0)
    return asked


def _matrix(results: list[Result]) -> list[str]:
    results = [r for r in results if len(r.case.expected) == 1]
    columns: list[str] = []
    for r in results:
        for key in (*r.case.expected[:1], r.first):
            if key not in columns:
                columns.append(key)
    out = [
        "| injected (scenario) \\ ranked first | " + " | ".join(f"`{c}`" for c in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for r in results:
        cells = ["1" if c == r.first else "" for c in columns]
        out.append(f"| `{r.case.expected[0]}` ({r.case.name}: {r.case.what}) | " + " | ".join(cells) + " |")
    return out


def markdown(
    results: list[Result], *, command: str, elapsed: float, newcomer: list[Asked] | None = None
) -> str:
    """The results page."""
    singles = [r for r in results if len(r.case.expected) == 1]
    combos = [r for r in results if len(r.case.expected) > 1]
    right = sum(r.right for r in singles)
    lines = [
        "# `babysitter explain` on live data: the demo's real CPU training, one fault at a time",
        "",
        f"Measured {datetime.date.today().isoformat()} on {cpu_model()} ({os.cpu_count()} CPUs, shared), "
        f"Python {sys.version.split()[0]}, {elapsed / 60:.1f} min in all.",
        "",
        f"Command: `{command}`",
        "",
        "Each scenario is a fresh `babysitter demo` (node agent with 8 simulated H100s, the tiny GPT "
        "training on CPU with the tracker and its ledger, Prometheus 2.42 with the generated rules in the "
        "demo's fast profile, Alertmanager) with its fault(s) at "
        f"{FAULT_AT:g} s; `explain()` runs in-process against that Prometheus as the demo's explainer "
        f"does, over the {WINDOW:g} s from the fault against the {BASELINE:g} s before it, asked "
        f"{LAG:g} s after the window ends (run `demo`, cluster `demo`, the demo's `GenerateConfig`). "
        f"The training claims simulated GPU {GPU} in `train_info` (the demo's rule), so GPU faults "
        "are injected there.",
        "",
        f"## Confusion matrix: {right} of {len(singles)} single causes ranked first",
        "",
        *_matrix(results),
        "",
    ]
    if combos:
        lines += [
            "## Combinations",
            "",
            "| injected | expected 1st, 2nd | ranked 1st | ranked 2nd |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {r.case.what} | {', '.join(f'`{k}`' for k in r.case.expected)} | `{r.first}` | `{r.second}` |"
            for r in combos
        ]
        lines.append("")
    lines += [
        "## Each scenario",
        "",
        "| scenario | expected | 1st | 2nd | tokens/s vs baseline | lost s (of the window) | took |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        change = "-" if r.tokens_change is None else f"{r.tokens_change:+.0%}"
        lost = "-" if r.lost_seconds is None else f"{r.lost_seconds:.1f}"
        lines.append(
            f"| {r.case.name} | {', '.join(r.case.expected)} | {r.first} | {r.second} | {change} | {lost} "
            f"| {r.seconds:.0f} s |"
        )
    if newcomer:
        ok = sum(not a.problems for a in newcomer)
        lines += [
            "",
            f"## The newcomer's sequence (issue 22): {ok} of {len(newcomer)} answers agree with themselves",
            "",
            "`babysitter demo --keep` with the default scenario, then, at its end, `explain` as the CLI "
            "asks it (the rules' names read from the Prometheus), and the demo's own on-screen question:",
            "",
            "| asked | contradictions |",
            "|---|---|",
        ]
        lines += [f"| `{a.label}` | {'; '.join(a.problems) or 'none'} |" for a in newcomer]
        for a in newcomer:
            lines += ["", f"### {a.label}", "", "```", *(a.lines or ["(no answer)"]), "```"]
    lines += ["", "## What explain printed", ""]
    for r in results:
        lines += [f"### {r.case.name}: {r.case.what}", "", "```"]
        lines += r.lines or [f"error: {r.error}"]
        lines += ["```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--only", nargs="*", choices=[*(c.name for c in CASES), "newcomer"], help="run only these scenarios"
    )
    p.add_argument("--out", type=Path, help="write the results page (markdown) here")
    p.add_argument("--keep", type=Path, help="keep the demos' work directories here (default: a temp dir)")
    args = p.parse_args(argv)
    cases = [c for c in CASES if not args.only or c.name in args.only]
    command = " ".join(
        ["python benchmarks/bench_explain_live.py", *(argv if argv is not None else sys.argv[1:])]
    )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-explain-live-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        results = []
        for case in cases:
            result = run_case(case, root)
            mark = "ok" if result.right else "MISS"
            print(
                f"{case.name:26s} expected {','.join(case.expected):26s} first {result.first:15s} "
                f"second {result.second:15s} {mark} ({result.seconds:.0f} s) {result.error}",
                flush=True,
            )
            for line in result.lines:
                print("    " + line, flush=True)
            results.append(result)
        newcomer = None
        if not args.only or "newcomer" in args.only:
            newcomer = run_newcomer(root)
            for item in newcomer:
                print(f"newcomer {item.label:26s} {'ok' if not item.problems else 'CONTRADICTS'}", flush=True)
                for line in [*item.problems, *item.lines]:
                    print("    " + line, flush=True)
    page = markdown(results, command=command, elapsed=time.monotonic() - started, newcomer=newcomer)
    if args.out:
        args.out.write_text(page + "\n")
    else:
        print(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
