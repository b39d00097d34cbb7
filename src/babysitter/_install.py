"""The pip command that adds an extra to this installation, for the hints of missing packages.

babysitter is installed from a clone or a wheel built from one, not from an index, and an index may
serve an unrelated project under the same name: a hint that says ``pip install 'babysitter[report]'``
would fail, or install someone else's code. pip records where it installed a project from
(``direct_url.json``, PEP 610): the hint names that directory, wheel or repository. Imported by the
command line's modules at start-up, so it reads the metadata only when a hint is wanted.
"""

from __future__ import annotations

import shlex
from pathlib import Path

__all__ = ["checkout", "pip_install_extra"]

_README = "see the README, Install"


def _source() -> str | None:
    """Where pip installed this babysitter from (a path or a URL); None when it does not say."""
    import json
    from importlib import metadata
    from urllib.parse import unquote, urlsplit

    try:
        text = metadata.distribution("babysitter").read_text("direct_url.json")
    except (metadata.PackageNotFoundError, OSError):
        return None
    try:
        info = json.loads(text or "")
        url = str(info["url"])
    except (ValueError, KeyError, TypeError):
        return None
    vcs = info.get("vcs_info")
    if isinstance(vcs, dict) and vcs.get("vcs"):
        commit = vcs.get("commit_id")
        return f"{vcs['vcs']}+{url}" + (f"@{commit}" if commit else "")
    parts = urlsplit(url)
    return unquote(parts.path) if parts.scheme == "file" else url


def checkout(package: Path | None = None) -> Path | None:
    """The clone the package runs from (an editable install, or ``PYTHONPATH=src``), else None.

    Only the package directory's own place counts (``<clone>/src/babysitter``): a copy installed into
    a virtual environment inside a clone is not taken for it. ``package``: for tests."""
    package = package or Path(__file__).resolve().parent
    root = package.parent.parent
    if package.parent.name == "src" and (root / "pyproject.toml").is_file():
        return root
    return None


def pip_install_extra(extra: str) -> str:
    """``pip install ...`` that adds ``extra`` to the babysitter this process imports."""
    root = checkout()
    if root is not None:
        return f"pip install -e {shlex.quote(f'{root}[{extra}]')}"
    source = _source()
    if source is None:
        return f"pip install '<your babysitter clone or wheel>[{extra}]' ({_README})"
    if "://" in source:  # a repository or an archive elsewhere: a direct reference
        return f"pip install {shlex.quote(f'babysitter[{extra}] @ {source}')}"
    return f"pip install {shlex.quote(f'{source}[{extra}]')}"
