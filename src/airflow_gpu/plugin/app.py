"""The plugin's FastAPI app, mounted by Airflow's API server at /gpu.

Pages (HTML, rendered here) and JSON endpoints give the same page models; every route,
static files included, requires an Airflow login. A page asked with `?fragment=1` returns
only its <main>, which the page's script fetches every few seconds to refresh itself."""

from __future__ import annotations

from datetime import UTC, datetime
from importlib import resources
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Path, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import escape

from ..scheduler_core.units import parse_duration
from .auth import login_url, require_login
from .source import SchedulerSource, SourceError
from .views.cluster import cluster_page
from .views.job import job_page
from .views.queue import queue_page
from .views.teams import teams_page

REFRESH_SECONDS = 5          # default of [gpu_scheduler] ui_refresh_seconds
HISTORY_JOBS = 2000          # newest jobs read for the teams' history (plus pending and live)
WINDOWS = ("1h", "6h", "24h", "7d")
JOB_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"
Fragment = Annotated[bool, Query(description="only the page's <main>, for refreshes")]
JobId = Annotated[str, Path(pattern=JOB_ID)]
Window = Annotated[str, Query(pattern=r"^\d+[mhd]$", description="e.g. 1h, 6h, 7d")]
Search = Annotated[str | None, Query(max_length=100, description="host, job, team or rack")]
Name = Annotated[str | None, Query(max_length=200)]
View = Annotated[Literal["full", "compact"] | None,
                 Query(description="compact: one small cell per GPU (default from 24 hosts)")]
# "": the filter form's "any state"
GpuState = Annotated[Literal["", "free", "held", "mig", "unhealthy", "drained",
                             "unreachable"] | None,
                     Query(description="hosts with a GPU in this state")]
# Pages load only their own files and may be framed only by the Airflow UI (same origin);
# inline styles carry the team colours.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data:; frame-ancestors 'self'; form-action 'self'")
STATIC = {"gpu.css": "text/css", "gpu.js": "text/javascript", "gpu.svg": "image/svg+xml"}


def create_app(source: SchedulerSource | None = None) -> FastAPI:
    source = source or SchedulerSource()
    env = Environment(loader=PackageLoader("airflow_gpu.plugin", "templates"),
                      autoescape=select_autoescape(default=True), trim_blocks=True,
                      lstrip_blocks=True)
    app = FastAPI(title="GPU cluster (airflow-provider-gpu)", docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.source = source
    router = APIRouter(dependencies=[Depends(require_login)])

    def models(page: str, request: Request, **args: Any) -> dict[str, Any]:
        now = datetime.now(UTC)
        if page == "cluster":
            return cluster_page(source.cluster(), source.live_jobs(), **args)
        if page == "queue":
            return queue_page(source.queue(), source.live_jobs(), now)
        if page == "teams":
            jobs = {j["id"]: j for j in [*source.jobs(newest=True, limit=HISTORY_JOBS),
                                         *source.jobs("pending"), *source.live_jobs()]}
            page = teams_page(source.teams(), list(jobs.values()), source.cluster(), now,
                              args["window"])
            return {**page, "history_jobs": HISTORY_JOBS}
        job_id = args["job_id"]
        job = source.job(job_id)
        usage, usage_error = None, None
        try:        # a page without its accounting rather than no page
            usage = source.usage(job_id)
        except SourceError as exc:
            usage_error = ("this scheduler has no usage endpoint (a version before GPU "
                           "accounting)" if exc.status == 404 else exc.message)
        return job_page(job, source.explain(job_id), source.cluster(), source.live_jobs(),
                        now, airflow_root(request),
                        source.jobs("pending") if job.get("preempted_by") else [],
                        usage=usage, usage_error=usage_error)

    def render(page: str, request: Request, fragment: bool, **args: Any) -> HTMLResponse:
        context = {"page": page, "root": request.scope.get("root_path", ""),
                   "airflow": airflow_root(request), "refresh": refresh_seconds(),
                   "now": datetime.now(UTC).strftime("%H:%M:%S UTC"), "args": args,
                   "windows": WINDOWS}
        try:
            context["m"] = models(page, request, **args)
            status = 200
        except SourceError as exc:
            context["error"], status = exc.message, exc.status
        template = env.get_template(f"{page}.html")
        if fragment and status != 200:      # the script shows it in its banner
            body = str(escape(context["error"]))
        elif fragment:
            body = "".join(template.blocks["main"](template.new_context(context)))
        else:
            body = template.render(context)
        return HTMLResponse(body, status_code=status)

    def as_json(page: str, request: Request, **args: Any) -> JSONResponse:
        try:
            return JSONResponse(models(page, request, **args))
        except SourceError as exc:
            return JSONResponse({"detail": exc.message}, status_code=exc.status)

    @router.get("/", response_class=HTMLResponse)
    @router.get("/cluster", response_class=HTMLResponse)
    def cluster(request: Request, fragment: Fragment = False, view: View = None,
                q: Search = None, state: GpuState = None, rack: Name = None,
                team: Name = None):
        return render("cluster", request, fragment, view=view, q=q, state=state,
                      rack=rack, team=team)

    @router.get("/queue", response_class=HTMLResponse)
    def queue(request: Request, fragment: Fragment = False):
        return render("queue", request, fragment)

    @router.get("/jobs/{job_id}", response_class=HTMLResponse)
    def job(request: Request, job_id: JobId, fragment: Fragment = False):
        return render("job", request, fragment, job_id=job_id)

    @router.get("/teams", response_class=HTMLResponse)
    def teams(request: Request, window: Window = "1h", fragment: Fragment = False):
        return render("teams", request, fragment, window=window_seconds(window),
                      window_name=window)

    @router.get("/api/cluster")
    def cluster_json(request: Request, view: View = None, q: Search = None,
                     state: GpuState = None, rack: Name = None, team: Name = None):
        return as_json("cluster", request, view=view, q=q, state=state, rack=rack,
                       team=team)

    @router.get("/api/queue")
    def queue_json(request: Request):
        return as_json("queue", request)

    @router.get("/api/jobs/{job_id}")
    def job_json(request: Request, job_id: JobId):
        return as_json("job", request, job_id=job_id)

    @router.get("/api/teams")
    def teams_json(request: Request, window: Window = "1h"):
        return as_json("teams", request, window=window_seconds(window))

    @router.get("/static/{name}")
    def static(name: str):
        if name not in STATIC:
            raise HTTPException(404, f"no static file {name!r}; there are {sorted(STATIC)}")
        data = resources.files("airflow_gpu.plugin").joinpath("static", name).read_bytes()
        return Response(data, media_type=STATIC[name],
                        headers={"Cache-Control": "private, max-age=300"})

    app.include_router(router)
    app.add_exception_handler(HTTPException, _login_page(env))

    @app.middleware("http")
    async def headers(request: Request, call_next):
        response = await call_next(request)
        response.headers.setdefault("Content-Security-Policy", CSP)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        return response

    return app


def refresh_seconds() -> int:
    """How often pages reload their data: `[gpu_scheduler] ui_refresh_seconds` (>= 1)."""
    from airflow.configuration import conf

    return max(1, conf.getint("gpu_scheduler", "ui_refresh_seconds",
                              fallback=REFRESH_SECONDS))


def window_seconds(window: str) -> float:
    seconds = parse_duration(window)
    if not 60 <= seconds <= 30 * 86400:
        raise HTTPException(422, f"window: {window!r} is outside 1m-30d; use e.g. 1h or 7d")
    return float(seconds)


def airflow_root(request: Request) -> str:
    """The Airflow UI's path prefix: the mount point minus our /gpu."""
    root = request.scope.get("root_path", "")
    return root[: -len("/gpu")] if root.endswith("/gpu") else ""


def _login_page(env: Environment):
    """401/403 as JSON for the endpoints and scripts, as a page with a login link for
    people (the Airflow UI's login comes back here afterwards)."""

    def handle(request: Request, exc: HTTPException) -> Response:
        headers = getattr(exc, "headers", None)
        wants_html = ("text/html" in request.headers.get("accept", "")
                      and "/api/" not in request.url.path)
        if exc.status_code not in (401, 403) or not wants_html:
            return JSONResponse({"detail": exc.detail}, status_code=exc.status_code,
                                headers=headers)
        page = env.get_template("login.html").render(
            root=request.scope.get("root_path", ""), detail=exc.detail,
            login=login_url(str(request.url.path)))
        return HTMLResponse(page, status_code=exc.status_code, headers=headers)

    return handle
