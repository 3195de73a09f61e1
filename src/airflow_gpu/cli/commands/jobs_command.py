"""The job commands on the API: `submit`, `status`, `explain` (with the job's webhook
notifications), `cancel`, `slowdown`, and `resume` (a drained host), `teams`, `team-set`
(shares, quotas, the webhook and its secret) and `notifications` (the undelivered ones)
that share their registration."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Group
from rich.table import Table

from ...scheduler_core.client import delivery_state
from ...scheduler_core.errors import InputError
from ...scheduler_core.jobspec import NOTIFY_EVENTS
from ...scheduler_core.units import format_duration
from ..common import api_client, output, show


def cmd_submit(args: argparse.Namespace) -> int:
    """Check the whole file as `plan` does (exit 2, nothing sent), then submit all of its
    jobs or none in one request (several jobs: POST /api/v1/jobs/batch)."""
    from ...scheduler_core.client import ApiError
    from ...scheduler_core.errors import load_yaml
    from ...scheduler_core.jobclasses import resolve
    from ...scheduler_core.jobspec import load_jobs
    from ...scheduler_core.plugins import default_registry

    jobs = load_jobs(args.file)          # the same checks and messages as `plan`
    reg = default_registry()
    for job in jobs:
        resolve(job, reg.job_classes, args.file)
    data = load_yaml(args.file)          # sent as written: unset fields stay unset
    specs = data["jobs"] if isinstance(data, dict) and "jobs" in data else [data]
    if args.key and len(specs) > 1:
        raise InputError("--key: an idempotency key names one job; the file holds "
                         f"{len(specs)}", args.file)
    import uuid

    # One idempotency key per job of the file (--key for a single job): the client
    # retries a submit that got no answer with the same keys, so none is created twice.
    keys = [args.key] if args.key else [str(uuid.uuid4()) for _ in specs]
    with api_client(args) as c:
        if len(specs) == 1:
            jobs_out = [c.submit(specs[0], keys[0])]
        else:
            try:
                jobs_out = c.submit_batch(specs, keys)
            except ApiError as exc:
                if 400 <= exc.status < 500:     # the batch is refused whole
                    raise ApiError(exc.status, f"{_text(exc.detail)}; none of the "
                                   f"{len(specs)} jobs of {args.file} was submitted") from None
                raise
    if args.json:
        print(json.dumps(jobs_out[0] if len(jobs_out) == 1 else jobs_out, indent=2,
                         default=str))
    else:
        for j in jobs_out:
            print(j["id"])
    return 0


def _text(detail: Any) -> str:
    from ...scheduler_core.client import _detail_text

    return _detail_text(detail)


def _host_line(h: dict) -> str:
    return f"{h['name']}: {'drained' if h['drained'] else 'in service'}"


# -- tables ------------------------------------------------------------------------------
def _teams_table(teams: list[dict]) -> Table:
    t = Table(title="Teams", title_justify="left")
    errors = any(x.get("error") for x in teams)    # a stored setting the service refuses
    hooks = any(x.get("webhook_url") or x.get("webhook_secret_hint") for x in teams)
    for col in ("team", "share", "quota GPUs", "may borrow", "GPUs held", "borrowed",
                "lent") + (("webhook", "secret") if hooks else ()) + (
                    ("error",) if errors else ()):
        t.add_column(col, overflow="fold")
    for x in teams:
        quota = "-" if x["quota_gpus"] is None else str(x["quota_gpus"])
        borrow = ("-" if x["quota_gpus"] is None else "no limit"
                  if x.get("borrow_gpus") is None else str(x["borrow_gpus"]))
        t.add_row(x["name"], f"{x['share']:g}", quota, borrow, str(x["held_gpus"]),
                  str(x.get("borrowed_gpus", 0)), str(x.get("lent_gpus", 0)),
                  *((_webhook(x), x.get("webhook_secret_hint") or "-") if hooks else ()),
                  *((x.get("error") or "-",) if errors else ()))
    return t


def _webhook(x: dict) -> str:
    if not x.get("webhook_url"):
        return "-"
    return f"{x['webhook_url']} ({', '.join(x.get('webhook_events') or ())})"


def _job_table(j: dict):
    from .status_view import job_table  # its placement now and its earlier admissions

    return job_table(j)


def _explain_table(e: dict) -> Table:
    t = Table(title=f"Job {e['id']}: {e['state']}" + (
        f" - {e['code']}: {e['reason']}" if e.get("code") else ""), title_justify="left")
    t.add_column("at")
    t.add_column("event")
    t.add_column("message", overflow="fold")
    for ev in e["events"]:
        t.add_row(str(ev["at"]), ev["kind"], ev["message"])
    lines = []
    if e.get("eta_seconds") is not None:
        lines.append(f"ETA {format_duration(e['eta_seconds'])}")
    elif e.get("elapsed_s") is not None:
        lines.append(elapsed_line(e))
    if e.get("preemptions"):
        lines.append(f"preempted {e['preemptions']} time(s); last: {e['preempt_reason']}")
    t.caption = "\n".join(lines) or None
    if e.get("notifications"):
        return Group(t, notifications_table(e["notifications"], "Notifications"))
    return t


def notifications_table(rows: list[dict], title: str, jobs: bool = False) -> Table:
    t = Table(title=title, title_justify="left")
    for col in ("at", *(("job",) if jobs else ()), "event", "for", "url", "asked by",
                "delivery"):
        t.add_column(col, overflow="fold")
    for n in rows:
        t.add_row(str(n["created_at"]), *((n["job_id"] or "-",) if jobs else ()),
                  n["event"] or "-", n["kind"], n["url"], n["source"], delivery_state(n))
    return t


def _team_set(c, a: argparse.Namespace) -> list[dict]:
    """team-set: the shares unless only webhook options are given; the webhook options
    given (a URL of `none` removes it)."""
    webhook = {}
    if a.webhook is not None:
        webhook["url"] = None if a.webhook == "none" else a.webhook
    if a.webhook_events is not None:
        webhook["events"] = [e.strip() for e in a.webhook_events.split(",") if e.strip()]
    if a.webhook_secret is not None:
        webhook["secret"] = a.webhook_secret
    shares = not webhook or any(v is not None for v in (a.share, a.quota_gpus,
                                                         a.borrow_gpus))
    return [c.set_team(a.name, a.share, a.quota_gpus, a.borrow_gpus, webhook, shares)]


def cmd_team_set(args: argparse.Namespace) -> int:
    """As `token create` prints a token: a new webhook secret alone (shown this once),
    else the teams table."""
    with api_client(args) as c:
        teams = _team_set(c, args)
    secret = teams[0].get("webhook_secret")
    if secret and not args.json:
        print(secret)
        return 0
    output(args, teams, _teams_table)
    return 0


def elapsed_line(e: dict) -> str:
    """"ran 1h02m of its 2h time limit", as squeue's TIME and TIME_LIMIT columns."""
    limit = e.get("time_limit_s")
    verb = "running for" if e["state"] in ("admitted", "running", "preempting") else "ran"
    text = f"{verb} {format_duration(e['elapsed_s'])}"
    text += (" (no time limit)" if limit is None else
             f" of its {format_duration(limit)} time limit")
    if e.get("limit_cut_by"):
        text += (f"; backfilled ahead of the reservation of job {e['limit_cut_by']}: "
                 "stopped and requeued if still running when it starts")
    return text


def _slowdown_table(d: dict) -> Table:
    t = Table(title="Locality slowdown the scheduler plans with (runtime factor by "
              "placement)", title_justify="left")
    for col in ("job class", *d["tiers"], "samples"):
        t.add_column(col, justify="left" if col == "job class" else "right")
    t.add_row("(policy)", *(f"{f:g}" for f in d["default"]), "-")
    for c in d["classes"]:
        t.add_row(c["job_class"] or "(none)", *(f"{x['factor']:.3g}" for x in c["tiers"]),
                  " / ".join(str(x["samples"]) for x in c["tiers"]))
    t.caption = ("learned from jobs that ran to their end" if d["learn"] else
                 "learning is off (learn_slowdown: false)")
    e = Table(title="Estimate factors (planned runtime = the job's runtime x factor)",
              title_justify="left")
    for col in ("team", "runtime from", "samples", "factor"):
        e.add_column(col, justify="left" if col in ("team", "runtime from") else "right")
    for x in d.get("estimates", []):
        e.add_row(x["team"], "time_limit" if x["source"] == "limit" else "expected_runtime",
                  str(x["samples"]), f"{x['factor']:g}")
    mode = d.get("correct_estimates", "off")
    e.caption = ("correction is off (correct_estimates: off)" if mode == "off" else
                 f"correct_estimates: {mode}, the {d['estimate_quantile']:g} quantile of each "
                 "team's ratios of actual to given runtime" + (
                     "" if e.row_count else "; no job has run to its end on one host yet"))
    return Group(t, e)


# -- the parsers ---------------------------------------------------------------------------
def add_commands(sub, client: argparse.ArgumentParser) -> None:
    """The commands; `client`: the client commands' parent parser (cli_config.py)."""
    for name, func, helptext, extra in (
            ("submit", cmd_submit, "submit a job file; prints the job id", ("file",)),
            ("status", show(lambda c, a: c.job(a.id), _job_table),
             "one job: state and placement", ("id",)),
            ("explain", show(lambda c, a: c.explain(a.id), _explain_table),
             "why a job waits, its ETA and its events", ("id",)),
            ("cancel", show(lambda c, a: c.cancel(a.id), _job_table),
             "cancel a job (releases its resources)", ("id",)),
            ("resume", show(lambda c, a: c.drain(a.host, False), _host_line),
             "put a drained host back in service (admin)", ("host",)),
            ("slowdown", show(lambda c, a: c.slowdown(), _slowdown_table),
             "the locality slowdown per job class, as learned from ended jobs", ()),
            ("teams", show(lambda c, a: c.teams(), _teams_table),
             "teams: share, GPU quota, GPUs held", ()),
            ("team-set", cmd_team_set, "set a team's share, GPU quota and borrowing limit, "
             "and its webhook (admin)", ("name",)),
            ("notifications", show(lambda c, a: c.undelivered(a.state),
                                   lambda rows: notifications_table(
                                       rows, "Undelivered notifications", jobs=True)),
             "webhook notifications not delivered: pending, retrying, given up (admin)",
             ())):
        p = sub.add_parser(name, help=helptext, parents=[client])
        for arg in extra:
            p.add_argument(arg)
        if name == "submit":
            p.add_argument("--key", help="idempotency key: submitting again returns the same job")
        if name == "team-set":
            p.add_argument("--share", type=float, help="fair-share weight, 0.001 to "
                           "1000000 (omit: the policy file's)")
            p.add_argument("--quota-gpus", type=int,
                           help="GPUs guaranteed to the team, 0 to 1000000 (omit: no "
                           "quota)")
            p.add_argument("--borrow-gpus", type=int,
                           help="GPUs it may hold beyond its quota while other teams leave "
                           "them idle, 0 (a hard quota) to 1000000 (omit: the policy file's)")
            p.add_argument("--webhook", metavar="URL", help="notify every job's events of "
                           "the team to this URL (one the policy's "
                           "notifications.allowed_urls allows); none: remove it. Webhook "
                           "options alone leave the shares as they are")
            p.add_argument("--webhook-events", metavar="EVENTS", help="comma-separated: "
                           + ", ".join(NOTIFY_EVENTS) + " (default end,failure)")
            p.add_argument("--webhook-secret", choices=("new",), help="new: create or "
                           "rotate the secret notifications are signed with; printed this "
                           "once")
        if name == "notifications":
            p.add_argument("--state", choices=("pending", "given_up"),
                           help="only these (default both)")
        p.set_defaults(func=func)
