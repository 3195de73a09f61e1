"""The decisions of bench/scheduling_pass.py's preempting pass, written out to compare an
engine change against: what starts where, the victims (by whom, why, the message), the
reservations, every pending reason with its ETA, and the same for the pass after it.

    .venv/bin/python bench/pass_decisions.py --out /tmp/before.json    # before the change
    .venv/bin/python bench/pass_decisions.py --compare /tmp/before.json  # after it

Scenarios: the bench's (1,024 hosts, 5,000 pending, teams and preemption), explained and
not, and smaller clusters with other seeds. With --compare it exits 1 if any differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from scheduling_pass import build

# hosts, pending, seed, explain
SCENARIOS = ((1024, 5000, 1, True), (1024, 5000, 1, False), (256, 2000, 2, True),
             (256, 2000, 2, False), (256, 2000, 3, True), (128, 1000, 4, True),
             (128, 1000, 4, False), (512, 3000, 5, True))


def _alloc(a) -> list:
    return [a.host.name, a.role, a.index, a.gpu_mask, sorted(a.cpu_masks), sorted(a.mem),
            a.slice_mask]


def decisions(result) -> dict:
    return {
        "started": [[j.name, [_alloc(a) for a in p.allocations]] for j, p in result.started],
        "preempted": [[x.victim.name, x.by.name, x.reason, x.message, x.stop_at, x.broken]
                      for x in result.preempted],
        "reservations": [[r.job.name, r.start, r.end, r.tier, r.protected, r.eta,
                          [_alloc(a) for a in r.allocations]] for r in result.reservations],
        "pending": {k: [v.code, v.message, repr(v.details), v.eta]
                    for k, v in result.pending.items()},
        "cut": {k: list(v) for k, v in result.cut.items()},
        "tested": result.tested,
    }


def run() -> dict:
    now, out = 10 * 86400.0, {}
    for hosts, pending, seed, explain in SCENARIOS:
        sched = build(hosts, pending, seed, now, teams=True)
        first = decisions(sched.schedule(now, explain=explain))
        # the next pass: claims of the first one's preemptors, their victims stopping
        first["next"] = decisions(sched.schedule(now + 10, explain=explain))
        out[f"{hosts} hosts, {pending} pending, seed {seed}, explain {explain}"] = first
        print(f"{hosts} hosts, seed {seed}, explain {explain}: {len(first['started'])} "
              f"started, {len(first['preempted'])} preempted", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="write the decisions here")
    ap.add_argument("--compare", type=Path, help="compare with decisions written before")
    args = ap.parse_args(argv)
    got = run()
    if args.out:
        args.out.write_text(json.dumps(got, sort_keys=True))
    if not args.compare:
        return 0
    before = json.loads(args.compare.read_text())
    differ = [f"{k}: {part}" for k in before for part in before[k]
              if json.loads(json.dumps(got.get(k, {}).get(part))) != before[k][part]]
    for d in differ:
        print("differs:", d)
    print(f"{len(before)} scenarios: " + ("the same decisions" if not differ else
                                         f"{len(differ)} parts differ"))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
