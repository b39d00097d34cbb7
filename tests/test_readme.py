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
    assert re.search(r"^demo: .*\n\t\$\(BIN\)/babysitter demo$", makefile, flags=re.MULTILINE)
    # torch is pinned and installed before the project, so pip never resolves a CUDA build.
    env = makefile[makefile.index("env:") :]
    assert env.index('"$(TORCH)"') < env.index('-e ".[test]"')
    assert "TORCH ?= torch==2.13.0" in makefile
