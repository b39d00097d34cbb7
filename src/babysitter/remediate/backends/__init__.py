"""Scheduler backends: Slurm (its commands), Kubernetes (the official client), a user's script."""

from __future__ import annotations

from babysitter.remediate.backends.base import Backend, BackendError, Outcome, Step
from babysitter.remediate.policy import Policy

__all__ = ["Backend", "BackendError", "Outcome", "Step", "make_backend"]


def make_backend(policy: Policy) -> Backend:
    """The backend the policy names (the Kubernetes client is imported only when asked for)."""
    if policy.backend == "slurm":
        from babysitter.remediate.backends.slurm import SlurmBackend

        return SlurmBackend(policy.slurm)
    if policy.backend == "kubernetes":
        from babysitter.remediate.backends.kubernetes import KubernetesBackend

        return KubernetesBackend(policy.kubernetes)
    from babysitter.remediate.backends.script import ScriptBackend

    assert policy.script is not None  # parse_policy requires it for this backend
    return ScriptBackend(policy.script)
