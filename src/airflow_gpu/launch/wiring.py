"""Rendezvous environment for distributed frameworks, from the admitted placement.

Every replica gets its own port: `base_port` plus its position among the job's replicas
on the same host, so replicas sharing a host (host networking) never collide.
"""

from __future__ import annotations

import json
from collections import Counter

from .replica import Replica

FRAMEWORKS = ("tensorflow-ps", "pytorch", "none")
BY_CLASS = {"tensorflow-ps": "tensorflow-ps", "pytorch": "pytorch"}


def ports(replicas: list[Replica], base_port: int) -> list[int]:
    seen: Counter[str] = Counter()
    out = []
    for r in replicas:
        out.append(base_port + seen[r.host])
        seen[r.host] += 1
    return out


def wiring(framework: str, replicas: list[Replica], base_port: int = 29500
           ) -> list[dict[str, str]]:
    """One environment per replica (in the order given)."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework: {framework!r} is not one of {', '.join(FRAMEWORKS)}")
    if framework == "none":
        return [{} for _ in replicas]
    addr = [f"{r.address}:{p}" for r, p in zip(replicas, ports(replicas, base_port),
                                                 strict=True)]
    if framework == "tensorflow-ps":
        cluster: dict[str, list[str]] = {}
        for r, a in zip(replicas, addr, strict=True):
            cluster.setdefault(r.role, []).append(a)
        return [{"TF_CONFIG": json.dumps({"cluster": cluster,
                                          "task": {"type": r.role, "index": r.index}})}
                for r in replicas]
    # pytorch (torchrun's variables): rank 0 is the first replica of the first GPU role
    order = sorted(range(len(replicas)), key=lambda i: (not replicas[i].gpus, i))
    rank = {i: n for n, i in enumerate(order)}
    master = replicas[order[0]]
    on_host = Counter(r.host for r in replicas)
    local: Counter[str] = Counter()
    out = [{} for _ in replicas]
    for i in order:
        r = replicas[i]
        out[i] = {"MASTER_ADDR": master.address,
                  "MASTER_PORT": str(base_port),
                  "WORLD_SIZE": str(len(replicas)), "RANK": str(rank[i]),
                  "LOCAL_RANK": str(local[r.host]),
                  "LOCAL_WORLD_SIZE": str(on_host[r.host]),
                  "GROUP_RANK": str(sorted(on_host).index(r.host))}
        local[r.host] += 1
    return out
