"""Client commands for users coming from Slurm and Grid Engine (docs/service.md, "Coming
from Slurm / Grid Engine"): `queue` (squeue, qstat), `prio` (sprio), `share` (sshare),
`hold` / `release` (scontrol hold/release, qhold/qrls), `update` (scontrol update,
qalter; an array: each element, and its ArrayTaskThrottle), `requeue` (scontrol
requeue), `drain HOSTS --reason` and `resume HOSTS` (scontrol update State=DRAIN Reason=,
State=RESUME; host ranges) and `cluster` (sinfo, qhost). Job arguments take an id, a
unique id prefix (4 characters or more), a job name or an array's element (NAME_3): the
service resolves them."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from rich.table import Table

from ...scheduler_core.errors import InputError
from ...scheduler_core.units import format_duration, format_size
from ..common import show
from .changed_view import changed_run, job_line
from .status_view import label

LIVE = ("admitted", "running", "preempting")


def _dur(s: float | None) -> str:
    return "-" if s is None else format_duration(max(0, s))


def _short(job_id: str) -> str:
    return job_id[:8]


def _at(at: str | datetime | None) -> str:
    """An absolute time, in UTC, to the minute (squeue's START_TIME)."""
    if at is None:
        return "-"
    if isinstance(at, str):
        at = datetime.fromisoformat(at.replace("Z", "+00:00"))
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at.astimezone(UTC).strftime("%m-%d %H:%M")


# -- queue (squeue) -------------------------------------------------------------------------
def queue_table(jobs: list[dict]) -> Table:
    t = Table(title="Queue: live jobs by start, then pending jobs in the scheduler's order",
              title_justify="left")
    for col in ("#", "id", "name", "team/user", "state", "prio", "elapsed", "time limit",
                "ETA (UTC)", "in", "hosts / reason"):
        t.add_column(col, overflow="fold")
    for j in jobs:
        hosts = ",".join(dict.fromkeys(r["host"] for r in j.get("replicas", [])
                                       if r.get("live", True)))
        pending = j["state"] == "pending"
        code = (j.get("pending") or {}).get("code")
        where = (f"{code}: {j.get('reason') or (j.get('pending') or {}).get('reason') or ''}"
                 if pending and code else "-" if pending else hosts or "-")
        notes = _notes(j)
        if j.get("array_tasks"):     # an array's waiting elements, one line as squeue
            ident, name = _short(j["array_id"]), f"{j['name']}_[{j['array_tasks']}]"
        else:
            ident, name = _short(j["id"]), label(j)
        who = j["team"] + (f"/{j['user']}" if j.get("user") else "")    # squeue's USER
        t.add_row(str(j["rank"]) if j.get("rank") else "-", ident, name,
                  who, j["state"], f"{j['band']:g}" if j.get("band") is not None
                  else str(j["priority"]), _dur(j.get("elapsed_s")),
                  _dur(j.get("time_limit_s")) if j.get("time_limit_s") else "none",
                  _at(j.get("eta_at")), _dur(j.get("eta_s")) if j.get("eta_s") is not None
                  else "-", where + (f" ({notes})" if notes else ""))
    return t


def _notes(j: dict) -> str:
    notes = []
    if j.get("borrowed") and j["state"] in LIVE:
        notes.append("borrowed")
    if j.get("preemptions"):
        notes.append(f"preempted {j['preemptions']}x (last by "
                     f"{(j.get('preempted_by') or '-')[:8]})")
    if j.get("requeue_reason") and j["state"] == "pending":
        notes.append(f"requeued: {j['requeue_reason']}")
    return "; ".join(notes)


# -- prio (sprio) ---------------------------------------------------------------------------
def prio_table(d: dict) -> Table:
    w = d["weights"]
    t = Table(title=f"Pending jobs in scheduling order (mode {d['mode']}): band = priority + "
              f"class weight (strict), then score = fair share (weight {w['fairshare']:g}) + "
              f"size (weight {w['size']:g}) + age (weight {w['age']:g}/h)",
              title_justify="left")
    slack = any(j.get("slack_s") is not None for j in d["jobs"])    # a deadline job waits
    # a rule on_deadline: whether each deadline job's team may preempt for it (policy)
    rule = slack and d.get("on_deadline_rule")
    for col in ("#", "id", "name", "team/user", "priority", "class", "band", "fair share",
                "size", "age", "score", *(("slack",) if slack else ()),
                *(("may preempt",) if rule else ()), "protected"):
        t.add_column(col, justify="left" if col in ("id", "name", "team") else "right")
    for j in d["jobs"]:
        team = j["team"] + (f"/{j['user']}" if j.get("user") else "")
        first = ("yes" if j["protected"] else "preempting" if j.get("preempting")
                 else "deadline" if j.get("deadline_first") else "")
        t.add_row(str(j["rank"]), _short(j["id"]), j["name"], team, str(j["priority"]),
                  f"{j['class_weight']:+g}", f"{j['band']:g}", f"{j['fairshare']:.2f}",
                  f"{j['size']:.2f}", f"{j['age']:.2f}", f"{j['score']:.2f}",
                  *((_slack(j.get("slack_s")),) if slack else ()),
                  *((_yes(j.get("deadline_preempts")),) if rule else ()), first)
    if slack:
        t.caption = (f"slack: time left before a job must start for its pipeline's deadline; "
                     f"under deadline_slack ({format_duration(d.get('deadline_slack_s') or 0)})"
                     " a job goes ahead of its band's others (protected: deadline)")
    if rule:
        t.caption += ("\nmay preempt: whether the job's team may preempt for its deadline "
                      "under the rule on_deadline (the policy's deadline_preempts)")
    if d.get("not_queued"):
        t.caption = ((t.caption + "\n") if t.caption else "") + "not considered: " + ", ".join(
            f"{_short(j['id'])} {j['name']} ({j['code']})" for j in d["not_queued"])
    return t


def _yes(flag: bool | None) -> str:
    return "-" if flag is None else "yes" if flag else "no"


def _slack(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return format_duration(seconds) if seconds >= 0 else f"-{format_duration(-seconds)}"


# -- share (sshare) -------------------------------------------------------------------------
def share_table(teams: list[dict]) -> Table:
    t = Table(title="Fair share: usage decays with fairshare_half_life; factor = "
              "2^(-usage/share); points = fairshare_weight x factor; a team's users share "
              "its part (norm share)", title_justify="left")
    for col in ("team", "share", "norm share", "usage GPU-h", "norm usage", "factor",
                "points", "GPUs held", "quota", "borrowed", "lent", "pending", "live",
                "max jobs"):
        t.add_column(col, justify="left" if col == "team" else "right")
    for x in teams:
        quota = "-" if x.get("quota_gpus") is None else str(x["quota_gpus"])
        t.add_row(x["name"], f"{x['share']:g}", f"{x['share_norm']:.3f}",
                  f"{x['usage_gpu_hours']:.1f}", f"{x['usage_norm']:.3f}",
                  f"{x['fairshare_factor']:.3f}", f"{x['fairshare_points']:.2f}",
                  str(x.get("held_gpus", 0)), quota, str(x.get("borrowed_gpus", 0)),
                  str(x.get("lent_gpus", 0)), str(x.get("pending_jobs", 0)),
                  str(x.get("live_jobs", 0)), _most(x.get("max_submit_jobs")))
        for u in x.get("users", ()):     # the tree's second level (sshare -a)
            t.add_row(f"  {u['user'] or '(no user)'}", f"{u['share']:g}",
                      f"{u['share_norm']:.3f}", f"{u['usage_gpu_hours']:.1f}",
                      f"{u['usage_norm']:.3f}", f"{u['fairshare_factor']:.3f}",
                      f"{u['fairshare_points']:.2f}", "", "", "", "",
                      str(u["pending_jobs"]), str(u["live_jobs"]),
                      _most(u.get("max_submit_jobs")))
    t.caption = ("max jobs: the most jobs submitted and not ended (pending and live) the "
                 "team or user may have (policy max_submit_jobs, Slurm's MaxSubmitJobs; "
                 "-: no limit)")
    return t


def _most(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


# -- drain, resume (hold, release, update, requeue: changed_view.py) -----------------------
def host_lines(hosts: list[dict]) -> str:
    """A line per host drained or resumed."""
    return "\n".join(f"{h['name']}: drained" + (f" (reason: {h['drain_reason']})"
                                                if h.get("drain_reason") else "")
                     if h.get("drained") else f"{h['name']}: in service" for h in hosts)


# -- cluster (sinfo, qhost) ------------------------------------------------------------------
def _mem(n: int) -> str:
    return format_size(n) if n else "0"


def cluster_table(c: dict) -> Table:
    t = Table(title=f"Cluster {c['cluster']}: {c['gpus_allocated']} of {c['gpus_total']} "
              f"GPUs allocated, {c.get('gpus_free', 0)} free, "
              f"{c.get('gpus_unavailable', 0)} unavailable (drained, unreachable or "
              "unhealthy)", title_justify="left")
    if c.get("mig_devices"):
        t.title += (f"; MIG devices: {c['mig_devices_held']} of {c['mig_devices']} held "
                    f"({c['mig_gpus_held']:g} GPUs by share)")
    mig = any(h.get("mig_devices") for h in c["hosts"])
    for col in ("host", "model", "state", "GPUs", "free", "cores", "memory",
                "per NUMA node", "GPU map", "jobs", *(("MIG devices",) if mig else ()),
                "util % (per GPU)", "power"):
        t.add_column(col, overflow="fold")
    for h in c["hosts"]:
        gmap = "".join(_gpu_mark(g) for g in h["gpus"])
        held: dict[str, list[str]] = {}
        for g in h["gpus"]:
            if g["job"]:
                held.setdefault(g["job"], []).append("GPU")
            for m in g.get("mig", ()):
                if m["job"]:
                    held.setdefault(m["job"], []).append(m["profile"])
        util = [g.get("utilization_gpu") for g in h["gpus"]]
        watts = [g["power_watts"] for g in h["gpus"] if g.get("power_watts") is not None]
        if not h.get("reachable", True):
            state = "unreachable"
        elif h["drained"]:
            state = "drained" + (f": {h['drain_reason']}" if h.get("drain_reason") else "")
        else:
            state = "ok"
        state += "".join(f"\nquarantined {q['table']} {q.get('gpu', q.get('cpu'))}: "
                         f"{q['reason']}" for q in h.get("quarantined", ()))
        state += "".join(f"\n{_reserved(r)}" for r in h.get("reservations", ()))
        numa = "\n".join(
            f"{n['node']}: {n['gpus_allocated']}/{len(n['gpus'])} GPU "
            f"{n['cpus_allocated']}/{n['cpus_total']} CPU "
            f"{_mem(n['memory_allocated'])}/{_mem(n['memory_total'])}"
            for n in h.get("numa", []) if n["gpus"] or n["cpus_allocated"]
            or n["memory_allocated"])
        t.add_row(h["name"], h["model"], state,
                  f"{h.get('gpus_allocated', 0)}/{len(h['gpus'])}", str(h["free_gpus"]),
                  f"{h.get('cpus_allocated', 0)}/{h.get('cpus_total', 0)}",
                  f"{_mem(h.get('memory_allocated', 0))}/{_mem(h.get('memory_total', 0))}",
                  numa or "-", gmap,
                  "\n".join(f"{_short(j)} ({_held(n)})" for j, n in held.items()) or "-",
                  *((_mig_cell(h),) if mig else ()),
                  " ".join("-" if u is None else f"{u:.0f}" for u in util)
                  if any(u is not None for u in util) else "-",
                  f"{sum(watts):.0f} W" if watts else "-")
    t.caption = ("GPUs and cores: allocated/total (a MIG GPU with a device held counts); "
                 "GPU map: # held, . free, x unhealthy, q quarantined (airflow-gpu db "
                 "check), M MIG GPU with every device held, "
                 "m MIG GPU with free devices; jobs: short id (GPUs or MIG devices held)")
    return t


def _reserved(r: dict) -> str:
    """A host's reservation now or next: `reserved: fw (maint) until 12-24 08:00`."""
    what = "maint" if r["maint"] else ",".join(r["teams"])
    if r["state"] == "active":
        return f"reserved: {r['name']} ({what}) until {_at(r['end'])}"
    return f"next: {r['name']} ({what}) {_at(r['start'])}-{_at(r['end'])}"


def _gpu_mark(g: dict) -> str:
    if not g["healthy"]:
        return "x"
    if g.get("quarantined"):
        return "q"
    if g.get("mig_mode"):
        return "M" if all(m["job"] for m in g["mig"]) else "m"
    return "#" if g["job"] else "."


def _held(what: list[str]) -> str:
    """`2` GPUs, or the MIG devices by profile: `2x 3g.40gb`."""
    gpus = what.count("GPU")
    out = [str(gpus)] if gpus else []
    for p in dict.fromkeys(w for w in what if w != "GPU"):
        out.append(f"{what.count(p)}x {p}")
    return ", ".join(out)


def _mig_cell(h: dict) -> str:
    """Per GPU in MIG mode: each device's holder (short id) or `free`, and the compute
    slices of its free devices."""
    lines = []
    for g in h["gpus"]:
        if not g.get("mig_mode"):
            continue
        runs: list[list] = []             # [count, profile, holder], like devices together
        for m in g["mig"]:
            who = _short(m["job"]) if m["job"] else "free"
            if runs and runs[-1][1:] == [m["profile"], who]:
                runs[-1][0] += 1
            else:
                runs.append([1, m["profile"], who])
        devs = ", ".join(f"{f'{n}x ' if n > 1 else ''}{p} {who}" for n, p, who in runs)
        lines.append(f"GPU {g['index']}: {devs} ({g.get('mig_free_slices', 0)}/7 free)")
    return "\n".join(lines) or "-"


# -- the parsers ------------------------------------------------------------------------------
JOB_HELP = ("job id, unique id prefix (4+ characters), job name or array (hold, release, "
            "update: each element; NAME_3: one)")
# the API's job states (slurmroutes.States), here so that a typo fails before a request
STATES = ("pending", "admitted", "running", "preempting", "succeeded", "failed",
          "cancelled", "lost", "timeout")


def check_queue(args: argparse.Namespace) -> None:
    if args.state is not None and args.state not in STATES:
        raise InputError(f"--state: {args.state!r} is no job state; use one of "
                         f"{', '.join(STATES)}")


def check_update(args: argparse.Namespace) -> None:
    if args.priority is None and args.time_limit is None and args.max_running is None:
        raise InputError(f"update {args.id}: nothing to change; give --priority N, "
                         "--time-limit DURATION (e.g. 2h) and/or --max-running N (an array)")
    if args.max_running is not None and args.max_running < 0:
        raise InputError(f"--max-running: {args.max_running} is below 0; give the most "
                         "elements running at once (0: no limit)")


def checked(check, run):
    """Run `check(args)` (InputError: exit 2) before the command makes any request."""
    def go(args: argparse.Namespace) -> int:
        check(args)
        return run(args)
    return go


def add_commands(sub, client: argparse.ArgumentParser) -> None:
    """Register the commands; `client`: the client commands' parent parser; `show(call,
    table)` runs a client call and prints its answer (common.py)."""
    def add(name: str, func, helptext: str, *args: tuple) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=helptext, description=helptext, parents=[client])
        for flags, kw in args:
            p.add_argument(*flags, **kw)
        p.set_defaults(func=func)
        return p

    job = (("id",), {"help": JOB_HELP})
    add("queue", checked(check_queue, show(lambda c, a: c.queue(a.all, a.state, a.team,
                                                                a.limit, a.user),
                                           queue_table)),
        "pending and live jobs in the scheduler's order, with reason, ETA, elapsed and "
        "time limit (squeue, qstat)",
        (("--all",), {"action": "store_true", "help": "ended jobs too (newest first)"}),
        (("--state",), {"help": f"only jobs in this state: {', '.join(STATES)}"}),
        (("--team",), {"help": "only this team's jobs"}),
        (("--user", "-u"), {"help": "only this user's jobs (squeue -u)"}),
        (("--limit",), {"type": int, "help": "at most this many jobs (default 1000)"}))
    add("prio", show(lambda c, a: c.priorities(a.team, a.user), prio_table),
        "pending jobs' priority factors as the scheduler computes them (sprio)",
        (("--team",), {"help": "only this team's jobs"}),
        (("--user", "-u"), {"help": "only this user's jobs"}))
    add("share", show(lambda c, a: c.shares(), share_table),
        "teams' shares, decayed usage, fair-share factor and quota use (sshare)")
    add("hold", changed_run(lambda c, a: c.hold_jobs([a.id]), "held"),
        "keep a pending job (an array: each pending element) from starting until "
        "released (scontrol hold, qhold)", job)
    add("release", changed_run(lambda c, a: c.release_jobs([a.id]), "released"),
        "release a held job or an array's held elements (scontrol release, qrls); an "
        "admin's hold only by an admin", job)
    add("requeue", show(lambda c, a: c.requeue(a.id), job_line),
        "stop a running job and put it back in the queue under the same id (scontrol "
        "requeue)", job)
    add("update", checked(check_update, changed_run(
        lambda c, a: c.update_jobs([a.id], a.priority, a.time_limit, a.max_running),
        "updated")),
        "change a pending job's priority or a job's time limit, an array's for each "
        "element, or an array's max_running (scontrol update, qalter)",
        job, (("--priority",), {"type": int, "help": "new priority (pending jobs)"}),
        (("--time-limit",), {"help": "new time limit, e.g. 2h (within the job class's and "
                             "the policy's maximum; raising a running job's: admins)"}),
        (("--max-running",), {"type": int, "help": "an array's most elements admitted or "
                              "running at once (Slurm's ArrayTaskThrottle; 0: no limit)"}))
    add("drain", show(lambda c, a: c.drain_hosts(a.host, True, a.reason), host_lines),
        "keep new work off hosts, saying why (admin; scontrol update State=DRAIN): names "
        "or ranges, dgx-a-[01-04],dgx-h-05, all or none",
        (("host",), {"metavar": "HOSTS"}),
        (("--reason",), {"help": "why: shown in `cluster` and in pending reasons that name "
                         "the host"}))
    add("resume", show(lambda c, a: c.drain_hosts(a.host, False), host_lines),
        "put drained hosts back in service (admin; scontrol update State=RESUME): names "
        "or ranges, dgx-a-[01-04],dgx-h-05, all or none", (("host",), {"metavar": "HOSTS"}))
    add("cluster", show(lambda c, a: c.cluster(), cluster_table),
        "hosts: GPUs, cores and memory allocated per host and NUMA node, drain state and "
        "reason (sinfo, qhost)")
