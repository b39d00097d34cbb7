"""The node agent's Dockerfile, read as a container engine would, agrees with the project and the
DaemonSet. No engine runs here, so this is what stands in for a build: the checks hadolint makes
for these instructions, and that every name the image relies on exists."""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import shlex
from dataclasses import dataclass

import pytest
import yaml

from babysitter._version import __version__
from babysitter.cli import build_parser
from babysitter.node.config import DEFAULT_PORT
from gen_helpers import REPO

IMAGE_NAME = "babysitter-node-agent"


@dataclass(frozen=True)
class Instruction:
    op: str
    args: str
    stage: int


def parse(text: str) -> tuple[dict[str, str], list[Instruction]]:
    """Global ARG defaults and the instructions, continuation lines joined, comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    assert not pending, "a continuation line ends the file"
    args: dict[str, str] = {}
    out: list[Instruction] = []
    stage = -1
    for line in lines:
        op, _, rest = line.partition(" ")
        op = op.upper()
        if op == "FROM":
            stage += 1
        elif op == "ARG" and stage < 0:
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip()
        out.append(Instruction(op, rest.strip(), stage))
    return args, out


ARGS, INSTRUCTIONS = parse((REPO / "Dockerfile").read_text())
STAGES = [i for i in INSTRUCTIONS if i.op == "FROM"]
FINAL = len(STAGES) - 1


def _in_stage(stage: int, op: str) -> list[Instruction]:
    return [i for i in INSTRUCTIONS if i.stage == stage and i.op == op]


def _image(ref: str) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: ARGS[m.group(1) or m.group(2)], ref)


def test_multi_stage_on_a_tagged_base() -> None:
    """A named build stage and a runtime stage; every base has an explicit tag, never latest
    (hadolint DL3006, DL3007), and the runtime's base is a Python image (the DaemonSet's init
    container runs `python`)."""
    assert len(STAGES) >= 2
    names = []
    for stage in STAGES:
        ref, *rest = stage.args.split()
        image = _image(ref)
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest" and "/" not in tag, image
        assert rest[:1] == ["AS"] or rest[:1] == ["as"], stage.args
        names.append(rest[1])
    assert len(set(names)) == len(names)
    assert _image(STAGES[FINAL].args.split()[0]).split(":")[0].endswith("python")


def test_runtime_stage_copies_the_environment_and_builds_nothing() -> None:
    """The runtime stage takes the virtual environment from the build stage and runs no pip or
    compiler: no build tools or caches in the image."""
    build_name = STAGES[0].args.split()[-1]
    copies = _in_stage(FINAL, "COPY")
    assert any(c.args.startswith(f"--from={build_name} /opt/babysitter") for c in copies)
    for run in _in_stage(FINAL, "RUN"):
        assert "pip" not in run.args and "gcc" not in run.args, run.args


def test_runs_as_a_non_root_user_by_default() -> None:
    """The last USER of the runtime stage is a numeric non-root uid (and gid) the stage creates
    (hadolint DL3002: the last user is not root)."""
    users = _in_stage(FINAL, "USER")
    assert users
    uid, _, gid = users[-1].args.partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit() and int(gid) != 0
    created = " ".join(r.args for r in _in_stage(FINAL, "RUN"))
    assert f"--uid {uid}" in created and f"--gid {gid}" in created


def test_entrypoint_is_the_console_script_and_cmd_a_subcommand() -> None:
    """ENTRYPOINT (exec form) is the script pyproject declares, CMD a subcommand the CLI has, and the
    DaemonSet's args start with the same subcommand."""
    (entrypoint,) = _in_stage(FINAL, "ENTRYPOINT")
    (cmd,) = _in_stage(FINAL, "CMD")
    script = json.loads(entrypoint.args)
    command = json.loads(cmd.args)
    pyproject = (REPO / "pyproject.toml").read_text()
    scripts = re.search(r"^\[project\.scripts\]\n((?:.+\n)+)", pyproject, flags=re.MULTILINE)
    assert scripts and f'{script[0]} = "babysitter.cli:main"' in scripts.group(1)
    assert script == ["babysitter"]
    (subparsers,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert command[0] in subparsers.choices
    container = _daemonset()["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][0] == command[0]


def test_hadolint_basics() -> None:
    """pip without a cache (DL3042) and with the nvml extra pyproject defines; absolute WORKDIR
    (DL3000); COPY, never ADD, for local files (DL3020); no sudo (DL3004); apt-get, if ever used,
    with --no-install-recommends (DL3015); no secrets passed as ARG or ENV."""
    pips = [i.args for i in INSTRUCTIONS if i.op == "RUN" and "pip install" in i.args]
    assert pips and all("--no-cache-dir" in p for p in pips)
    assert any('".[nvml]"' in p for p in pips)
    assert re.search(r"^nvml = \[", (REPO / "pyproject.toml").read_text(), flags=re.MULTILINE)
    for i in INSTRUCTIONS:
        assert i.op != "ADD", i.args
        assert "sudo " not in i.args
        if i.op == "WORKDIR":
            assert i.args.startswith("/")
        if i.op == "RUN" and "apt-get install" in i.args:
            assert "--no-install-recommends" in i.args
        if i.op in {"ARG", "ENV"}:
            assert not re.search(r"(?i)(password|secret|token|key)\w*=", i.args), i.args


def test_nvml_comes_from_the_host_driver() -> None:
    """The NVIDIA container toolkit injects libnvidia-ml.so when these are set (utility is the
    capability NVML needs); the image ships no driver library of its own."""
    env = " ".join(i.args for i in _in_stage(FINAL, "ENV"))
    assert re.search(r"NVIDIA_VISIBLE_DEVICES=all\b", env)
    caps = re.search(r"NVIDIA_DRIVER_CAPABILITIES=([\w,]+)", env)
    assert caps and "utility" in caps.group(1).split(",")
    assert "libnvidia-ml" not in " ".join(i.args for i in INSTRUCTIONS if i.op in {"COPY", "RUN"})
    (expose,) = _in_stage(FINAL, "EXPOSE")
    assert expose.args == str(DEFAULT_PORT)


def _dockerignore() -> list[str]:
    return [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]


def _in_context(path: str) -> bool:
    """Whether the build context holds ``path`` (the last matching .dockerignore pattern wins)."""
    kept = True
    for pattern in _dockerignore():
        negate = pattern.startswith("!")
        bare = pattern.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, bare) or path.startswith(bare + "/") or fnmatch.fnmatch(path, f"*/{bare}"):
            kept = negate
    return kept


def test_the_build_context_holds_what_copy_names_and_nothing_private() -> None:
    """Every COPY source of the build stage exists and passes .dockerignore; the virtual environment
    and git history never enter the context."""
    for copy in _in_stage(0, "COPY"):
        *sources, _dest = shlex.split(copy.args)
        for source in sources:
            assert (REPO / source).exists(), source
            assert _in_context(source), source
    assert _in_context("src/babysitter/cli/__init__.py")
    for private in (".venv/bin/python", ".git/config", "tests/conftest.py", "benchmarks/results/fleet.md"):
        assert not _in_context(private), private


def _daemonset() -> dict:  # type: ignore[type-arg]
    return yaml.safe_load((REPO / "exporters/node-agent-daemonset.yaml").read_text())


@pytest.mark.parametrize("doc", ["Dockerfile", "exporters/README.md"])
def test_the_daemonset_runs_the_image_the_docs_build(doc: str) -> None:
    """Both DaemonSet containers run <registry>/babysitter-node-agent:<package version>, the image the
    Dockerfile's and the deployment guide's `docker build -t` lines produce."""
    spec = _daemonset()["spec"]["template"]["spec"]
    images = {c["image"] for c in spec["initContainers"] + spec["containers"]}
    (image,) = images
    assert re.fullmatch(rf"[\w.-]+(?::\d+)?/[\w./-]+/{IMAGE_NAME}:{re.escape(__version__)}", image), image
    builds = re.findall(r"docker build -t (\S+) \.", (REPO / doc).read_text())
    assert builds and set(builds) == {image}
