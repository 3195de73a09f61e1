"""Teams: the admins' fair-share weights, GPU quotas and borrowing, webhooks (notify.py),
and each team's GPUs held, borrowed and lent now. The policy in force merges the shares
and quotas into the policy file (Store._policy)."""

from __future__ import annotations

from pydantic import ValidationError
from sqlalchemy import func, select

from ..errors import InputError, describe_validation_error
from ..policy.config import TeamPolicy
from ..policy.quota import lending, plain
from ..store.models import GpuHoldRow, JobRow, TeamRow
from ..webhookurl import redact
from .common import Principal
from .errors import Forbidden
from .notify import set_webhook, webhook_view, webhooks
from .uow import Store


def set_team(svc: Store, name: str, who: Principal, share: float | None,
             quota_gpus: int | None, borrow_gpus: int | None = None,
             webhook: dict | None = None, shares: bool = True) -> dict:
    """Admins set a team's fair-share weight, GPU quota (None: no quota) and how many
    GPUs beyond it the team may borrow (None: the policy file's), unless `shares` is
    False (they stay); and its webhook: the keys of `webhook` that are given (`url`,
    `events`, `secret`: "new"), notify.set_webhook. The answer holds a new secret once."""
    if not who.admin:
        raise Forbidden("only admins change team shares, quotas and webhooks")
    try:     # the API checks too; this guards every other caller
        TeamPolicy(share=1.0 if share is None else share, quota_gpus=quota_gpus,
                   borrow_gpus=borrow_gpus or 0)
    except ValidationError as exc:
        raise InputError(describe_validation_error(exc, TeamPolicy)) from None
    said = []
    with svc.sessions.begin() as s:
        if shares:
            row = s.get(TeamRow, name) or TeamRow(name=name)
            row.share, row.quota_gpus, row.borrow_gpus = share, quota_gpus, borrow_gpus
            s.add(row)
            said.append(f"share {share}, quota_gpus {quota_gpus}" + (
                "" if borrow_gpus is None else f", borrow_gpus {borrow_gpus}"))
        secret = None
        if webhook:
            hook, secret = set_webhook(svc, s, name, webhook)
            said.append(f"webhook {redact(hook.url) if hook.url else 'none'}" + (
                f" ({', '.join(hook.events)})" if hook.events else "")
                + ("; its webhook secret was rotated" if secret else ""))
        svc._event(s, "team", f"team {name}: " + "; ".join(said or ["unchanged"]))
    svc._policy_cache = None
    svc.wake.set()
    out = teams(svc)[name]
    return {**out, "webhook_secret": secret} if secret else out


def teams(svc: Store) -> dict[str, dict]:
    """Every team with a policy, a job or a quota: share, quota and GPUs held now (those
    its jobs hold inside admins' reservations apart: they count against no quota)."""
    policy = svc._policy()
    held, inside = {}, {}
    with svc.reads() as s:
        for team, reserved, n in s.execute(
                select(JobRow.team, JobRow.reservation.is_not(None), func.count(GpuHoldRow.gpu))
                .join(GpuHoldRow, GpuHoldRow.job_id == JobRow.id)
                .group_by(JobRow.team, JobRow.reservation.is_not(None))):
            into = inside if reserved else held
            into[team] = into.get(team, 0) + n
        names = set(s.scalars(select(JobRow.team).distinct()))
        from .clusterview import mig_shares

        for reserved in (False, True):                            # MIG: by share
            into = inside if reserved else held
            for team, share in mig_shares(svc.cluster, s, reserved).items():
                into[team] = into.get(team, 0) + share
    hooks = webhooks(svc)
    names |= set(policy.teams) | set(hooks)
    lent = lending(policy, held, svc.cluster.total_gpus)
    return {t: {"name": t, "share": policy.share(t), "quota_gpus": policy.quota(t),
                "borrow_gpus": policy.teams[t].borrow_gpus if t in policy.teams else None,
                "held_gpus": plain(held.get(t, 0)),
                "borrowed_gpus": lent.get(t, (0, 0))[0],
                "lent_gpus": lent.get(t, (0, 0))[1],
                "reservation_gpus": plain(inside.get(t, 0)), "error": svc.policy_errors.get(t),
                **webhook_view(hooks.get(t))}
            for t in sorted(names)}
