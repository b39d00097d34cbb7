"""Shared test setup: every test gets its own registration directory, so trackers started by
tests never show up in a real node agent's directory (or in each other's)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _isolated_registry(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path_factory.mktemp("registry")
    monkeypatch.setenv("BABYSITTER_REGISTRY_DIR", str(directory))
    return directory
