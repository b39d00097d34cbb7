"""What the alert modules share: the rule and test types, Go-template snippets, and the label sets that
promtool input series carry in a real deployment. Private to the package: the helpers keep the short
underscored names the alert definitions were written with."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from babysitter.catalog import MetricSpec
from babysitter.catalog import node as N
from babysitter.catalog import train as T
from babysitter.generate.config import GenerateConfig, parse_duration
from babysitter.generate.promql import eq, newest

__all__ = ["Alert", "AlertTest", "Labels", "likely_text", "with_team"]

Labels = Mapping[str, str]


@dataclass(frozen=True)
class AlertTest:
    """promtool input series and expectations for one alert (written for the default config)."""

    series: tuple[tuple[str, str], ...]
    #: Eval times at which the alert must not fire, with why (before ``for:``, below threshold...).
    quiet: tuple[tuple[str, str], ...]
    fire_at: str
    #: Labels of each alert expected at ``fire_at`` (besides severity and component), in order.
    fire_labels: tuple[Labels, ...]
    #: Expected summary and description, rendered, one pair per firing alert.
    fire_text: tuple[tuple[str, str], ...]
    interval: str = "1m"
    #: How often promtool evaluates every rule over the test: a test spanning hours sets it coarser
    #: (each evaluation runs all the rules, so hours at 1m cost promtool many seconds).
    evaluation_interval: str = "1m"
    #: Expected values of the alert's extra annotations (``Alert.annotations``), one mapping per firing
    #: alert; an annotation that renders empty is absent from what promtool compares.
    fire_annotations: tuple[Mapping[str, str], ...] = ()


@dataclass(frozen=True)
class Alert:
    """One alerting rule and its test."""

    name: str
    expr: str
    severity: str
    component: str
    summary: str
    description: str
    for_: str
    test: AlertTest | None = field(default=None, compare=False)
    #: More annotations (name -> template), e.g. the culprit hosts ``babysitter remediate`` drains.
    annotations: Mapping[str, str] = field(default_factory=dict)
    #: Fires always, by design (``Watchdog``, a dead man's switch's heartbeat): its test has no quiet case.
    heartbeat: bool = False

    def rule(self, cfg: GenerateConfig) -> dict[str, object]:
        """The rule as it goes into the rule file."""
        rule: dict[str, object] = {"alert": self.name, "expr": self.expr}
        if parse_duration(self.for_) > 0:
            rule["for"] = self.for_
        rule["labels"] = {"component": self.component, "severity": self.severity}
        rule["annotations"] = {
            "description": self.description,
            "runbook_url": cfg.runbook_url(self.name),
            "summary": self.summary,
            **self.annotations,
        }
        return rule


def _l(name: str) -> str:
    return "{{ $labels.%s }}" % name  # noqa: UP031 - braces of Go templates fight f-strings


_V = "{{ $value | humanize }}"
_STEP = '{{ $value | printf "%.0f" }}'
_VD = "{{ $value | humanizeDuration }}"
_VP = "{{ $value | humanizePercentage }}"


def likely_text(record: str, cluster_label: str) -> str:
    """ ": likely gpu throttling on host h1:9400", read from the likely-cause rule when the notification
    is rendered (nothing when the cause is unknown or the rule has no series). A template query, not a
    label: a cause that changes must not make a new alert and restart its ``for:``."""
    selector = "%s{%s=%%q,run=%%q}" % (record, cluster_label)  # noqa: UP031 - Go template braces
    return (
        '{{ with query (printf "'
        + selector.replace('"', '\\"')
        + '" $labels.'
        + cluster_label
        + ' $labels.run) }}{{ with index . 0 }}{{ if ne .Labels.likely_cause "unknown" }}: likely '
        '{{ reReplaceAll "_" " " .Labels.likely_cause }}{{ with .Labels.likely_host }} on host {{ . }}'
        "{{ end }}{{ end }}{{ end }}{{ end }}"
    )


def with_team(expr: str, run_key: tuple[str, ...], likely_team: str, alert: str = "") -> str:
    """``expr`` labeled with the run's ``team`` (routing: infra or training) from the likely-team rule;
    unjoined when the rule has no series for the run (a rule that lags or fails never drops a page).

    With ``alert`` (the alert's own name), a run the alert already fires for keeps the team it was
    paged with (its ``ALERTS`` series): a team is part of an alert's identity, so a likely cause that
    changes during a hang would resolve the page and send a new one to the other team (the campaign
    saw a stall paged twice, once resolved in the middle of the hang). While pending it follows the
    likely team: the evidence of its ``for:`` decides whom it pages."""
    on_run = f"on ({', '.join(run_key)})"
    team = likely_team = newest(likely_team, run_key)
    if alert:
        firing = f'ALERTS{{alertname="{alert}", alertstate="firing", team!=""}}'
        held = f"topk by ({', '.join(run_key)}) (1, max by ({', '.join((*run_key, 'team'))}) ({firing}))"
        team = f"(\n{held}\nor {on_run}\n{likely_team}\n)"
    return f"(\n{expr}\n)\n* {on_run} group_left (team)\n{team}\nor {on_run}\n(\n{expr}\n)"


def _series(spec: MetricSpec, labels: Labels, suffix: str = "") -> str:
    """A promtool input series name for a catalog entry."""
    inner = ", ".join(eq(key, value) for key, value in labels.items())
    return f"{spec.name}{suffix}{{{inner}}}"


def _up_series(labels: Labels) -> str:
    inner = ", ".join(eq(key, value) for key, value in labels.items())
    return f"up{{{inner}}}"


# Test fixtures: the label sets series carry in a real deployment (tracker series come through the
# node agent, so they carry its job and instance too).
_TRAIN = {"cluster": "c1", "instance": "n1:9400", "job": "babysitter-node", "run": "r1", "rank": "0"}
_GPU = {
    "cluster": "c1",
    "gpu": "3",
    "instance": "n1:9400",
    "job": "babysitter-node",
    "model": "NVIDIA H100 80GB HBM3",
    "pci_bus_id": "0000:9b:00",
    "uuid": "GPU-8c5d3f3a",
}


def _with(base: Labels, **extra: str) -> dict[str, str]:
    return {**base, **extra}


def _run_labels(run: str = "r1") -> dict[str, str]:
    return {"cluster": "c1", "run": run}


def _gpu_labels(**extra: str) -> dict[str, str]:
    keep = ("cluster", "instance", *N.GPU_LABELS)
    return {**{key: _GPU[key] for key in keep}, **extra}


def _stepping(labels: Labels, values: str) -> tuple[tuple[str, str], ...]:
    """A rank whose last-step time and 1 s steps follow ``values`` (seconds since the test began)."""
    return (
        (_series(T.LAST_STEP_TIMESTAMP, labels), values),
        (_series(T.STEP_DURATION, labels, "_sum"), values),
        (_series(T.STEP_DURATION, labels, "_count"), values),
    )


def _node_labels() -> dict[str, str]:
    return {key: _GPU[key] for key in ("cluster", "instance", "job")}
