"""The REST API (FastAPI), assembled: the routers of routes/ (one per resource), the
token checked before any body (authfirst.py), bodies limited and decoded off the event
loop (bodies.py), errors mapped to HTTP once (errors.py). Routes stay thin: the work is
in service/."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline

from ..service import probes, readlimit
from ..service.core import Service
from ..service.loop import SchedulerLoop
from ..service.metrics import Metrics
from ..store.budget import fit_threads
from .authfirst import AuthFirst
from .bodies import MAX_BODY, BodyLimit, DecodedOffLoop
from .errors import add_handlers
from .routes import (
    accounting,
    batch,
    bulk,
    cluster,
    hosts,
    jobs,
    notifications,
    queue,
    reservations,
    teams,
    tokens,
    wait,
)
from .routes import probes as probe_routes

# in the order the router tries them; the node agents' reports, the most frequent request,
# second: found after a few routes, not some thirty (by the token check, then the router)
ROUTERS = (probe_routes.router, hosts.reports, *(m.router for m in (
    wait, bulk, jobs, batch, accounting, cluster, hosts, teams, queue, tokens, reservations,
    notifications)))


def app_from_env() -> FastAPI:
    """The app as `airflow-gpu server` starts it in each worker process."""
    import os

    from ..engine.cluster import load_cluster
    from ..policy.config import PolicyConfig, load_policy
    from ..service.core import Settings

    env = os.environ
    log_to_stderr(env.get("AIRFLOW_GPU_LOG_LEVEL") or "info")
    policy_file = env.get("AIRFLOW_GPU_POLICY_FILE")
    settings = Settings(env["AIRFLOW_GPU_DB"], load_cluster(env["AIRFLOW_GPU_CLUSTER"]),
                        load_policy(policy_file) if policy_file else PolicyConfig(),
                        float(env.get("AIRFLOW_GPU_LEASE_TTL", 60)),
                        float(env.get("AIRFLOW_GPU_INTERVAL", 2)),
                        host_timeout=float(env.get("AIRFLOW_GPU_HOST_TIMEOUT") or 60),
                        deployment=env.get("AIRFLOW_GPU_DEPLOYMENT") or None)
    protect = probes.protect_mode(env.get(probes.ENV), probes.ENV)
    return create_app(Service(settings), protect=protect)


def log_to_stderr(level: str) -> None:
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
    app.state.protect = probes.protect_mode(protect, "protect")
    app.state.ready = True
    app.router.route_class = DecodedOffLoop      # JSON bodies decode in worker threads
    app.add_middleware(BodyLimit, limit=MAX_BODY)
    app.add_middleware(AuthFirst)                # outermost: the token before the body
    add_handlers(app)
    # the routers' own routes, as they are: include_router would build each route (its
    # dependencies and body models) again for every app (~0.1 s of CPU per app)
    for router in ROUTERS:
        app.router.routes.extend(router.routes)
    return app
