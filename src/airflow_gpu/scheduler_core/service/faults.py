"""Jobs on a GPU that turned unhealthy. Each is flagged (the job's `gpu_fault`, and an
event) and then, by its job class's `on_gpu_failure` policy:

- requeue: the whole gang goes back to `pending` with the same job id; its allocations
  stop being live and its GPU and CPU holds are released in the same transaction, so the
  launcher's next heartbeat answers 409 "... is pending" and it stops its replicas;
- cancel: the job ends as `cancelled`, its resources are released;
- keep: it runs on; only the flag and the event tell.

A job is handled once per admission: a requeued job that is admitted again is handled
again if a GPU fails under it again."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import or_, select, tuple_
from sqlalchemy.orm import Session

from ..store.models import GpuHoldRow, GpuRow, JobRow
from .common import CHUNK, LIVE, _update, requeued
from .uow import Store

DEFAULT_POLICY = "requeue"


def _policy(svc: Store, spec: dict) -> str:
    jc = svc.reg.job_classes.get(spec.get("job_class") or "")
    return jc.on_gpu_failure if jc is not None else DEFAULT_POLICY


def handle_gpu_faults(svc: Store, s: Session, now: datetime,
                      host: str | None = None) -> list[str]:
    """Act on live jobs that hold an unhealthy GPU (on `host`, or anywhere) and were not
    handled since their admission; returns the ids of the jobs acted on."""
    # the unhealthy GPUs first (few; most passes none), then the live jobs holding them:
    # never a join of every hold with every live job, which the planner may choose when
    # its statistics lag the lease writes
    bad = select(GpuRow.host, GpuRow.index, GpuRow.health_reason).where(
        GpuRow.healthy.is_(False))
    why = {(h, i): r for h, i, r in s.execute(
        bad if host is None else bad.where(GpuRow.host == host))}
    hits: dict[str, list[str]] = {}
    specs: dict[str, dict] = {}      # columns, not rows: the session must not keep a stale job
    keys = sorted(why)
    for k in range(0, len(keys), CHUNK):
        for job_id, h, gpu, spec in s.execute(
                select(GpuHoldRow.job_id, GpuHoldRow.host, GpuHoldRow.gpu, JobRow.spec)
                .join(JobRow, JobRow.id == GpuHoldRow.job_id)
                .where(GpuHoldRow.host.in_({h for h, _ in keys[k:k + CHUNK]}),
                       tuple_(GpuHoldRow.host, GpuHoldRow.gpu).in_(keys[k:k + CHUNK]),
                       JobRow.state.in_(LIVE), or_(JobRow.gpu_fault_at.is_(None),
                                                   JobRow.gpu_fault_at < JobRow.admitted_at))
                .order_by(GpuHoldRow.job_id, GpuHoldRow.host, GpuHoldRow.gpu)):
            reason = why[(h, gpu)]
            hits.setdefault(job_id, []).append(f"{h}:{gpu}" + (f" ({reason})" if reason else ""))
            specs[job_id] = spec
    for job_id, gpus in sorted(hits.items()):
        policy = _policy(svc, specs[job_id])
        fault = f"GPU {', '.join(gpus)} unhealthy"
        if policy == "requeue":
            done = s.execute(_update(JobRow).where(JobRow.id == job_id, JobRow.state.in_(LIVE))
                             .values(**requeued("gpu_fault", gpu_fault=fault,
                                                gpu_fault_at=now)))
            message = (f"requeued: {fault}; the whole job goes back to the queue with the same "
                       "id (job class policy on_gpu_failure: requeue)")
        elif policy == "cancel":
            done = s.execute(_update(JobRow).where(JobRow.id == job_id, JobRow.state.in_(LIVE))
                             .values(state="cancelled", finished_at=now, outcome="cancelled",
                                     lease_expires_at=None, gpu_fault=fault, gpu_fault_at=now))
            message = f"cancelled: {fault} (job class policy on_gpu_failure: cancel)"
        else:
            done = s.execute(_update(JobRow).where(JobRow.id == job_id, JobRow.state.in_(LIVE))
                             .values(gpu_fault=fault, gpu_fault_at=now))
            message = f"{fault}; the job keeps running (job class policy on_gpu_failure: keep)"
        if done.rowcount != 1:
            continue
        if policy != "keep":
            svc._release(s, job_id)
        kind = {"requeue": "requeued", "cancel": "cancelled"}.get(policy, "gpu_fault")
        svc._event(s, kind, message, job=job_id)
    return list(hits)
