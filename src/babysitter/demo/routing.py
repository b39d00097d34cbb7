"""The demo's Alertmanager configuration: the shipped production routing, pointed at the demo.

The demo routes alerts with the shipped ``exporters/alertmanager.yml`` (package data,
``babysitter/data/alertmanager.yml``, so an installed package has it too) or a file the user gives: its
severity routes, grouping and inhibitions unchanged, so the demo pages what production would page and no
more. Only three things change, at runtime: every receiver becomes a webhook to the demo's own
receiver (``/<receiver name>``, so the screen can say which receiver each alert went to), the
grouping waits shrink to seconds (the fast profile's pace; production waits 30 s and 5 min), and
GPU alerts also go to ``babysitter remediate --dry-run`` (``continue``: the routing below still
applies), as docs/remediate.md routes them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from babysitter._install import pip_install_extra

__all__ = [
    "DEMO_GROUP_INTERVAL",
    "DEMO_GROUP_WAIT",
    "DEMO_REMEDIATED",
    "REMEDIATE_RECEIVER",
    "RoutingError",
    "demo_alertmanager_config",
    "load_routing",
    "shipped_routing",
]

#: Grouping waits in the demo (production: exporters/alertmanager.yml's 30 s and 5 min).
DEMO_GROUP_WAIT = "1s"
DEMO_GROUP_INTERVAL = "2s"
#: The receiver the demo adds for ``babysitter remediate``.
REMEDIATE_RECEIVER = "demo-remediate"


class RoutingError(ValueError):
    """The Alertmanager configuration to route with cannot be used."""


def shipped_routing() -> Path | None:
    """The production routing shipped in the package (``exporters/alertmanager.yml`` links to it);
    None when the installation lacks it."""
    path = Path(str(resources.files("babysitter") / "data" / "alertmanager.yml"))
    return path if path.is_file() else None


def load_routing(path: Path) -> dict[str, Any]:
    """Read an Alertmanager configuration; RoutingError when it has no route or receivers."""
    try:
        import yaml
    except ImportError as exc:
        raise RoutingError(
            f"reading the Alertmanager routing needs PyYAML, in the demo extra: {pip_install_extra('demo')}"
        ) from exc
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise RoutingError(f"{path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("route"), dict):
        raise RoutingError(f"{path}: not an Alertmanager configuration (no 'route')")
    receivers = data.get("receivers")
    if not isinstance(receivers, list) or not all(
        isinstance(r, dict) and isinstance(r.get("name"), str) for r in receivers
    ):
        raise RoutingError(f"{path}: 'receivers' must be a list of named receivers")
    return data


def _shorten(route: dict[str, Any], *, root: bool) -> None:
    if root or "group_wait" in route:
        route["group_wait"] = DEMO_GROUP_WAIT
    if root or "group_interval" in route:
        route["group_interval"] = DEMO_GROUP_INTERVAL
    for child in route.get("routes") or ():
        if isinstance(child, dict):
            _shorten(child, root=False)


def _receivers(route: Mapping[str, Any]) -> set[str]:
    """The receivers a routing tree names."""
    found = {route["receiver"]} if "receiver" in route else set()
    for child in route.get("routes") or ():
        found |= _receivers(child)
    return found


#: The alerts the demo's remediator gets (its policy acts on GPU alerts).
DEMO_REMEDIATED = 'alertname=~"Gpu.*"'


def demo_alertmanager_config(
    routing: Mapping[str, Any],
    webhook_url: Callable[[str], str],
    remediate_url: str | None = None,
    *,
    remediate_token: Path | None = None,
    shorten: bool = True,
    remediated: str = DEMO_REMEDIATED,
) -> dict[str, Any]:
    """``routing`` with every receiver a webhook to ``webhook_url(name)`` (resolutions too), the
    grouping waits of the demo (``shorten``; else the routing's own), and, with ``remediate_url``,
    the alerts ``remediated`` matches to the remediator first, sending the token in
    ``remediate_token`` (a file: Alertmanager's ``credentials_file``)."""
    config: dict[str, Any] = {
        key: copy.deepcopy(value) for key, value in routing.items() if key in ("global", "route")
    }
    if "inhibit_rules" in routing:
        config["inhibit_rules"] = copy.deepcopy(routing["inhibit_rules"])
    used = _receivers(routing.get("route") or {})  # a receiver no route reaches (remediate's) stays out
    config["receivers"] = [
        {"name": r["name"], "webhook_configs": [{"url": webhook_url(r["name"]), "send_resolved": True}]}
        for r in routing["receivers"]
        if r["name"] in used
    ]
    route = config["route"]
    if shorten:
        _shorten(route, root=True)
    if remediate_url is not None:
        route["routes"] = [
            {
                "receiver": REMEDIATE_RECEIVER,
                "matchers": [remediated],
                "group_by": ["alertname", "cluster", "instance", "gpu"],
                "continue": True,
            },
            *(route.get("routes") or ()),
        ]
        hook: dict[str, Any] = {"url": remediate_url, "send_resolved": True}
        if remediate_token is not None:
            auth = {"type": "Bearer", "credentials_file": str(remediate_token)}
            hook["http_config"] = {"authorization": auth}
        config["receivers"].append({"name": REMEDIATE_RECEIVER, "webhook_configs": [hook]})
    return config
