"""The shipped VictoriaMetrics configuration against the installed 1.79.5 binaries, without running them.

Cheap checks (each binary parsing the flags with ``-version``, vmalert's ``-dryRun``); tests/test_victoriametrics.py runs both
with these flags end to end. The documented commands were the ones that did not start on 1.79.5
(``-search.maxSamplesPerQuery=1e9``: "invalid value"; ``-rule.evalDelay``: "flag provided but not
defined"), so every command line the docs show is parsed here too.
"""

from __future__ import annotations

import re
import shlex
import subprocess

import pytest

from babysitter.generate import GenerateConfig
from babysitter.generate.config import parse_duration
from gen_helpers import REPO
from test_paging_config import _route_for, _rule, _scrape_intervals
from vmkit import SHIPPED, VICTORIA_METRICS, VMALERT, require_victoriametrics, shipped_args

#: New series reach VictoriaMetrics's queries up to this late (its 10 s index refresh; measured by
#: tests/test_victoriametrics.py, docs/victoriametrics.md).
NEW_SERIES = 10


def _parses(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run a command line with ``-version`` added: the binary parses every flag and its value (an
    unknown flag or a value of the wrong type fails, as at start) and exits without starting."""
    binary = {"victoria-metrics": VICTORIA_METRICS, "vmalert": VMALERT}[argv[0]]
    return subprocess.run(
        [binary, *argv[1:], "-version"], capture_output=True, text=True, timeout=30, check=False
    )


def _names(args: list[str]) -> list[str]:
    return [arg.lstrip("-").split("=", 1)[0] for arg in args if arg.startswith("-")]


@pytest.mark.parametrize(
    ("file", "binary"), [("victoria-metrics.default", "victoria-metrics"), ("vmalert.default", "vmalert")]
)
def test_every_shipped_flag_parses_on_the_installed_version(file: str, binary: str) -> None:
    require_victoriametrics()
    done = _parses([binary, *shipped_args(file)])
    assert done.returncode == 0, (file, done.stderr[-1000:])


def test_an_unknown_flag_or_a_bad_value_is_refused() -> None:
    """What the two documented commands did on 1.79.5, so the checks here can fail."""
    require_victoriametrics()
    assert _parses(["victoria-metrics", "-search.maxSamplesPerQuery=1e9"]).returncode != 0
    assert _parses(["vmalert", "-rule.evalDelay=30s"]).returncode != 0


def test_every_shipped_flag_is_explained_in_its_file() -> None:
    """Each flag the files set has its reason next to it (the files are what an operator reads)."""
    for file in ("victoria-metrics.default", "vmalert.default"):
        text = (SHIPPED / file).read_text()
        comments = "\n".join(line for line in text.splitlines() if line.startswith("#"))
        unexplained = {
            f"-{name}"
            for name in _names(shipped_args(file))
            if f"-{name}" not in comments and name not in ("storageDataPath", "httpListenAddr", "rule")
        }
        assert not unexplained, (file, unexplained)


def _documented_commands() -> list[list[str]]:
    """Every ``victoria-metrics`` or ``vmalert`` command line in the docs' code blocks."""
    found = []
    for doc in (REPO / "exporters/README.md", REPO / "docs/victoriametrics.md"):
        blocks = re.findall(r"^```sh\n(.*?)^```", doc.read_text(), re.MULTILINE | re.DOTALL)
        for line in "\n".join(blocks).replace("\\\n", " ").splitlines():
            argv = shlex.split(line)
            if argv and argv[0] in ("victoria-metrics", "vmalert"):
                found.append(argv)
    return found


def test_the_documented_commands_parse_on_the_installed_version() -> None:
    require_victoriametrics()
    commands = _documented_commands()
    assert {argv[0] for argv in commands} == {"victoria-metrics", "vmalert"}, commands
    for argv in commands:
        done = _parses(argv)
        assert done.returncode == 0, (argv, done.stderr[-1000:])


def test_vmalert_loads_the_committed_rule_files() -> None:
    """``-dryRun`` parses every expression with MetricsQL and every annotation template, as vmalert
    does at start; a file it refuses stops it from starting."""
    require_victoriametrics()
    files = ("babysitter-rules.yaml", "babysitter-alerts.yaml", "babysitter-dcgm-exporter-rules.yaml")
    argv = [VMALERT, "-dryRun", *(f"-rule={REPO / 'alerts' / name}" for name in files)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_rules_evaluate_at_now_on_victoriametrics() -> None:
    """Without ``nocache=1`` VictoriaMetrics answers vmalert's "now" as of -search.latencyOffset ago,
    and ``-datasource.lookback`` moves the evaluation back too: neither may delay the pages."""
    args = dict(arg.split("=", 1) for arg in shipped_args("vmalert.default") if "=" in arg)
    assert args["-datasource.url"].endswith("?nocache=1"), args["-datasource.url"]
    assert parse_duration(args["-datasource.lookback"]) == 0
    # Prometheus's lookback delta: a series with no sample for 5 minutes leaves the result.
    assert parse_duration(args["-datasource.queryStep"]) == 300
    vm = dict(arg.split("=", 1) for arg in shipped_args("victoria-metrics.default") if "=" in arg)
    assert vm["-search.latencyOffset"] == "30s"  # what dashboards get; the rules bypass it


@pytest.mark.parametrize(
    ("alertname", "labels", "budget", "new_series"),
    [
        ("GpuXidCritical", {"severity": "critical", "component": "gpu"}, 60, True),
        ("GpuDown", {"severity": "critical", "component": "gpu"}, 300, False),
        ("TrainingStalled", {"severity": "critical", "component": "training"}, 300, False),
    ],
)
def test_worst_case_fault_to_page_on_vmalert_fits_the_goal(
    alertname: str, labels: dict[str, str], budget: int, new_series: bool
) -> None:
    """tests/test_paging_config.py's worst case with the shipped files, plus what vmalert adds: its
    flush of recording results is not on these alerts' path (they read scraped series); a series born
    with the fault (a GPU's first Xid of a code) reaches its queries up to 10 s late."""
    group, rule = _rule(alertname)
    route = _route_for({**labels, "alertname": alertname})
    scrape = max(seconds for _, seconds in _scrape_intervals())
    evaluation = parse_duration(group["interval"])
    detect = GenerateConfig().stall_min_seconds if alertname == "TrainingStalled" else 0
    hold = parse_duration(rule.get("for", "0s"))
    worst = scrape + evaluation + detect + hold + parse_duration(route["group_wait"])
    worst += NEW_SERIES if new_series else 0
    assert worst < budget, (alertname, worst)
