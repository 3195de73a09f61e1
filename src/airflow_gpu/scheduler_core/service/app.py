"""The REST API (FastAPI). Routes stay thin: the work is in `core.Service`."""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime
from typing import Annotated, Literal

from fastapi import Depends, FastAPI, Header, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi_offline import FastAPIOffline
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy.exc import DataError, DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from ..errors import InputError
from ..store.budget import fit_threads
from . import acct, health, probes, readlimit
from .auth import AgentPrincipal, TokenExpired, principal_for
from .bodies import MAX_BODY, BodyLimit, DecodedOffLoop, invalid, safe
from .core import LIVE, Conflict, Forbidden, NotFound, Principal, Service, utcnow
from .loop import SchedulerLoop
from .metrics import Metrics
from .schemas import (
    DrainRequest,
    ExplainOut,
    FinishRequest,
    GpuOut,
    HostOut,
    HostRegistration,
    HostReport,
    JobOut,
    SubmitRequest,
    TeamOut,
    TeamRequest,
)

NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"       # team names, as in the job spec
States = Literal["pending", "admitted", "running", "preempting", "succeeded", "failed",
                 "cancelled", "lost", "timeout"]


def _aware(at: datetime | None) -> datetime | None:
    """A time without a zone is UTC (what the API writes)."""
    return at.replace(tzinfo=UTC) if at is not None and at.tzinfo is None else at


def app_from_env() -> FastAPI:
    """The app as `airflow-gpu server` starts it in each worker process."""
    import os

    from ..engine.cluster import load_cluster
    from ..policy.config import PolicyConfig, load_policy
    from .core import Settings

    env = os.environ
    _log_to_stderr(env.get("AIRFLOW_GPU_LOG_LEVEL") or "info")
    policy_file = env.get("AIRFLOW_GPU_POLICY_FILE")
    settings = Settings(env["AIRFLOW_GPU_DB"], load_cluster(env["AIRFLOW_GPU_CLUSTER"]),
                        load_policy(policy_file) if policy_file else PolicyConfig(),
                        float(env.get("AIRFLOW_GPU_LEASE_TTL", 60)),
                        float(env.get("AIRFLOW_GPU_INTERVAL", 2)),
                        host_timeout=float(env.get("AIRFLOW_GPU_HOST_TIMEOUT") or 60),
                        deployment=env.get("AIRFLOW_GPU_DEPLOYMENT") or None)
    protect = probes.protect_mode(env.get(probes.ENV), probes.ENV)
    return create_app(Service(settings), protect=protect)


def _log_to_stderr(level: str) -> None:
    """The service's own log (who schedules, who holds the lock, passes that fail or have
    stopped) on stderr at the server's --log-level; uvicorn configures only its own."""
    import logging

    logger = logging.getLogger("airflow_gpu")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: "
                                               "%(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    level = level.upper()
    logger.setLevel("DEBUG" if level == "TRACE" else level)    # uvicorn's "trace" too


def create_app(service: Service, run_loop: bool = True, protect: str = "none") -> FastAPI:
    """The API on `service`; `protect`: who may read /metrics and /healthz (probes.py)."""
    metrics = Metrics(service)
    loop = SchedulerLoop(service, metrics)

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        readlimit.stop_on_signals(service)    # long reads must not hold up a shutdown
        fit_threads(service.engine)           # a connection always free for the pass
        if run_loop:
            loop.start()
        yield
        readlimit.stop(service)
        if run_loop:
            loop.stop()

    # /docs and /redoc from assets in the package: they work without internet
    app = FastAPIOffline(title="airflow-provider-gpu scheduler-core", version="1",
                  description="GPU-aware admission for Airflow on DGX clusters.",
                  lifespan=lifespan)
    app.state.service, app.state.loop, app.state.metrics = service, loop, metrics
    app.state.parsers = None
    app.state.protect = probes.protect_mode(protect, "protect")
    app.router.route_class = DecodedOffLoop      # JSON bodies decode in worker threads
    app.add_middleware(BodyLimit, limit=MAX_BODY)
    app.add_exception_handler(RequestValidationError, invalid)

    for exc_type, status in ((InputError, 422), (NotFound, 404), (Forbidden, 403),
                             (Conflict, 409)):
        app.add_exception_handler(exc_type, _handler(status))
    # e.g. a NUL character, which PostgreSQL text cannot hold: the client's input, not a fault
    app.add_exception_handler(DataError, lambda _, e: JSONResponse(
        {"detail": "a value cannot be stored: it holds a character (such as NUL) or a size "
         f"the database refuses ({str(e.orig).splitlines()[0]})"}, status_code=422))
    # a full disk or a read-only database: 503, the client may retry; anything else: 500
    app.add_exception_handler(DBAPIError, _storage)
    # every pooled connection busy for the pool's timeout: overloaded, the client may retry
    app.add_exception_handler(PoolTimeout, lambda _, e: JSONResponse(
        {"detail": "the service's database connections are all busy; retry shortly (or "
         "raise --db-pool-size within the database's max_connections)"}, status_code=503,
        headers={"Retry-After": str(health.RETRY_AFTER)}))
    app.add_exception_handler(readlimit.ReadTooLong, lambda _, e: JSONResponse(
        {"detail": str(e)}, status_code=503, headers={"Retry-After": str(health.RETRY_AFTER)}))
    app.add_exception_handler(_Http, lambda _, e: JSONResponse(
        {"detail": e.detail}, status_code=e.status,
        headers={"WWW-Authenticate": "Bearer"} if e.status == 401 else None))

    @app.get("/healthz", dependencies=[Depends(_probe_reader)])
    def healthz() -> dict:
        """Who schedules, when the last pass completed, and why passes fail if they do."""
        return health.report(loop)

    @app.get("/livez")
    async def livez() -> dict:
        """Liveness: the process serves HTTP. Never touches the database (a liveness probe
        must not restart replicas because the database is down or full)."""
        return {"status": "ok"}

    app.state.ready = True

    @app.get("/readyz")
    def readyz(request: Request, cred: Bearer) -> JSONResponse:
        """Readiness: a write to the database commits, and the leader's passes complete
        (503 with Retry-After and the problems when not; the problems only to callers
        that may read /healthz). Open to anyone: orchestrators' probes send no token."""
        ok, body = health.readiness(loop, service)
        from .quarantine import ready_detail

        body["quarantined"] = ready_detail(service)   # a detail; still ready
        if ok != app.state.ready:              # logged when it changes, not every probe
            app.state.ready = ok
            if ok:
                health.log.info("ready again")
            else:
                health.log.warning("not ready: %s", "; ".join(body["problems"]))
        shown = probes.ready_body(body, probes.check(request, cred) is None)
        return JSONResponse(shown, status_code=200 if ok else 503,
                            headers=None if ok else {"Retry-After": str(health.RETRY_AFTER)})

    @app.get("/metrics", response_class=PlainTextResponse,
             dependencies=[Depends(_probe_reader)])
    def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/api/v1/jobs", status_code=201, response_model=JobOut)
    async def submit(body: SubmitRequest, p: Who, response: Response,
                     idempotency_key: Annotated[str | None, Header(max_length=200)] = None):
        row, created = await run_in_threadpool(
            service.submit, body.spec, p, body.idempotency_key or idempotency_key)
        if not created:
            response.status_code = 200
        return JobOut.of(row)

    from . import batch

    batch.add_routes(app, service)     # POST /api/v1/jobs/batch, before {id}

    @app.get("/api/v1/jobs", response_model=list[JobOut])
    def list_jobs(_: Who, state: States | None = None,
                  team: Annotated[str | None, Query(max_length=200, pattern=NAME)] = None,
                  name: Annotated[str | None, Query(max_length=200, pattern=NAME)] = None,
                  order: Literal["submitted", "newest"] = "submitted",
                  limit: Annotated[int, Query(ge=1, le=10_000)] = 1000):
        from .jobcontrol import name_blockers

        jobs = service.list_jobs(state, team, limit, name, order == "newest")
        live = service.live_allocations([j.id for j in jobs if j.state in LIVE])
        return name_blockers(service, [JobOut.of(j, live.get(j.id)) for j in jobs])

    @app.get("/api/v1/jobs/{job_id}", response_model=JobOut)
    def get_job(job_id: JobRef, _: Who):
        from .jobcontrol import name_blockers

        out = JobOut.of(service.get(job_id), service.allocations(job_id))
        return name_blockers(service, [out])[0]

    @app.delete("/api/v1/jobs/{job_id}", response_model=JobOut)
    def cancel(job_id: JobRef, p: Who):
        return JobOut.of(service.cancel(job_id, p), service.allocations(job_id))

    @app.get("/api/v1/jobs/{job_id}/explain", response_model=ExplainOut)
    def explain(job_id: JobRef, _: Who):
        from .jobcontrol import blockers, name_jobs

        j = service.get(job_id)
        out = ExplainOut.of(j, service.events(job_id), time.time())
        out.blockers, names = blockers(service, j)     # the jobs it waits for, by name
        out.reason = name_jobs(out.reason, names)
        return out

    @app.post("/api/v1/jobs/{job_id}/heartbeat", response_model=JobOut)
    def heartbeat(job_id: JobRef, p: Who,
                  attempt: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None):
        return JobOut.of(service.heartbeat(job_id, p, attempt), service.allocations(job_id))

    @app.post("/api/v1/jobs/{job_id}/finish", response_model=JobOut)
    def finish(job_id: JobRef, body: FinishRequest, p: Who):
        return JobOut.of(service.finish(job_id, p, body.outcome, body.exit_code, body.attempt),
                         service.allocations(job_id))

    @app.get("/api/v1/jobs/{job_id}/usage")
    def job_usage(job_id: JobRef, _: Who) -> dict:
        """The job's GPU accounting: totals, each replica's, utilization over time."""
        return acct.job_usage(service, job_id, utcnow())

    @app.get("/api/v1/accounting")
    def accounting(_: Who, by: Literal["job", "team", "day"] = "job",
                   since: datetime | None = None, until: datetime | None = None,
                   team: Annotated[str | None, Query(max_length=200, pattern=NAME)] = None,
                   job: Annotated[str | None, Query(max_length=200)] = None) -> dict:
        """GPU accounting over a window (default: the last 7 days), per job, per team or
        per day and team (Slurm's sacct, Grid Engine's qacct); `job` is an id, a unique
        id prefix or a job name, as everywhere."""
        if job:
            from .jobcontrol import resolve_job

            job = resolve_job(service, job)
        try:
            return acct.report(service, by, _aware(since), _aware(until), team, job,
                               utcnow())
        except ValueError as exc:
            raise InputError(str(exc)) from None

    @app.get("/api/v1/cluster")
    def cluster(_: Who) -> dict:
        return service.cluster_view()

    @app.get("/api/v1/slowdown")
    def slowdown(_: Who) -> dict:
        """The locality slowdown factors the scheduler plans with, per job class: the
        policy's, and what it learned from jobs that ran to their end."""
        return service.slowdown_view()

    @app.post("/api/v1/hosts/{name}/drain", response_model=HostOut)
    def drain(name: str, p: Who, body: DrainRequest | None = None):
        row = service.set_drained(name, True, p, body.reason if body else None)
        return HostOut(name=row.name, drained=row.drained, drain_reason=row.drain_reason)

    @app.post("/api/v1/hosts/{name}/resume", response_model=HostOut)
    def resume(name: str, p: Who):
        row = service.set_drained(name, False, p)
        return HostOut(name=row.name, drained=row.drained)

    @app.put("/api/v1/hosts/{name}")
    def register(name: Annotated[str, Path(pattern=NAME, max_length=200)],
                 body: HostRegistration, p: HostAgent) -> dict:
        """A node agent registers its host's model (the host's agent token, or an admin
        token); answers the host's entry of the cluster view."""
        return service.register_host(name, p, body.topology,
                                     body.model_dump(exclude={"topology"}))

    @app.delete("/api/v1/hosts/{name}", status_code=204)
    def forget(name: Annotated[str, Path(pattern=NAME, max_length=200)], p: Who):
        """Remove the node agent's registration of a host (admins)."""
        service.forget_host(name, p)
        return Response(status_code=204)

    @app.post("/api/v1/hosts/{name}/report", response_model=list[GpuOut])
    def report(name: str, body: HostReport, p: HostAgent):
        """The host's heartbeat: its GPUs' health and utilization (the host's agent token,
        or an admin token)."""
        rows = service.report_gpus(name, p, [g.model_dump(exclude_unset=True)
                                             for g in body.gpus])
        return [GpuOut(index=g.index, name=g.name, healthy=g.healthy,
                       health_reason=g.health_reason) for g in rows]

    @app.get("/api/v1/teams", response_model=list[TeamOut])
    def teams(_: Who):
        return list(service.teams().values())

    @app.put("/api/v1/teams/{name}", response_model=TeamOut)
    def set_team(name: Annotated[str, Path(pattern=NAME, max_length=200)],
                 body: TeamRequest, p: Who):
        return service.set_team(name, p, body.share, body.quota_gpus, body.borrow_gpus)

    from . import slurmroutes

    slurmroutes.add_routes(app, service, _not_agent, _job_ref)   # queue, prio, hold, ...
    from . import tokens

    tokens.add_routes(app, service)    # /api/v1/tokens
    return app


_bearer = HTTPBearer(auto_error=False)


def _who(request: Request,
         cred: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> Principal:
    if cred is None:
        raise _Http(401, "missing bearer token: send 'Authorization: Bearer <token>' "
                    "(airflow-gpu token create --team T)")
    try:
        p = principal_for(request.app.state.service.reads, cred.credentials)
    except TokenExpired as exc:
        raise _Http(401, str(exc)) from None
    if p is None:
        raise _Http(401, "unknown token (or revoked): create one with airflow-gpu token "
                    "create")
    return p


Bearer = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _probe_reader(request: Request, cred: Bearer) -> None:
    """/metrics and /healthz: a token (or an admin's) when --protect-metrics asks."""
    refused = probes.check(request, cred)
    if refused:
        raise _Http(*refused)


def _not_agent(p: Annotated[Principal, Depends(_who)]) -> Principal:
    """Team and admin tokens; an agent token is refused (403) here."""
    if isinstance(p, AgentPrincipal):
        raise _Http(403, f"this is an agent token (role agent, hosts {p.describe()}): it "
                    "may only register and report its own hosts (PUT /api/v1/hosts/{name}, "
                    "POST /api/v1/hosts/{name}/report); for jobs, teams and the cluster use "
                    "a team token (airflow-gpu token create --team T), for admin routes an "
                    "admin token (--admin)")
    return p


def _host_agent(name: str, p: Annotated[Principal, Depends(_who)]) -> Principal:
    """The agent token of host `name` (or an admin token), which the service then lets
    register and report that host; any other agent token is refused (403)."""
    if isinstance(p, AgentPrincipal):
        if not p.serves(name):
            raise _Http(403, f"this agent token (role agent) is for hosts {p.describe()}, "
                        f"not {name}: use the agent token of {name} (airflow-gpu token "
                        f"create --agent --host {name})")
        # for this host's register and report; still an agent's (agents.register)
        return replace(p, admin=True)
    return p


Who = Annotated[Principal, Depends(_not_agent)]


def _job_ref(job_id: str, request: Request, _: Who) -> str:
    """The job a path names: its id, a unique id prefix (4 characters or more) or its
    name (jobcontrol.resolve_job: 404 when none, 409 naming the candidates when several)."""
    from .jobcontrol import resolve_job

    return resolve_job(request.app.state.service, job_id)


JobRef = Annotated[str, Depends(_job_ref)]
HostAgent = Annotated[Principal, Depends(_host_agent)]


class _Http(Exception):
    def __init__(self, status: int, detail: str):
        self.status, self.detail = status, detail


def _storage(request: Request, exc: DBAPIError) -> JSONResponse:
    why = health.storage_problem(exc) or health.unavailable(exc)
    if why is None:
        raise exc                 # a fault of the service: 500, with its traceback logged
    # the database cannot store, or cannot be reached: the client may retry; one line
    health.log.warning("%s %s: 503: %s", request.method, request.url.path, why)
    return JSONResponse({"detail": why}, status_code=503,
                        headers={"Retry-After": str(health.RETRY_AFTER)})


def _handler(status: int):
    def handle(_: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": safe(str(exc), 4000)}, status_code=status)
    return handle
