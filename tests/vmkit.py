"""Real VictoriaMetrics and vmalert processes for tests and benchmarks, run with the shipped flags.

The flags come from ``exporters/central/victoriametrics/*.default`` (what a deployment copies to
``/etc/default/``), parsed as systemd would, with only the addresses, paths and the fast profile's
evaluation interval put in by the caller: the test runs what ships, not a copy of it.

Usage::

    with VictoriaMetricsServer(tmp_path) as vm, VmalertServer(tmp_path, vm, rules, am) as alert:
        vm.query_value("sum(up)")
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "SHIPPED",
    "VICTORIA_METRICS",
    "VMALERT",
    "VictoriaMetricsServer",
    "VmalertServer",
    "require_victoriametrics",
    "shipped_args",
]

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "exporters/central/victoriametrics"
VICTORIA_METRICS = shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics"
VMALERT = shutil.which("vmalert") or "/usr/bin/vmalert"
#: The placeholders the shipped files use for addresses and paths.
VM_ADDRESS = "10.0.0.5:8428"
VMALERT_ADDRESS = "10.0.0.5:8880"
ALERTMANAGER_ADDRESS = "10.0.0.6:9093"
RULES_DIR = "/etc/babysitter/alerts"
DATA_DIR = "/var/lib/victoria-metrics"


def require_victoriametrics() -> None:
    """Skip loudly where Debian's victoria-metrics package is not installed; CI installs it."""
    for path, name in ((VICTORIA_METRICS, "victoria-metrics"), (VMALERT, "vmalert")):
        if not Path(path).exists():
            pytest.skip(f"{name} not installed (apt-get install victoria-metrics)")


def shipped_args(name: str) -> list[str]:
    """The ``ARGS="..."`` of a shipped ``/etc/default`` file, split as systemd splits ``$ARGS``."""
    text = (SHIPPED / name).read_text()
    match = re.search(r'^ARGS="([^"]*)"$', text, re.MULTILINE)
    if match is None:
        raise ValueError(f'{name}: no ARGS="..." line')
    return shlex.split(match.group(1))


def _substitute(args: Sequence[str], replace: Mapping[str, str], override: Mapping[str, str]) -> list[str]:
    """``args`` with placeholder text replaced, and the named flags' values overridden (each flag
    must be in the file already: an override never adds a flag the deployment does not set)."""
    out = []
    seen = set()
    for given in args:
        arg = given
        for old, new in replace.items():
            arg = arg.replace(old, new)
        flag = arg.split("=", 1)[0]
        if flag in override:
            arg = f"{flag}={override[flag]}"
            seen.add(flag)
        out.append(arg)
    missing = set(override) - seen
    if missing:
        raise ValueError(f"overrides of flags the shipped file does not set: {sorted(missing)}")
    return out


def _free_port() -> int:
    from promkit import free_port

    return free_port()


def _get(url: str, timeout: float = 10.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - loopback test URL
        return bytes(response.read())


class _Process:
    """A child process with a log file and a readiness URL."""

    name = "process"

    def __init__(self, workdir: Path, argv: list[str], ready_url: str) -> None:
        self.workdir = workdir
        self.argv = argv
        self._ready = ready_url
        self._log = workdir / f"{self.name}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        handle = self._log.open("wb")
        try:
            self._proc = subprocess.Popen(self.argv, stdout=handle, stderr=subprocess.STDOUT)
        finally:
            handle.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log_tail()}")
            try:
                _get(self._ready, timeout=1)
                return
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.name} did not become ready in 30 s: {self.log_tail()}")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=5)

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def log_tail(self, chars: int = 2000) -> str:
        return self._log.read_text(errors="replace")[-chars:] if self._log.exists() else ""


class VictoriaMetricsServer(_Process):
    """Single-node VictoriaMetrics with ``victoria-metrics.default``'s flags on a loopback port."""

    name = "victoria-metrics"

    def __init__(
        self, workdir: Path, *, override: Mapping[str, str] | None = None, extra: Sequence[str] = ()
    ) -> None:
        """``extra``: flags the shipped file does not set, that a test or benchmark needs (the fleet
        benchmark's ``-promscrape.config``: there VictoriaMetrics scrapes like the Prometheus beside it)."""
        require_victoriametrics()
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.address}"
        data = workdir / "vm-data"
        args = _substitute(
            shipped_args("victoria-metrics.default"),
            {VM_ADDRESS: self.address, DATA_DIR: str(data)},
            override or {},
        )
        super().__init__(
            workdir, [VICTORIA_METRICS, *args, *extra, "-loggerLevel=WARN"], f"{self.url}/health"
        )

    def __enter__(self) -> VictoriaMetricsServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """Instant query at ``at`` (now when None), as vmalert asks: ``nocache=1``, so the answer is
        as of that instant, not ``-search.latencyOffset`` before it."""
        from promkit import instant_query

        return instant_query(self.url, expr, at, nocache="1")

    def query_value(self, expr: str, at: float | None = None) -> float | None:
        """The single value of an instant query, None when the result is empty."""
        from promkit import single_value

        return single_value(self.query(expr, at), expr)


class VmalertServer(_Process):
    """vmalert with ``vmalert.default``'s flags, reading and writing ``vm``, notifying ``notifier``."""

    name = "vmalert"

    def __init__(
        self,
        workdir: Path,
        vm: VictoriaMetricsServer,
        rule_files: Sequence[Path],
        notifier: str,
        *,
        override: Mapping[str, str] | None = None,
    ) -> None:
        require_victoriametrics()
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = shipped_args("vmalert.default")
        shipped_rules = [a for a in args if a.startswith("-rule=")]
        if len(shipped_rules) != len(rule_files):
            raise ValueError(f"vmalert.default loads {len(shipped_rules)} rule files, got {len(rule_files)}")
        # The shipped rule paths, in order, become the given files (same names: what generate writes).
        replace: dict[str, str] = {
            VM_ADDRESS: vm.address,
            VMALERT_ADDRESS: f"127.0.0.1:{self.port}",
            ALERTMANAGER_ADDRESS: notifier,
        }
        for shipped, given in zip(shipped_rules, rule_files, strict=True):
            if Path(shipped.split("=", 1)[1]).name != given.name:
                raise ValueError(f"{shipped} is not {given.name}")
            replace[shipped.split("=", 1)[1]] = str(given)
        args = _substitute(args, replace, override or {})
        super().__init__(workdir, [VMALERT, *args, "-loggerLevel=WARN"], f"{self.url}/health")

    def __enter__(self) -> VmalertServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def groups(self) -> list[dict[str, Any]]:
        """Every rule group vmalert loaded, with its rules' state (``/api/v1/rules``)."""
        body = json.loads(_get(f"{self.url}/api/v1/rules"))
        return list(body["data"]["groups"])
