"""Who may read /metrics and /healthz (`--protect-metrics`): anyone (`none`, the default),
any valid token (`token`) or an admin token (`admin`). Both name teams, jobs and the
database backends that hold the scheduler lock. /livez and /readyz stay open for the
probes of orchestrators (which send no token); when protected, /readyz tells such
callers only whether the replica is ready, not its problems (they may name jobs)."""

from __future__ import annotations

from ..errors import InputError
from .auth import AgentPrincipal

MODES = ("none", "token", "admin")
ENV = "AIRFLOW_GPU_PROTECT_METRICS"


def protect_mode(value: str | None, what: str = "--protect-metrics") -> str:
    """The mode from the option or the environment; `none` when unset."""
    if value is None or value == "":
        return "none"
    mode = value.strip().lower()
    if mode not in MODES:
        raise InputError(f"{what}: {value!r} is not a protection of /metrics and /healthz; "
                         "use none (anyone may read them), token (any valid token) or "
                         "admin (an admin token)")
    return mode


def refusal(mode: str, path: str, principal, token_error: str | None) -> tuple[int, str] | None:
    """(status, detail) when the caller may not read `path` under `mode`; None when it
    may. `principal` is the token's (None: no token, or an unknown one)."""
    if mode == "none":
        return None
    need = "an admin token" if mode == "admin" else "a bearer token"
    create = ("airflow-gpu token create --team T --admin" if mode == "admin"
              else "airflow-gpu token create --team T")
    if principal is None:
        why = token_error or "no valid bearer token was sent"
        return 401, (f"GET {path} needs {need} (the server runs with --protect-metrics "
                     f"{mode}): {why}; send 'Authorization: Bearer <token>' ({create})")
    if mode == "admin" and not principal.admin:
        whose = (f"an agent token for hosts {principal.describe()}"
                 if isinstance(principal, AgentPrincipal)
                 else f"a team token of team {principal.team!r}")
        return 403, (f"GET {path} needs an admin token (the server runs with "
                     f"--protect-metrics admin); this is {whose}: use an admin token "
                     f"({create})")
    return None


def ready_body(body: dict, shown: bool) -> dict:
    """/readyz's answer: whole when `shown`, else whether the replica is ready and how
    many problems it has (the status code says the same)."""
    if shown:
        return body
    out = {"status": body["status"]}
    if body.get("problems"):
        out["problems"] = len(body["problems"])
        out["detail"] = ("the problems are shown with a token (--protect-metrics); see "
                         "/healthz and the server's log")
    return out


def check(request, credentials) -> tuple[int, str] | None:
    """(status, detail) when this request may not read its path under the app's mode
    (`app.state.protect`); None when it may."""
    from .auth import TokenExpired, principal_for

    mode = getattr(request.app.state, "protect", "none")
    if mode == "none":
        return None
    principal, why = None, None
    if credentials is not None:
        try:
            principal = principal_for(request.app.state.service.reads,
                                      credentials.credentials)
        except TokenExpired as exc:
            why = str(exc)
        else:
            why = None if principal else "the token is unknown (or revoked)"
    return refusal(mode, request.url.path, principal, why)
