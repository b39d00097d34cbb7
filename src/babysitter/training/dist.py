"""Who this process is in a distributed job: rank, local rank, world size.

torch.distributed wins when it is already initialized; otherwise the launchers' variables
(torchrun, Slurm, Open MPI) answer. torch is never imported here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["RankInfo", "detect_rank"]

_RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
_LOCAL_VARS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
_WORLD_VARS = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


@dataclass(frozen=True)
class RankInfo:
    """This process's place in the job."""

    rank: int
    local_rank: int
    world_size: int


def _first_int(env: Mapping[str, str], names: tuple[str, ...], default: int) -> int:
    for name in names:
        raw = env.get(name)
        if raw is None or raw == "":
            continue
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None
        if value < 0:
            raise ValueError(f"environment variable {name}={raw!r} is negative")
        return value
    return default


def detect_rank(env: Mapping[str, str] | None = None) -> RankInfo:
    """Rank, local rank and world size; a lone process is rank 0 of 1."""
    env = os.environ if env is None else env
    local_rank = _first_int(env, _LOCAL_VARS, 0)
    dist = sys.modules.get("torch.distributed")
    if dist is not None:
        try:
            if dist.is_available() and dist.is_initialized():
                return RankInfo(int(dist.get_rank()), local_rank, int(dist.get_world_size()))
        except Exception:  # noqa: S110 - fall back to the environment
            pass
    rank = _first_int(env, _RANK_VARS, 0)
    world = _first_int(env, _WORLD_VARS, 1)
    if rank >= world:
        raise ValueError(f"rank {rank} is not below world size {world} (check RANK/WORLD_SIZE)")
    return RankInfo(rank, local_rank, world)
