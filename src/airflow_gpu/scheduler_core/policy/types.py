"""The types the policy's modules share, below all of them: a queued job, why a job
waits, and what the pass's helpers read of the Scheduler and of the pass.

SchedulerView and PassView describe scheduler.Scheduler and onepass.Pass for the modules
those two drive (guarantee, passplan, pending, preempt, upcoming), so that these need not
import the modules that import them. Members whose classes live above this module are
typed Any, their class named in the comment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..engine.need import Need
    from ..engine.state import ClusterState
    from ..jobspec import JobSpec
    from ..plugins import Registry
    from .config import PolicyConfig


def account(team: str, user: str | None) -> str:
    """The fair-share account of a team's job (no team name holds a '/')."""
    return f"{team}/{user}" if user else team


def team_of(account: str) -> str:
    return account.split("/", 1)[0]


@dataclass(eq=False)
class QueuedJob:
    spec: JobSpec            # with its job class applied
    submit: float
    seq: int
    runtime: float           # planned runtime on one host, seconds (corrected estimate)
    base: float              # the business band: priority + class weight
    needs: list[Need]
    shape: tuple
    gpus: int = 0            # GPUs of the whole gang
    charge: float = 0        # GPUs charged (quotas, fair share): gpus + MIG shares
    size: float = 0.0        # size factor (0..1)
    estimate: float = 0.0    # its runtime as given, before correction.py's factor
    limit: float = math.inf  # its time limit, seconds (inf: none)
    grace: float = 0.0       # seconds from SIGTERM to SIGKILL at the limit
    cpus: int = 0            # logical CPUs of the whole gang (team quotas)
    memory: int = 0          # host memory bytes of the whole gang
    borrowed: bool = False   # started beyond its team's guarantee (quota.py)
    preempted_by: frozenset[str] = frozenset()   # jobs that once preempted it
    preemptible: bool = True
    preempt_signal: str = "SIGTERM"
    preempt_grace: float = 0.0                   # seconds from the signal to SIGKILL
    checkpoint_interval: float | None = None     # seconds (what a preemption loses)
    behind: bool = False     # requeued as idle: at the back of its band (point 4 above)
    deadline: float = math.inf       # when its pipeline must be done (the pass's clock)
    latest_start: float = math.inf   # deadline - (runtime + downstream work): slack.py
    # the spec's, kept as plain attributes: a pass reads them tens of thousands of times
    name: str = field(init=False, repr=False)
    team: str = field(init=False, repr=False)
    # its fair-share account: `team`, or `team/user` for a user's job
    account: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.name, self.team = self.spec.name, self.spec.team
        self.account = account(self.spec.team, getattr(self.spec, "user", None))

    @property
    def job_class(self) -> str | None:
        return self.spec.job_class


@dataclass
class Pending:
    """Why a job waits: a code, a message with numbers, details, and an ETA if planned."""

    code: str            # Resources | Locality | Priority | Quota | Unhealthy
    message: str
    details: dict = field(default_factory=dict)
    eta: float | None = None     # seconds from the pass until the planned start

    def to_dict(self) -> dict:
        return {"code": self.code, "reason": self.message, "details": self.details,
                "eta_seconds": None if self.eta is None else round(self.eta)}


class SchedulerView(Protocol):
    """What the pass and its helpers use of scheduler.Scheduler."""

    state: ClusterState
    config: PolicyConfig
    reg: Registry
    queue: Any                          # jobqueue.JobQueue
    quotas: Any                         # quota.Quotas
    running: dict[str, QueuedJob]
    stopping: dict[str, str]
    yields: dict[str, tuple[float, str]]
    claims: dict[str, list[str]]
    promised: dict[str, float]
    reuse_reservations: bool
    _planned: tuple                     # the last pass's reservations (Scheduler.__init__)
    windows: dict[str, Any]             # the admins' reservations (windows.Window), by name

    def stop(self, victim: QueuedJob, by: QueuedJob, now: float) -> float: ...

    def best_tier(self, job: QueuedJob) -> int: ...

    def runtime(self, job: QueuedJob, tier: int) -> float: ...

    def protect_before(self, now: float) -> float: ...

    def urgent_before(self, now: float) -> float: ...

    def plan_epoch(self) -> tuple[int, int]: ...

    def _start(self, job: QueuedJob, allocations, now: float,
               deadline: float | None = None) -> None: ...


class PassView(Protocol):
    """What the helpers of one pass use of onepass.Pass."""

    s: SchedulerView
    now: float
    mode: str
    explain: bool
    head: QueuedJob | None
    plan: Any                           # passplan.PassPlan
    result: Any                         # onepass.PassResult
    reasons: Any                        # pending.Reasons, or None when not explaining
    cannot_preempt: dict[tuple, float]
    victim_pool: list | None

    @property
    def reservations(self) -> list: ...     # of reservations.Reservation

    def add(self, r: Any) -> None: ...      # a reservations.Reservation

    def late(self, job: QueuedJob) -> bool: ...   # its deadline is at risk (onepass.py)
