"""Runs the README's training example as it is, with an outside clock (not collected by pytest).

``python readme_example_runner.py EXAMPLE.py CLOCK`` appends to CLOCK the process's start and, through
torch's global optimizer step hook, the time of every optimizer step, one unbuffered write each, then
executes EXAMPLE.py (the README's block, verbatim) as ``__main__``. The clock never goes through
babysitter, so ``tests/test_readme_example.py`` can hold the report against it.
"""

from __future__ import annotations

import os
import sys
import time

_STARTED = time.time()


def main() -> None:
    example, clock = sys.argv[1], sys.argv[2]
    fd = os.open(clock, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, f"start {_STARTED:.6f} {os.getpid()}\n".encode())

    from torch.optim.optimizer import register_optimizer_step_post_hook

    def on_step(optimizer: object, args: object, kwargs: object) -> None:
        os.write(fd, f"step {time.time():.6f}\n".encode())

    register_optimizer_step_post_hook(on_step)
    with open(example, encoding="utf-8") as f:
        code = compile(f.read(), "README.md (the training example)", "exec")
    exec(code, {"__name__": "__main__", "__file__": example})  # noqa: S102 - the README's own example
    os.write(fd, f"end {time.time():.6f}\n".encode())


if __name__ == "__main__":
    main()
