"""What pip builds from the checkout: the version from one place, the SPDX licence, the LICENSE file,
the console script. Built without isolation (no index needed) from a copy of the sources."""

from __future__ import annotations

import email
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from babysitter._version import __version__
from gen_helpers import REPO

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_setuptools_floor_reads_the_spdx_licence_string() -> None:
    """`license = "Apache-2.0"` (PEP 639) needs setuptools 77; an older floor lets pip pick a setuptools
    that rejects the project table."""
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    (requirement,) = [r for r in PYPROJECT["build-system"]["requires"] if r.startswith("setuptools")]
    match = re.fullmatch(r"setuptools>=(\d+)(?:\.\d+)*", requirement)
    assert match, requirement
    assert int(match.group(1)) >= 77


def test_the_version_lives_in_one_place() -> None:
    """pyproject reads the version from _version.py; no second literal to forget."""
    assert "version" not in PYPROJECT["project"]
    assert "version" in PYPROJECT["project"]["dynamic"]
    attr = PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "babysitter._version.__version__"


def test_license_file_is_the_apache_2_text() -> None:
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert PYPROJECT["project"]["license-files"] == ["LICENSE"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel pip builds from a copy of what a source checkout holds (about 2 s)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = tmp_path_factory.mktemp("wheel")
    # The PEP 517 hook pip calls, without pip's own start-up (the installed setuptools is >= 77).
    build = f"from setuptools import build_meta; build_meta.build_wheel({str(out)!r})"
    subprocess.run(
        [sys.executable, "-c", build],
        cwd=src,
        check=True,
        capture_output=True,
        timeout=120,
    )
    (built,) = out.glob("*.whl")
    return built


def test_wheel_metadata_agrees_with_the_package(wheel: Path) -> None:
    """The wheel's version is the package's, its licence the SPDX expression with the LICENSE file
    inside, and its one console script is the CLI."""
    dist_info = f"babysitter-{__version__}.dist-info"
    with zipfile.ZipFile(wheel) as zf:
        meta = email.message_from_bytes(zf.read(f"{dist_info}/METADATA"))
        licence = zf.read(f"{dist_info}/licenses/LICENSE").decode()
        entry_points = zf.read(f"{dist_info}/entry_points.txt").decode()
        names = zf.namelist()
        routing = zf.read("babysitter/data/alertmanager.yml")
    assert meta["Name"] == "babysitter"
    assert meta["Version"] == __version__
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert licence == (REPO / "LICENSE").read_text()
    assert "[console_scripts]\nbabysitter = babysitter.cli:main" in entry_points
    assert "babysitter/py.typed" in names
    # The demo's Alertmanager routing ships inside the package: the one file exporters/ links to.
    assert (REPO / "exporters/alertmanager.yml").is_symlink()
    assert routing == (REPO / "exporters/alertmanager.yml").read_bytes()
    assert {"demo", "test", "nvml"} <= set(meta.get_all("Provides-Extra") or [])
