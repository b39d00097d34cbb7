"""Alert rules: metadata, runbooks, promtool check/test on the committed files, Alertmanager example."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from babysitter.generate import GenerateConfig, fast
from babysitter.generate.alerts import alerts
from babysitter.generate.rules import LIKELY_CAUSES
from babysitter.generate.writer import render, write
from gen_helpers import REPO, known_series_names, promtool, referenced_names, require_promtool

CFG = GenerateConfig()
ALERTS = alerts(CFG)
RUNBOOKS = REPO / "docs/runbooks"
AMTOOL = shutil.which("amtool") or "/usr/bin/amtool"


class TestAlertMetadata:
    @pytest.mark.parametrize("alert", ALERTS, ids=lambda a: a.name)
    def test_labels_and_annotations(self, alert: object) -> None:
        """Severity routes the page, component groups and inhibits, the description quotes values."""
        rule = alert.rule(CFG)  # type: ignore[attr-defined]
        # "none" is the heartbeat's alone (Watchdog): routed to the dead man's switch, never paging.
        severities = {"none"} if alert.heartbeat else {"critical", "warning", "info"}  # type: ignore[attr-defined]
        assert rule["labels"]["severity"] in severities
        assert rule["labels"]["component"] in {
            "training",
            "checkpoint",
            "storage",
            "gpu",
            "node",
            "remediation",
            "fabric",
            "host",
            "monitoring",
        }
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url", *alert.annotations}  # type: ignore[attr-defined]
        if not alert.heartbeat:  # type: ignore[attr-defined]  # a heartbeat has no value to quote
            assert "{{ $value" in annotations["description"] or "{{ $labels." in annotations["description"]
        # Absolute (clickable in a page), ending in the committed page's path under the base URL.
        url = annotations["runbook_url"]
        assert url.startswith("https://") and url.endswith(f"/docs/runbooks/{rule['alert']}.md")
        assert (REPO / "docs/runbooks" / f"{rule['alert']}.md").is_file()

    def test_every_alert_has_a_firing_and_a_quiet_case(self) -> None:
        """The promtool test of each alert expects it firing once and silent at least once."""
        files = render(CFG)
        for alert in ALERTS:
            test = yaml.safe_load(files[f"alerts/tests/{alert.name}.yaml"])
            cases = [
                case
                for t in test["tests"]
                for case in t["alert_rule_test"]
                if case["alertname"] == alert.name
            ]
            firing = [case for case in cases if case["exp_alerts"]]
            quiet = [case for case in cases if not case["exp_alerts"]]
            assert firing and (quiet or alert.heartbeat), alert.name
            assert not (quiet and alert.heartbeat), alert.name  # a heartbeat that can be quiet is not one
            for case in firing:
                for expected in case["exp_alerts"]:
                    assert expected["exp_labels"]["severity"] == alert.severity
                    assert set(expected["exp_annotations"]) == {
                        "summary",
                        "description",
                        "runbook_url",
                        *alert.annotations,
                    }

    def test_paging_xid_actions_match_the_node_agent(self) -> None:
        """Every Xid action the config names is one the node agent's catalog can emit."""
        from babysitter.node.xid.codes import ACTIONS, UNKNOWN_ACTION

        assert set(CFG.xid_page_actions) | set(CFG.xid_ignore_actions) <= {*ACTIONS, UNKNOWN_ACTION}
        assert "reboot" in CFG.xid_page_actions  # Xid 79, fallen off the bus, must page

    def test_throttle_reasons_match_the_gpu_collector(self) -> None:
        """Throttle reasons alerted on are reason labels the GPU collector exports."""
        from babysitter.node.gpu.collector import CLOCK_EVENT_REASONS

        assert set(CFG.throttle_reasons) <= {label for label, _ in CLOCK_EVENT_REASONS}


class TestRunbooks:
    def test_one_runbook_per_alert_and_no_orphans(self) -> None:
        """docs/runbooks/<Alert>.md exists for every alert, and every page belongs to an alert."""
        pages = {path.stem for path in RUNBOOKS.glob("*.md") if path.name != "README.md"}
        assert pages == {alert.name for alert in ALERTS}

    @pytest.mark.parametrize("alert", ALERTS, ids=lambda a: a.name)
    def test_runbook_sections(self, alert: object) -> None:
        """Each page says what it means, how to confirm, and what to do."""
        text = (RUNBOOKS / f"{alert.name}.md").read_text()  # type: ignore[attr-defined]
        assert text.startswith(f"# {alert.name}\n")  # type: ignore[attr-defined]
        for heading in ("## What it means", "## How to confirm", "## What to do"):
            assert heading in text

    @pytest.mark.parametrize("page", sorted(RUNBOOKS.glob("*.md")), ids=lambda p: p.name)
    def test_runbook_queries_use_existing_series(self, page: Path) -> None:
        """Series named in a runbook's PromQL exist in the catalog or the recording rules (no drift)."""
        known = known_series_names()
        for block in re.findall(r"```promql\n(.*?)```", page.read_text(), flags=re.DOTALL):
            for line in block.splitlines():
                expr = line.split("#", 1)[0]
                assert referenced_names(expr) <= known, (page.name, line)


@pytest.mark.prometheus
class TestPromtool:
    def test_check_rules_on_committed_files(self) -> None:
        """promtool check rules accepts the committed recording and alert rules."""
        require_promtool()
        result = promtool(
            ["check", "rules", "babysitter-rules.yaml", "babysitter-alerts.yaml"], REPO / "alerts"
        )
        assert result.returncode == 0, result.stdout + result.stderr

    def test_unit_tests_on_committed_files(self) -> None:
        """promtool test rules passes every alert's firing and quiet cases."""
        require_promtool()
        tests = sorted(str(p.relative_to(REPO / "alerts")) for p in (REPO / "alerts/tests").glob("*.yaml"))
        assert (
            len(tests) == len(ALERTS) + 4
        )  # and the recording rules' four tests (fabric, windows, slowdown)
        # A guard against a hung promtool, not a time limit: the 53 files take 40 s of CPU, and on a
        # loaded 2-core CI machine, beside two other test workers, that went past 120 s once.
        result = promtool(["test", "rules", *tests], REPO / "alerts", timeout=600)
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
        assert result.stdout.count("SUCCESS") == len(tests)

    def test_fast_profile_rules_are_valid(self, tmp_path: Path) -> None:
        """The rules the end-to-end tests and the demo load pass promtool check rules too."""
        require_promtool()
        write(tmp_path, render(fast()))
        result = promtool(
            ["check", "rules", "babysitter-rules.yaml", "babysitter-alerts.yaml"], tmp_path / "alerts"
        )
        assert result.returncode == 0, result.stdout + result.stderr

    def test_a_wrong_expectation_fails(self, tmp_path: Path) -> None:
        """The harness is not vacuous: an expected description that differs by one word fails promtool."""
        require_promtool()
        write(tmp_path, render(CFG))
        test = tmp_path / "alerts/tests/GpuXidCritical.yaml"
        text = test.read_text()
        assert "reported Xid 79" in text
        test.write_text(text.replace("reported Xid 79", "reported Xid 78"))
        result = promtool(["test", "rules", "tests/GpuXidCritical.yaml"], tmp_path / "alerts")
        assert result.returncode != 0

    @pytest.mark.parametrize(
        ("alert", "change"),
        [
            ("TrainingStalled", {"stall_min_seconds": 1500}),
            ("TrainingStragglerRank", {"straggler_ratio": 1.6}),
            ("CheckpointOverdue", {"checkpoint_overdue_factor": 4.0}),
            ("GpuXidCritical", {"xid_page_actions": ("reset_gpu", "drain")}),
            ("CheckpointIntervalOffAdvice", {"checkpoint_advice_min_gain": 0.004}),  # r3 would fire
            ("CheckpointIntervalOffAdvice", {"checkpoint_advice_factor": 4.0}),  # r4 would not
            ("RuleEvaluationFailing", {"monitoring_for": "20m"}),
            ("AlertmanagerNotificationsFailing", {"monitoring_delivery_window": "1m"}),
            ("AlertDeliveryFailing", {"monitoring_delivery_window": "5m"}),  # the shipped campaign's 5m
        ],
    )
    def test_tests_catch_a_changed_rule(self, tmp_path: Path, alert: str, change: dict[str, object]) -> None:
        """Rules generated with a different threshold fail the default tests: they pin the behaviour."""
        require_promtool()
        files = render(CFG)
        changed = render(replace(CFG, **change))  # type: ignore[arg-type]
        files["alerts/babysitter-rules.yaml"] = changed["alerts/babysitter-rules.yaml"]
        files["alerts/babysitter-alerts.yaml"] = changed["alerts/babysitter-alerts.yaml"]
        write(tmp_path, files)
        result = promtool(["test", "rules", f"tests/{alert}.yaml"], tmp_path / "alerts")
        assert result.returncode != 0, result.stdout


class TestAlertmanagerExample:
    CONFIG = REPO / "exporters/alertmanager.yml"

    def _amtool(self, *args: str) -> subprocess.CompletedProcess[str]:
        if not Path(AMTOOL).exists():
            pytest.skip("amtool not installed (apt-get install prometheus-alertmanager)")
        return subprocess.run([AMTOOL, *args], capture_output=True, text=True, timeout=30, check=False)

    @pytest.mark.prometheus
    def test_config_is_valid(self) -> None:
        """amtool accepts the example."""
        result = self._amtool("check-config", str(self.CONFIG))
        assert result.returncode == 0, result.stdout + result.stderr

    @pytest.mark.prometheus
    @pytest.mark.parametrize(
        ("labels", "receivers"),
        [
            (("severity=critical", "component=gpu", "instance=n1:9400"), "pager,chat"),
            (("severity=critical", "component=training", "run=r1"), "pager,chat"),
            (("severity=warning", "component=gpu"), "chat"),
            (("severity=warning", "component=checkpoint", "run=r1"), "chat"),
            (("severity=info", "component=checkpoint", "run=r1"), "chat"),
        ],
    )
    def test_severity_routes(self, labels: tuple[str, ...], receivers: str) -> None:
        """Critical pages and goes to chat; warnings and infos go to chat only."""
        result = self._amtool("config", "routes", "test", f"--config.file={self.CONFIG}", *labels)
        assert result.stdout.strip() == receivers, result.stdout + result.stderr

    @pytest.mark.prometheus
    def test_pages_go_to_the_likely_causes_team(self) -> None:
        """A page whose run carries ``team`` goes to that team's on-call; without one, to infra's.

        The teams are the ones the likely-cause rule can write (it says ``training`` when nothing
        is found): a new team without a route fails here."""
        pagers = {"infra": "pager", "training": "pager-training"}
        teams = {team for _, team in LIKELY_CAUSES} | {"training"}
        assert teams == set(pagers)
        for alert in ("TrainingStalled", "TrainingMfuDrop"):
            for team, pager in pagers.items():
                labels = (f"alertname={alert}", "severity=critical", "component=training", "run=r1")
                result = self._amtool(
                    "config", "routes", "test", f"--config.file={self.CONFIG}", *labels, f"team={team}"
                )
                assert result.stdout.strip() == f"{pager},chat", result.stdout + result.stderr
        # A host's alerts stay with infra whatever a run's team is.
        labels = ("severity=critical", "component=gpu", "instance=n1:9400", "team=training")
        result = self._amtool("config", "routes", "test", f"--config.file={self.CONFIG}", *labels)
        assert result.stdout.strip() == "pager,chat", result.stdout + result.stderr
        # Warnings (an MFU drop) go to the shared chat, their team label in the message.
        labels = ("severity=warning", "component=training", "run=r1", "team=training")
        result = self._amtool("config", "routes", "test", f"--config.file={self.CONFIG}", *labels)
        assert result.stdout.strip() == "chat", result.stdout + result.stderr

    def test_inhibitions_name_real_alerts_and_labels(self) -> None:
        """Every alert name and component an inhibition matches exists in the generated rules."""
        config = yaml.safe_load(self.CONFIG.read_text())
        names = {alert.name for alert in ALERTS}
        components = {alert.component for alert in ALERTS}
        assert any(
            rule["source_matchers"] == ['alertname="NodeAgentDown"'] and "instance" in rule["equal"]
            for rule in config["inhibit_rules"]
        )
        for rule in config["inhibit_rules"]:
            for matcher in [*rule["source_matchers"], *rule["target_matchers"]]:
                label, _, pattern = re.match(r'(\w+)(=~|=)"(.*)"', matcher).groups()  # type: ignore[union-attr]
                pool = names if label == "alertname" else components
                assert label in {"alertname", "component"}
                assert all(value in pool for value in pattern.split("|")), matcher
