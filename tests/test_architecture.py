"""The layout keeps its promises: imports point down, and docs/architecture.md maps the tree as it is.

Every import in ``src/babysitter`` is read with ``ast`` (lazy ones inside functions and ``TYPE_CHECKING``
blocks count too: they are dependencies all the same). Each module belongs to one layer, by its longest
prefix in :data:`LAYERS`. A module may import any lower layer, its own top-level package at its layer,
and another top-level package of its layer only along the edges :data:`SIDEWAYS` declares.
``docs/architecture.md``'s package map must list every package, every root module and every module
:data:`LAYERS` places on its own, with the same layer and the same sideways edges.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
DOC = ROOT / "docs" / "architecture.md"

#: Lowest first. A module's layer is that of its longest matching prefix; ``babysitter`` alone is the
#: public facade (``babysitter/__init__.py``: ``watch``, ``Tracker``...), which re-exports the training side.
#: ``generate``'s writer and two-tier configurations sit above its definitions: what the central tier
#: keeps depends on what the scorecard and ``babysitter top`` read.
LAYERS: dict[str, tuple[str, ...]] = {
    # Leaf utilities for reading what users wrote: they import nothing of babysitter.
    "base": ("babysitter.jsonin", "babysitter.userfiles"),
    "catalog": ("babysitter.catalog",),
    "core": (
        "babysitter._install",
        "babysitter._version",
        "babysitter.checkpoints",
        "babysitter.export",
        "babysitter.flops",
        "babysitter.hardware",
        "babysitter.jsonout",
        "babysitter.labels",
        "babysitter.ledger",
        "babysitter.prom",
        "babysitter.registration",
        "babysitter.terminal",
    ),
    "monitoring as code": ("babysitter.generate",),
    "features": (
        "babysitter",
        "babysitter.campaign",
        "babysitter.demo",
        "babysitter.explain",
        "babysitter.generate.distributed",
        "babysitter.incident",
        "babysitter.generate.writer",
        "babysitter.integrations",
        "babysitter.node",
        "babysitter.probe",
        "babysitter.remediate",
        "babysitter.scorecard",
        "babysitter.training",
        "babysitter.views",
    ),
    "cli": ("babysitter.__main__", "babysitter.cli"),
}

#: The only imports between different top-level packages of one layer (importer -> imported).
SIDEWAYS: frozenset[tuple[str, str]] = frozenset(
    {
        # Which checkpoint verifies reads the ledger's record of the saves.
        ("babysitter.checkpoints", "babysitter.ledger"),
        # The facade re-exports the training side's API; ``python -m babysitter`` is the command line.
        ("babysitter", "babysitter.training"),
        ("babysitter.__main__", "babysitter.cli"),
        # The framework callbacks are adapters over the tracker.
        ("babysitter.integrations", "babysitter.training"),
        # The probe finds its rank the way a training rank does.
        ("babysitter.probe", "babysitter.training"),
        # The agent exports the probe's result files.
        ("babysitter.node", "babysitter.probe"),
        # The scorecard's and the probe's tables draw what those computed.
        ("babysitter.views", "babysitter.scorecard"),
        ("babysitter.views", "babysitter.probe"),
        # ``babysitter top`` shows explain's hint for a run whose MFU dropped.
        ("babysitter.views", "babysitter.explain"),
        # The two-tier configurations keep what the scorecard and ``babysitter top`` query.
        ("babysitter.generate", "babysitter.scorecard"),
        ("babysitter.generate", "babysitter.views"),
        # dcgm-exporter's Xid codes get the action buckets of the agent's Xid catalog.
        ("babysitter.generate", "babysitter.node"),
        # The demo trains like a user (``babysitter.watch``), simulates GPUs, writes the rules, shows ``top``.
        ("babysitter.demo", "babysitter"),
        ("babysitter.demo", "babysitter.generate"),
        ("babysitter.demo", "babysitter.node"),
        ("babysitter.demo", "babysitter.views"),
        # The demo explains its throttle fault on screen.
        ("babysitter.demo", "babysitter.explain"),
        # The incident gatherer asks the ranks what the training side answers (its request protocol).
        ("babysitter.incident", "babysitter.training"),
        # The remediator gathers the incident's bundle before it acts.
        ("babysitter.remediate", "babysitter.incident"),
        # The fault campaign runs the demo's stack and pager on simulated hosts, ranks that train like a
        # user's (``babysitter.watch``), and the rules ``babysitter generate`` writes.
        ("babysitter.campaign", "babysitter"),
        ("babysitter.campaign", "babysitter.demo"),
        ("babysitter.campaign", "babysitter.node"),
        ("babysitter.campaign", "babysitter.generate"),
    }
)

_ORDER = list(LAYERS)


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted((SRC / "babysitter").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(module: str, path: Path) -> Iterator[tuple[int, str]]:
    """(line, imported module of ours) for every import statement, wherever it sits in the file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            # ``from babysitter import flops`` imports the submodule; ``from babysitter import watch``
            # takes a name from the facade.
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        for name in names:
            target = name
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != module:
                yield node.lineno, target


def _covers(prefix: str, module: str) -> bool:
    # The facade ``babysitter`` is one module; any other prefix covers its package.
    return module == prefix or (prefix != "babysitter" and module.startswith(prefix + "."))


def _owner(module: str) -> tuple[str, str]:
    """(layer, package prefix) of a module: its longest prefix in LAYERS."""
    found = [(len(p), layer, p) for layer, prefixes in LAYERS.items() for p in prefixes if _covers(p, module)]
    if not found:
        raise LookupError(f"{module} is in no layer: add its package to LAYERS and to docs/architecture.md")
    _length, layer, prefix = max(found)
    return layer, prefix


def _unit(module: str) -> str:
    """The top-level package (``babysitter.node`` for ``babysitter.node.gpu.nvml``), or the root module."""
    return ".".join(module.split(".")[:2])


#: (importer, line, imported), once per statement and target.
EDGES = sorted({(m, line, target) for m, path in MODULES.items() for line, target in _imports(m, path)})


def _where(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(ROOT)}:{line}"


def test_every_module_belongs_to_a_layer() -> None:
    """A new top-level package or root module must be placed in a layer before it can be imported."""
    missing = [m for m in MODULES if not any(_covers(p, m) for ps in LAYERS.values() for p in ps)]
    assert not missing, f"modules in no layer (add them to LAYERS and docs/architecture.md): {missing}"


def test_imports_point_down() -> None:
    """A module imports lower layers, its own package, and same-layer packages only along SIDEWAYS."""
    bad = []
    for module, line, target in EDGES:
        layer, target_layer = _owner(module)[0], _owner(target)[0]
        up = _ORDER.index(target_layer) > _ORDER.index(layer)
        sideways = target_layer == layer and _unit(target) != _unit(module)
        if up or (sideways and (_unit(module), _unit(target)) not in SIDEWAYS):
            kind = "up" if up else "sideways"
            bad.append(
                f"{_where(module, line)}: {module} ({layer}) imports {target} ({target_layer}): {kind}"
            )
    assert not bad, "imports that do not point down:\n" + "\n".join(bad)


def test_sideways_edges_are_all_used() -> None:
    """A declared sideways edge nothing uses is a stale promise: remove it (and from the doc)."""
    used = {(_unit(m), _unit(t)) for m, _line, t in EDGES if _owner(m)[0] == _owner(t)[0]}
    assert not SIDEWAYS - used, f"declared but unused: {sorted(SIDEWAYS - used)}"


def test_catalog_imports_nothing_of_ours() -> None:
    """The catalog is the bottom: every other part reads metric names from it."""
    bad = [
        f"{_where(m, line)}: {t}"
        for m, line, t in EDGES
        if _covers("babysitter.catalog", m) and not _covers("babysitter.catalog", t)
    ]
    assert not bad, "\n".join(bad)


def test_nothing_outside_the_cli_imports_it() -> None:
    """The command line parses arguments and calls down; no library module reaches up into it."""
    bad = [
        f"{_where(m, line)}: {t}"
        for m, line, t in EDGES
        if _owner(t)[1] in ("babysitter.cli", "babysitter.__main__") and _owner(m)[0] != "cli"
    ]
    assert not bad, "\n".join(bad)


def test_the_training_side_never_imports_the_node_agent_or_the_cli() -> None:
    """A training rank loads only what it runs: no agent, no command line, no views."""
    forbidden = (
        "babysitter.node",
        "babysitter.cli",
        "babysitter.views",
        "babysitter.demo",
        "babysitter.remediate",
    )
    bad = [
        f"{_where(m, line)}: {t}"
        for m, line, t in EDGES
        if _covers("babysitter.training", m) and any(_covers(f, t) for f in forbidden)
    ]
    assert not bad, "\n".join(bad)


def test_no_import_cycles() -> None:
    """No two modules import each other, directly or through others (lazy imports included)."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module, _line, target in EDGES:
        graph[module].add(target)
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            pytest.fail("import cycle: " + " -> ".join(cycle))


# ------------------------------------------------------------------------------ docs/architecture.md

_ROW = re.compile(r"^\|\s*(?P<layer>[^|]+?)\s*\|\s*`(?P<path>[^`]+)`\s*\|(?P<rest>.*)\|\s*$")


def _doc_rows() -> dict[str, tuple[str, str]]:
    """Package map rows: path -> (layer, the rest of the row)."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Package map", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        match = _ROW.match(line)
        if match:
            rows[match["path"]] = (match["layer"], match["rest"])
    return rows


def _tree() -> set[str]:
    """Root modules (``labels.py``) and every package (``node/``, ``node/gpu/``), as the map names them."""
    base = SRC / "babysitter"
    entries = {p.name for p in base.glob("*.py")}
    entries |= {
        f"{p.parent.relative_to(base).as_posix()}/" for p in base.rglob("__init__.py") if p.parent != base
    }
    own = [p for ps in LAYERS.values() for p in ps if p.count(".") > 1 and MODULES[p].name != "__init__.py"]
    entries |= {MODULES[p].relative_to(base).as_posix() for p in own}
    return entries


def _module_of(path: str) -> str:
    """``node/gpu/`` -> ``babysitter.node.gpu``; ``__init__.py`` is the facade ``babysitter``."""
    if path == "__init__.py":
        return "babysitter"
    return "babysitter." + path.removesuffix("/").removesuffix(".py").replace("/", ".")


def test_the_package_map_lists_the_tree() -> None:
    """Every package, root module and module placed on its own is in the map, and nothing else is."""
    rows, tree = set(_doc_rows()), _tree()
    assert rows == tree, (
        f"missing from the map: {sorted(tree - rows)}; not in the tree: {sorted(rows - tree)}"
    )


def test_the_package_map_states_the_layers_and_sideways_imports_the_test_enforces() -> None:
    """The map's layer column matches LAYERS; its 'may also import' names exactly SIDEWAYS."""
    rows = _doc_rows()
    wrong = [
        f"{path}: the map says {layer!r}, LAYERS says {_owner(_module_of(path))[0]!r}"
        for path, (layer, _rest) in rows.items()
        if layer != _owner(_module_of(path))[0]
    ]
    assert not wrong, "\n".join(wrong)
    declared = {
        (_unit(_module_of(path)), _unit(_module_of(name)))
        for path, (_layer, rest) in rows.items()
        for name in re.findall(r"->\s*`([^`]+)`", rest)
    }
    assert declared == SIDEWAYS, (
        f"map only: {sorted(declared - SIDEWAYS)}; test only: {sorted(SIDEWAYS - declared)}"
    )
