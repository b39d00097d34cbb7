"""``python -m babysitter.campaign``: run one seeded fault campaign and write its grade (JSON, markdown)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import signal
import sys
import tempfile
from pathlib import Path

from babysitter.campaign import faults as F


def build_parser() -> argparse.ArgumentParser:
    """The command line (``benchmarks/campaign.py`` runs it for the published results)."""
    p = argparse.ArgumentParser(
        prog="python -m babysitter.campaign",
        description=(
            "A seeded fault campaign on a simulated cluster (node agents with simulated GPUs and fake "
            "sysfs trees, a lockstep gloo job under torchrun), graded through real Prometheus and "
            "Alertmanager: detection, time to first notification, culprit, false pages, notifications "
            "per fault, remediation. See docs/campaign.md."
        ),
    )
    p.add_argument(
        "--profile", choices=("fast", "default"), default="fast", help="rules and clocks (default: fast)"
    )
    p.add_argument("--seed", type=int, default=1, help="the schedule's seed (default 1)")
    p.add_argument("--hosts", type=int, default=3, help="simulated hosts, one rank each (default 3)")
    p.add_argument("--gpus", type=int, default=2, help="simulated GPUs per host (default 2)")
    p.add_argument(
        "--faults",
        default="",
        help="comma-separated kinds to play once each (default: every kind playable at the profile): "
        + ", ".join(k.name for k in F.KINDS),
    )
    p.add_argument("--draw", type=int, default=0, help="hard faults to draw by Llama 3's interruption counts")
    p.add_argument(
        "--draw-slow", type=int, default=0, help="slow faults to draw by Greyhound's fail-slow shares"
    )
    p.add_argument("--no-noise", action="store_true", help="no eval phase, slow save or planned restart")
    p.add_argument(
        "--rules",
        type=Path,
        action="append",
        default=[],
        help="your rule file (repeatable) instead of the generated ones",
    )
    p.add_argument(
        "--alertmanager-config",
        type=Path,
        default=None,
        help="your Alertmanager routing instead of exporters/alertmanager.yml",
    )
    p.add_argument(
        "--policy",
        type=Path,
        default=None,
        help="your remediate policy instead of exporters/remediate-policy.example.yaml",
    )
    p.add_argument("--workdir", type=Path, default=None, help="keep every process's log and data here")
    p.add_argument("--json", type=Path, default=None, help="write the full result here")
    p.add_argument("--markdown", type=Path, default=None, help="write the result page here")
    p.add_argument("--label", default="", help="the campaign's name in the result page")
    p.add_argument("--schedule-only", action="store_true", help="print the schedule and exit")
    return p


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _err(text: str) -> None:
    sys.stderr.write(f"babysitter campaign: {text}\n")


def main(argv: list[str] | None = None) -> int:
    """Run it; 0 when every fault was detected with its culprit named right and nothing paged falsely,
    1 otherwise, 2 on a setup error."""
    args = build_parser().parse_args(argv)
    from babysitter.campaign.cluster import ClusterOptions, campaign_config
    from babysitter.campaign.schedule import Shape, build_schedule, timing_for
    from babysitter.demo.stack import StackError

    kinds = tuple(k.strip() for k in args.faults.split(",") if k.strip())
    try:
        if not 2 <= args.hosts <= 16 or not 1 <= args.gpus <= 8:
            raise ValueError("--hosts must lie in 2..16 and --gpus in 1..8")
        for path in [*args.rules, args.alertmanager_config, args.policy]:
            if path is not None and not path.is_file():
                raise ValueError(f"{path}: no such file")
        timing = timing_for(args.profile)
        shape = Shape(hosts=args.hosts, gpus=args.gpus)
        schedule = build_schedule(
            args.seed,
            campaign_config(args.profile),
            timing,
            shape,
            kinds=kinds,
            draw=args.draw,
            draw_slow=args.draw_slow,
            noise=not args.no_noise,
        )
    except (KeyError, ValueError) as exc:
        _err(str(exc))
        return 2
    if args.schedule_only:
        _out(json.dumps(schedule.to_json(), indent=2))
        return 0
    from babysitter.campaign.play import play
    from babysitter.campaign.report import markdown, to_json

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="babysitter-campaign-"))
    workdir.mkdir(parents=True, exist_ok=True)
    _out(
        f"babysitter campaign: seed {args.seed}, profile {args.profile}, {len(schedule.faults)} faults, "
        f"{schedule.length / 60:.1f} min; work directory {workdir}"
    )
    options = ClusterOptions(
        workdir=workdir.resolve(),
        profile=args.profile,
        shape=shape,
        rules=tuple(args.rules),
        routing=args.alertmanager_config,
        policy=args.policy,
    )

    def _interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    started = datetime.datetime.now(datetime.timezone.utc)
    try:
        outcome = play(options, schedule, timing, say=_out)
    except StackError as exc:
        _err(str(exc))
        return 2
    except KeyboardInterrupt:
        _err("interrupted; everything it started is stopped")
        return 130
    label = args.label or f"seed {args.seed}, {args.profile} profile"
    data = to_json(outcome, label=label)
    # What benchmarks/campaign.py records beside each campaign (--add): when, and how busy the machine was.
    data["started"] = started.strftime("%Y-%m-%d %H:%M UTC")
    data["load_average"] = os.getloadavg()[0]
    data["workdir"] = str(workdir)
    if args.json:
        args.json.write_text(json.dumps(data, indent=1) + "\n")
    text = markdown([data], command="python -m babysitter.campaign " + shlex.join(argv or sys.argv[1:]))
    if args.markdown:
        args.markdown.write_text(text)
    _out(text)
    s = outcome.score.summary
    ok = (
        s["detected"] == s["faults"]
        and s["culprit_wrong"] == 0
        and s["culprit_unnamed"] == 0
        and s["false_pages"] == 0
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
