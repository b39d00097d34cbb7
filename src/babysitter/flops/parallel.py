"""How one data-parallel replica's tokens and FLOPs are shared among its ranks.

Model parallelism splits one replica's work over ``tp x pp x cp`` ranks that all see the same batch:
tensor parallel (TP) splits every matmul, pipeline parallel (PP) splits the layers, context parallel
(CP) splits the sequence. If each of them counted the replica's tokens and FLOPs, every sum over ranks
would be ``tp x pp x cp`` times too high and every per-rank MFU as well. So each rank is credited with
``1 / (tp x pp x cp)`` of its replica's tokens and model FLOPs, as torchtitan divides its throughput
by the non-data-parallel degree and Megatron-LM divides the global batch's FLOPs by the world size.
Then per-rank MFU equals the job's MFU when the ranks keep pace, and ``sum`` over ranks never double
counts. The share is even although PP stages and TP ranks do not do exactly equal work: the ranks of
a replica step together, so the share only says how the replica's FLOPs are split, not who was busy.

Expert parallelism (EP) is carved out of the data-parallel (and context/tensor-parallel) ranks in
Megatron-LM and torchtitan: each EP rank brings its own tokens, and each token's active experts run
once wherever they live. So EP does not divide anything; it is recorded for the record only.

The pipeline bubble is time, not FLOPs: it lengthens the step, so it lowers MFU; FLOPs are never
discounted for it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["DIMS", "MESH_DIM_NAMES", "ParallelLayout", "layout_from_mesh", "model_mesh", "resolve_layout"]

log = logging.getLogger("babysitter")

#: Keys of a ``parallelism=`` mapping: tensor, pipeline, context, expert and data parallel degrees
#: (also the ``train_info`` labels that carry them, ``catalog.train.PARALLEL_LABELS``).
DIMS = ("tp", "pp", "cp", "ep", "dp")

#: DeviceMesh dimension names and the degree each one counts toward. torchtitan, Lightning's
#: ModelParallelStrategy, accelerate's ParallelismConfig and FSDP2/HSDP use these; anything else is
#: refused rather than guessed. ``sp`` is accelerate's sequence parallelism (Ulysses): its ranks share a
#: batch and split the sequence, as CP does (Megatron-LM's sequence parallelism lives inside TP and has
#: no mesh dimension). Flattened dims (``dp_shard_cp``, ``dp_cp``) are not root dims and not listed.
MESH_DIM_NAMES: Mapping[str, str] = {
    "tp": "tp",
    "tensor": "tp",
    "tensor_parallel": "tp",
    "pp": "pp",
    "pipeline": "pp",
    "pipeline_parallel": "pp",
    "cp": "cp",
    "context": "cp",
    "context_parallel": "cp",
    "sp": "cp",
    "ep": "ep",
    "expert": "ep",
    "expert_parallel": "ep",
    "dp": "dp",
    "data": "dp",
    "data_parallel": "dp",
    "dp_replicate": "dp",
    "dp_shard": "dp",
    "dp_shard_in_ep": "dp",
    "dp_shard_mod_ep": "dp",
    "ddp": "dp",
    "fsdp": "dp",
    "hsdp": "dp",
    "replicate": "dp",
    "shard": "dp",
}


@dataclass(frozen=True)
class ParallelLayout:
    """Parallel degrees of the job, as seen from one rank; ``world_size == tp * pp * cp * dp``.

    ``dp`` counts every rank that brings its own tokens (expert-parallel ranks included); ``ep`` is
    informational. ``source`` says where the layout came from: ``default`` (data parallel only),
    ``explicit`` (a mapping), ``mesh`` (a DeviceMesh passed in) or ``model`` (the DTensor
    parameters' mesh).
    """

    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    dp: int = 1
    source: str = "default"

    @property
    def ranks_per_replica(self) -> int:
        """Ranks that process one batch together (tp x pp x cp): the divisor of tokens and FLOPs."""
        return self.tp * self.pp * self.cp

    @property
    def world_size(self) -> int:
        """Ranks in the job."""
        return self.ranks_per_replica * self.dp

    def share(self, replica_amount: float) -> float:
        """This rank's share of an amount (tokens, samples, FLOPs) of its replica."""
        m = self.ranks_per_replica
        return replica_amount if m == 1 else replica_amount / m

    def labels(self) -> dict[str, str]:
        """The degrees as ``train_info`` label values."""
        return {dim: str(getattr(self, dim)) for dim in DIMS}

    def __str__(self) -> str:
        return ",".join(f"{dim}={getattr(self, dim)}" for dim in DIMS)


def _degree(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"parallelism[{name!r}] must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"parallelism[{name!r}] must be >= 1, got {value}")
    return value


def _check(degrees: Mapping[str, int], world_size: int, source: str) -> ParallelLayout:
    """The layout of ``degrees`` in a world of ``world_size`` ranks; ValueError if they do not fit."""
    tp, pp, cp, ep = (degrees.get(dim, 1) for dim in ("tp", "pp", "cp", "ep"))
    replica = tp * pp * cp
    if world_size % replica:
        raise ValueError(
            f"parallelism: tp x pp x cp = {tp} x {pp} x {cp} = {replica} ranks per data-parallel replica "
            f"does not divide the world size {world_size} (RANK/WORLD_SIZE or torch.distributed)"
        )
    dp = world_size // replica
    if "dp" in degrees and degrees["dp"] != dp:
        raise ValueError(
            f"parallelism: dp={degrees['dp']} but world size {world_size} / (tp x pp x cp = {replica}) "
            f"= {dp}; dp counts every rank that brings its own batch (expert-parallel ranks included)"
        )
    if (world_size // pp) % ep:
        raise ValueError(
            f"parallelism: ep={ep} must divide the ranks of one pipeline stage ({world_size // pp}): expert "
            "parallel groups are carved out of the data, context and tensor parallel ranks"
        )
    return ParallelLayout(tp=tp, pp=pp, cp=cp, ep=ep, dp=dp, source=source)


def _is_mesh(value: object) -> bool:
    return hasattr(value, "mesh_dim_names") and hasattr(value, "size") and hasattr(value, "ndim")


def layout_from_mesh(mesh: Any) -> dict[str, int]:
    """Degrees (``tp``, ``pp``, ``cp``, ``ep``, ``dp``) of a ``torch.distributed`` DeviceMesh, by dim name.

    Raises ValueError for an unnamed mesh or a dimension name not in :data:`MESH_DIM_NAMES` (say what
    it is with a ``parallelism=`` mapping instead). A dimension named ``ep`` holds ranks that bring
    their own tokens, so it counts toward ``dp`` as well.
    """
    names = mesh.mesh_dim_names
    if not names:
        raise ValueError(
            "parallelism: the DeviceMesh has no dimension names; build it with "
            "init_device_mesh(..., mesh_dim_names=('dp', 'tp')) or pass parallelism={'tp': ..., 'pp': ...}"
        )
    degrees = dict.fromkeys(DIMS, 1)
    for i, name in enumerate(names):
        dim = MESH_DIM_NAMES.get(str(name))
        if dim is None:
            raise ValueError(
                f"parallelism: DeviceMesh dimension {name!r} is not one babysitter knows "
                f"({', '.join(sorted(MESH_DIM_NAMES))}); pass parallelism={{'tp': ..., 'pp': ..., 'cp': ...}}"
            )
        size = int(mesh.size(i))
        degrees[dim] *= size
        if dim == "ep":
            degrees["dp"] *= size
    return degrees


def _root(mesh: Any) -> Any:
    """The mesh a slice (``mesh["tp"]``) was cut from, or ``mesh`` itself."""
    root = getattr(mesh, "_get_root_mesh", None)
    try:
        return root() if callable(root) else mesh
    except Exception:  # a torch without the helper: the mesh as given
        return mesh


def _readable(mesh: Any) -> bool:
    names = mesh.mesh_dim_names
    return bool(names) and all(str(name) in MESH_DIM_NAMES for name in names)


def _pick(mesh: Any, world_size: int) -> Any:
    """The mesh that says the most: the root a slice was cut from when it spans the world with dims
    babysitter knows (torchtitan, Lightning, accelerate), else the mesh given. A root that is one
    flattened ``world`` dimension (meshes built by ``_unflatten``, as newer torchtitan does) says
    nothing, so the mesh given is read instead."""
    root = _root(mesh)
    if root is not mesh and _readable(root) and int(root.size()) == world_size:
        return root
    return mesh


def model_mesh(model: object) -> Any:
    """The DeviceMesh of the first DTensor parameter of ``model`` (FSDP2, tensor parallel), or None.

    Never imports torch: a process that has not imported ``torch.distributed.tensor`` has no DTensors.
    """
    dtensor_mod = sys.modules.get("torch.distributed.tensor")
    dtensor = getattr(dtensor_mod, "DTensor", None)
    parameters = getattr(model, "parameters", None)
    if dtensor is None or not callable(parameters):
        return None
    try:
        for param in parameters():
            if isinstance(param, dtensor):
                return param.device_mesh
    except Exception as exc:  # an odd module: no layout from it
        log.debug("babysitter: could not read the model's device mesh: %r", exc)
    return None


def _is_fsdp2(model: object) -> bool:
    fsdp = sys.modules.get("torch.distributed.fsdp")
    module_type = getattr(fsdp, "FSDPModule", None)
    return module_type is not None and isinstance(model, module_type)


def _from_model(model: object, world_size: int) -> ParallelLayout | None:
    found = model_mesh(model)
    if found is None:
        return None
    mesh = _pick(found, world_size)
    if not mesh.mesh_dim_names and mesh.ndim == 1 and _is_fsdp2(model):
        return None  # fully_shard()'s default mesh: one unnamed data-parallel dimension
    try:
        return _mesh_layout(layout_from_mesh(mesh), int(mesh.size()), world_size, "model")
    except ValueError as exc:
        log.warning(
            "babysitter: cannot tell the parallel layout from the model's DeviceMesh (%s); MFU and tokens "
            "assume data parallelism only: pass parallelism= to watch()",
            exc,
        )
        return None


def _mesh_layout(degrees: dict[str, int], mesh_size: int, world_size: int, source: str) -> ParallelLayout:
    if world_size % mesh_size:
        raise ValueError(f"parallelism: the DeviceMesh has {mesh_size} ranks, not a divisor of {world_size}")
    degrees = {**degrees, "dp": degrees["dp"] * (world_size // mesh_size)}  # ranks outside: data parallel
    if mesh_size != world_size:
        # Right for a tensor-parallel mesh under DDP; wrong if the ranks outside are pipeline stages.
        log.log(
            logging.WARNING if source == "model" else logging.INFO,
            "babysitter: the DeviceMesh (%s) spans %d of %d ranks; the other ranks are taken as data "
            "parallel (pass parallelism= with pp= if they are pipeline stages)",
            ", ".join(f"{k}={v}" for k, v in degrees.items() if v > 1) or "all 1",
            mesh_size,
            world_size,
        )
    return _check(degrees, world_size, source)


def resolve_layout(parallelism: object, *, world_size: int, model: object = None) -> ParallelLayout:
    """The checked layout from ``watch(parallelism=...)``: a mapping, a DeviceMesh or None.

    A DeviceMesh is read whole: a slice such as ``mesh["tp"]`` gives the layout of the mesh it was
    cut from when that one spans the world; ranks outside the mesh read count as data parallel. None
    reads the mesh of the model's DTensor parameters the same way when it names its dimensions, else
    assumes data parallelism only (every rank brings its own tokens). Raises TypeError/ValueError at
    setup for a layout that does not fit the world size.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world size must be a positive int, got {world_size!r}")
    if parallelism is None:
        found = _from_model(model, world_size)
        return found if found is not None else ParallelLayout(dp=world_size)
    if _is_mesh(parallelism):
        mesh = _pick(parallelism, world_size)
        return _mesh_layout(layout_from_mesh(mesh), int(mesh.size()), world_size, "mesh")
    if not isinstance(parallelism, Mapping):
        raise TypeError(
            "parallelism must be a mapping such as {'tp': 8, 'pp': 4}, a torch.distributed DeviceMesh "
            f"or None, got {type(parallelism).__name__}"
        )
    unknown = sorted(str(k) for k in parallelism if k not in DIMS)
    if unknown:
        raise ValueError(f"parallelism: unknown keys {unknown}; use {', '.join(DIMS)}")
    degrees = {str(k): _degree(str(k), v) for k, v in parallelism.items()}
    return _check(degrees, world_size, "explicit")
