"""Checkpoints that verify: a manifest of what a save wrote, checks against it, and where to resume.

A checkpoint counts when it verifies, not when it exists. The training process writes a *manifest*
after each save (:mod:`.build`: every file, its size, a SHA-256 per 16 MiB chunk; committed last, so a
manifest means a complete save); the node agent's sentinel checks checkpoints against their manifests
within an I/O budget (:mod:`.verify`) and writes what it finds next to the ledger (:mod:`.verdicts`);
``babysitter report`` and ``babysitter remediate`` name the newest checkpoint that verifies
(:mod:`.resume`). :mod:`.layouts` knows DCP, Hugging Face, safetensors and ``torch.save`` layouts and
their headers; :mod:`.digest` reads and hashes; :mod:`.manifest` is the format. docs/checkpoints.md
says how it works, what it costs and what it cannot see.
"""

from __future__ import annotations

from babysitter.checkpoints.build import BuildResult, build_manifest
from babysitter.checkpoints.manifest import FileEntry, Manifest, ManifestError, manifest_path, read_manifest
from babysitter.checkpoints.resume import CheckpointStatus, checkpoint_statuses, resume_point
from babysitter.checkpoints.verify import Problem, verify_checkpoint

__all__ = [
    "BuildResult",
    "CheckpointStatus",
    "FileEntry",
    "Manifest",
    "ManifestError",
    "Problem",
    "build_manifest",
    "checkpoint_statuses",
    "manifest_path",
    "read_manifest",
    "resume_point",
    "verify_checkpoint",
]
