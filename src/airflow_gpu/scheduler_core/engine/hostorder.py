"""The hosts of a domain in the order a gang fill (trial.Trial.fill) ranks them, kept for
the whole fill. Ranking every candidate for every replica made a fill O(hosts x the gang's
hosts): 2.7 s for a 512-host gang on 8,192 hosts. Of a host's rank only two parts change
during a fill: whether its switch already holds the job (`switches`), and, with `pack`,
the parts that depend on how many replicas are left (`target`), which are the same for
hosts that can take the same number of replicas (`n`). So the hosts are grouped by `n`,
each group sorted once by the parts that stay, and indexed by switch; a choice looks at
the head of each group and of each of the job's switches: the same host as ranking them
all, in time that does not grow with the domain."""

from __future__ import annotations

from .cluster import Host


class _Group:
    """The hosts that can take `n` replicas, best first by the rank's fixed parts."""

    def __init__(self, n: int, hosts: list[tuple[tuple, Host]]):
        self.n = n
        hosts.sort(key=lambda x: x[0])
        self.hosts = hosts
        self.at = 0
        self.by_switch: dict[tuple[str, str], list[tuple[tuple, Host]]] = {}
        for x in hosts:
            self.by_switch.setdefault(x[1].switch_key, []).append(x)
        self.switch_at = dict.fromkeys(self.by_switch, 0)

    def head(self, taken) -> tuple[tuple, Host] | None:
        self.at = _skip(self.hosts, self.at, taken)
        return self.hosts[self.at] if self.at < len(self.hosts) else None

    def head_in(self, switches, taken) -> tuple[tuple, Host] | None:
        best = None
        for sw in switches:
            hosts = self.by_switch.get(sw)
            if hosts is None:
                continue
            at = self.switch_at[sw] = _skip(hosts, self.switch_at[sw], taken)
            if at < len(hosts) and (best is None or hosts[at][0] < best[0]):
                best = hosts[at]
        return best


def _skip(hosts: list[tuple[tuple, Host]], at: int, taken) -> int:
    # a host used or full stays so for the rest of the fill
    while at < len(hosts) and taken(hosts[at][1].index):
        at += 1
    return at


class HostOrder:
    """`cands`: (replicas the host could take, host); `fixed(h)`: the rank's parts that do
    not change during a fill, as (score, level, usable GPUs, index) (see Trial._choose)."""

    def __init__(self, cands: list[tuple[int, Host]], fixed):
        groups: dict[int, list[tuple[tuple, Host]]] = {}
        for n, h in cands:
            groups.setdefault(n, []).append((fixed(h), h))
        self.groups = [_Group(n, hosts) for n, hosts in groups.items()]

    def choose(self, target: int, switches: set, used: dict, full: set) -> Host | None:
        """The host Trial._choose's rank puts first among those neither used nor full."""
        def taken(i: int) -> bool:
            return i in used or i in full

        heads = [(g, h) for g in self.groups if (h := g.head(taken)) is not None]
        if not heads:
            return None
        fitting = any(g.n >= target for g, _ in heads)
        best = None
        for g, (key, host) in heads:
            inside = False
            if switches and host.switch_key not in switches:
                other = g.head_in(switches, taken)
                # the job's own switches come second in the rank, after the score
                if other is not None and other[0][0] <= key[0]:
                    key, host, inside = other[0], other[1], True
            else:
                inside = bool(switches)
            score, level, usable, index = key
            n = g.n
            rank = (score, bool(switches) and not inside, n < target, level,
                    n if fitting else -n, usable, index)
            if best is None or rank < best[0]:
                best = (rank, host)
        return best[1]
