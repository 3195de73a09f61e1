"""The queue policy: how pending jobs are ordered, limited and protected from starvation.

band  = priority + job-class weight               (strict: higher bands first)
score = fairshare_weight * 2^(-usage/share)      (within a band, after the job that has
      + size_weight * size factor                 waited reserve_after: jobqueue.py)
      + age_weight * hours waited

`usage` is the team's share of all GPU-seconds used, decayed with a half-life;
`share` its configured share of the cluster (Slurm's classic fair-share factor:
a team that used exactly its share gets half the weight, an idle team all of it).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, field_validator, model_validator

from ..errors import load_yaml, validate
from ..jobclasses import STOP_GRACE, Defaults
from ..jobspec import MEMORY_PER_CPU, MEMORY_PER_GPU, web_url
from ..units import MAX_SIZE, Duration, Size, format_duration

Mode = Literal["backfill", "fifo", "count"]


class _Spec(BaseModel):
    # no .inf or .nan: an infinite weight or band turns every score into inf or nan
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


SHARE_RANGE = (1e-3, 1e6)   # a team's fair-share weight: wider makes 2^(-u/s) degenerate
QUOTA_MAX = 1_000_000       # GPUs a team quota may name


def check_share(v: float) -> float:
    lo, hi = SHARE_RANGE
    if not (math.isfinite(v) and lo <= v <= hi):
        raise ValueError(f"must be a number from {lo:g} to {hi:.0f} (a team's relative weight "
                         "in fair share, e.g. 1; 2 is twice as much)")
    return v


def check_quota(v: int | None) -> int | None:
    if v is not None and not 0 <= v <= QUOTA_MAX:
        raise ValueError(f"must be a number of GPUs from 0 to {QUOTA_MAX}, or none for no "
                         "quota")
    return v


def check_count(v: int | None) -> int | None:
    if v is not None and not 0 <= v <= 1 << 40:
        raise ValueError("must be 0 or more, or none")
    return v


def check_bytes(v: int | None) -> int | None:
    if v is not None and not 0 <= v <= MAX_SIZE:
        raise ValueError("must be a size of 0 or more (e.g. 4TiB), or none")
    return v


RESOURCES = ("gpus", "cpus", "memory")
JOBS_MAX = 10**9          # the largest max_submit_jobs: a limit nobody reaches


class UserPolicy(_Spec):
    """A user's part of the team's share, and a cap of its own."""

    share: float = Field(1.0, description="the user's part of the team's share, relative to "
                         "the team's other users (1 each by default)")
    quota_gpus: int | None = Field(None, description="the most GPUs the user's jobs may hold "
                                   "(none: the team's user_quota_gpus)")

    max_submit_jobs: int | None = Field(None, ge=0, le=JOBS_MAX, description="the most "
                                        "jobs the user may have submitted and not ended "
                                        "(none: the team's user_max_submit_jobs)")

    _share = field_validator("share")(check_share)
    _quota = field_validator("quota_gpus")(check_quota)


class TeamPolicy(_Spec):
    """A team's fair-share weight, and its quota: per resource a guarantee (`quota_*`,
    Kueue's nominal quota) and how much more it may hold on what others leave idle
    (`borrow_*`, Kueue's borrowing limit; 0, the default, makes the quota a hard cap;
    none: no limit). What a team holds beyond its guarantee is borrowed and may be
    reclaimed by the teams whose guarantee it uses."""

    share: float = Field(1.0, description="relative share of the cluster for fair share "
                         f"({SHARE_RANGE[0]:g} to {SHARE_RANGE[1]:.0f})")
    quota_gpus: int | None = Field(
        None, description="GPUs guaranteed to the team (none: no guarantee and no limit)")
    quota_cpus: int | None = Field(None, description="logical CPUs guaranteed (none: no "
                                   "quota on CPUs)")
    quota_memory: Size | None = Field(None, description="host memory guaranteed (none: no "
                                      "quota on memory)")
    borrow_gpus: int | None = Field(0, description="GPUs the team may hold beyond quota_gpus "
                                    "while others leave them idle (0: hard quota; none: no "
                                    "limit)")
    borrow_cpus: int | None = Field(0, description="CPUs beyond quota_cpus (none: no limit)")
    borrow_memory: Size | None = Field(0, description="memory beyond quota_memory (none: no "
                                       "limit)")
    users: dict[str, UserPolicy] = Field({}, description="the team's users: their part of "
                                         "its share and their caps (a user not named has "
                                         "share 1)")
    user_quota_gpus: int | None = Field(None, description="the most GPUs one user's jobs "
                                        "may hold, inside the team's quota (none: no cap)")
    max_submit_jobs: int | None = Field(None, ge=0, le=JOBS_MAX, description="the most jobs "
                                        "the team may have submitted and not ended (none: "
                                        "the policy's max_submit_jobs)")
    user_max_submit_jobs: int | None = Field(None, ge=0, le=JOBS_MAX, description="the same "
                                             "for each of its users (none: the policy's)")
    deadline_preempts: bool | None = Field(None, description="whether the team's jobs "
                                           "whose deadline is at risk may preempt under a "
                                           "rule on_deadline (none: the policy's "
                                           "preemption.deadline_preempts)")

    _share = field_validator("share")(check_share)
    _quota = field_validator("quota_gpus", "borrow_gpus", "user_quota_gpus")(check_quota)
    _counts = field_validator("quota_cpus", "borrow_cpus")(check_count)
    _bytes = field_validator("quota_memory", "borrow_memory")(check_bytes)

    def guarantee(self) -> tuple[float, float, float]:
        """Guaranteed (gpus, cpus, memory); inf where the resource has no quota."""
        return tuple(math.inf if v is None else v for v in (
            self.quota_gpus, self.quota_cpus, self.quota_memory))

    def limit(self) -> tuple[float, float, float]:
        """The most (gpus, cpus, memory) the team may hold, borrowing included."""
        return tuple(math.inf if q is None or b is None else q + b for q, b in (
            (self.quota_gpus, self.borrow_gpus), (self.quota_cpus, self.borrow_cpus),
            (self.quota_memory, self.borrow_memory)))


class PreemptRule(_Spec):
    """Which jobs may preempt which (Slurm's QOS Preempt=, by band): the preemptors are
    jobs whose band is at least `min_band`, or jobs of `job_class`; the victims, jobs
    whose band is below `preempts_below` and below the preemptor's own. With
    `on_deadline`, only jobs whose deadline is at risk preempt, and the victims may be of
    their own band too (never higher), if they have no deadline themselves."""

    min_band: float | None = Field(None, description="preemptors: jobs of this band "
                                   "(priority + job-class weight) or higher")
    job_class: str | None = Field(None, description="preemptors: jobs of this class")
    on_deadline: bool = Field(False, description="preemptors: only jobs whose deadline is "
                              "at risk (their latest start has come, or they would start "
                              "after it by waiting); victims: of their own band too, if "
                              "without a deadline")
    preempts_below: float = Field(description="victims: jobs of a band below this")

    @model_validator(mode="after")
    def _who(self) -> PreemptRule:
        if self.min_band is not None and self.job_class is not None or (
                self.min_band is None and self.job_class is None and not self.on_deadline):
            raise ValueError("give one of min_band or job_class (who may preempt), or "
                             "on_deadline: true, e.g. {min_band: 100, preempts_below: 50} "
                             "or {on_deadline: true, preempts_below: 10}")
        return self

    def allows(self, band: float, job_class: str | None, late: bool = False) -> bool:
        """`late`: the job's deadline is at risk (onepass.Pass.late)."""
        if self.on_deadline and not late:
            return False
        return (band >= self.min_band if self.min_band is not None
                else job_class == self.job_class if self.job_class is not None else True)


class Preemption(_Spec):
    reclaim: bool = Field(True, description="a job its team's guarantee covers stops "
                          "borrowed work to start (quota reclaim)")
    rules: list[PreemptRule] = Field(default_factory=list, description="priority "
                                     "preemption: which bands preempt which (none: no "
                                     "priority preemption)")
    min_run_time: Duration = Field(600, ge=0, description="no job is preempted before it "
                                   "has run this long (Slurm's PreemptExemptTime)")
    min_saved_wait: Duration = Field(900, ge=0, description="no preemption for a job whose "
                                     "wait (so far plus still expected) stays within this")
    max_victims: int = Field(64, ge=1, le=10_000, description="the most jobs one "
                             "preemption may stop")
    deadline_preempts: bool = Field(True, description="whether the jobs of a team that does "
                                    "not say (teams' deadline_preempts) may preempt for "
                                    "their deadline under a rule on_deadline: a deadline is "
                                    "the job's own claim, so an admin chooses whose counts")

    def victims_below(self, band: float, job_class: str | None, late: bool = False) -> float:
        """The band below which a job of `band` and `job_class` may preempt (-inf: none);
        `late`: its deadline is at risk (rules `on_deadline`: its own band too)."""
        return max((min(r.preempts_below, math.nextafter(band, math.inf) if r.on_deadline
                         else band) for r in self.rules if r.allows(band, job_class, late)),
                   default=-math.inf)


class IdlePolicy(_Spec):
    """Jobs whose GPUs stay below `threshold` percent utilization for `after`: flagged
    (a warning in the task log and the UI, an event, a metric) and, with action
    `requeue`, stopped and requeued once they stay idle `grace` longer: at the back of
    their band, and held at the `hold_after`-th time. A job class's `idle_*` fields
    override these for its jobs."""

    after: Duration | None = Field(None, ge=1, description="flag a job whose GPUs all "
                                   "stay under the threshold this long (none: never)")
    threshold: float = Field(5.0, ge=0, le=100, description="GPU utilization (percent) "
                             "under which a GPU counts as idle")
    action: Literal["notify", "requeue"] = Field("notify", description="notify: flag the "
                                                 "job and notify its webhooks, nothing "
                                                 "more; requeue: then stop and requeue it")
    grace: Duration = Field(600, ge=0, description="seconds a flagged job may stay idle "
                            "before the action")
    hold_after: int | None = Field(2, ge=1, description="with action requeue: the job is "
                                   "held (JobHeldUser, released by its team or an admin) "
                                   "at its this-many-th idle requeue (none: never held)")


class Notifications(_Spec):
    """Webhooks (docs/notifications.md): the URL prefixes jobs and teams may name, and
    how a delivery is retried while its receiver is down (twice the wait each time, from
    `retry_first` up to `retry_max`, given up `give_up_after` after its event)."""

    allowed_urls: list[str] = Field(
        default_factory=list, max_length=1000, description="URL prefixes a webhook may "
        "start with, e.g. https://hooks.example.com/ (none: no webhooks at all)")
    retry_first: Duration = Field(10, ge=1, le=86400, description="seconds from a failed "
                                  "attempt to the first retry; each retry waits twice as "
                                  "long as the one before")
    retry_max: Duration = Field(600, ge=1, le=86400, description="the longest wait "
                                "between two attempts")
    give_up_after: Duration = Field(86400, ge=1, le=30 * 86400, description="a delivery "
                                    "still failing this long after its event is given up "
                                    "(an event says so)")
    timeout: float = Field(10.0, ge=0.1, le=300, description="seconds one attempt may take "
                           "(connect, send, answer)")

    @field_validator("allowed_urls")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        for i, url in enumerate(v):
            try:
                web_url(url)
            except ValueError as exc:
                raise ValueError(f"[{i}]: {exc}; write a prefix such as "
                                 "https://hooks.example.com/") from None
        return v

    def allows(self, url: str) -> bool:
        """Whether `url` starts with an allowed prefix at a boundary: a prefix that ends
        with '/' or ':' as written, else followed by '/', '?', '#', ':' or nothing (so
        https://hooks.example.com never admits https://hooks.example.com.evil.net)."""
        for prefix in self.allowed_urls:
            if url.startswith(prefix) and (prefix.endswith(("/", ":"))
                                           or url[len(prefix):][:1] in ("", "/", "?", "#",
                                                                        ":")):
                return True
        return False


class PolicyConfig(_Spec):
    mode: Mode = Field("backfill", description="backfill | fifo | count")
    age_weight: float = Field(0.0, ge=0, description="priority points per hour waited "
                              "(none by default: reserve_after protects old jobs)")
    fairshare_weight: float = Field(20.0, ge=0, description="priority points of an idle team")
    fairshare_half_life: Duration = Field(7 * 86400, gt=0,
                                          description="past GPU usage halves after this long")
    default_runtime: Duration = Field(3600, gt=0,
                                      description="planned runtime of jobs that give none")
    memory_per_gpu: Size = Field(MEMORY_PER_GPU, gt=0, description="host memory a replica "
                                 "books per GPU when neither it nor its job class says")
    memory_per_cpu: Size = Field(MEMORY_PER_CPU, gt=0, description="host memory a replica "
                                 "books per CPU when neither it nor its job class says")
    default_time_limit: Duration | None = Field(
        None, gt=0, description="time limit of jobs that, like their class, set none "
        "(none: no limit, like Slurm's default MaxTime=UNLIMITED)")
    max_time_limit: Duration | None = Field(
        None, gt=0, description="the most time_limit any job may ask for (none: no maximum)")
    stop_grace: Duration = Field(STOP_GRACE, ge=0, le=3600, description="seconds from SIGTERM "
                                 "to SIGKILL at a time limit, where the job class sets none")
    cpu_allocation: Literal["core", "thread"] = Field(
        "core", description="core: replicas get whole physical cores (SMT siblings "
        "together); thread: logical CPUs one by one; a job or its class may say otherwise")
    reserve_after: Duration = Field(
        12 * 3600, ge=0, description="the wait guarantee: a job of a band that has waited "
        "this long (the smallest jobs; see reserve_after_scale) is protected, oldest "
        "first: it goes first, with a reservation")
    reserve_after_scale: float = Field(
        28.0, ge=1, le=1000, description="a job asking for every GPU of the cluster waits "
        "this many times reserve_after before it is protected; a job of a share s of the "
        "GPUs reserve_after x (1 + s x (scale - 1)); 1: every job after reserve_after")
    size_weight: float = Field(100.0, ge=0, description="priority points of the smallest job "
                               "(GPUs x expected runtime): smaller work goes first in a band")
    locality_slowdown: tuple[PositiveFloat, PositiveFloat, PositiveFloat] = Field(
        (1.0, 1.1, 1.3), description="runtime factor on one host, one switch, across switches")
    learn_slowdown: bool = Field(True, description="learn the slowdown per job class from "
                                 "the runtimes of ended jobs")
    correct_estimates: Literal["off", "up", "both"] = Field(
        "up", description="plan each job with its runtime times its team's observed ratio "
        "of actual to estimated runtime: up (only teams that overrun), both, or off")
    estimate_quantile: float = Field(
        0.9, ge=0.5, le=0.99, description="the quantile of a team's observed ratios planned "
        "with (0.5: their mean; higher: fewer jobs overrun their plan)")
    deadline_slack: Duration = Field(
        4 * 3600, ge=0, description="a job with a deadline whose slack (its latest start less "
        "now) is under this goes ahead of its band's other jobs, least slack first; 0 or "
        "off: no deadline ordering")
    reservation_depth: int = Field(16, ge=0, le=10_000,
                                   description="at most this many reservations per pass: "
                                   "protected jobs and jobs waiting for locality")
    max_jobs_tested: int = Field(500, ge=1,
                                 description="pending jobs tested per pass (Slurm's "
                                 "bf_max_job_test): bounds the cost of a pass")
    max_submit_jobs: int | None = Field(
        20_000, ge=0, le=JOBS_MAX, description="the most jobs one team may have submitted "
        "and not ended, pending, held or running (Slurm's MaxSubmitJobs; an array counts "
        "each element); a team's own max_submit_jobs overrides it; none: no limit")
    user_max_submit_jobs: int | None = Field(
        10_000, ge=0, le=JOBS_MAX, description="the same for one user of a team (Grid "
        "Engine's max_u_jobs): one full array; a team or user of the policy may say "
        "otherwise; none: no limit")
    default_share: float = Field(1.0, description="share of a team not listed in teams")
    teams: dict[str, TeamPolicy] = Field(default_factory=dict)
    preemption: Preemption = Field(default_factory=Preemption)
    idle: IdlePolicy = Field(default_factory=IdlePolicy)
    notifications: Notifications = Field(default_factory=Notifications)

    _default_share = field_validator("default_share")(check_share)

    @field_validator("deadline_slack", mode="before")
    @classmethod
    def _slack_off(cls, v):
        return 0 if v in ("off", False) else v      # YAML reads a bare off as False

    @field_validator("locality_slowdown")
    @classmethod
    def _widening(cls, v: tuple[float, float, float]) -> tuple[float, float, float]:
        if not v[0] <= v[1] <= v[2]:
            raise ValueError(f"{list(v)} must not shrink from one host to one switch to "
                             "across switches, e.g. [1.0, 1.1, 1.3]")
        return v

    @property
    def protect_span(self) -> float:
        """Seconds a job of the whole cluster waits for protection beyond reserve_after."""
        return float(self.reserve_after) * (self.reserve_after_scale - 1.0)

    @model_validator(mode="after")
    def _default_within_max(self) -> PolicyConfig:
        """Checked here, or every job that sets no limit is refused, naming the job."""
        most, default = self.max_time_limit, self.default_time_limit
        if most is not None and default is not None and default > most:
            raise ValueError(f"default_time_limit: {format_duration(default)} is more than "
                             f"max_time_limit {format_duration(most)}, so every job that "
                             "sets no time limit would be refused; lower default_time_limit "
                             "or raise max_time_limit")
        return self

    @property
    def defaults(self) -> Defaults:
        """What jobs get that neither they nor their class set."""
        return Defaults(self.memory_per_gpu, self.memory_per_cpu, self.default_time_limit,
                        self.max_time_limit, self.stop_grace, self.cpu_allocation)

    def share(self, team: str) -> float:
        t = self.teams.get(team)
        return t.share if t else self.default_share

    def quota(self, team: str) -> int | None:
        t = self.teams.get(team)
        return t.quota_gpus if t else None

    def guarantee(self, team: str) -> tuple[float, float, float]:
        """What `team` holds without borrowing: (gpus, cpus, memory), inf where no quota
        governs. Where some team has a GPU quota, a team with none has no GPUs
        guaranteed: all it holds is borrowed and may be reclaimed."""
        t = self.teams.get(team)
        g = t.guarantee() if t else (math.inf,) * 3
        if g[0] == math.inf and self.has_gpu_quotas:
            g = (0, *g[1:])
        return g

    @property
    def has_gpu_quotas(self) -> bool:
        return any(t.quota_gpus is not None for t in self.teams.values())

    def limit(self, team: str) -> tuple[float, float, float]:
        t = self.teams.get(team)
        return t.limit() if t else (math.inf,) * 3

    def user_share(self, team: str, user: str | None) -> float:
        t = self.teams.get(team)
        u = t.users.get(user) if t and user else None
        return u.share if u else 1.0

    def user_cap(self, team: str, user: str | None) -> int | None:
        """The most GPUs `user`'s jobs of `team` may hold (None: no cap)."""
        t = self.teams.get(team)
        if t is None or not user:
            return None
        u = t.users.get(user)
        return u.quota_gpus if u and u.quota_gpus is not None else t.user_quota_gpus


    def deadline_preempts(self, team: str) -> bool:
        """Whether `team`'s jobs may preempt for their deadline (rules on_deadline)."""
        t = self.teams.get(team)
        if t is not None and t.deadline_preempts is not None:
            return t.deadline_preempts
        return self.preemption.deadline_preempts

    def submit_limits(self, team: str, user: str | None) -> tuple[int | None, int | None]:
        """The most jobs `team`, and `user` of it, may have submitted and not ended (None:
        no limit; no user: only the team's)."""
        t = self.teams.get(team)
        team_max = (t.max_submit_jobs if t and t.max_submit_jobs is not None
                    else self.max_submit_jobs)
        if not user:
            return team_max, None
        u = t.users.get(user) if t else None
        if u and u.max_submit_jobs is not None:
            return team_max, u.max_submit_jobs
        if t and t.user_max_submit_jobs is not None:
            return team_max, t.user_max_submit_jobs
        return team_max, self.user_max_submit_jobs


def load_policy(path: str) -> PolicyConfig:
    """A policy file: the fields of PolicyConfig at the top level (or under `policy:`)."""
    data = load_yaml(path) or {}
    if isinstance(data, dict) and set(data) == {"policy"}:
        data = data["policy"]
    return validate(PolicyConfig, data, path)
