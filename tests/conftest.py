"""Shared test setup: every test gets its own registration directory, so trackers started by
tests never show up in a real node agent's directory (or in each other's); and the session fails when
a process it started outlives it (leftover_check.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest_plugins = ["leftover_check"]

#: Modules that take a minute or more on the CI machine, longest first (``--durations`` of CI runs):
#: collected first, so that xdist's loadscope starts them first and the suite does not end waiting on
#: one of them started last. It needs ``--no-loadscope-reorder`` (the Makefile passes it): by default
#: xdist re-sorts modules by their number of tests, and these have few, so they went last.
SLOW_FIRST = (
    "test_incident_loop.py",
    "test_scorecard.py",
    "test_campaign_e2e.py",
    "test_install.py",
    "test_two_tier.py",
    "test_demo_e2e.py",
    "test_victoriametrics.py",
    "test_alerts.py",
    "test_collectives_e2e.py",
    "test_remediate_e2e.py",
    "test_monitoring_e2e.py",
    "test_parallel_torchrun.py",
    "test_readme_example.py",
    "test_alerts_e2e.py",
    "test_slowdown_e2e.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow modules first, in :data:`SLOW_FIRST` order; the rest as collected (a stable sort)."""
    rank = {name: index for index, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


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
