"""Shared test setup: every test gets its own registration directory, so trackers started by
tests never show up in a real node agent's directory (or in each other's)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _isolated_registry(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path_factory.mktemp("registry")
    monkeypatch.setenv("BABYSITTER_REGISTRY_DIR", str(directory))
    return directory


@pytest.fixture
def gloo() -> Iterator[Any]:
    """A one-rank gloo process group in this process, as ``torch.distributed`` (destroyed after: other
    tests expect none). torch's flight recorder is the process's and outlives it."""
    import torch.distributed as dist
    from torch.distributed import HashStore

    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    try:
        yield dist
    finally:
        dist.destroy_process_group()
