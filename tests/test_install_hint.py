"""A missing package's message names the pip command that adds the right extra to this installation
(issue 32: the demo's hint asked for `pip install 'babysitter[report]'`, which no index serves, when
the demo needs the demo extra)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from babysitter import _install
from babysitter._install import pip_install_extra
from babysitter.cli import main

REPO = Path(__file__).resolve().parents[1]


class _Dist:
    def __init__(self, direct_url: dict[str, Any] | None) -> None:
        self.direct_url = direct_url

    def read_text(self, name: str) -> str | None:
        assert name == "direct_url.json"
        return None if self.direct_url is None else json.dumps(self.direct_url)


def _installed_from(monkeypatch: pytest.MonkeyPatch, direct_url: dict[str, Any] | None) -> None:
    """As if this package were installed (not a checkout), from what ``direct_url`` says."""
    from importlib import metadata

    monkeypatch.setattr(_install, "checkout", lambda: None)
    monkeypatch.setattr(metadata, "distribution", lambda name: _Dist(direct_url))


def test_from_the_checkout_it_names_an_editable_install_of_it() -> None:
    assert pip_install_extra("demo") == f"pip install -e '{REPO}[demo]'"


@pytest.mark.parametrize(
    ("direct_url", "said"),
    [
        (
            {"url": "file:///home/me/src/babysitter", "dir_info": {}},
            "pip install '/home/me/src/babysitter[demo]'",
        ),
        (
            {"url": "file:///tmp/dist/babysitter-0.1.0-py3-none-any.whl", "archive_info": {}},
            "pip install '/tmp/dist/babysitter-0.1.0-py3-none-any.whl[demo]'",
        ),
        (
            {
                "url": "https://git.example/ml/babysitter.git",
                "vcs_info": {"vcs": "git", "commit_id": "abc123"},
            },
            "pip install 'babysitter[demo] @ git+https://git.example/ml/babysitter.git@abc123'",
        ),
        (
            {"url": "file:///home/me/my%20src/babysitter", "dir_info": {}},
            "pip install '/home/me/my src/babysitter[demo]'",
        ),
        (None, "pip install '<your babysitter clone or wheel>[demo]' (see the README, Install)"),
    ],
)
def test_installed_it_names_where_pip_installed_it_from(
    monkeypatch: pytest.MonkeyPatch, direct_url: dict[str, Any] | None, said: str
) -> None:
    _installed_from(monkeypatch, direct_url)
    assert pip_install_extra("demo") == said


def test_the_demo_names_every_missing_package_and_the_demo_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One try: torch first (the CPU build), then the demo extra, which also brings PyYAML (the
    report extra lacks it; before, the hint named that one)."""
    real = importlib.util.find_spec
    gone = {"torch", "rich", "yaml"}
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in gone else real(name, *a)
    )
    assert main(["demo"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("babysitter demo needs torch, rich, PyYAML: install torch first"), err
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in err
    assert err.rstrip().endswith(f"then add babysitter's demo extra: {pip_install_extra('demo')}"), err
    assert "[report]" not in err


def test_the_demo_without_torch_alone_asks_for_torch_only(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    assert main(["demo"]) == 2
    err = capsys.readouterr().err
    assert "needs torch: install torch first" in err and "extra" not in err, err


def test_top_asks_for_the_report_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "rich" else real(name, *a)
    )
    assert main(["top", "--once", "--metrics", "http://127.0.0.1:9"]) == 2
    assert f"in the report extra: {pip_install_extra('report')}" in capsys.readouterr().err


def test_a_copy_installed_in_a_venv_inside_a_clone_is_not_the_checkout(tmp_path: Path) -> None:
    """Before, generate walked up from its file to any pyproject.toml beside a src/babysitter: an
    installed copy in clone/.venv took the clone for its checkout and wrote its files there."""
    clone = tmp_path / "clone"
    (clone / "src/babysitter/cli").mkdir(parents=True)
    (clone / "pyproject.toml").write_text("[project]\n")
    installed = clone / ".venv/lib/python3.11/site-packages/babysitter"
    installed.mkdir(parents=True)
    assert _install.checkout(installed) is None
    assert _install.checkout(clone / "src/babysitter") == clone
    assert _install.checkout() == REPO  # this suite runs from its checkout
