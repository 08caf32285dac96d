"""The nemesis suite by hand: faults against a controller-mode cluster in network
namespaces, a workload recording every SEND_OK, and a report per nemesis.

tests/support/nemesis.py has the cluster (3 controllers, groups broker-a of 3 brokers
and broker-b of 2, each process in a namespace of its own), the nemeses (partitions,
kill -9, SIGSTOP, clock skew, a full disk), the workload (hamq's producer, one task per
queue; with --cpp RocketMQ's C++ client too) and the checker (lost, duplicated,
reordered, divergent CommitLogs; per fault the window with no SEND_OK and the time to
recover). The schedule is drawn from --seed (printed; the same seed, the same schedule)
until the faults' hold times add up to --duration; --each runs every nemesis once.

    python benchmarks/nemesis.py --duration 30m --cpp --json report.json
    python benchmarks/nemesis.py --each --hold 5
    python benchmarks/nemesis.py --duration 5m --nemesis split-master,stop-master

Needs root: network namespaces and iptables (installed from Debian when missing).
Exit status 1 when an acknowledged message was lost or CommitLogs diverged (the cluster's
directory is kept then, with every process's log), 2 when it cannot run here.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support

from tests.support import netns
from tests.support.nemesis import NEMESES, nemesis_cluster, random_schedule, run_schedule

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smh]?)")


def duration_s(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``2h`` in seconds; ValueError naming the text."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"duration {text!r} is not a number of s, m or h (30m, 90s)")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=duration_s, default=duration_s("5m"))
    parser.add_argument("--seed", type=int, default=None, help="the schedule's (random)")
    parser.add_argument("--nemesis", default="", help="names, comma-separated (all)")
    parser.add_argument("--each", action="store_true", help="every nemesis once")
    parser.add_argument("--hold", type=float, default=5.0, help="seconds a fault is held (--each)")
    parser.add_argument("--cpp", action="store_true", help="RocketMQ's C++ client sends too")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    args = parser.parse_args(argv)
    names = [n for n in args.nemesis.split(",") if n]
    unknown = sorted(set(names) - set(NEMESES))
    if unknown:
        parser.error(f"unknown nemesis {', '.join(unknown)}; known: {', '.join(sorted(NEMESES))}")
    args.names = names
    return args


async def main(args: argparse.Namespace, root: Path) -> bool:
    seed = random.randrange(1 << 30) if args.seed is None else args.seed
    if args.each:
        schedule = [(name, args.hold) for name in (args.names or sorted(NEMESES))]
    else:
        schedule = random_schedule(seed, args.duration, args.names)
    print(f"seed {seed}: {len(schedule)} fault(s): " + ", ".join(f"{n} {h}s" for n, h in schedule))
    started = time.monotonic()
    async with nemesis_cluster(root) as cluster:
        with netns.entered(cluster.client):
            report = await run_schedule(cluster, schedule, seed=seed, cpp=args.cpp)
    print(report.summary())
    print(f"({time.monotonic() - started:.0f} s in all; logs and stores in {root})")
    for kind in ("lost", "divergent", "reordered", "duplicated"):
        found = getattr(report, kind)
        if found:
            print(
                f"{kind}: {len(found)}: {', '.join(found[:10])}{' ...' if len(found) > 10 else ''}"
            )
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "seed": seed,
                    "schedule": schedule,
                    "acked": report.acked,
                    "cppAcked": report.cpp_acked,
                    "lost": report.lost,
                    "divergent": report.divergent,
                    "duplicated": len(report.duplicated),
                    "reordered": len(report.reordered),
                    "errors": report.errors,
                    "byNemesis": report.by_nemesis(),
                },
                indent=1,
            )
        )
    return report.ok


if __name__ == "__main__":
    arguments = parse_args(sys.argv[1:])
    why = netns.unavailable()
    if why is not None:
        print(f"cannot run the nemesis suite here: {why}", file=sys.stderr)
        sys.exit(2)
    directory = Path(tempfile.mkdtemp(prefix="hamq-nemesis-"))
    ok = trio.run(main, arguments, directory)
    if ok:
        shutil.rmtree(directory, ignore_errors=True)
    sys.exit(0 if ok else 1)
