"""The cluster file: hosts (with name ranges), their model, rack and switch."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..errors import InputError, load_yaml, validate
from .hosttype import HostType, host_type
from .migconfig import MigGroup, apply_groups
from .topology import load_topology

_RANGE_RE = re.compile(r"\[([^\]]+)\]")
_DOMAIN_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}")
_DIGITS = re.compile(r"[0-9]{1,18}")
# a host name as agents register it and the API's /hosts/{name} routes take it
_HOST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")
# The most names one `name:` pattern may expand to: more hosts than any cluster has, and
# few enough that a slip (`n[1-10000000]`) is refused at once instead of hanging.
MAX_HOST_NAMES = 100_000


def _show(text: str) -> str:
    return repr(text) if len(text) <= 60 else repr(f"{text[:57]}...")


def _ranges(pattern: str) -> list[tuple[re.Match, list[tuple[int, int, int]]]]:
    """The `[...]` groups of a pattern: (match, [(first, last, zero-padded width)])."""
    groups = []
    for m in _RANGE_RE.finditer(pattern):
        parts = []
        for part in m.group(1).split(","):
            lo, _, hi = part.strip().partition("-")
            if not _DIGITS.fullmatch(lo) or (hi and not _DIGITS.fullmatch(hi)):
                raise ValueError(f"bad host range {_show(part)} in {_show(pattern)}; write e.g. "
                                 "dgx-[01-16] or n[1-2,5]")
            if hi and int(hi) < int(lo):
                raise ValueError(f"host range {_show(part)} in {_show(pattern)} runs backwards")
            parts.append((int(lo), int(hi or lo), len(lo) if lo.startswith("0") else 0))
        groups.append((m, parts))
    rest = _RANGE_RE.sub("", pattern)
    if "[" in rest or "]" in rest:
        raise ValueError(f"host range in {_show(pattern)} is not closed (or is empty): each '[' "
                         "needs its ']' and numbers between; write e.g. dgx-[01-16]")
    count = 1
    for _, parts in groups:
        count *= sum(last - first + 1 for first, last, _ in parts)
    if count > MAX_HOST_NAMES:
        raise ValueError(f"host range {_show(pattern)} names {count:,} hosts, over the most one "
                         f"entry may name ({MAX_HOST_NAMES:,}); check the range, or split it "
                         "over several entries")
    return groups


def _why_not_host(name: str) -> str:
    if len(name) > 200:
        return f"{len(name)} characters"
    if not _HOST_RE.fullmatch(name[:1] or "-"):
        return f"it starts with {name[:1]!r}" if name else "it is empty"
    c = next(c for c in name if not _HOST_RE.fullmatch("a" + c))
    return "it holds a space" if c == " " else f"it holds {c!r} (U+{ord(c):04X})"


def expand_hostnames(pattern: str) -> list[str]:
    """`dgx-a-[01-16]` -> dgx-a-01 .. dgx-a-16; `n[1-2,5]` -> n1, n2, n5. Padding is kept.
    Several ranges multiply (`r[1-2]n[1-3]`: 6 names), at most MAX_HOST_NAMES in all."""
    names = [""]
    end = 0
    for m, parts in _ranges(pattern):
        head = pattern[end:m.start()]
        values = [str(i).zfill(width) for first, last, width in parts
                  for i in range(first, last + 1)]
        names = [f"{n}{head}{v}" for n in names for v in values]
        end = m.end()
    return [f"{n}{pattern[end:]}" for n in names]


class HostEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description="host name or a range such as dgx-a-[01-16]")
    model: str = Field(description="built-in model name or path to a gpu-topology/v1 file")
    rack: str = "default"
    switch: str = Field("default", description="leaf / top-of-rack switch")
    nvlink_domain: str | None = Field(None, description="multi-node NVLink domain (a GB200 "
                                      "NVL72 rack): hosts naming the same one share an "
                                      "NVLink fabric")
    docker_url: str | None = None
    address: str | None = Field(None, description="address other hosts reach this one at "
                                "(rendezvous of distributed jobs); default: the host name")
    labels: dict[str, str] = {}
    mig: list[MigGroup] | None = Field(None, description="GPUs in MIG mode and their "
                                       "layout (migconfig.py), e.g. [{gpus: [0, 1], layout: "
                                       "[3g.40gb, 2g.20gb, 2g.20gb]}]")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        bad = next((n for n in expand_hostnames(v) if not _HOST_RE.fullmatch(n)), None)
        if bad is not None:
            raise ValueError(f"{_show(bad)} is not a host name: {_why_not_host(bad)}; use "
                             "ASCII letters, digits and . _ - (a letter or digit first, at "
                             "most 200), e.g. dgx-a-01, as the host's agent registers it")
        return v

    @field_validator("mig", mode="before")
    @classmethod
    def _one_group(cls, v):
        return [v] if isinstance(v, dict) else v

    @field_validator("nvlink_domain")
    @classmethod
    def _domain(cls, v: str | None) -> str | None:
        if v is not None and not _DOMAIN_RE.fullmatch(v):
            raise ValueError(f"{_show(v)} is not an NVLink domain name; use letters, digits "
                             "and . _ : / - (at most 200), e.g. nvl72-rack-1, or leave "
                             "nvlink_domain out for a host whose NVLink ends at the host")
        return v


class ClusterFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cluster: str = "cluster"
    hosts: list[HostEntry] = Field(description="may be empty: node agents register hosts")


@dataclass(eq=False)
class Host:
    index: int
    name: str
    type: HostType
    rack: str
    switch: str
    docker_url: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    address: str | None = None
    nvlink_domain: str | None = None     # hosts sharing one share an NVLink fabric

    @property
    def switch_key(self) -> tuple[str, str]:
        # Switch names are only unique within a rack in some sites.
        return (self.rack, self.switch)


@dataclass(eq=False)
class Cluster:
    name: str
    hosts: list[Host]

    def __post_init__(self) -> None:
        self.by_name = {h.name: h for h in self.hosts}
        self.switches: dict[tuple[str, str], list[Host]] = {}
        self.racks: dict[str, list[Host]] = {}
        # multi-node NVLink domains (only hosts that name one; others are their own)
        self.nvlink_domains: dict[str, list[Host]] = {}
        self.max_host_gpus = max((h.type.n_gpus for h in self.hosts), default=0)
        self.total_gpus = sum(h.type.n_gpus for h in self.hosts)
        for h in self.hosts:
            self.switches.setdefault(h.switch_key, []).append(h)
            self.racks.setdefault(h.rack, []).append(h)
            if h.nvlink_domain is not None:
                self.nvlink_domains.setdefault(h.nvlink_domain, []).append(h)


def build_cluster(spec: ClusterFile, base_dir: Path | None = None, source: str = "") -> Cluster:
    hosts: list[Host] = []
    seen: set[str] = set()
    for i, entry in enumerate(spec.hosts):
        try:
            topo = load_topology(entry.model, base_dir)
        except InputError as exc:
            raise InputError(f"hosts[{i}].model: {exc}", source or None) from None
        if entry.mig:
            try:
                topo = apply_groups(topo, entry.mig)
            except ValueError as exc:
                raise InputError(f"hosts[{i}].{exc}", source or None) from None
        htype = host_type(topo)
        for name in expand_hostnames(entry.name):
            if name in seen:
                raise InputError(f"hosts[{i}].name: host {name!r} is declared twice; "
                                 "each host name must be unique", source or None)
            seen.add(name)
            hosts.append(Host(len(hosts), name, htype, entry.rack, entry.switch,
                              entry.docker_url, dict(entry.labels),
                              entry.address, entry.nvlink_domain))
    cluster = Cluster(spec.cluster, hosts)
    check_nvlink_domains(cluster, spec, source)
    return cluster


def check_nvlink_domains(cluster: Cluster, spec: ClusterFile, source: str = "") -> None:
    """Each NVLink domain holds hosts whose model has NVLink beyond the host, and no more
    GPUs than the smallest such model says a domain has."""
    entry_of: dict[str, int] = {}
    for i, entry in enumerate(spec.hosts):
        for name in expand_hostnames(entry.name):
            entry_of[name] = i
    for domain, hosts in cluster.nvlink_domains.items():
        for h in hosts:
            if h.type.topo.nvlink.domain_gpus is None:
                raise InputError(
                    f"hosts[{entry_of[h.name]}].nvlink_domain: {domain!r} is set on host "
                    f"{h.name!r}, but its model {h.type.model} has no NVLink beyond the host "
                    "(nvlink.domain_gpus is not set); leave nvlink_domain out, or use a host "
                    "model whose nvlink declares domain_gpus (e.g. gb200-nvl72-tray)",
                    source or None)
        limit = min(h.type.topo.nvlink.domain_gpus for h in hosts)
        gpus = sum(h.type.n_gpus for h in hosts)
        if gpus > limit:
            last = hosts[-1]
            raise InputError(
                f"hosts[{entry_of[last.name]}].nvlink_domain: {domain!r} holds {gpus} GPUs on "
                f"{len(hosts)} hosts, but an NVLink domain of {last.type.model} holds at most "
                f"{limit}; split the hosts over more domains (e.g. one per rack)",
                source or None)


def builtin_cluster_path(name: str) -> Path | None:
    from importlib import resources

    path = Path(str(resources.files(__package__) / "clusters" / f"{name}.yaml"))
    return path if path.exists() else None


def load_cluster(path_or_name: str | Path) -> Cluster:
    """A cluster file by path, or a built-in cluster by name (`example`)."""
    path = Path(path_or_name)
    if not path.exists() and (builtin := builtin_cluster_path(str(path_or_name))):
        path = builtin
    spec = validate(ClusterFile, load_yaml(path), str(path))
    return build_cluster(spec, path.parent, str(path))


def synthetic_cluster(n_hosts: int, models: str | tuple[str, ...] = "dgx-a100",
                      hosts_per_switch: int = 16, switches_per_rack: int = 4) -> Cluster:
    """`n_hosts` hosts of built-in models, `hosts_per_switch` per leaf switch and
    `switches_per_rack` switches per rack; with several models, they alternate by switch."""
    models = (models,) if isinstance(models, str) else models
    for what, n in (("hosts", n_hosts), ("hosts per switch", hosts_per_switch),
                    ("switches per rack", switches_per_rack)):
        if n < 1:
            raise InputError(f"{what}: {n} is not a positive number; give at least 1")
    width = len(str(n_hosts))
    entries = []
    for s, lo in enumerate(range(1, n_hosts + 1, hosts_per_switch)):
        hi = min(lo + hosts_per_switch - 1, n_hosts)
        model = models[s % len(models)]
        entries.append({"name": f"{model}-[{lo:0{width}d}-{hi:0{width}d}]", "model": model,
                        "rack": f"rack-{s // switches_per_rack + 1}", "switch": f"leaf-{s + 1}"})
    spec = validate(ClusterFile, {"cluster": f"{n_hosts}x{'+'.join(models)}", "hosts": entries},
                    "--model")
    return build_cluster(spec, source="--model")


# Slowdown tiers of a placement: what the locality slowdown depends on (timemodel.py).
# Hosts of one multi-node NVLink domain talk over NVLink at the bandwidth GPUs of one host
# have, so a gang inside one domain is on tier 0 like a gang on one host.
TIERS = ("one host or NVLink domain", "one switch", "across switches")


def tier_of_hosts(hosts: Iterable[Host]) -> int:
    """0: one host (or none) or one NVLink domain, 1: several hosts under one switch,
    2: across switches."""
    indexes, switches, domains = set(), set(), set()
    for h in hosts:
        indexes.add(h.index)
        switches.add(h.switch_key)
        domains.add(h.nvlink_domain)
    if len(indexes) <= 1 or (len(domains) == 1 and None not in domains):
        return 0
    return 1 if len(switches) == 1 else 2
