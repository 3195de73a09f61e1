"""What `hold`, `release`, `update` and `requeue` print (slurm_command.py): a job's line,
and for the references of hold, release and update (POST /api/v1/jobs/hold ...) its
first jobs' lines and how many changed."""

from __future__ import annotations

import argparse
import json

from ..common import api_client, console
from .status_view import label


def job_line(j: dict) -> str:
    p = j.get("pending") or {}
    why = f" - {p['code']}: {p['reason']}" if p.get("code") else ""
    return f"job {j['id']} ({label(j)}, team {j['team']}): {j['state']}{why}"


def changed_lines(verb: str):
    """hold, release, update of references (POST /api/v1/jobs/hold ...): one job named
    on its own is shown as that job (`--json`: the job); an array's elements a line
    each, the first ten, and how many changed."""
    def lines(d: dict) -> str:
        out = [job_line(j) for j in d["jobs"]]
        if d["count"] > len(d["jobs"]):
            out.append(f"... and {d['count'] - len(d['jobs'])} more")
        out += [f"array {a['name']} ({a['id'][:8]}): at most "
                f"{a['max_running'] or 'all'} of its {a['size']} elements run at once "
                f"(max_running {a['max_running'] or 'none'})" for a in d.get("arrays", ())]
        n, left = len(d["changed"]), d["count"] - len(d["changed"])
        if not d.get("one_job"):
            out.append(f"{verb} {n} of {d['count']} job{'s' if d['count'] != 1 else ''}"
                       + (f"; {left} passed over (ended, live, or already so)"
                          if left else ""))
        return "\n".join(out)
    return lines


def changed_run(call, verb: str):
    """A hold, release or update command: its answer as `changed_lines` says."""
    def run(args: argparse.Namespace) -> int:
        with api_client(args) as c:
            got = call(c, args)
        one = got.get("one_job") and got["jobs"]
        if args.json:
            print(json.dumps(got["jobs"][0] if one else got, indent=2, default=str))
        else:
            console().print(changed_lines(verb)(got), markup=False, highlight=False)
        return 0
    return run
