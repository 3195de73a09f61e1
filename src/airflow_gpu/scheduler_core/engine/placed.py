"""What a placement trial gives: Placed (where every replica goes) or Unplaced (why not)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .cluster import Host
from .state import ReplicaAllocation, tier_of


@dataclass
class Placed:
    allocations: list[ReplicaAllocation]

    @property
    def hosts(self) -> list[Host]:
        return list({a.host.index: a.host for a in self.allocations}.values())

    @property
    def tier(self) -> int:
        """0: one host or NVLink domain, 1: one switch, 2: across switches (what the
        slowdown depends on)."""
        return tier_of(self.allocations)


class Unplaced:
    """Why a job cannot be placed now. Explained on first read (the scheduling hot path
    seldom asks), from the state as it was: read it before changing the state."""

    def __init__(self, why: Callable[[], tuple[str, str, dict]]):
        self._explain: Callable[[], tuple[str, str, dict]] | None = why
        self._why: tuple[str, str, dict] | None = None

    def explain(self) -> tuple[str, str, dict]:
        """(code, message, details), computed once."""
        if self._why is None:
            self._why = self._explain()
            self._explain = None          # lets the trial and its state copies go
        return self._why

    @property
    def code(self) -> str:
        """Resources | Locality"""
        return self.explain()[0]

    @property
    def message(self) -> str:
        return self.explain()[1]

    @property
    def details(self) -> dict:
        return self.explain()[2]

    def __repr__(self) -> str:
        return f"Unplaced({self.code!r}, {self.message!r})"


@dataclass
class Progress:
    """How far the best failed trial got, for the pending reason."""

    domain: str = ""
    role: str = ""
    placed: int = -1
    wanted: int = 0
    free_gpus: int = 0
    hosts: int = 0
    score: int = -1           # replicas placed in that trial, all roles
