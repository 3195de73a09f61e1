"""The job commands on the API: `submit`, `status`, `explain` (with the job's webhook
notifications), `slowdown`, `teams`, `team-set` (shares, quotas, the webhook and its
secret) and `notifications` (the undelivered ones) that share their registration
(`cancel`: cancel_command.py)."""

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
from ..common import api_client, output, refuse_jobs, show


def cmd_submit(args: argparse.Namespace) -> int:
    """Check the whole file as `plan` does (exit 2, nothing sent), then submit all of its
    jobs or none in one request (several jobs: POST /api/v1/jobs/batch), each as the
    service stores it (jobfile.py: JSON, only the fields the file gives). `--array` and
    `--dependency` apply to a one-job file."""
    from ...scheduler_core.client import ApiError
    from ...scheduler_core.jobclasses import resolve
    from ...scheduler_core.jobfile import read_jobs, wire
    from ...scheduler_core.plugins import default_registry

    jobs = read_jobs(args.file)          # the same checks and messages as `plan`
    classes = default_registry().job_classes
    refused = []
    for i, job in enumerate(jobs):
        try:
            resolve(job, classes)
        except InputError as exc:
            refused.append((i, job.name, str(exc).removeprefix(f"job {job.name!r}: ")))
    if refused:                          # nothing is sent
        return refuse_jobs(args.file, refused)
    specs = [wire(job) for job in jobs]
    if args.key and len(specs) > 1:
        raise InputError("--key: an idempotency key names one job; the file holds "
                         f"{len(specs)}", args.file)
    if args.array is not None or args.dependency is not None:
        specs = [_job_flags(specs[0], args, len(specs))]
    import uuid

    # One idempotency key per job of the file (--key for a single job): the client
    # retries a submit that got no answer with the same keys, so none is created twice.
    keys = [args.key] if args.key else [str(uuid.uuid4()) for _ in specs]
    with api_client(args) as c:
        try:
            jobs_out = [c.submit(specs[0], keys[0])] if len(specs) == 1 else \
                c.submit_batch(specs, keys)
        except ApiError as exc:
            raise _refused(exc, args, len(specs)) from None
    if args.json:
        print(json.dumps(jobs_out[0] if len(jobs_out) == 1 else jobs_out, indent=2,
                         default=str))
    else:
        for j in jobs_out:
            print(j.get("array_id") or j["id"])      # an array: its id names every element
    return 0


FLAGS = {"array": "--array", "depends_on": "--dependency"}    # fields the flags set


def _job_flags(spec: dict, args: argparse.Namespace, jobs: int) -> dict:
    """The one job of the file with --array and --dependency as its fields, checked as
    the file's fields are (exit 2, naming the flag and the field)."""
    from pydantic import ValidationError

    from ...scheduler_core.fielderrors import field_message
    from ...scheduler_core.jobfile import wire
    from ...scheduler_core.jobspec import JobSpec
    from ...scheduler_core.newspecs import submitting

    given = {k: v for k, v in (("array", args.array), ("depends_on", args.dependency))
             if v is not None}
    if jobs != 1:
        key = next(iter(given))
        raise InputError(f"{FLAGS[key]}: it applies to a file of one job, and this one holds "
                         f"{jobs}; give each job its own `{key}:` instead", args.file)
    try:
        with submitting():            # a new spec, as the file's jobs were read
            return wire(JobSpec.model_validate({**spec, **given}))
    except ValidationError as exc:
        for err in exc.errors():
            key = str(err["loc"][0]) if err["loc"] else ""
            if key in given:
                where = ".".join(map(str, err["loc"]))
                raise InputError(f"{FLAGS[key]} {given[key]!r}: {where}: "
                                 f"{field_message(err)}") from None
        raise


def _refused(exc, args: argparse.Namespace, jobs: int) -> Exception:
    """The service's refusal: a dependency it cannot resolve is bad input (exit 2, as a
    mistake in the file is); any other refusal of a batch names it refused whole."""
    from ...scheduler_core.client import ApiError

    text = _text(exc.detail)
    if exc.status == 422 and "depends_on" in text:
        flagged = f"--dependency: {text}" if args.dependency else text
        return InputError(flagged + ("" if jobs == 1 else f"; none of the {jobs} jobs was "
                                     "submitted"), args.file)
    if jobs > 1 and 400 <= exc.status < 500:     # the batch is refused whole
        return ApiError(exc.status, f"{text}; none of the {jobs} jobs of {args.file} was "
                        "submitted")
    return exc


def _text(detail: Any) -> str:
    from ...scheduler_core.client import _detail_text

    return _detail_text(detail)


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
    from .status_view import due_line  # its pipeline's deadline and slack

    lines += [x for x in (due_line(e),) if x]
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
        text += (f"; backfilled ahead of the reservation of job {e['limit_cut_by'][:8]}: "
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
            p.add_argument("--array", metavar="RANGE", help="one job per index, as sbatch "
                           "--array: 0-99%%8 (at most 8 admitted or running at once), "
                           "1-7:2, 0,4,9-12; a file of one job. Prints the array's id")
            p.add_argument("--dependency", metavar="COND", help="start only once these "
                           "hold, as sbatch --dependency: afterok:JOB[:JOB...], afterany:, "
                           "afternotok:, several joined by commas; a file of one job")
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
