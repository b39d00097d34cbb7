"""Real Prometheus and Alertmanager processes for tests: loopback, ephemeral ports, temp dirs.

Usage::

    with PrometheusServer(tmp_path, targets=["127.0.0.1:9450"], scrape_interval="1s") as prom:
        prom.wait_for("up == 1")
        value = prom.query_value("train_mfu_ratio")
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

__all__ = ["PrometheusServer", "free_port", "instant_query", "require_binary", "single_value"]

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager") or ""
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def require_binary(path: str, name: str) -> None:
    """Skip loudly in a developer's checkout without the Debian packages; CI installs them."""
    if not path or not Path(path).exists():
        pytest.skip(f"{name} not installed (apt-get install prometheus prometheus-alertmanager)")


def free_port() -> int:
    """A port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - loopback test URL
        return json.loads(response.read())


def instant_query(url: str, expr: str, at: float | None = None, **extra: str) -> list[dict[str, Any]]:
    """An instant query against a Prometheus HTTP API at ``url``; the result vector (raises on an
    error). ``extra``: more query parameters (VictoriaMetrics's ``nocache``)."""
    params = {"query": expr, **extra}
    if at is not None:
        params["time"] = repr(at)
    body = _get_json(f"{url}/api/v1/query?{urllib.parse.urlencode(params)}")
    if body.get("status") != "success":
        raise AssertionError(f"query {expr!r} failed at {url}: {body}")
    result = body["data"]["result"]
    return result if isinstance(result, list) else [{"metric": {}, "value": result}]


def single_value(result: list[dict[str, Any]], expr: str) -> float | None:
    """The one value of an instant query's result, None when it is empty."""
    if not result:
        return None
    if len(result) != 1:
        raise AssertionError(f"{expr!r} returned {len(result)} series")
    return float(result[0]["value"][1])


class PrometheusServer:
    """A Prometheus 2.x process scraping ``targets`` (``host:port``), with optional rule files."""

    def __init__(
        self,
        workdir: Path,
        *,
        targets: Sequence[str] = (),
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        rule_files: Sequence[Path] = (),
        alertmanager: str | None = None,
        scheme: str = "http",
        extra_scrape_configs: Sequence[dict[str, Any]] = (),
        agent: bool = False,
        remote_write: Sequence[dict[str, Any]] = (),
        external_labels: dict[str, str] | None = None,
        receiver: bool = False,
        extra_flags: Sequence[str] = (),
    ) -> None:
        require_binary(PROMETHEUS, "prometheus")
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config: dict[str, Any] = {
            "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval},
            "scrape_configs": [
                {"job_name": "test", "scheme": scheme, "static_configs": [{"targets": list(targets)}]},
                *extra_scrape_configs,
            ],
        }
        if rule_files:
            config["rule_files"] = [str(p) for p in rule_files]
        if alertmanager:
            config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
        if remote_write:
            config["remote_write"] = list(remote_write)
        if external_labels:
            config["global"]["external_labels"] = dict(external_labels)
        if agent:  # agent mode has no rules, alerting or evaluation interval
            for key in ("rule_files", "alerting"):
                config.pop(key, None)
            config["global"].pop("evaluation_interval")
        self.agent = agent
        self._flags = [*(["--web.enable-remote-write-receiver"] if receiver else []), *extra_flags]
        self.config_path = workdir / "prometheus.yml"
        # JSON is valid YAML: no YAML library needed to write the config.
        self.config_path.write_text(json.dumps(config, indent=2))
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = workdir / "prometheus.log"

    def __enter__(self) -> PrometheusServer:
        data = self.workdir / "prom-data"
        data.mkdir(exist_ok=True)
        log = self._log.open("wb")
        storage = (
            ["--enable-feature=agent", f"--storage.agent.path={data}"]
            if self.agent
            else [f"--storage.tsdb.path={data}"]
        )
        self._proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={self.config_path}",
                *storage,
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
                "--log.level=warn",
                *self._flags,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self._log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:  # noqa: S310
                    if response.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        self.__exit__(None, None, None)
        raise RuntimeError("prometheus did not become ready in 30 s")

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=5)

    def kill(self) -> None:
        """SIGKILL: what a crashed or evicted Prometheus looks like (no shutdown, no last push)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """Instant query; the result vector (raises on a PromQL error)."""
        return instant_query(self.url, expr, at)

    def query_value(self, expr: str, at: float | None = None) -> float | None:
        """The single value of an instant query, None when the result is empty."""
        return single_value(self.query(expr, at), expr)

    def wait_for(self, expr: str, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Poll until ``expr`` returns a non-empty vector; the vector."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"{expr!r} still empty after {timeout} s; log: {self.log_tail()}")
            time.sleep(0.5)

    def log_tail(self) -> str:
        """The end of Prometheus' log, for assertion messages."""
        return self._log.read_text()[-2000:] if self._log.exists() else ""
