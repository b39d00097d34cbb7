"""The page carries the incident's id: a real Alertmanager writes it with exporters/babysitter.tmpl, and
it is the name of the bundle the remediator gathers for the same alert, with nothing passed between them
(both read the alert's start and fingerprint).
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from babysitter.incident.gather import Limits
from babysitter.remediate.alerts import parse_notification
from babysitter.remediate.incident_options import IncidentOptions
from babysitter.remediate.incidents import IncidentHook
from babysitter.training import incident_files as F
from gen_helpers import REPO, AlertmanagerServer, WebhookReceiver
from node_helpers import wait_for

pytestmark = [pytest.mark.prometheus]


def _post_alert(address: str, labels: dict[str, str]) -> None:
    body = [{"labels": labels, "annotations": {"summary": "no step for 5m"}}]
    request = urllib.request.Request(
        f"http://{address}/api/v2/alerts",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback test server
        assert response.status == 200


def test_the_page_names_the_bundle_the_remediator_gathers(tmp_path: Path) -> None:
    run_dir = tmp_path / "llama"
    run_dir.mkdir()
    with WebhookReceiver() as hook:
        config = {
            "templates": [str(REPO / "exporters/babysitter.tmpl")],
            "route": {"receiver": "both", "group_wait": "1s", "group_interval": "2s"},
            "receivers": [
                {
                    "name": "both",
                    "slack_configs": [
                        {
                            "api_url": f"{hook.url}/slack",
                            "channel": "#oncall",
                            "text": '{{ template "babysitter.incidents" . }}',
                        }
                    ],
                    "webhook_configs": [{"url": f"{hook.url}/remediate"}],
                }
            ],
        }
        with AlertmanagerServer(tmp_path, yaml.safe_dump(config)) as am:
            _post_alert(am.address, {"alertname": "TrainingStalled", "run": "llama", "instance": "n7:9400"})
            got: Any = wait_for(
                lambda: {p for p, _ in hook.received} >= {"/slack", "/remediate"} and hook.received,
                timeout=60,
                interval=0.2,
            )
    slack = next(body for path, body in got if path == "/slack")
    remediate = next(body for path, body in got if path == "/remediate")
    text = slack["attachments"][0]["text"]
    [alert] = parse_notification(remediate).alerts
    [bundle] = IncidentHook(
        IncidentOptions(limits=Limits(wait=1)), run_dir=lambda run: run_dir if run == "llama" else None
    ).gather(alert)[0]
    assert bundle.complete and F.valid_id(bundle.id)
    assert text.strip() == f"incident {bundle.id}: TrainingStalled run llama on n7:9400"
    assert sorted(p.name for p in (run_dir / F.INCIDENTS).iterdir()) == [bundle.id]
    assert abs(time.time() - alert.starts_at) < 120
