"""A small client of the scheduler-core API (httpx), for the CLI and the Airflow hooks.

The service and token come from arguments, else `AIRFLOW_GPU_URL` and `AIRFLOW_GPU_TOKEN`.

Every submit carries an idempotency key (the caller's, else a new UUID) and is retried with
the same key when the request times out or the connection fails, so a response lost on
the way creates no second job.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from typing import Any

import httpx

from .errors import InputError

DEFAULT_URL = "http://127.0.0.1:8080"
SUBMIT_RETRIES = (0.5, 1.0, 2.0)   # seconds before each retry of a submit that got no answer

log = logging.getLogger(__name__)


class ApiError(Exception):
    """The service answered with an error: its status and its message."""

    def __init__(self, status: int, detail: Any):
        self.status, self.detail = status, detail
        super().__init__(f"{status}: {_detail_text(detail)}")


def _detail_text(detail: Any) -> str:
    if isinstance(detail, list):   # FastAPI validation errors: name each field path
        return "; ".join(f"{'.'.join(str(p) for p in d.get('loc', []))}: {d.get('msg')}"
                         for d in detail)
    return str(detail)


def _answer(r: httpx.Response) -> Any:
    if r.status_code >= 400:
        try:
            detail = r.json().get("detail", r.text)
        except ValueError:
            detail = r.text
        raise ApiError(r.status_code, detail)
    return r.json()


def _unreachable(url: str, exc: Exception) -> InputError:
    return InputError(f"cannot reach the scheduler at {url} ({exc}); start it with "
                      "`airflow-gpu server` or set AIRFLOW_GPU_URL / --url")


def _options(url: str | None, token: str | None, timeout: float,
             verify: bool | str) -> tuple[str, dict]:
    url = (url or os.environ.get("AIRFLOW_GPU_URL") or DEFAULT_URL).rstrip("/")
    token = token or os.environ.get("AIRFLOW_GPU_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if url.startswith("http://"):   # no TLS: loading the CA bundle alone costs 40-80 ms
        verify = False
    return url, {"base_url": url, "headers": headers, "timeout": timeout, "verify": verify}


class Client:
    """`verify`: TLS certificate check, True or a CA bundle path (https URLs)."""

    def __init__(self, url: str | None = None, token: str | None = None,
                 timeout: float = 30.0, verify: bool | str = True):
        self.url, options = _options(url, token, timeout, verify)
        self.http = httpx.Client(**options)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_) -> None:
        self.close()

    def request(self, method: str, path: str, **kw) -> Any:
        try:
            r = self.http.request(method, path, **kw)
        except httpx.TransportError as exc:
            raise _unreachable(self.url, exc) from None
        return _answer(r)

    # -- the API ----------------------------------------------------------------------------
    def submit(self, spec: dict, idempotency_key: str | None = None,
               retries: tuple[float, ...] = SUBMIT_RETRIES) -> dict:
        """Submit a job. Without `idempotency_key` a new UUID is its key; a timeout or a
        failed connection is retried (after each of `retries` seconds) with the same key,
        so the job is created once even when an answer was lost."""
        body = {"spec": spec, "idempotency_key": idempotency_key or str(uuid.uuid4())}
        return self._post_retrying("/api/v1/jobs", body, f"job {spec.get('name')!r}",
                                   retries)

    def submit_batch(self, specs: list[dict], keys: list[str | None] | None = None,
                     retries: tuple[float, ...] = SUBMIT_RETRIES) -> list[dict]:
        """Submit several jobs in one request, all or none (POST /api/v1/jobs/batch); the
        jobs in the order given. Each job's key is its entry of `keys`, else a new UUID;
        retried as `submit` is, with the same keys, so no job is created twice."""
        keys = list(keys) if keys is not None else [None] * len(specs)
        if len(keys) != len(specs):
            raise ValueError(f"{len(specs)} specs but {len(keys)} idempotency keys")
        body = {"jobs": [{"spec": s, "idempotency_key": k or str(uuid.uuid4())}
                         for s, k in zip(specs, keys, strict=True)]}
        return self._post_retrying("/api/v1/jobs/batch", body, f"{len(specs)} jobs",
                                   retries)

    def _post_retrying(self, path: str, body: dict, what: str,
                       retries: tuple[float, ...]) -> Any:
        """POST `body` (which holds its idempotency keys), again after each of `retries`
        seconds while the request times out or the connection fails."""
        for wait in retries:
            try:
                return _answer(self.http.request("POST", path, json=body))
            except httpx.TransportError as exc:
                log.warning("submitting %s to %s: %s; retrying in %gs with the same "
                            "idempotency key", what, self.url, type(exc).__name__, wait)
                time.sleep(wait)
        return self.request("POST", path, json=body)

    def job(self, job_id: str) -> dict:
        return self.request("GET", f"/api/v1/jobs/{job_id}")

    def wait(self, job_id: str, state: str | None = None, timeout: float = 30.0) -> dict:
        """The job once it is no longer in `state` (default: the state it is in now), or
        as it is after `timeout` seconds (at most 60): one long-poll request."""
        params = {"timeout": timeout, **({"state": state} if state else {})}
        return self.request("GET", f"/api/v1/jobs/{_ref(job_id)}/wait", params=params,
                            timeout=timeout + self.http.timeout.read)

    def jobs(self, state: str | None = None, team: str | None = None, name: str | None = None,
             newest_first: bool = False, limit: int | None = None) -> list[dict]:
        params = {k: v for k, v in (("state", state), ("team", team), ("name", name),
                                    ("order", "newest" if newest_first else None),
                                    ("limit", limit)) if v}
        return self.request("GET", "/api/v1/jobs", params=params)

    def cancel(self, job_id: str) -> dict:
        return self.request("DELETE", f"/api/v1/jobs/{job_id}")

    def explain(self, job_id: str) -> dict:
        return self.request("GET", f"/api/v1/jobs/{job_id}/explain")

    def heartbeat(self, job_id: str, attempt: int | None = None) -> dict:
        return self.request("POST", f"/api/v1/jobs/{job_id}/heartbeat",
                            params={"attempt": attempt} if attempt else None)

    def heartbeats(self, jobs: list[tuple[str, int | None]]) -> dict:
        """Heartbeats of many jobs (full id, admission started or None), 1000 at most:
        {"jobs": [beaten, as they now are], "refused": [{id, status, detail}]}."""
        return self.request("POST", "/api/v1/jobs/heartbeats", json={"jobs": [
            {"id": i, "attempt": a} for i, a in jobs]})

    def finish(self, job_id: str, outcome: str, exit_code: int | None = None,
               attempt: int | None = None) -> dict:
        return self.request("POST", f"/api/v1/jobs/{job_id}/finish",
                            json={"outcome": outcome, "exit_code": exit_code,
                                  "attempt": attempt})

    def cluster(self) -> dict:
        return self.request("GET", "/api/v1/cluster")

    def slowdown(self) -> dict:
        return self.request("GET", "/api/v1/slowdown")

    def drain(self, host: str, drained: bool = True) -> dict:
        return self.request("POST", f"/api/v1/hosts/{host}/{'drain' if drained else 'resume'}")

    def teams(self) -> list[dict]:
        return self.request("GET", "/api/v1/teams")

    def set_team(self, name: str, share: float | None, quota_gpus: int | None,
                 borrow_gpus: int | None = None, webhook: dict | None = None,
                 shares: bool = True) -> dict:
        """Set the shares (all three; `shares` False: left as they are) and the webhook
        fields given in `webhook` (url, events, secret: "new")."""
        body = {"share": share, "quota_gpus": quota_gpus,
                "borrow_gpus": borrow_gpus} if shares else {}
        body.update((f"webhook_{k}", v) for k, v in (webhook or {}).items())
        return self.request("PUT", f"/api/v1/teams/{name}", json=body)

    def notifications(self, job_id: str) -> list[dict]:
        return self.request("GET", f"/api/v1/jobs/{_ref(job_id)}/notifications")

    def undelivered(self, state: str | None = None) -> list[dict]:
        """Notifications not delivered (pending or given up; admins)."""
        return self.request("GET", "/api/v1/notifications",
                            params={"state": state} if state else None)

    def tokens(self, team: str | None = None) -> list[dict]:
        """Every token (admins): id, team, role, hosts, created_at, expires_at, hint."""
        return self.request("GET", "/api/v1/tokens", params={"team": team} if team else None)

    def create_token(self, team: str | None, role: str = "team",
                     hosts: list[str] | None = None, expires_in: str | int | None = None,
                     expires_at: str | None = None,
                     allow_new_hosts: list[str] | None = None,
                     user: str | None = None) -> dict:
        """A new token (admins); the answer's `token` is its secret, shown this once."""
        body = {k: v for k, v in (("team", team), ("role", role), ("hosts", hosts),
                                  ("expires_in", expires_in), ("expires_at", expires_at),
                                  ("allow_new_hosts", allow_new_hosts), ("user", user))
                if v is not None}
        return self.request("POST", "/api/v1/tokens", json=body)

    def revoke_token(self, token_id: int) -> dict:
        """Revoke the token with this id (admins); answers what it was."""
        return self.request("DELETE", f"/api/v1/tokens/{token_id}")

    def revoke_team_tokens(self, team: str) -> list[dict]:
        """Revoke every token of `team` (admins); answers what they were."""
        return self.request("DELETE", "/api/v1/tokens", params={"team": team})

    def usage(self, job_id: str) -> dict:
        return self.request("GET", f"/api/v1/jobs/{job_id}/usage")

    def accounting(self, by: str = "job", since: str | None = None, until: str | None = None,
                   team: str | None = None, job: str | None = None) -> dict:
        params = {k: v for k, v in (("by", by), ("since", since), ("until", until),
                                    ("team", team), ("job", job)) if v is not None}
        return self.request("GET", "/api/v1/accounting", params=params)

    # -- Slurm / Grid Engine habits (docs/service.md) -------------------------------------
    def queue(self, all_jobs: bool = False, state: str | None = None,
              team: str | None = None, limit: int | None = None,
              user: str | None = None) -> list[dict]:
        """Jobs in the scheduler's order (squeue): live, then pending by priority."""
        params = {k: v for k, v in (("all", "true" if all_jobs else None), ("state", state),
                                    ("team", team), ("limit", limit), ("user", user)) if v}
        return self.request("GET", "/api/v1/queue", params=params)

    def priorities(self, team: str | None = None, user: str | None = None) -> dict:
        """Pending jobs' priority factors (sprio)."""
        params = {k: v for k, v in (("team", team), ("user", user)) if v}
        return self.request("GET", "/api/v1/priorities", params=params or None)

    def shares(self) -> list[dict]:
        """Teams' fair share (sshare)."""
        return self.request("GET", "/api/v1/shares")

    def hold(self, job: str) -> dict:
        return self.request("POST", f"/api/v1/jobs/{_ref(job)}/hold")

    def release(self, job: str) -> dict:
        return self.request("POST", f"/api/v1/jobs/{_ref(job)}/release")

    def requeue(self, job: str) -> dict:
        return self.request("POST", f"/api/v1/jobs/{_ref(job)}/requeue")

    def update(self, job: str, priority: int | None = None,
               time_limit: str | int | None = None) -> dict:
        body = {k: v for k, v in (("priority", priority), ("time_limit", time_limit))
                if v is not None}
        return self.request("PATCH", f"/api/v1/jobs/{_ref(job)}", json=body)

    def hold_jobs(self, jobs: list[str]) -> dict:
        """Hold every job the references name (an array: each pending element)."""
        return self.request("POST", "/api/v1/jobs/hold", json={"jobs": jobs})

    def release_jobs(self, jobs: list[str]) -> dict:
        return self.request("POST", "/api/v1/jobs/release", json={"jobs": jobs})

    def update_jobs(self, jobs: list[str], priority: int | None = None,
                    time_limit: str | int | None = None,
                    max_running: int | None = None) -> dict:
        """Change every job the references name; `max_running`: an array's throttle."""
        body = {k: v for k, v in (("priority", priority), ("time_limit", time_limit),
                                  ("max_running", max_running)) if v is not None}
        return self.request("POST", "/api/v1/jobs/update", json={"jobs": jobs, **body})

    def drain_host(self, host: str, reason: str | None = None) -> dict:
        """Drain a host, saying why (admins)."""
        return self.request("POST", f"/api/v1/hosts/{_ref(host)}/drain",
                            json={"reason": reason} if reason else None)

    def drain_hosts(self, hosts: str, drained: bool = True,
                    reason: str | None = None) -> list[dict]:
        """Drain (or resume) every host of names and ranges (`dgx-a-[01-04],dgx-h-05`),
        all or none (admins); each host as it is now."""
        body = {"hosts": hosts, **({"reason": reason} if reason else {})}
        return self.request("POST", f"/api/v1/hosts/{'drain' if drained else 'resume'}",
                            json=body)["hosts"]

    def cancel_jobs(self, jobs: list[str] | None = None, team: str | None = None,
                    state: str | None = None, name: str | None = None,
                    submitted_before: str | None = None, dry_run: bool = False,
                    user: str | None = None) -> dict:
        """scancel with filters: every job the references (an array: each element) and the
        filters match; `dry_run`: which, cancelling none. {matched, cancelled, jobs, ...}"""
        body = {k: v for k, v in (("jobs", jobs), ("team", team), ("state", state),
                                  ("name", name), ("submitted_before", submitted_before),
                                  ("user", user)) if v}
        return self.request("POST", "/api/v1/jobs/cancel", json={**body, "dry_run": dry_run})

    # -- admins' reservations -----------------------------------------------------------------
    def reservations(self, include_ended: bool = False) -> list[dict]:
        return self.request("GET", "/api/v1/reservations",
                            params={"all": "true"} if include_ended else None)

    def reservation(self, name: str) -> dict:
        return self.request("GET", f"/api/v1/reservations/{_ref(name)}")

    def reserve(self, body: dict) -> dict:
        """Make a reservation (admins); answers it with the jobs it will stop."""
        return self.request("POST", "/api/v1/reservations", json=body)

    def update_reservation(self, name: str, body: dict) -> dict:
        return self.request("PATCH", f"/api/v1/reservations/{_ref(name)}", json=body)

    def delete_reservation(self, name: str) -> dict:
        return self.request("DELETE", f"/api/v1/reservations/{_ref(name)}")


def delivery_state(n: dict) -> str:
    """A webhook notification's delivery state in words (the API's NotificationOut)."""
    if n["state"] == "delivered":
        return f"delivered {n['delivered_at']}"
    if n["state"] == "given_up":
        return f"given up after {n['attempts']} attempt(s): {n['last_error']}"
    if n["attempts"]:
        return (f"retrying: {n['attempts']} attempt(s) failed, next {n['next_attempt_at']}; "
                f"last: {n['last_error']}")
    return "pending"


def _ref(text: str) -> str:
    """A job reference or host name as one path segment."""
    from urllib.parse import quote

    return quote(text, safe="")


class AsyncClient:
    """What the deferrable trigger needs, without blocking the triggerer's event loop."""

    def __init__(self, url: str | None = None, token: str | None = None,
                 timeout: float = 30.0, verify: bool | str = True):
        self.url, options = _options(url, token, timeout, verify)
        self.http = httpx.AsyncClient(**options)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_) -> None:
        await self.http.aclose()

    async def request(self, method: str, path: str, **kw) -> Any:
        try:
            r = await self.http.request(method, path, **kw)
        except httpx.TransportError as exc:
            raise _unreachable(self.url, exc) from None
        return _answer(r)

    async def job(self, job_id: str) -> dict:
        return await self.request("GET", f"/api/v1/jobs/{job_id}")

    async def cancel(self, job_id: str) -> dict:
        return await self.request("DELETE", f"/api/v1/jobs/{job_id}")

    async def wait_many(self, ids: list[str], state: str = "pending",
                        timeout: float = 30.0) -> dict:
        """One long poll for many jobs (POST /api/v1/jobs/wait): as soon as one or more
        of them is no longer in `state`, those; at the timeout, all of them as they are
        now. `{"jobs": [...], "missing": [ids], "timed_out": bool}`."""
        return await self.request("POST", "/api/v1/jobs/wait",
                                  json={"ids": ids, "state": state, "timeout": timeout},
                                  timeout=timeout + self.http.timeout.read)
