"""``babysitter.watch()``: the one line in a training script."""

from __future__ import annotations

import atexit
import logging
import os
import socket
import sys
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from babysitter import __version__
from babysitter._setup import TrackerConfig, resolve
from babysitter.deferred import LossReader
from babysitter.events import NullEvents, RunEvents
from babysitter.export.http import TLSConfig, serve
from babysitter.export.prometheus import TrackerCollector
from babysitter.timing import CudaStepTimer
from babysitter.tracker import Tracker

__all__ = ["watch"]

log = logging.getLogger("babysitter")


def watch(
    model: object = None,
    *,
    run: str | None = None,
    tokens_per_step: int | None = None,
    samples_per_step: int | None = None,
    flops_per_token: float | None = None,
    hardware_flops_per_token: float | None = None,
    seq_len: int | None = None,
    peak_flops: float | None = None,
    dtype: object = None,
    device: str | None = None,
    port: int | None = None,
    addr: str = "127.0.0.1",
    tls: TLSConfig | None = None,
    run_dir: str | os.PathLike[str] | None = None,
    registry_dir: str | os.PathLike[str] | None = None,
    labels: Mapping[str, object] | None = None,
    flush_interval: float = 1.0,
    mfu_window: float = 60.0,
    timing: str = "auto",
    ledger: bool = True,
) -> Tracker:
    """Start tracking this training process and serve its metrics.

    Arguments are checked here, so a mistake fails before training starts. What the environment
    gets wrong later (a taken port, an unwritable directory, a full disk) never does: it is logged
    once and counted in ``babysitter_internal_errors_total``.

    Args:
        model: a torch module (with a Hugging Face ``.config`` for FLOPs from the architecture) or a
            config; used for FLOPs per token when ``flops_per_token`` is not given.
        run: the run's name, stable across restarts (default: ``$BABYSITTER_RUN``, the run
            directory's name, torchrun's run id, the Slurm job id).
        tokens_per_step / samples_per_step: processed by this rank per ``step()`` unless passed there.
        flops_per_token: model FLOPs per token, forward and backward, no recomputation (MFU).
        hardware_flops_per_token: the same counting recomputation (HFU); defaults to the model FLOPs.
        seq_len: training sequence length, for the attention term of FLOPs from a model config.
        peak_flops: dense peak FLOP/s of this rank's device, overriding the table.
        dtype: training dtype for the peak lookup (``"bf16"``, ``torch.bfloat16``, ``"fp8"``...);
            default bf16.
        device: device name for the peak lookup, overriding detection (e.g. ``"NVIDIA H100 80GB HBM3"``).
        port: metrics port; default ``9450 + local_rank`` (or ``$BABYSITTER_PORT + local_rank``);
            0 picks a free port; -1 serves nothing. A taken port falls back to a free one.
        addr: bind address; loopback by default (the node agent serves it to Prometheus).
        tls: serve HTTPS with this certificate and key.
        run_dir: directory of the run (next to the checkpoints) where rank 0 keeps the goodput ledger.
        registry_dir: where to register the endpoint for the node agent (default
            ``$BABYSITTER_REGISTRY_DIR`` or ``/tmp/babysitter``).
        labels: constant labels on every series, e.g. ``{"cluster": "provider-a"}``.
        flush_interval: seconds between housekeeping passes (ledger batches, histogram folds).
        mfu_window: seconds of the sliding window for ``train_mfu_ratio``.
        timing: ``"auto"``, ``"cpu"`` (host clock) or ``"cuda"`` (CUDA events, no sync).
        ledger: set False to keep rank 0 from writing the ledger even with a ``run_dir``.
    """
    config = resolve(
        model=model,
        run=run,
        tokens_per_step=tokens_per_step,
        samples_per_step=samples_per_step,
        flops_per_token=flops_per_token,
        hardware_flops_per_token=hardware_flops_per_token,
        seq_len=seq_len,
        peak_flops=peak_flops,
        dtype=dtype,
        device=device,
        port=port,
        addr=addr,
        tls=tls,
        registry_dir=registry_dir,
        run_dir=run_dir,
        labels=labels,
        flush_interval=flush_interval,
        mfu_window=mfu_window,
        timing=timing,
    )
    timer, loss_reader = _cuda_parts(config)
    events = _events(config, enabled=ledger)
    tracker = Tracker(config, events=events, cuda_timer=timer, loss_reader=loss_reader)
    try:
        events.incarnation_start(
            time=tracker.start_time,
            info={
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "world_size": config.rank.world_size,
                "version": __version__,
                "device": config.peak.device,
                "flops_per_token": config.flops.model,
                "peak_flops": config.peak.flops_per_second,
            },
        )
    except Exception as exc:
        tracker.errors.record("ledger", exc)
    _export(tracker, config)
    tracker.start_housekeeping()
    atexit.register(tracker.close)
    return tracker


def _cuda_parts(config: TrackerConfig) -> tuple[CudaStepTimer | None, LossReader]:
    if config.timing != "cuda":
        return None, LossReader()
    torch: Any = sys.modules.get("torch")
    if torch is None:  # pragma: no cover - timing="cuda" without torch imported
        import torch
    timer = CudaStepTimer(lambda: torch.cuda.Event(enable_timing=True))
    return timer, LossReader(training_stream=torch.cuda.current_stream())


def _events(config: TrackerConfig, *, enabled: bool) -> RunEvents:
    if not enabled or config.run_dir is None or config.rank.rank != 0:
        return NullEvents()
    try:
        from babysitter.ledger import LedgerWriter

        writer: RunEvents = LedgerWriter(config.run_dir, run=config.run)
    except Exception as exc:
        log.error("babysitter: goodput ledger disabled for run %r in %s: %s", config.run, config.run_dir, exc)
        return NullEvents()
    return writer


def _export(tracker: Tracker, config: TrackerConfig) -> None:
    registry = CollectorRegistry(auto_describe=False)
    collector = TrackerCollector(tracker)
    registry.register(collector)
    tracker.registry = registry
    if config.port is None:
        return
    try:
        endpoint = serve(registry, addr=config.addr, port=config.port, tls=config.tls)
    except Exception as exc:
        tracker.errors.record("export", exc)
        return
    collector.port = endpoint.port
    collector.requested_port = endpoint.requested_port
    tracker.metrics_url = endpoint.url
    tracker.add_close_hook(endpoint.close)
    if endpoint.requested_port not in (0, endpoint.port):
        tracker.errors.record(
            "port_in_use", f"port {endpoint.requested_port} taken, serving on {endpoint.port}"
        )
    _register(tracker, config, endpoint.url)


def _register(tracker: Tracker, config: TrackerConfig, url: str) -> None:
    if config.registry_dir is None:
        return
    from babysitter import registration

    try:
        path = registration.register(
            config.registry_dir,
            registration.Endpoint(
                pid=os.getpid(),
                start_time=registration.process_start_time(os.getpid()),
                url=url,
                run=config.run,
                rank=config.rank.rank,
                local_rank=config.rank.local_rank,
            ),
        )
    except Exception as exc:
        tracker.errors.record("registration", exc)
        return
    tracker.add_close_hook(lambda: registration.unregister(path))
