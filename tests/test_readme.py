"""The README's two set-up commands are the ones CI and the Makefile run."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command() -> None:
    """`.ci/run` executes exactly the test command the README gives, and the Makefile defines both."""
    readme = (REPO / "README.md").read_text()
    commands = re.findall(r"^(make \w+)\s+#", readme, flags=re.MULTILINE)
    assert commands[:2] == ["make demo", "make test"]
    ci = [line for line in (REPO / ".ci/run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == "exec make test"
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^test: .*pytest", makefile, flags=re.MULTILINE)
    assert re.search(r"^demo: .*\n(\t@echo .*\n)?\t\$\(BIN\)/babysitter demo$", makefile, flags=re.MULTILINE)
    # torch is pinned and installed before the project, so pip never resolves a CUDA build.
    env = makefile[makefile.index("env:") :]
    assert env.index('"$(TORCH)"') < env.index('-e ".[test]"')
    assert "TORCH ?= torch==2.13.0" in makefile


def _recipe(makefile: str, target: str) -> tuple[list[str], list[str]]:
    """The prerequisites and recipe lines of ``target``."""
    match = re.search(rf"^{target}:(.*)\n((?:\t.*\n?)*)", makefile, flags=re.MULTILINE)
    assert match, target
    return match.group(1).split(), [line.strip() for line in match.group(2).splitlines()]


def test_make_demo_installs_only_what_the_demo_needs() -> None:
    """`make demo` installs torch and the demo extra (not the test extra: mypy, ruff, transformers,
    lightning, OpenTelemetry), with pip's progress shown and each long step announced; the demo extra
    holds what the demo imports; `make test` still builds the full test environment."""
    makefile = (REPO / "Makefile").read_text()
    prereqs, _ = _recipe(makefile, "demo")
    assert "env" not in prereqs and "demo-env" in prereqs
    _, recipe = _recipe(makefile, "demo-env")
    pips = [line for line in recipe if "pip install" in line]
    assert pips and all(" -q" not in line for line in pips)
    assert '"$(TORCH)"' in pips[0] and pips[-1].endswith('-e ".[demo]"')
    assert all(recipe[i - 1].startswith("@echo") for i, line in enumerate(recipe) if "pip install" in line)
    pyproject = (REPO / "pyproject.toml").read_text()
    demo_extra = re.search(r"^demo = \[(.*)\]$", pyproject, flags=re.MULTILINE)
    assert demo_extra and {"rich", "matplotlib"} <= set(re.findall(r'"(\w+)', demo_extra.group(1)))
    test_prereqs, _ = _recipe(makefile, "pytest")
    assert "env" in test_prereqs


def test_readme_says_where_torch_comes_from() -> None:
    """The README says that a plain `torch==2.13.0` is the CUDA build on PyPI and gives the CPU line,
    which the Makefile accepts as TORCH_INDEX."""
    readme = (REPO / "README.md").read_text()
    cpu_index = "https://download.pytorch.org/whl/cpu"
    assert f"pip install torch==2.13.0 --index-url {cpu_index}" in readme
    assert f"make demo TORCH_INDEX={cpu_index}" in readme
    assert "CUDA build" in readme
    makefile = (REPO / "Makefile").read_text()
    assert "TORCH_FROM := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)" in makefile


def test_readme_and_makefile_say_the_same_demo_duration() -> None:
    """Issue 22: the README said "about two minutes", the Makefile "about 3 minutes"; both now say the
    measured length (docs/demo.md, "One measured run")."""
    readme = (REPO / "README.md").read_text()
    makefile = (REPO / "Makefile").read_text()
    said = re.search(r'babysitter demo \(about ([^)]+)\)"', makefile)
    assert said, "the Makefile announces the demo's length"
    assert f"About {said.group(1)}" in readme, said.group(1)


def test_readme_is_a_five_minute_read_with_one_picture_and_one_example() -> None:
    """What it is, one picture (committed, rendered from a real run), the two commands, one complete
    training example (run by tests/test_readme_example.py), and links for the rest."""
    readme = (REPO / "README.md").read_text()
    pictures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", readme)
    assert len(pictures) == 1 and (REPO / pictures[0]).is_file(), pictures
    assert (REPO / pictures[0]).stat().st_size < 400_000, "a picture, not a payload"
    assert len(re.findall(r"^```python$", readme, flags=re.MULTILINE)) == 1
    assert len(readme.split()) < 1600, len(readme.split())
    assert len(readme.splitlines()) <= 150, len(readme.splitlines())  # the first hour: a page, not a manual
    for target in re.findall(r"\]\(((?:docs|exporters|dashboards|alerts)/[^)#]*)", readme):
        assert (REPO / target).exists(), target
