"""The agent loop: register the host with the service, then heartbeat its GPUs' health and
utilization every `interval` seconds, and at once when a GPU turns unhealthy.

The service being away is not fatal (the agent keeps trying); a token that is refused or
a model the service rejects is, since retrying cannot fix either. A registration refused
for now (409: the host's model changed while jobs run there) is tried again every
`interval` seconds until the host is empty and the service takes it."""

from __future__ import annotations

import logging
import threading
import time

from ..scheduler_core.client import ApiError, Client
from ..scheduler_core.errors import InputError
from .config import AgentConfig

log = logging.getLogger(__name__)

SLICE = 1.0     # seconds the source may block at a time, so a stop request is seen soon


def summary(gpus: list[dict]) -> str:
    """A heartbeat in one line: `8 GPUs, 7 healthy (GPU 3: XID 79 ...); utilization % 97 0 ...`."""
    bad = [f"GPU {g['index']}: {g.get('reason') or 'unhealthy'}" for g in gpus
           if not g.get("healthy", True)]
    util = [g.get("utilization_gpu") for g in gpus]
    return (f"{len(gpus)} GPUs, {len(gpus) - len(bad)} healthy"
            + (f" ({'; '.join(bad)})" if bad else "")
            + ("; utilization % " + " ".join("-" if u is None else f"{u:.0f}" for u in util)
               if any(u is not None for u in util) else "; no utilization"))


class Agent:
    def __init__(self, config: AgentConfig, source, client: Client):
        if not config.name:
            raise InputError("name: the agent needs the host's name; pass --name or set "
                             "name in the --config file")
        self.config, self.source, self.client = config, source, client
        self.name = config.name
        self.registered = False

    # -- the two calls ------------------------------------------------------------------
    def registration(self) -> dict:
        c = self.config
        return {"topology": self.source.topology.document(), "rack": c.rack,
                "switch": c.switch, "docker_url": c.docker_url, "address": c.address,
                "labels": c.labels}

    def register(self) -> dict:
        host = self.client.request("PUT", f"/api/v1/hosts/{self.name}",
                                   json=self.registration())
        self.registered = True
        log.info("registered %s as %s with %d GPUs", self.name, host.get("model"),
                 len(host.get("gpus", [])))
        return host

    def report(self) -> list[dict]:
        """One heartbeat; a service that forgot the host (404) gets it registered again."""
        body = {"gpus": self.source.gpus()}
        log.debug("reporting %s: %s", self.name, summary(body["gpus"]))
        try:
            return self.client.request("POST", f"/api/v1/hosts/{self.name}/report", json=body)
        except ApiError as exc:
            if exc.status != 404:
                raise
            log.warning("the service does not know %s (%s); registering again", self.name, exc)
            self.register()
            return self.client.request("POST", f"/api/v1/hosts/{self.name}/report", json=body)

    # -- the loop -----------------------------------------------------------------------
    def _try(self, call) -> bool:
        """Run a call to the service; False (and a log line) if it should be retried."""
        try:
            call()
            return True
        except InputError as exc:          # the service cannot be reached
            log.warning("%s", exc)
        except ApiError as exc:
            if exc.status in (401, 403, 422):
                raise self._refused(exc) from None
            if exc.status == 409 and not self.registered:
                # e.g. the host's model changed while jobs run there: it applies once the
                # host is empty, so keep trying (no heartbeats meanwhile)
                log.error("the service refused to register %s for now (%s); trying again "
                          "every %gs", self.name, exc, self.config.interval)
            else:
                log.error("the service answered %s; retrying", exc)
        return False

    def _refused(self, exc: ApiError) -> InputError:
        hint = (f"; use this host's agent token (airflow-gpu token create --agent --host "
                f"{self.name}), or use an admin token" if exc.status in (401, 403) else "")
        return InputError(f"the service refused the agent of {self.name}: {exc}{hint}")

    def run(self, stop: threading.Event | None = None, once: bool = False) -> int:
        """Register, then heartbeat until `stop` is set. With `once`: register, send one
        heartbeat and return (errors are fatal then)."""
        stop = stop or threading.Event()
        if once:
            try:
                self.register()
                self.report()
            except ApiError as exc:
                if exc.status in (401, 403, 422):
                    raise self._refused(exc) from None
                raise
            return 0
        interval = self.config.interval
        while not stop.is_set() and not self._try(self.register):
            stop.wait(interval)
        next_at = time.monotonic()
        changed = False
        while not stop.is_set():
            if changed or time.monotonic() >= next_at:
                self._try(self.report)
                next_at = time.monotonic() + interval
            changed = self.source.wait(min(SLICE, max(0.0, next_at - time.monotonic())))
        return 0
