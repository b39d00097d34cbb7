"""The README's install line, run as a new user runs it (issue 32), in a new virtual environment.

A copy of the clone (what ``git clone`` gives: no virtual environment, no build output) sits in a
temporary directory as ``babysitter/``; a new virtual environment without system site packages gets
torch first (``torch==2.13.0``: this machine's local CPU wheel; PyTorch's CPU index, which the
README names, is out of CI's reach) and then the README's own line, verbatim, not editable. Everything
then runs from another temporary directory with the environment's own commands, so neither the
checkout nor this suite's environment is on ``sys.path``: ``babysitter demo --help`` and the routing
the demo loads, ``babysitter generate`` (the same files as the committed ones) and the README's example
with ``babysitter report``. Each step's time is printed (``-s``); docs/guide.md gives the measurement.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_readme_example import readme_example

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
#: Not in a fresh clone: this checkout's environment, caches and build output.
_NOT_CLONED = {".git", ".venv", "build", "dist", ".mypy_cache", ".pytest_cache", ".ruff_cache"}


def readme_install_line() -> list[str]:
    """The ``pip install`` line of the README's "Install into your own environment" block."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Install into your own environment") :]
    block = re.search(r"```sh\n(.*?)```", section, flags=re.DOTALL)
    assert block, "no sh block under '## Install into your own environment'"
    (line,) = [x for x in block.group(1).splitlines() if x.startswith("pip install")]
    argv = shlex.split(line, comments=True)
    assert argv[:2] == ["pip", "install"] and "-e" not in argv and "--editable" not in argv, argv
    return argv


def _ignore(directory: str, names: list[str]) -> set[str]:
    top = Path(directory) == REPO
    return {n for n in names if (top and n in _NOT_CLONED) or n == "__pycache__" or n.endswith(".egg-info")}


class Installed:
    """The new environment, the copy of the clone it was installed from, and a directory to run in."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.clone = root / "babysitter"
        self.venv = root / "venv"
        self.bin = self.venv / "bin"
        self.cwd = root / "cwd"
        self.times: dict[str, float] = {}
        # The user's shell, not this suite's environment: no PYTHONPATH, no active virtual environment.
        drop = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"}
        self.env = {k: v for k, v in os.environ.items() if k not in drop}
        self.env["PATH"] = f"{self.bin}{os.pathsep}{self.env.get('PATH', '')}"
        self.env["PIP_NO_COMPILE"] = "1"  # what runs is compiled when imported; saves CPU here

    def run(self, what: str, argv: list[str], cwd: Path | None = None, **env: str) -> str:
        started = time.monotonic()
        done = subprocess.run(
            argv,
            cwd=cwd or self.cwd,
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=600,
        )
        self.times[what] = time.monotonic() - started
        assert done.returncode == 0, f"{what}: {argv}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done.stdout

    def python(self, code: str) -> str:
        return self.run("python", [str(self.bin / "python"), "-c", code])


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    env = Installed(tmp_path_factory.mktemp("install"))
    started = time.monotonic()
    shutil.copytree(REPO, env.clone, symlinks=True, ignore=_ignore)
    env.cwd.mkdir()
    env.run("venv", [sys.executable, "-m", "venv", str(env.venv)], cwd=env.root)
    env.run("torch", [str(env.bin / "pip"), "install", "-q", "torch==2.13.0"], cwd=env.root)
    line = readme_install_line()
    env.run("readme line", [str(env.bin / "pip"), *line[1:]], cwd=env.root)  # from beside the clone
    env.times["setup"] = time.monotonic() - started
    print(f"install: {', '.join(f'{k} {v:.1f} s' for k, v in env.times.items())}")
    return env


def test_the_readme_line_installs_into_the_new_environment_not_editable(installed: Installed) -> None:
    """babysitter imports from the environment's site-packages, with nothing of the checkout or the
    copy on sys.path, and pip recorded a plain (not editable) install of the copy."""
    out = json.loads(
        installed.python(
            "import json, sys, babysitter; from importlib import metadata; "
            "d = metadata.distribution('babysitter'); "
            "print(json.dumps([babysitter.__file__, sys.path, json.loads(d.read_text('direct_url.json'))]))"
        )
    )
    module, path, direct_url = out
    assert Path(module).is_relative_to(installed.venv / "lib"), module
    assert "site-packages" in Path(module).parts
    outside = [
        p for p in path if p and (Path(p).is_relative_to(REPO) or Path(p).is_relative_to(installed.clone))
    ]
    assert outside == [], outside
    assert direct_url["url"] == installed.clone.as_uri() and not direct_url["dir_info"].get("editable")


def test_the_demo_finds_its_routing_inside_the_package(installed: Installed) -> None:
    """Before: "no exporters/alertmanager.yml next to this installation". The demo's Alertmanager
    routing is package data, the same file as exporters/alertmanager.yml, and it loads (PyYAML came
    with the demo extra)."""
    assert "--alertmanager-config" in installed.run(
        "demo --help", [str(installed.bin / "babysitter"), "demo", "--help"]
    )
    path = Path(
        installed.python(
            "from babysitter.demo.routing import load_routing, shipped_routing; "
            "p = shipped_routing(); load_routing(p); print(p)"
        ).strip()
    )
    assert path.is_relative_to(installed.venv), path
    assert path.read_bytes() == (REPO / "exporters/alertmanager.yml").read_bytes()
    # Its hints name this installation's source: the copy of the clone, not an index.
    hint = installed.python(
        "from babysitter._install import pip_install_extra; print(pip_install_extra('nvml'))"
    )
    assert hint.strip() == f"pip install {shlex.quote(f'{installed.clone}[nvml]')}"


def test_generate_writes_the_committed_files_into_the_current_directory(installed: Installed) -> None:
    """Not a checkout: it writes under the current directory, and what it writes is what the
    repository commits (``--check`` against the copy of the clone passes)."""
    out_dir = installed.root / "generated"
    out_dir.mkdir()
    said = installed.run("generate", [str(installed.bin / "babysitter"), "generate"], cwd=out_dir)
    assert f"files changed under {out_dir}" in said
    assert (out_dir / "alerts/babysitter-alerts.yaml").is_file() and (out_dir / "dashboards").is_dir()
    checked = installed.run(
        "generate --check",
        [str(installed.bin / "babysitter"), "generate", "--check", "--out", str(installed.clone)],
    )
    assert "are up to date" in checked


def test_the_readme_example_runs_and_reports(installed: Installed) -> None:
    """The README's example, as it is, without RUN_DIR: it writes under the current directory, and
    ``babysitter report`` (the table and the PNG: the extra's rich and matplotlib) reads it."""
    example = installed.root / "example.py"
    example.write_text(readme_example(), encoding="utf-8")
    out = installed.run(
        "example",
        [str(installed.bin / "python"), str(example)],
        STEPS="6",
        SAVE_EVERY="3",
        BABYSITTER_PORT="0",
    )
    run_dir = installed.cwd / "babysitter-example-run"
    assert f"run directory {run_dir}" in out
    report = json.loads(
        installed.run("report --json", [str(installed.bin / "babysitter"), "report", str(run_dir), "--json"])
    )
    assert report["state"] == "ended" and report["incarnation_list"][0]["last_step"] == 6
    assert report["checkpoints"]["saved"] == 2
    png = installed.root / "report.png"
    table = installed.run(
        "report --png", [str(installed.bin / "babysitter"), "report", str(run_dir), "--png", str(png)]
    )
    assert "goodput" in table and png.stat().st_size > 10_000
    print(f"install test steps: {', '.join(f'{k} {v:.1f} s' for k, v in installed.times.items())}")
