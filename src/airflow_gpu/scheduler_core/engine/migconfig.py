"""The cluster file's MIG section: which GPUs of a host entry are in MIG mode, and their
static layout (as the GPU operator's `mixed` strategy and nvidia-mig-parted declare it).

    hosts:
      - name: dgx-a-[01-04]
        model: dgx-a100
        mig:
          - {gpus: [0, 1], layout: [3g.20gb, 2g.10gb, 2g.10gb]}
          - {gpus: [2], layout: {1g.5gb: 7}}       # profile -> count

Each layout is checked against the GPU's slices (mig.place_layout). What the host's node
agent reports (MIG mode, instances, UUIDs) wins over this, as for the rest of the model;
an agent that reports nothing of MIG (declared mode) keeps this layout.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .mig import ALL_PROFILES, unknown_profile, with_layout
from .topology import Topology

MAX_INSTANCES = 7     # MIG devices one GPU may hold


class MigGroup(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpus: list[int] | Literal["all"] = Field(description="GPU indexes in MIG mode, or all")
    layout: list[str] | dict[str, int] = Field(
        description="each GPU's MIG devices: a list of profiles ([3g.40gb, 2g.20gb, "
        "2g.20gb]) or profile -> count ({1g.10gb: 7})")

    @field_validator("gpus")
    @classmethod
    def _indexes(cls, v):
        if isinstance(v, list):
            if not v:
                raise ValueError("no GPU given; list GPU indexes such as [0, 1], or all")
            bad = [g for g in v if g < 0]
            if bad:
                raise ValueError(f"{bad[0]} is not a GPU index; GPU indexes start at 0")
        return v

    @field_validator("layout")
    @classmethod
    def _profiles(cls, v):
        names = list(v) if isinstance(v, dict) else v
        if not names:
            raise ValueError("an empty layout; give the GPU's MIG devices, e.g. "
                             "[3g.40gb, 2g.20gb, 2g.20gb]")
        for name in names:
            if name not in ALL_PROFILES:
                raise ValueError(unknown_profile(name))
        if isinstance(v, dict):
            for name, n in v.items():
                if isinstance(n, bool) or not 1 <= n <= MAX_INSTANCES:
                    raise ValueError(f"{name}: {n!r} devices; give 1 to {MAX_INSTANCES}")
        elif len(v) > MAX_INSTANCES:
            raise ValueError(f"{len(v)} devices; a GPU holds at most {MAX_INSTANCES}")
        return v

    def profiles(self) -> list[str]:
        if isinstance(self.layout, dict):
            return [name for name, n in self.layout.items() for _ in range(n)]
        return list(self.layout)


def apply_groups(topo: Topology, groups: list[MigGroup]) -> Topology:
    """The model with the groups' GPUs in MIG mode; ValueError('mig[k]...: why; fix')."""
    layouts: dict[int, list[str]] = {}
    where: dict[int, int] = {}
    indexes = [g.index for g in topo.gpus]
    for k, group in enumerate(groups):
        gpus = indexes if group.gpus == "all" else group.gpus
        for g in gpus:
            if g not in indexes:
                raise ValueError(f"mig[{k}].gpus: the model {topo.model} has no GPU {g} "
                                 f"(GPUs 0-{len(indexes) - 1})")
            if g in where:
                raise ValueError(f"mig[{k}].gpus: GPU {g} is in mig[{where[g]}] too; give "
                                 "each GPU one layout")
            where[g] = k
            layouts[g] = group.profiles()
    try:
        return with_layout(topo, layouts)
    except ValueError as exc:
        k = next((where[g] for g in sorted(where) if f"GPU {g} " in str(exc)), 0)
        raise ValueError(f"mig[{k}].layout: {exc}") from None


def declared_layouts(topo: Topology) -> dict[int, list[str]]:
    """The MIG layouts a model carries (GPU -> profiles), as apply_groups gave them."""
    return {g.index: [i.profile for i in g.mig_instances] for g in topo.gpus
            if g.mig_mode and g.mig_instances}
