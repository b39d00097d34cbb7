"""``babysitter.watch()``: the one line in a training script."""

from __future__ import annotations

import atexit
import logging
import os
import socket
import sys
import weakref
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from babysitter._version import __version__
from babysitter.export.http import TLSConfig, serve
from babysitter.flops.formulas import FlopsPerToken
from babysitter.training.collector import TrackerCollector
from babysitter.training.config import TrackerConfig, manifest_mode, resolve
from babysitter.training.events import NullEvents, RunEvents
from babysitter.training.loss import LossReader
from babysitter.training.timing import CudaStepTimer
from babysitter.training.tracker import Tracker

__all__ = ["watch"]

log = logging.getLogger("babysitter")

#: Trackers of this process, made inert in a forked child (see Tracker._after_fork_in_child).
_TRACKERS: weakref.WeakSet[Tracker] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for tracker in list(_TRACKERS):
        try:
            tracker._after_fork_in_child()
        except Exception as exc:  # never raise in a fork handler
            log.debug("babysitter: fork handler failed: %s", exc)


os.register_at_fork(after_in_child=_after_fork_in_child)


def watch(
    model: object = None,
    *,
    run: str | None = None,
    tokens_per_step: int | None = None,
    samples_per_step: int | None = None,
    parallelism: Mapping[str, int] | Any | None = None,
    flops_per_token: float | FlopsPerToken | None = None,
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
    hang_timeout: float | str | None = "auto",
    hang_factor: float = 10.0,
    hang_floor: float = 300.0,
    hang_dump_dir: str | os.PathLike[str] | None = None,
    hang_kill_signal: int | None = None,
    straggler_every: int | None = None,
    straggler_timeout: float = 300.0,
    flight_recorder: bool = True,
    otlp_endpoint: str | None = None,
    otlp_interval: float = 15.0,
    otlp_headers: Mapping[str, str] | None = None,
    checkpoint_manifest: bool | str = "background",
    replica_check_every: int | None = None,
    replica_ranks: object = None,
    incidents: bool = True,
) -> Tracker:
    """Start tracking this training process and serve its metrics.

    Arguments are checked here, so a mistake fails before training starts. What the environment
    gets wrong later never does: it is logged once and counted, a full disk under the ledger in
    ``babysitter_ledger_write_errors_total`` (its records are kept and retried), the rest (a taken
    port, an unwritable registration directory) in ``babysitter_internal_errors_total``.

    Args:
        model: what FLOPs per token come from when ``flops_per_token`` is not given
            (:func:`babysitter.flops.infer`, docs/flops.md): a Hugging Face model or config of a
            covered ``model_type``, a nanoGPT-style config (``n_layer``, ``n_head``, ``n_embd``,
            ``vocab_size``) or any torch module (nanoGPT's ``GPT``, a plain ``nn.Module``): its
            parameters are counted (6N) and its attention layers found (12·L·H·Q·T, which needs
            ``seq_len``). What cannot be counted fails here, naming the argument to pass. Without a
            model or ``flops_per_token`` there is no MFU, and one warning says so.
        run: the run's name, stable across restarts (default: ``$BABYSITTER_RUN``, the run
            directory's name, torchrun's run id, the Slurm job id).
        tokens_per_step / samples_per_step: tokens (samples) of this rank's data-parallel replica per
            optimizer step, i.e. of the batch this rank takes part in (micro-batch x gradient
            accumulation x sequence length), unless passed to ``step()``. Every rank of a tensor,
            pipeline or context parallel group passes the same number: the tracker credits each with
            ``1 / (tp x pp x cp)`` of the tokens and FLOPs, so per-rank MFU is the job's MFU and sums
            over ranks count every token once (docs/flops.md, "Parallelism").
        parallelism: how the model is split: a mapping ``{"tp": 8, "pp": 4, "cp": 2, "ep": 8}``
            (missing degrees are 1; data parallel is the rest of the world size), a
            ``torch.distributed`` DeviceMesh with named dimensions, or None: the mesh of the
            model's DTensor parameters (FSDP2 with tensor parallelism) when it names its
            dimensions, else data parallelism only. A layout that does not fit the world size
            fails here.
        flops_per_token: model FLOPs per token of the whole model (not of this rank's shard), forward
            and backward, no recomputation (MFU): a number, or a :class:`babysitter.flops.FlopsPerToken`
            (from ``flops.estimate``/``infer``/``measure``), whose hardware FLOPs and source come along.
        hardware_flops_per_token: the same counting recomputation (HFU); defaults to the model FLOPs.
        seq_len: training sequence length, for the attention term of FLOPs from the model.
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
        hang_timeout: hang watchdog threshold: ``"auto"`` (``hang_factor`` x the recent median step
            time, at least ``hang_floor`` seconds), a number of seconds, or None for no watchdog.
        hang_dump_dir: where the watchdog writes thread stack dumps (default ``run_dir/hangs`` or a
            temp dir).
        hang_kill_signal: send this signal to the process after a hang's dump (default: never).
        straggler_every: exchange step times with the other ranks every this many steps for
            ``train_straggler_score`` (gloo, async, no device sync); None (default) keeps it off.
            It creates a process group, so every rank must call ``watch()`` at the same point.
        straggler_timeout: seconds an exchange may take before the scores turn themselves off.
        flight_recorder: read torch's flight recorder (``training/collectives.py``): the collectives
            each rank enqueued give lockstep runs an arrival-based straggler score and name the rank
            a hung collective waits for. ``watch()`` sets ``TORCH_FR_BUFFER_SIZE`` (torch 2.13's
            default, 2000) when unset, which counts if it runs before the first collective; False
            leaves torch's environment alone and reads nothing.
        otlp_endpoint: also push the metrics to this OpenTelemetry Collector (OTLP/HTTP URL)
            every ``otlp_interval`` seconds, with ``otlp_headers``.
        checkpoint_manifest: after each ``checkpoint_save(path=...)``, write a manifest of what was
            saved (files, sizes, SHA-256 per 16 MiB chunk; docs/checkpoints.md): ``"background"``
            (default: off the training thread, after the save's blocking part), ``"blocking"`` (inside
            the save's block: its blocking time includes the hashing) or ``"off"``.
        replica_check_every: every this many steps, fingerprint this rank's parameters on their
            device and compare them with its data-parallel replicas' over gloo (no device sync on the
            hot path); a rank that disagrees exports ``train_replica_mismatch_step``. None (default)
            keeps it off. Like ``straggler_every`` it creates a process group at ``watch()``.
        replica_ranks: the ranks that hold the same parameters as this one (itself included), or a
            1-D DeviceMesh of them (``mesh["dp_replicate"]`` under HSDP); default: the ranks with this
            rank's tensor, context and pipeline coordinates (Megatron-LM's and torchtitan's rank
            order), or what the model's DTensor placements say.
        incidents: with a ``run_dir``, answer incident requests there (``run_dir/incidents/``: this
            rank's thread stacks and flight recorder, from a thread of its own, for the bundle
            ``babysitter remediate`` gathers before it acts; docs/incidents.md) and keep the uncaught
            exception that ends this rank. False turns both off.
    """
    try:
        config = resolve(
            model=model,
            run=run,
            tokens_per_step=tokens_per_step,
            samples_per_step=samples_per_step,
            parallelism=parallelism,
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
    except ValueError as exc:
        # A setup mistake (a dtype typo, a bad layout): raised from this call, without the frames of
        # the resolution behind it; the message says what to pass.
        raise exc.with_traceback(None) from None
    runtime = _runtime_parts(
        hang_timeout=hang_timeout,
        hang_factor=hang_factor,
        hang_floor=hang_floor,
        hang_dump_dir=hang_dump_dir,
        hang_kill_signal=hang_kill_signal,
        straggler_every=straggler_every,
        straggler_timeout=straggler_timeout,
    )
    manifests = manifest_mode(checkpoint_manifest)
    if replica_check_every is not None:
        from babysitter.training.replicas import validate

        validate(model, replica_check_every, replica_ranks, config.rank.rank)
    if not isinstance(flight_recorder, bool):
        raise ValueError(f"flight_recorder must be True or False, got {flight_recorder!r}")
    if not isinstance(incidents, bool):
        raise ValueError(f"incidents must be True or False, got {incidents!r}")
    runtime["flight_recorder"] = _flight_recorder(flight_recorder)
    if otlp_endpoint is not None:
        from babysitter.training.otlp import _endpoint

        _endpoint(otlp_endpoint)  # a malformed URL fails here, before training
    timer, loss_reader = _cuda_parts(config)
    events = _events(config, enabled=ledger)
    tracker = Tracker(config, events=events, cuda_timer=timer, loss_reader=loss_reader)
    _TRACKERS.add(tracker)
    _identify_gpu(tracker, config, model)
    try:
        events.incarnation_start(
            time=tracker.start_time,
            info={
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "world_size": config.rank.world_size,
                "parallelism": str(config.parallel),
                "version": __version__,
                "device": config.peak.device,
                "flops_per_token": config.flops.model,
                "peak_flops": config.peak.flops_per_second,
            },
        )
    except Exception as exc:
        tracker.errors.record("ledger", exc)
    _export(tracker, config)
    _start_manifests(tracker, manifests)
    collectives = _start_runtime(tracker, runtime)
    if incidents and config.run_dir is not None:
        _start_incidents(tracker, config.run_dir, collectives)
    if replica_check_every is not None:
        _start_replicas(tracker, model, replica_check_every, replica_ranks)
    if otlp_endpoint is not None:
        from babysitter.training.otlp import OtlpPusher

        OtlpPusher(tracker, otlp_endpoint, interval=otlp_interval, headers=otlp_headers).start()
    tracker.start_housekeeping()
    atexit.register(tracker.close)
    return tracker


def _runtime_parts(
    *,
    hang_timeout: float | str | None,
    hang_factor: float,
    hang_floor: float,
    hang_dump_dir: str | os.PathLike[str] | None,
    hang_kill_signal: int | None,
    straggler_every: int | None,
    straggler_timeout: float,
) -> dict[str, Any]:
    """Check the watchdog and straggler options at setup; what ``_start_runtime`` needs."""
    if hang_timeout is not None and hang_timeout != "auto" and isinstance(hang_timeout, (str, bool)):
        raise ValueError(f"hang_timeout must be 'auto', seconds or None, got {hang_timeout!r}")
    if straggler_every is not None and (
        isinstance(straggler_every, bool) or not isinstance(straggler_every, int) or straggler_every < 2
    ):
        raise ValueError(f"straggler_every must be an int >= 2 or None, got {straggler_every!r}")
    if (
        isinstance(straggler_timeout, bool)
        or not isinstance(straggler_timeout, (int, float))
        or not straggler_timeout > 0
    ):
        raise ValueError(f"straggler_timeout must be a positive number of seconds, got {straggler_timeout!r}")
    from babysitter.training.watchdog import validate_options

    watchdog = {
        "timeout": None if hang_timeout == "auto" else hang_timeout,
        "factor": hang_factor,
        "floor": hang_floor,
        "kill_signal": hang_kill_signal,
    }
    if hang_timeout is not None:
        validate_options(**watchdog)  # type: ignore[arg-type]
    return {
        "hang": hang_timeout is not None,
        "watchdog": {**watchdog, "dump_dir": hang_dump_dir},
        "straggler_every": straggler_every,
        "straggler_timeout": straggler_timeout,
    }


def _flight_recorder(wanted: bool) -> str | None:
    """Ask torch to record collectives (before its first one, where this runs early enough); None: off."""
    if not wanted:
        return None
    from babysitter.training.flight import enable

    return enable()


def _start_runtime(tracker: Tracker, runtime: dict[str, Any]) -> Any:
    from babysitter.training.straggler import StragglerMonitor
    from babysitter.training.watchdog import Watchdog

    collectives = _collectives(tracker, runtime)
    if runtime["hang"]:
        report = collectives.describe if collectives is not None else None
        Watchdog(tracker, **runtime["watchdog"], report=report).start()
    every = runtime["straggler_every"]
    if every is not None:
        monitor = StragglerMonitor(
            tracker, every=every, timeout=runtime["straggler_timeout"], collectives=collectives
        )
        if monitor.start() or monitor.waiting:
            monitor.attach()
    return collectives


def _start_incidents(tracker: Tracker, run_dir: str | os.PathLike[str], collectives: Any) -> None:
    """Answer incident requests in the run directory and keep this rank's crash (never raises)."""
    try:
        from babysitter.training.crash import install
        from babysitter.training.incidents import IncidentResponder

        describe = collectives.describe if collectives is not None else None
        IncidentResponder(tracker, run_dir, describe=describe).start()
        install(tracker, run_dir)
    except Exception as exc:
        tracker.errors.record("incidents", exc)


def _start_manifests(tracker: Tracker, mode: str) -> None:
    from babysitter.training.manifests import ManifestWriter

    writer = ManifestWriter(tracker, mode=mode)
    tracker.checkpoint_observer = writer
    tracker.add_metrics_source(writer.metrics)


def _start_replicas(tracker: Tracker, model: object, every: int, ranks: object) -> None:
    from babysitter.training.replicas import ReplicaChecker

    checker = ReplicaChecker(tracker, model, every=every, ranks=ranks)
    if checker.start():
        checker.attach()


def _collectives(tracker: Tracker, runtime: dict[str, Any]) -> Any:
    """The flight-recorder reader, where the recorder is wanted (else None). Its thread does nothing
    until torch.distributed is initialized (it looks once a second), whenever torch is imported."""
    enabled = runtime.get("flight_recorder")
    if enabled is None:
        return None
    from babysitter.training.collectives import CollectiveMonitor

    floor = min(30.0, float(runtime["watchdog"]["floor"]))
    monitor = CollectiveMonitor(tracker, stall_floor=floor, enabled=enabled)
    tracker.flight_recorder = monitor.info
    return monitor.start()


def _cuda_parts(config: TrackerConfig) -> tuple[CudaStepTimer | None, LossReader]:
    if config.timing != "cuda":
        return None, LossReader()
    torch: Any = sys.modules.get("torch")
    if torch is None:  # pragma: no cover - timing="cuda" without torch imported
        import torch
    timer = CudaStepTimer(lambda: torch.cuda.Event(enable_timing=True))
    return timer, LossReader(training_stream=torch.cuda.current_stream())


def _cuda_device_index(config: TrackerConfig, model: object) -> int | None:
    """The CUDA device this rank trains on (its model's, else the current one under CUDA timing)."""
    torch: Any = sys.modules.get("torch")
    if torch is None:
        return None
    if model is not None and hasattr(model, "parameters"):
        first = next(iter(model.parameters()), None)
        if first is not None:
            device = first.device
            return int(device.index or 0) if device.type == "cuda" else None
    if config.timing == "cuda":
        return int(torch.cuda.current_device())
    return None


def _identify_gpu(tracker: Tracker, config: TrackerConfig, model: object) -> None:
    """Put the rank's GPU (uuid, PCI address) into ``train_info``; nothing on CPU, never raises."""
    try:
        index = _cuda_device_index(config, model)
        if index is None:
            return
        from babysitter.training.gpu import gpu_labels

        tracker.gpu = gpu_labels(sys.modules["torch"], index, tracker.errors)
    except Exception as exc:
        tracker.errors.record("gpu_identity", exc)


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
            "port_in_use",
            f"port {endpoint.requested_port} taken, serving on {endpoint.port}",
            said=(
                f"babysitter: metrics port {endpoint.requested_port} is taken (another process on this "
                f"host); serving on {endpoint.url} instead, which the node agent finds through the "
                f'registration (counted in babysitter_internal_errors_total{{where="port_in_use"}})'
            ),
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
