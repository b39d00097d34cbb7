"""babysitter generate: deterministic output, --check on the committed files, config validation, YAML."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from babysitter.catalog import ALL
from babysitter.cli import main
from babysitter.generate import GenerateConfig, fast
from babysitter.generate.config import parse_duration, profile
from babysitter.generate.writer import check, render, write
from babysitter.generate.yamlout import dump
from gen_helpers import REPO


class TestRender:
    def test_output_is_deterministic(self) -> None:
        """Two renders of the same config are byte-identical (no timestamps, no dict-order drift)."""
        assert render(GenerateConfig()) == render(GenerateConfig())

    def test_every_kind_of_file_is_produced(self) -> None:
        """Dashboards, both rule files, one promtool test per alert, the metrics doc and the runbook index."""
        files = render(GenerateConfig())
        assert len([p for p in files if p.startswith("dashboards/")]) == 4
        assert {"alerts/babysitter-rules.yaml", "alerts/babysitter-alerts.yaml", "docs/metrics.md"} <= set(
            files
        )
        alerts = yaml.safe_load(files["alerts/babysitter-alerts.yaml"])
        names = {rule["alert"] for group in alerts["groups"] for rule in group["rules"]}
        assert {Path(p).stem for p in files if p.startswith("alerts/tests/")} == {
            *names,
            "recording-rules",
            "recording-rules-windows",
            "recording-rules-fabric",
            "recording-rules-slowdown",
        }

    def test_every_recording_rule_has_a_hand_computed_case(self) -> None:
        """The recording rules' promtool test checks each rule's result, not only that it parses."""
        files = render(GenerateConfig())
        rules = yaml.safe_load(files["alerts/babysitter-rules.yaml"])
        records = {rule["record"] for group in rules["groups"] for rule in group["rules"]}
        tested = {
            case["expr"]
            for name in ("recording-rules", "recording-rules-fabric", "recording-rules-slowdown")
            for t in yaml.safe_load(files[f"alerts/tests/{name}.yaml"])["tests"]
            for case in t["promql_expr_test"]
        }
        untested = records - tested
        # Window-heavy aggregates are exercised by the alert tests that use them instead.
        assert untested <= {
            name for name in records if name.endswith(("increase24h", "rate5m", "mean1h", ":count"))
        }, untested

    def test_fast_profile_has_no_promtool_tests(self) -> None:
        """promtool cases are written for the default thresholds; the fast profile must not ship them."""
        files = render(fast())
        assert not [p for p in files if p.startswith("alerts/tests/")]
        rules = yaml.safe_load(files["alerts/babysitter-alerts.yaml"])
        stalled = next(r for g in rules["groups"] for r in g["rules"] if r["alert"] == "TrainingStalled")
        assert "for" not in stalled  # fast: fire on the first evaluation past the threshold

    @pytest.mark.parametrize("name", ["default", "fast"])
    def test_the_monitoring_alerts_wait_longer_than_their_window(self, name: str) -> None:
        """A one-off burst of failures (a restarted Prometheus drops its first alerts) stays in the
        window for the window's length: ``for:`` must outlast it, or the burst pages (the fast profile's
        10 s paged AlertDeliveryFailing after every Prometheus restart of the campaign)."""
        cfg = profile(name)
        assert parse_duration(cfg.monitoring_for) > parse_duration(cfg.monitoring_window)

    def test_cluster_label_is_configurable(self) -> None:
        """A different cluster label reaches every aggregation and no 'cluster' grouping is left behind."""
        files = render(GenerateConfig(cluster_label="provider"))
        rules = files["alerts/babysitter-rules.yaml"] + files["alerts/babysitter-alerts.yaml"]
        assert "by (provider, run)" in rules
        assert not re.search(r"\bby \(cluster\b", rules)

    def test_metrics_doc_lists_every_catalog_metric(self) -> None:
        """docs/metrics.md has a row for every catalog entry, with its help text."""
        doc = render(GenerateConfig())["docs/metrics.md"]
        for spec in ALL:
            assert f"`{spec.name}" in doc, spec.name


class TestCheck:
    def test_committed_files_are_fresh(self, capsys: pytest.CaptureFixture[str]) -> None:
        """`babysitter generate --check` passes on the repository: the committed output is current."""
        assert main(["generate", "--check", "--out", str(REPO)]) == 0, capsys.readouterr().out

    def test_cli_check_in_a_fresh_interpreter(self) -> None:
        """`python -m babysitter generate --check` passes under another hash seed (no set-order output)."""
        env = {**os.environ, "PYTHONHASHSEED": "12345"}
        result = subprocess.run(
            [sys.executable, "-m", "babysitter", "generate", "--check"],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=REPO,
            check=False,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]

    def test_check_reports_changed_missing_and_extra(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--check exits 1 and names each stale file with its state and a diff."""
        files = render(GenerateConfig())
        write(tmp_path, files)
        dashboard = tmp_path / "dashboards/babysitter-stragglers.json"
        dashboard.write_text(dashboard.read_text().replace("Stragglers", "Stragglerz"))
        (tmp_path / "docs/metrics.md").unlink()
        (tmp_path / "alerts/tests/OldAlert.yaml").write_text("tests: []\n")
        assert main(["generate", "--check", "--out", str(tmp_path)]) == 1
        out = capsys.readouterr().out
        assert re.search(r"changed\s+dashboards/babysitter-stragglers.json", out)
        assert re.search(r"missing\s+docs/metrics.md", out)
        assert re.search(r"extra\s+alerts/tests/OldAlert.yaml", out)
        assert '+  "title": "babysitter / Stragglers"' in out

    def test_write_repairs_everything_check_reports(self, tmp_path: Path) -> None:
        """After write, check is clean: stale files rewritten, no-longer-generated ones removed."""
        files = render(GenerateConfig())
        (tmp_path / "alerts/tests").mkdir(parents=True)
        (tmp_path / "alerts/tests/OldAlert.yaml").write_text("tests: []\n")
        touched = write(tmp_path, files)
        assert "alerts/tests/OldAlert.yaml" in touched
        assert not (tmp_path / "alerts/tests/OldAlert.yaml").exists()
        assert check(tmp_path, files) == []
        assert write(tmp_path, files) == []
        assert (tmp_path / "docs/metrics.md").stat().st_mode & 0o777 == 0o644

    def test_write_leaves_unrelated_files_alone(self, tmp_path: Path) -> None:
        """Only generated file kinds are removed: a README in dashboards/ survives."""
        (tmp_path / "dashboards").mkdir()
        (tmp_path / "dashboards/README.md").write_text("hand-written\n")
        write(tmp_path, render(GenerateConfig()))
        assert (tmp_path / "dashboards/README.md").read_text() == "hand-written\n"

    def test_cli_writes_fast_profile(self, tmp_path: Path) -> None:
        """`--profile fast --out DIR` writes rules the e2e tests and the demo load."""
        assert main(["generate", "--profile", "fast", "--out", str(tmp_path)]) == 0
        rules = yaml.safe_load((tmp_path / "alerts/babysitter-alerts.yaml").read_text())
        assert len([r for g in rules["groups"] for r in g["rules"]]) >= 20


class TestConfig:
    @pytest.mark.parametrize(("text", "seconds"), [("5m", 300), ("1h30m", 5400), ("0s", 0), ("24h", 86400)])
    def test_parse_duration(self, text: str, seconds: int) -> None:
        """Durations made of h/m/s parts parse to seconds."""
        assert parse_duration(text) == seconds

    @pytest.mark.parametrize("text", ["", "5", "5d", "m5", "1.5m", "5m1h"])
    def test_parse_duration_rejects(self, text: str) -> None:
        """Anything else is a clear error at setup."""
        with pytest.raises(ValueError, match="duration"):
            parse_duration(text)

    @pytest.mark.parametrize(
        ("field", "value", "message"),
        [
            ("cluster_label", "has-dash", "label name"),
            ("rate_window", "0s", "positive"),
            ("stall_for", "ten minutes", "duration"),
            ("mfu_drop_fraction", 1.5, "between 0 and 1"),
            ("straggler_ratio", 0.9, "above 1"),
            ("runbook_url_pattern", "https://x/runbooks.md", "{alert}"),
            ("runbook_base_url", "docs/runbooks", "absolute http(s) URL"),
            ("runbook_base_url", "file:///srv/runbooks", "absolute http(s) URL"),
            ("xid_ignore_actions", ("reboot",), "paged and ignored"),
        ],
    )
    def test_bad_config_fails_at_construction(self, field: str, value: object, message: str) -> None:
        """A bad knob raises when the config is built, never while generating."""
        with pytest.raises(ValueError, match=re.escape(message)):
            GenerateConfig(**{field: value})  # type: ignore[arg-type]

    def test_unknown_profile_lists_known_ones(self) -> None:
        """An unknown profile name says which exist."""
        with pytest.raises(KeyError, match="default, fast"):
            profile("slow")


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    st.text(alphabet="ab {}\"'\n:#-|>&*!%@`", max_size=30),
)
_KEYS = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_TREES = st.recursive(
    _SCALARS,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(_KEYS, children, max_size=4)),
    max_leaves=20,
)


class TestYaml:
    @settings(max_examples=300, deadline=None)
    @given(_TREES)
    def test_round_trip(self, value: object) -> None:
        """Whatever dump writes, a YAML parser reads back as the same value."""
        assert yaml.safe_load(dump(value)) == value

    def test_promql_becomes_a_literal_block(self) -> None:
        """Multi-line PromQL stays readable in the rule file (no escaped newlines)."""
        text = dump({"expr": 'sum by (run) (\n  rate(x{a="b"}[5m])\n)'})
        assert text == 'expr: |-\n  sum by (run) (\n    rate(x{a="b"}[5m])\n  )\n'


def test_generate_code_spells_no_metric_name() -> None:
    """Metric names come from the catalog: no string literal in the generator is a catalog name."""
    names = {spec.name for spec in ALL}
    offenders = []
    for path in (REPO / "src/babysitter/generate").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                offenders += [(path.name, name) for name in names if re.search(rf"\b{name}\b", node.value)]
    assert offenders == []


def test_dashboards_json_is_sorted_and_stable() -> None:
    """Dashboard files are sorted-key JSON, so diffs show only real changes."""
    for rel, text in render(GenerateConfig()).items():
        if rel.endswith(".json"):
            assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"


def test_runbook_url_pattern_from_the_command_line(tmp_path: Path) -> None:
    """--runbook-url-pattern puts the team's docs host into every alert; a pattern without {alert} is refused."""
    from babysitter.cli import main

    assert (
        main(
            [
                "generate",
                "--out",
                str(tmp_path),
                "--runbook-url-pattern",
                "https://docs.example.org/rb/{alert}",
            ]
        )
        == 0
    )
    groups = yaml.safe_load((tmp_path / "alerts" / "babysitter-alerts.yaml").read_text())["groups"]
    urls = {r["alert"]: r["annotations"]["runbook_url"] for g in groups for r in g["rules"]}
    assert urls["TrainingStalled"] == "https://docs.example.org/rb/TrainingStalled"
    assert all(url == f"https://docs.example.org/rb/{name}" for name, url in urls.items())
    assert (
        main(["generate", "--out", str(tmp_path), "--runbook-url-pattern", "https://docs.example.org/rb"])
        == 2
    )


def test_runbook_links_are_absolute() -> None:
    """Every generated runbook_url is an absolute link (a relative path is not clickable in a page):
    the base joined to the pattern, or an absolute pattern as it is."""
    cfg = GenerateConfig(runbook_base_url="https://git.example.org/ml/babysitter/blob/main/docs/runbooks/")
    assert (
        cfg.runbook_url("GpuDown")
        == "https://git.example.org/ml/babysitter/blob/main/docs/runbooks/GpuDown.md"
    )
    pattern = GenerateConfig(runbook_url_pattern="https://wiki.example.org/{alert}")
    assert pattern.runbook_url("GpuDown") == "https://wiki.example.org/GpuDown"
    for text in (
        render(GenerateConfig())["alerts/babysitter-alerts.yaml"],
        render(fast())["alerts/babysitter-alerts.yaml"],
    ):
        groups = yaml.safe_load(text)["groups"]
        urls = [r["annotations"]["runbook_url"] for g in groups for r in g["rules"] if "alert" in r]
        assert urls and all(re.fullmatch(r"https://[^/\s]+/\S+\.md", url) for url in urls), urls


@pytest.mark.parametrize(
    ("urls", "base"),
    [
        (
            {"repository": "https://github.com/acme/babysitter"},
            "https://github.com/acme/babysitter/blob/main/docs/runbooks",
        ),
        (
            {"source": "https://git.example.org/ml/babysitter.git/"},
            "https://git.example.org/ml/babysitter/blob/main/docs/runbooks",
        ),
        (
            {"runbooks": "https://wiki.example.org/rb/", "repository": "https://x.org/r"},
            "https://wiki.example.org/rb",
        ),
        ({"homepage": "https://babysitter.example.org"}, None),
    ],
)
def test_runbook_base_from_the_project_urls(urls: dict[str, str], base: str | None) -> None:
    """The default base comes from pyproject's [project.urls]: Runbooks as it is, else the repository's
    docs/runbooks as its forge shows it; a homepage alone says nothing about where the pages are."""
    from babysitter.cli.generate import runbook_base_from_urls

    assert runbook_base_from_urls(urls) == base


def test_runbook_base_url_from_the_command_line(tmp_path: Path) -> None:
    """--runbook-base-url puts the team's docs into every link; a relative base is refused with exit 2."""
    base = "https://git.example.org/ml/babysitter/-/blob/v1/docs/runbooks"
    assert main(["generate", "--out", str(tmp_path), "--runbook-base-url", base]) == 0
    groups = yaml.safe_load((tmp_path / "alerts" / "babysitter-alerts.yaml").read_text())["groups"]
    urls = {r["alert"]: r["annotations"]["runbook_url"] for g in groups for r in g["rules"]}
    assert all(url == f"{base}/{name}.md" for name, url in urls.items())
    assert main(["generate", "--out", str(tmp_path), "--check", "--runbook-base-url", base]) == 0
    assert main(["generate", "--out", str(tmp_path), "--runbook-base-url", "docs/runbooks"]) == 2


def test_generate_says_when_runbook_links_are_unconfigured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writing with the reserved default base (no --runbook-base-url, no [project.urls]) warns once on
    stderr; a configured base writes silently."""
    import babysitter.cli.generate as cli_generate

    monkeypatch.setattr(cli_generate, "_project_urls", dict)
    assert main(["generate", "--out", str(tmp_path)]) == 0
    assert "never resolves" in capsys.readouterr().err
    assert (
        main(["generate", "--out", str(tmp_path), "--runbook-base-url", "https://docs.example.org/rb"]) == 0
    )
    assert "never resolves" not in capsys.readouterr().err
