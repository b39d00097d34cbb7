"""``babysitter node-agent``: one process per host serving GPU, Xid, storage, checkpoint and trainer metrics.

Examples::

    babysitter node-agent --listen-address 0.0.0.0:9946
    babysitter node-agent --simulate 8 --gpu-model H100 --scenario faults.json \\
        --port 0 --port-file /tmp/agent.addr
    babysitter node-agent --no-collector.xid --storage-path /ckpt --checkpoint-run-dir /ckpt/run1
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from typing import Any

__all__ = ["register"]

log = logging.getLogger("babysitter.node")


def register(subparsers: Any) -> None:
    """Add the ``node-agent`` subcommand."""
    from babysitter.node.config import add_arguments

    parser = subparsers.add_parser(
        "node-agent",
        help="run the node agent (one per host): GPU health, Xid, storage, checkpoints, local trainers",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog=(
            "Every option can also come from the environment (BABYSITTER_NODE_<OPTION>, e.g. "
            "BABYSITTER_NODE_LISTEN_ADDRESS) or a config file (--config); flags win, then the "
            "environment, then the file."
        ),
    )
    add_arguments(parser)
    parser.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    from babysitter.node.config import ConfigError, load_config
    from babysitter.node.daemon import run

    try:
        config = load_config(args)
    except ConfigError as exc:
        log.error("babysitter node-agent: %s", exc)
        return 2
    stop = threading.Event()

    def _stop(signum: int, _frame: object) -> None:
        log.info("babysitter node-agent: %s received", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        return run(config, stop)
    except ConfigError as exc:
        log.error("babysitter node-agent: %s", exc)
        return 2
