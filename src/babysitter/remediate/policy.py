"""The remediation policy: which alert leads to which action, through which scheduler, within which rails.

A policy is a YAML, TOML or JSON file, checked completely at start: an unknown key, a bad regex, an
action the backend cannot do or a rail left open is an error naming its place in the file
(``rules[2].actions[0]: unknown action 'drian'``), never a surprise at 3 a.m. See
``docs/remediate.md`` for the format and ``exporters/remediate-policy.example.yaml`` for an example.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from babysitter._install import pip_install_extra
from babysitter.catalog.remediate import REMEDIATION_ACTIONS
from babysitter.generate.config import parse_duration
from babysitter.remediate.incident_options import IncidentOptions, parse_incidents

__all__ = [
    "Allow",
    "BackendKind",
    "DrainCap",
    "Hosts",
    "Jobs",
    "KubernetesOptions",
    "Policy",
    "PolicyError",
    "RateLimit",
    "Rule",
    "ScriptOptions",
    "SlurmOptions",
    "load_policy",
    "parse_policy",
]

BackendKind = Literal["slurm", "kubernetes", "script"]
Action = Literal["drain", "requeue", "annotate"]
#: Actions a rule may name; ``undrain`` is the rule's ``undrain_on_resolve``, not an action of its own.
RULE_ACTIONS: tuple[str, ...] = tuple(a for a in REMEDIATION_ACTIONS if a != "undrain")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_FIELD = re.compile(r"\{([^{}]*)\}")


class PolicyError(ValueError):
    """The policy file is not valid; the message names the place and the problem."""


@dataclass(frozen=True)
class Rule:
    """Alerts whose labels all match ``match`` (anchored regexes) lead to ``actions``."""

    name: str
    match: Mapping[str, re.Pattern[str]]
    actions: tuple[Action, ...]
    #: Reason text given to the scheduler; ``{label}`` fields come from the alert (sanitized).
    reason: str
    #: Act only once the alert has been firing this long (seconds since its ``startsAt``).
    firing_for: float = 0.0
    #: Undrain the host when the alert resolves (only hosts this remediator drained, for this alert).
    undrain_on_resolve: bool = False
    #: None: the policy's default.
    dry_run: bool | None = None
    #: Which hosts the rule acts on: ``alert`` (the alert's host label) or ``culprit`` (the hosts a
    #: stall page names as its culprits, annotation ``culprit_hosts``: never a rank that only waits),
    #: each only if it holds the run's ranks (needs ``jobs.prometheus_url``; docs/remediate.md).
    hosts_from: Literal["alert", "culprit"] = "alert"
    #: With ``hosts_from: culprit``: a stall naming more culprit hosts than this is not acted on
    #: (many culprits at once is a job or code problem, not a bad node).
    max_culprit_hosts: int = 1

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Every matcher's label is present and fully matches."""
        return all(
            name in labels and pattern.fullmatch(labels[name]) is not None
            for name, pattern in self.match.items()
        )


@dataclass(frozen=True)
class RateLimit:
    """At most ``actions`` disruptive actions (drain, undrain, requeue) within ``window`` seconds."""

    actions: int
    window: float


@dataclass(frozen=True)
class DrainCap:
    """At most ``max(min_nodes, floor(fraction x nodes))`` distinct nodes drained within ``window``."""

    fraction: float
    window: float
    min_nodes: int = 1
    #: The cluster's size when the backend cannot tell (or to pin it); None: ask the backend.
    cluster_nodes: int | None = None


@dataclass(frozen=True)
class Allow:
    """Allow-lists (anchored regexes); an empty list allows everything of that kind."""

    hosts: tuple[re.Pattern[str], ...] = ()
    partitions: tuple[re.Pattern[str], ...] = ()
    namespaces: tuple[re.Pattern[str], ...] = ()


@dataclass(frozen=True)
class Hosts:
    """Where an alert names its host: ``label``, cut to the scheduler's node name by ``pattern``'s group 1."""

    label: str = "instance"
    pattern: re.Pattern[str] = field(default_factory=lambda: re.compile(r"(.+?)(?::\d+)?"))


@dataclass(frozen=True)
class Jobs:
    """How an alert leads to the jobs to requeue.

    First ``labels`` (a job id on the alert itself); then, with ``prometheus_url``, the node agent's job
    map (``gpu_job_info``) for the alert's host, or the hosts a run's ranks report from; last, when
    ``ask_scheduler``, the scheduler's own list of jobs on the host.
    """

    labels: tuple[str, ...] = ("hpc_job", "slurm_job")
    prometheus_url: str | None = None
    lookback: float = 3600.0
    ask_scheduler: bool = True
    timeout: float = 10.0


@dataclass(frozen=True)
class SlurmOptions:
    """Slurm through its own commands."""

    #: Where scontrol, sinfo, squeue, scancel and sbatch live; None: found on PATH.
    bin_dir: str | None = None
    #: ``requeue`` (``scontrol requeue``) or ``resubmit`` (``scancel`` + ``sbatch`` of the job's own script).
    requeue: Literal["requeue", "resubmit"] = "requeue"
    timeout: float = 30.0


@dataclass(frozen=True)
class KubernetesOptions:
    """Kubernetes through the official client."""

    kubeconfig: str | None = None
    context: str | None = None
    in_cluster: bool = False
    taint_key: str = "babysitter.dev/remediation"
    taint_effect: Literal["NoSchedule", "NoExecute", "PreferNoSchedule"] = "NoSchedule"
    #: Pods are deleted only when one of these owner labels says a controller will recreate them.
    owner_labels: tuple[str, ...] = ("jobset.sigs.k8s.io/jobset-name", "training.kubeflow.org/job-name")
    grace_seconds: int = 30
    timeout: float = 30.0


@dataclass(frozen=True)
class ScriptOptions:
    """A user's program: ``path ACTION`` with the alert and the action as JSON on stdin."""

    path: str
    timeout: float = 60.0


@dataclass(frozen=True)
class Policy:
    """A checked policy."""

    backend: BackendKind
    rules: tuple[Rule, ...]
    rate_limit: RateLimit
    drain_cap: DrainCap
    audit_log: Path
    dry_run: bool = False
    cluster: str | None = None
    cluster_label: str = "cluster"
    allow: Allow = field(default_factory=Allow)
    hosts: Hosts = field(default_factory=Hosts)
    jobs: Jobs = field(default_factory=Jobs)
    slurm: SlurmOptions = field(default_factory=SlurmOptions)
    kubernetes: KubernetesOptions = field(default_factory=KubernetesOptions)
    script: ScriptOptions | None = None
    #: ``{run}`` template of run directories; the remediation is written next to the run's ledger.
    run_dirs: str | None = None
    #: A deferred alert (``firing_for``) not heard of again for this long is forgotten.
    pending_ttl: float = 86400.0
    #: When and how the incident's bundle is gathered before acting (docs/incidents.md).
    incidents: IncidentOptions = field(default_factory=IncidentOptions)

    def rule_for(self, labels: Mapping[str, str]) -> Rule | None:
        """The first rule that matches, or None."""
        return next((rule for rule in self.rules if rule.matches(labels)), None)

    def is_dry_run(self, rule: Rule) -> bool:
        """Whether the rule's actions only plan (the rule's own setting wins over the policy's)."""
        return self.dry_run if rule.dry_run is None else rule.dry_run


# --------------------------------------------------------------------------------------- parsing


class _Reader:
    """A mapping read key by key; whatever is left over at the end is an unknown key (a typo)."""

    def __init__(self, data: object, where: str) -> None:
        if not isinstance(data, dict):
            raise PolicyError(f"{where or 'the policy'}: expected a mapping, got {type(data).__name__}")
        self.data: dict[str, Any] = dict(data)
        self.where = where

    def at(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def take(self, key: str, default: Any = None) -> Any:
        return self.data.pop(key, default)

    def done(self, known: Sequence[str]) -> None:
        if self.data:
            extra = ", ".join(sorted(map(str, self.data)))
            raise PolicyError(
                f"{self.where or 'the policy'}: unknown key(s) {extra} (known: {', '.join(known)})"
            )

    def string(self, key: str, default: str | None = None, *, required: bool = False) -> str | None:
        value = self.take(key, default)
        if value is None:
            if required:
                raise PolicyError(f"{self.at(key)}: required")
            return None
        if not isinstance(value, str) or not value:
            raise PolicyError(f"{self.at(key)}: expected a non-empty string, got {value!r}")
        return value

    def boolean(self, key: str, default: bool | None) -> bool | None:
        value = self.take(key, default)
        if value is not None and not isinstance(value, bool):
            raise PolicyError(f"{self.at(key)}: expected true or false, got {value!r}")
        return value

    def duration(self, key: str, default: str | None, *, positive: bool = True) -> float:
        value = self.take(key, default)
        if value is None:
            raise PolicyError(f"{self.at(key)}: required (a duration such as 10m)")
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise PolicyError(f"{self.at(key)}: expected a duration such as '10m', got {value!r}")
        try:
            seconds = float(value) if isinstance(value, int) else float(parse_duration(value))
        except ValueError as exc:
            raise PolicyError(f"{self.at(key)}: {exc}") from None
        if positive and seconds <= 0:
            raise PolicyError(f"{self.at(key)}: must be longer than 0")
        if seconds < 0:
            raise PolicyError(f"{self.at(key)}: must not be negative")
        return seconds

    def integer(self, key: str, default: int | None, *, minimum: int) -> int | None:
        value = self.take(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise PolicyError(f"{self.at(key)}: expected an integer >= {minimum}, got {value!r}")
        return value

    def patterns(self, key: str) -> tuple[re.Pattern[str], ...]:
        value = self.take(key, [])
        if isinstance(value, str) or not isinstance(value, list):
            raise PolicyError(f"{self.at(key)}: expected a list of regular expressions")
        return tuple(_regex(item, f"{self.at(key)}[{i}]") for i, item in enumerate(value))

    def strings(self, key: str, default: Sequence[str]) -> tuple[str, ...]:
        value = self.take(key, list(default))
        if (
            isinstance(value, str)
            or not isinstance(value, list)
            or not all(isinstance(v, str) for v in value)
        ):
            raise PolicyError(f"{self.at(key)}: expected a list of strings")
        return tuple(value)

    def section(self, key: str) -> _Reader:
        return _Reader(self.take(key, {}) or {}, self.at(key))


def _regex(value: object, where: str) -> re.Pattern[str]:
    if not isinstance(value, str) or not value:
        raise PolicyError(f"{where}: expected a regular expression (a string)")
    try:
        return re.compile(value)
    except re.error as exc:
        raise PolicyError(f"{where}: bad regular expression {value!r}: {exc}") from None


def _rule(data: object, index: int, backend: BackendKind) -> Rule:
    r = _Reader(data, f"rules[{index}]")
    name = r.string("name", f"rule-{index}") or f"rule-{index}"
    match_data = r.take("match")
    if not isinstance(match_data, dict) or not match_data:
        raise PolicyError(f"{r.at('match')}: required: a mapping of label name to regex, alertname included")
    match: dict[str, re.Pattern[str]] = {}
    for label, pattern in match_data.items():
        if not isinstance(label, str) or not _LABEL.fullmatch(label):
            raise PolicyError(f"{r.at('match')}: {label!r} is not a label name")
        match[label] = _regex(pattern, f"{r.at('match')}.{label}")
    if "alertname" not in match:
        raise PolicyError(f"{r.at('match')}: must match alertname (a rule matching every alert is a footgun)")
    actions_data = r.take("actions")
    if isinstance(actions_data, str):
        actions_data = [actions_data]
    if not isinstance(actions_data, list) or not actions_data:
        raise PolicyError(f"{r.at('actions')}: required: a list of {', '.join(RULE_ACTIONS)}")
    actions: list[Action] = []
    for i, action in enumerate(actions_data):
        if action not in RULE_ACTIONS:
            raise PolicyError(
                f"{r.at('actions')}[{i}]: unknown action {action!r} (known: {', '.join(RULE_ACTIONS)})"
            )
        if action in actions:
            raise PolicyError(f"{r.at('actions')}[{i}]: {action} listed twice")
        actions.append(cast("Action", action))
    reason = r.string("reason", f"{{alertname}} ({name})") or name
    for field_name in _FIELD.findall(reason):
        if not _LABEL.fullmatch(field_name):
            raise PolicyError(f"{r.at('reason')}: {{{field_name}}} is not a label name")
    firing_for = r.duration("firing_for", "0s", positive=False)
    undrain = bool(r.boolean("undrain_on_resolve", False))
    if undrain and "drain" not in actions:
        raise PolicyError(f"{r.at('undrain_on_resolve')}: the rule does not drain")
    dry_run = r.boolean("dry_run", None)
    hosts_from = r.string("hosts_from", "alert")
    if hosts_from not in ("alert", "culprit"):
        raise PolicyError(f"{r.at('hosts_from')}: {hosts_from!r} is not alert or culprit")
    max_culprit_hosts = r.integer("max_culprit_hosts", 1, minimum=1) or 1
    if max_culprit_hosts != 1 and hosts_from != "culprit":
        raise PolicyError(f"{r.at('max_culprit_hosts')}: only with hosts_from: culprit")
    r.done(
        (
            "name",
            "match",
            "actions",
            "reason",
            "firing_for",
            "undrain_on_resolve",
            "dry_run",
            "hosts_from",
            "max_culprit_hosts",
        )
    )
    return Rule(
        name,
        match,
        tuple(actions),
        reason,
        firing_for,
        undrain,
        dry_run,
        cast("Literal['alert', 'culprit']", hosts_from),
        max_culprit_hosts,
    )


def parse_policy(data: object, *, base: Path | None = None) -> Policy:
    """A checked :class:`Policy` from parsed file contents; PolicyError names what is wrong and where."""
    top = _Reader(data, "")
    version = top.take("version", 1)
    if version != 1:
        raise PolicyError(f"version: {version!r} is not a policy version this babysitter reads (1)")
    backend = top.string("backend", required=True)
    if backend not in ("slurm", "kubernetes", "script"):
        raise PolicyError(f"backend: {backend!r} is not one of slurm, kubernetes, script")
    kind = cast("BackendKind", backend)

    s = top.section("slurm")
    requeue_mode = s.string("requeue", "requeue")
    if requeue_mode not in ("requeue", "resubmit"):
        raise PolicyError(f"slurm.requeue: {requeue_mode!r} is not requeue or resubmit")
    slurm = SlurmOptions(
        bin_dir=s.string("bin_dir"),
        requeue=cast("Literal['requeue', 'resubmit']", requeue_mode),
        timeout=s.duration("timeout", "30s"),
    )
    s.done(("bin_dir", "requeue", "timeout"))

    k = top.section("kubernetes")
    effect = k.string("taint_effect", "NoSchedule")
    if effect not in ("NoSchedule", "NoExecute", "PreferNoSchedule"):
        raise PolicyError(
            f"kubernetes.taint_effect: {effect!r} is not NoSchedule, NoExecute or PreferNoSchedule"
        )
    taint_key = k.string("taint_key", KubernetesOptions.taint_key) or KubernetesOptions.taint_key
    if not re.fullmatch(r"([a-z0-9.-]{1,253}/)?[A-Za-z0-9][A-Za-z0-9._-]{0,62}", taint_key):
        raise PolicyError(f"kubernetes.taint_key: {taint_key!r} is not a valid taint key")
    kube = KubernetesOptions(
        kubeconfig=k.string("kubeconfig"),
        context=k.string("context"),
        in_cluster=bool(k.boolean("in_cluster", False)),
        taint_key=taint_key,
        taint_effect=cast("Literal['NoSchedule', 'NoExecute', 'PreferNoSchedule']", effect),
        owner_labels=k.strings("owner_labels", KubernetesOptions.owner_labels),
        grace_seconds=k.integer("grace_seconds", 30, minimum=0) or 0,
        timeout=k.duration("timeout", "30s"),
    )
    k.done(
        (
            "kubeconfig",
            "context",
            "in_cluster",
            "taint_key",
            "taint_effect",
            "owner_labels",
            "grace_seconds",
            "timeout",
        )
    )

    script: ScriptOptions | None = None
    sc_data = top.take("script")
    if sc_data is not None:
        sc = _Reader(sc_data, "script")
        path = sc.string("path", required=True) or ""
        if not Path(path).is_absolute():
            raise PolicyError(f"script.path: {path!r} must be an absolute path (no PATH lookup, no shell)")
        script = ScriptOptions(path=path, timeout=sc.duration("timeout", "60s"))
        sc.done(("path", "timeout"))
    if kind == "script" and script is None:
        raise PolicyError("script: required when backend is script (script.path: the program to run)")

    h = top.section("hosts")
    host_label = h.string("label", "instance") or "instance"
    if not _LABEL.fullmatch(host_label):
        raise PolicyError(f"hosts.label: {host_label!r} is not a label name")
    host_pattern = _regex(h.take("pattern", Hosts().pattern.pattern), "hosts.pattern")
    if host_pattern.groups != 1:
        raise PolicyError("hosts.pattern: needs exactly one group (the node name)")
    h.done(("label", "pattern"))

    j = top.section("jobs")
    prometheus_url = j.string("prometheus_url")
    if prometheus_url is not None and not re.match(r"^https?://[^/?#]", prometheus_url):
        raise PolicyError(f"jobs.prometheus_url: {prometheus_url!r} is not an http(s) URL")
    job_labels = j.strings("labels", Jobs.labels)
    for label in job_labels:
        if not _LABEL.fullmatch(label):
            raise PolicyError(f"jobs.labels: {label!r} is not a label name")
    jobs = Jobs(
        labels=job_labels,
        prometheus_url=prometheus_url.rstrip("/") if prometheus_url else None,
        lookback=j.duration("lookback", "1h"),
        ask_scheduler=bool(j.boolean("ask_scheduler", True)),
        timeout=j.duration("timeout", "10s"),
    )
    j.done(("labels", "prometheus_url", "lookback", "ask_scheduler", "timeout"))

    rails = top.section("rails")
    rl = rails.section("rate_limit")
    if not rl.data:
        raise PolicyError(
            "rails.rate_limit: required (actions: N, window: DURATION); a remediator without one is unsafe"
        )
    rate = RateLimit(
        actions=rl.integer("actions", None, minimum=1) or _required(rl.at("actions")),
        window=rl.duration("window", None),
    )
    rl.done(("actions", "window"))
    dc = rails.section("drain_cap")
    if not dc.data:
        raise PolicyError("rails.drain_cap: required (fraction: 0..1, window: DURATION)")
    fraction = dc.take("fraction")
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise PolicyError(
            f"rails.drain_cap.fraction: expected a number strictly between 0 and 1, got {fraction!r}"
        )
    cap = DrainCap(
        fraction=float(fraction),
        window=dc.duration("window", None),
        min_nodes=dc.integer("min_nodes", 1, minimum=0) or 0,
        cluster_nodes=dc.integer("cluster_nodes", None, minimum=1),
    )
    dc.done(("fraction", "window", "min_nodes", "cluster_nodes"))
    if kind == "script" and cap.cluster_nodes is None:
        raise PolicyError(
            "rails.drain_cap.cluster_nodes: required with the script backend (it cannot count nodes)"
        )
    rails.done(("rate_limit", "drain_cap"))

    a = top.section("allow")
    allow = Allow(
        hosts=a.patterns("hosts"), partitions=a.patterns("partitions"), namespaces=a.patterns("namespaces")
    )
    a.done(("hosts", "partitions", "namespaces"))
    if allow.partitions and kind != "slurm":
        raise PolicyError("allow.partitions: only the slurm backend has partitions")
    if allow.namespaces and kind != "kubernetes":
        raise PolicyError("allow.namespaces: only the kubernetes backend has namespaces")

    audit = top.string("audit_log", required=True) or ""
    audit_path = Path(audit)
    if not audit_path.is_absolute():
        audit_path = (base or Path.cwd()) / audit_path
    run_dirs = top.string("run_dirs")
    if run_dirs is not None and "{run}" not in run_dirs:
        raise PolicyError(f"run_dirs: {run_dirs!r} must contain {{run}}")
    cluster = top.string("cluster")
    cluster_label = top.string("cluster_label", "cluster") or "cluster"
    if not _LABEL.fullmatch(cluster_label):
        raise PolicyError(f"cluster_label: {cluster_label!r} is not a label name")
    dry_run = bool(top.boolean("dry_run", False))
    pending_ttl = top.duration("pending_ttl", "24h")
    incidents = parse_incidents(top.section("incidents"), error=PolicyError, base=base)

    rules_data = top.take("rules")
    if not isinstance(rules_data, list) or not rules_data:
        raise PolicyError("rules: required: a list of rules (match, actions)")
    rules = tuple(_rule(item, i, kind) for i, item in enumerate(rules_data))
    names = [rule.name for rule in rules]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise PolicyError(f"rules: names used twice: {', '.join(dupes)}")
    for i, rule in enumerate(rules):
        if rule.hosts_from == "culprit" and jobs.prometheus_url is None:
            raise PolicyError(
                f"rules[{i}].hosts_from: culprit needs jobs.prometheus_url: a culprit host is acted on only "
                "when it holds the run's ranks, which the job map in Prometheus tells"
            )
    top.done(
        (
            "version",
            "backend",
            "slurm",
            "kubernetes",
            "script",
            "hosts",
            "jobs",
            "rails",
            "allow",
            "audit_log",
            "run_dirs",
            "cluster",
            "cluster_label",
            "dry_run",
            "pending_ttl",
            "rules",
            "incidents",
        )
    )
    return Policy(
        backend=kind,
        rules=rules,
        rate_limit=rate,
        drain_cap=cap,
        audit_log=audit_path,
        dry_run=dry_run,
        cluster=cluster,
        cluster_label=cluster_label,
        allow=allow,
        hosts=Hosts(host_label, host_pattern),
        jobs=jobs,
        slurm=slurm,
        kubernetes=kube,
        script=script,
        run_dirs=run_dirs,
        pending_ttl=pending_ttl,
        incidents=incidents,
    )


def _required(where: str) -> int:
    raise PolicyError(f"{where}: required")


def _toml(text: str) -> Any:
    if sys.version_info >= (3, 11):
        import tomllib

        return tomllib.loads(text)
    try:
        import tomli  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise PolicyError(
            f"TOML policies on Python 3.10 need tomli: {pip_install_extra('remediate')}"
        ) from None
    return tomli.loads(text)


def load_policy(path: Path) -> Policy:
    """Read and check a policy file (``.yaml``/``.yml``, ``.toml`` or ``.json``); PolicyError when invalid."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"cannot read policy {path}: {exc.strerror or exc}") from None
    suffix = path.suffix.lower()
    try:
        if suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError:
                raise PolicyError(f"YAML policies need PyYAML: {pip_install_extra('remediate')}") from None
            data = yaml.safe_load(text)
        elif suffix == ".toml":
            data = _toml(text)
        elif suffix == ".json":
            data = json.loads(text)
        else:
            raise PolicyError(f"{path}: unknown policy format {suffix!r} (use .yaml, .toml or .json)")
    except PolicyError:
        raise
    except Exception as exc:  # each parser has its own error type
        raise PolicyError(f"{path}: not valid {suffix[1:].upper()}: {exc}") from None
    try:
        return parse_policy(data, base=path.parent)
    except PolicyError as exc:
        raise PolicyError(f"{path}: {exc}") from None
