"""The published fault campaigns: several seeded campaigns, one results page (benchmarks/results/campaign.md)
and one JSON file with everything (benchmarks/results/campaign.json).

Each campaign is ``python -m babysitter.campaign`` (src/babysitter/campaign, docs/campaign.md): a
simulated cluster, a seeded schedule of every fault class the profile can play, real Prometheus and
Alertmanager with the rules and routing under test, graded per fault. A campaign at the fast profile
takes about 45 minutes, one at the shipped profile about 4 hours (its windows are minutes); run one
at a time on a small machine.

Usage:
    python benchmarks/campaign.py --run fast:1 --run default:2           # run, then write the page
    python benchmarks/campaign.py --run fast:3 --append                  # add one to the JSON and page
    python benchmarks/campaign.py --rules my-alerts.yaml --rules my-rules.yaml --run default:1
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks/results"

_HEAD = """# Fault campaigns: the babysitter graded as a babysitter

`benchmarks/campaign.py` runs `python -m babysitter.campaign` (docs/campaign.md): three simulated hosts
(node agents with two simulated H100s each and their own fake sysfs trees), a three-rank lockstep gloo
job under torchrun registered on them (checkpoints with manifests, the sentinel), real Prometheus with
the generated rules, real Alertmanager with exporters/alertmanager.yml (receivers pointed at the
campaign's webhook; at the fast profile its waits shortened as the demo's), `babysitter remediate
--dry-run` with exporters/remediate-policy.example.yaml (rails widened for three hosts), and an
external dead man's switch simulated on the Watchdog's heartbeats. A seeded schedule plays every fault
class the profile can play once, with quiet stretches and healthy noise (step-time jitter, eval
phases, slow but healthy saves, planned restarts) between them. Each notification is graded against
the fault whose window it falls in (its start to its clearing plus a settle time), or as a false page
when it falls in healthy time.

What the columns mean: *first notification*, the first notification of an alert the fault must cause
(pager or chat) and how long after the fault; *culprit*, whether those notifications name the place
the fault struck (right), another (wrong) or none; *pages*, pager notifications in the fault's window
(each webhook request once; "resolved early": resolutions sent before the fault was cleared); *other
alerts*, the other alerts that notified in the window (a consequence at the fault's place, or "wrong
place", or "left over" from the fault before); *remediation*, what the dry-run remediator planned and
whether that was what the fault needed.
"""


def _run(profile: str, seed: int, args: argparse.Namespace) -> tuple[str, Any, dict[str, Any]]:
    from babysitter.campaign.cluster import ClusterOptions, campaign_config
    from babysitter.campaign.play import play
    from babysitter.campaign.report import to_json
    from babysitter.campaign.schedule import Shape, build_schedule, timing_for

    timing = timing_for(profile)
    schedule = build_schedule(seed, campaign_config(profile), timing, Shape(), draw=args.draw)
    workdir = Path(tempfile.mkdtemp(prefix=f"campaign-{profile}-{seed}-"))
    options = ClusterOptions(
        workdir=workdir,
        profile=profile,
        rules=tuple(args.rules),
        routing=args.alertmanager_config,
        policy=args.policy,
    )
    label = f"seed {seed}, {'shipped' if profile == 'default' else profile} profile"
    started = datetime.datetime.now(datetime.timezone.utc)
    outcome = play(options, schedule, timing, say=lambda line: print(f"[{label}] {line}", flush=True))
    data = to_json(outcome, label=label)
    data["started"] = started.strftime("%Y-%m-%d %H:%M UTC")
    data["load_average"] = os.getloadavg()[0]
    data["workdir"] = str(workdir)
    return label, outcome, data


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", action="append", default=[], help="PROFILE:SEED (fast or default), repeatable")
    p.add_argument("--draw", type=int, default=0, help="hard faults drawn by Llama 3's counts, per campaign")
    p.add_argument("--rules", type=Path, action="append", default=[])
    p.add_argument("--alertmanager-config", type=Path, default=None)
    p.add_argument("--policy", type=Path, default=None)
    p.add_argument("--append", action="store_true", help="keep the campaigns already in the JSON")
    p.add_argument(
        "--add",
        type=Path,
        action="append",
        default=[],
        help="a campaign's JSON (python -m babysitter.campaign --json)",
    )
    p.add_argument("--notes", type=Path, default=None, help="markdown to put after the head (what was found)")
    p.add_argument(
        "--merge",
        action="append",
        default=[],
        metavar="PREFIX",
        help="one summary column for the campaigns whose label starts with PREFIX (one played in parts)",
    )
    p.add_argument("--json", type=Path, default=RESULTS / "campaign.json")
    p.add_argument("--markdown", type=Path, default=RESULTS / "campaign.md")
    args = p.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    from babysitter.campaign.report import markdown

    done: list[dict[str, Any]] = []
    if args.append and args.json.exists():
        done = json.loads(args.json.read_text())["campaigns"]
    for path in args.add:
        done.append(json.loads(path.read_text()))
        args.json.write_text(json.dumps({"campaigns": done}, indent=1) + "\n")
    for item in args.run:
        profile, _, seed = item.partition(":")
        _, _, data = _run(profile, int(seed or 1), args)
        done.append(data)
        args.json.write_text(json.dumps({"campaigns": done}, indent=1) + "\n")
    machine = (
        f"Machine: {platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} logical CPUs "
        f"(shared with other jobs), Python {platform.python_version()}; "
        + "; ".join(
            f"{d['label']}: started {d['started']}, load average {d['load_average']:.1f}" for d in done
        )
        + f". Servers: {done[0]['machine']['servers'] if done else '-'}."
    )
    command = "python benchmarks/campaign.py " + shlex.join(sys.argv[1:])
    notes = args.notes.read_text().strip() + "\n\n" if args.notes else ""
    args.markdown.write_text(
        _HEAD + "\n" + machine + "\n\n" + notes + markdown(done, command=command, merged=args.merge)
    )
    print(f"wrote {args.markdown} and {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
