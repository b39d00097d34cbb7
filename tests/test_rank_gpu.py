"""A rank's GPU in ``train_info``: the UUID and PCI address the node agent exports for the same GPU.

torch's device properties are faked (the CPU build has no CUDA device) and NVML is the node agent's
fake (``node/gpu/fake.py``); the node agent's GPU collector reads the same fake, so "the same format"
is checked against what it really exports, not against a spelled-out string.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import generate_latest

import babysitter
from babysitter.catalog import node as N
from babysitter.catalog import selfmon as S
from babysitter.catalog import train as T
from babysitter.node.gpu.collector import GpuCollector
from babysitter.node.gpu.fake import NVML_ERROR_UNKNOWN, FakeNvml, fake_gpus
from babysitter.training import gpu as rank_gpu
from babysitter.training.tally import Tally


@dataclass
class _Props:
    """The PCI fields of ``torch.cuda.get_device_properties`` (torch >= 2.5)."""

    pci_domain_id: int
    pci_bus_id: int
    pci_device_id: int


class _Cuda:
    """Only ``get_device_properties``: any other CUDA call (a synchronize) would fail the lookup."""

    def __init__(self, props: dict[int, Any]) -> None:
        self._props = props

    def get_device_properties(self, index: int) -> Any:
        return self._props[index]


class _Torch:
    def __init__(self, props: dict[int, Any]) -> None:
        self.cuda = _Cuda(props)


def _nvml(count: int = 4) -> FakeNvml:
    return FakeNvml(fake_gpus(count))


def _props_of(nvml: FakeNvml, index: int) -> _Props:
    domain, bus, rest = nvml.gpu(index).pci_bus_id.split(":")
    return _Props(int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16))


def _agent_labels(nvml: FakeNvml) -> dict[str, tuple[str, str]]:
    """uuid -> (uuid, pci_bus_id) as the node agent's GPU collector exports them."""
    collector = GpuCollector(nvml, gpm=False)
    collector.start()
    try:
        families = {family.name: family for family in collector.collect()}
    finally:
        collector.close()
    out = {}
    for sample in families[N.GPU_UP.name].samples:
        out[sample.labels["uuid"]] = (sample.labels["uuid"], sample.labels["pci_bus_id"])
    return out


def test_labels_match_the_node_agents_series_for_that_gpu() -> None:
    """The rank on CUDA device 2 names GPU 2 by the uuid and pci_bus_id the node agent exports for it."""
    nvml = _nvml()
    torch = _Torch({i: _props_of(nvml, i) for i in range(4)})
    errors = Tally("internal error")
    labels = rank_gpu.gpu_labels(torch, 2, errors, nvml=lambda: nvml)
    agent = _agent_labels(nvml)
    assert (labels["uuid"], labels["pci_bus_id"]) == agent[nvml.gpu(2).uuid]
    assert labels["pci_bus_id"] != nvml.gpu(2).pci_bus_id  # NVML's raw spelling was normalized
    assert errors.counts() == {}
    assert nvml.calls["nvmlDeviceGetHandleByPciBusId"] == 1
    assert nvml._init_count == 0  # init and shutdown paired


def test_bus_id_from_torch_in_nvml_spelling() -> None:
    """torch's integer PCI fields become NVML's ``domain:bus:device.function`` string."""
    assert rank_gpu.nvml_bus_id(_Props(0, 0x53, 0)) == "00000000:53:00.0"
    assert rank_gpu.nvml_bus_id(_Props(1, 0xAB, 0x1F)) == "00000001:AB:1F.0"


@pytest.mark.parametrize(
    "break_it",
    [
        pytest.param(
            lambda nvml: nvml.gpu(1).errors.update(nvmlDeviceGetUUID=NVML_ERROR_UNKNOWN), id="uuid-error"
        ),
        pytest.param(lambda nvml: setattr(nvml.gpu(1), "lost", True), id="gpu-lost"),
        pytest.param(lambda nvml: setattr(nvml.gpu(1), "pci_bus_id", "00000000:99:00.0"), id="not-found"),
    ],
)
def test_nvml_errors_give_no_labels_counted_and_logged_once(
    break_it: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Any NVML failure: empty labels, counted each time, one log line, nothing raised."""
    nvml = _nvml()
    torch = _Torch({1: _props_of(nvml, 1)})
    break_it(nvml)
    errors = Tally("internal error")
    with caplog.at_level(logging.WARNING, logger="babysitter"):
        first = rank_gpu.gpu_labels(torch, 1, errors, nvml=lambda: nvml)
        second = rank_gpu.gpu_labels(torch, 1, errors, nvml=lambda: nvml)
    assert first == second == {"uuid": "", "pci_bus_id": ""}
    assert errors.counts() == {"gpu_identity": 2}
    assert sum("gpu_identity" in record.getMessage() for record in caplog.records) == 1
    assert nvml._init_count == 0


@dataclass
class _PropsWithUuid(_Props):
    """torch's properties with ``uuid``: CUDA's bytes, which torch prints as 8-4-4-4-12 hex."""

    uuid: object = None


def _missing() -> Any:
    raise ImportError("no pynvml")


def test_without_nvml_the_uuid_comes_from_torch_in_the_agents_spelling() -> None:
    """No nvidia-ml-py: torch's UUID (printed without NVML's ``GPU-``) and bus id still name the GPU
    exactly as the node agent's series do, with no error counted."""
    nvml = _nvml()
    props = {i: _PropsWithUuid(*vars(_props_of(nvml, i)).values()) for i in range(4)}
    for i, p in props.items():
        p.uuid = nvml.gpu(i).uuid.removeprefix("GPU-").upper()  # whatever case torch prints
    errors = Tally("internal error")
    labels = rank_gpu.gpu_labels(_Torch(props), 3, errors, nvml=_missing)
    assert (labels["uuid"], labels["pci_bus_id"]) == _agent_labels(nvml)[nvml.gpu(3).uuid]
    assert errors.counts() == {}


@pytest.mark.parametrize("uuid", [None, "", "not-a-uuid", "0" * 32])
def test_without_nvml_and_no_usable_torch_uuid_gives_no_labels(uuid: object) -> None:
    """A torch whose properties have no UUID, or one in a shape NVML would not print: no labels."""
    nvml = _nvml()
    props = _PropsWithUuid(*vars(_props_of(nvml, 0)).values(), uuid=uuid)
    errors = Tally("internal error")
    assert rank_gpu.gpu_labels(_Torch({0: props}), 0, errors, nvml=_missing) == {"uuid": "", "pci_bus_id": ""}
    assert errors.counts() == {"gpu_identity": 1}


def test_missing_nvml_or_old_torch_gives_no_labels() -> None:
    """No nvidia-ml-py and a torch without ``uuid``, or a torch whose properties lack the PCI fields."""
    errors = Tally("internal error")
    nvml = _nvml()
    assert rank_gpu.gpu_labels(_Torch({0: _props_of(nvml, 0)}), 0, errors, nvml=_missing)["uuid"] == ""
    assert rank_gpu.gpu_labels(_Torch({0: object()}), 0, errors, nvml=lambda: nvml)["uuid"] == ""
    assert errors.counts() == {"gpu_identity": 2}


class _Param:
    def __init__(self, index: int) -> None:
        self.device = type("Device", (), {"type": "cuda", "index": index})()


class _CudaModel:
    """A model whose parameters live on ``cuda:index`` (what ``watch`` reads to find the device)."""

    def __init__(self, index: int) -> None:
        self._index = index

    def parameters(self) -> Any:
        return iter([_Param(self._index)])


def _info_sample(tracker: babysitter.Tracker) -> dict[str, str]:
    text = generate_latest(tracker.registry).decode()
    lines = [line for line in text.splitlines() if line.startswith(T.INFO.name + "{")]
    assert len(lines) == 1, text
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(lines[0] + "\n"):
        for sample in family.samples:
            return dict(sample.labels)
    raise AssertionError("no train_info sample")


def test_watch_puts_the_cuda_ranks_gpu_into_train_info(monkeypatch: pytest.MonkeyPatch) -> None:
    """watch() on a model on cuda:3 exports train_info{uuid, pci_bus_id} of GPU 3: one series."""
    import torch

    nvml = _nvml()
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: _props_of(nvml, index))
    monkeypatch.setattr(rank_gpu, "load_nvml", lambda: nvml)
    tracker = babysitter.watch(
        _CudaModel(3), run="r", tokens_per_step=1, flops_per_token=1.0, peak_flops=1e12, port=None,
        ledger=False, timing="cpu",
    )  # fmt: skip
    try:
        info = _info_sample(tracker)
    finally:
        tracker.close()
    assert (info["uuid"], info["pci_bus_id"]) == _agent_labels(nvml)[nvml.gpu(3).uuid]
    assert tracker.errors.counts() == {}


def test_cpu_run_has_empty_gpu_labels_and_no_error() -> None:
    """A CPU model: the labels are there but empty, nothing counted, NVML never asked."""
    import torch

    tracker = babysitter.watch(
        torch.nn.Linear(2, 2), run="cpu", tokens_per_step=1, flops_per_token=1.0, port=None, ledger=False
    )
    try:
        info = _info_sample(tracker)
        errors = generate_latest(tracker.registry).decode()
    finally:
        tracker.close()
    assert info.get("uuid", "") == "" and info.get("pci_bus_id", "") == ""
    assert 'where="gpu_identity"' not in errors
    assert S.INTERNAL_ERRORS.name in errors
