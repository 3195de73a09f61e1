"""When a waiting job's pending reason has changed enough to be logged again.

A launcher that polls a pending job (`airflow-gpu run`, the Airflow trigger) logs its
reason once, then again only when its code, the jobs it waits for (blockers) or the
placement planned for it change. The message itself is no key: it counts down ("waits
12m for ...", "reserve_after (3m from now)") and so differs at every scheduling pass."""

from __future__ import annotations

# details that name the jobs it waits for (as the service's blocker_ids reads them)
BLOCKERS = ("held_by", "mig_held_by", "reservation_for", "behind", "victims", "waits_for")
# details that say where it is planned to start
PLACEMENT = ("reserved_hosts", "reserved_gpus")


def _frozen(value):
    """A detail as something hashable and order-free: the names of a mapping, a sorted
    tuple of a list."""
    if isinstance(value, dict):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    if isinstance(value, list | tuple | set):
        return tuple(sorted((_frozen(v) for v in value), key=repr))
    return value


def reason_key(job: dict) -> tuple:
    """What must change for a waiting job's reason to be logged again: its state, the
    reason's code, its blockers (by id) and its planned placement."""
    why = job.get("pending") or {}
    details = why.get("details") or {}
    blockers = []
    for key in BLOCKERS:
        value = details.get(key)
        if isinstance(value, dict):
            blockers += map(str, value)           # holder -> GPUs or devices it holds
        elif isinstance(value, list):
            blockers += map(str, value)
        elif value is not None:
            blockers.append(str(value))
    placement = tuple((key, _frozen(details.get(key))) for key in PLACEMENT
                      if details.get(key) is not None)
    return job.get("state"), why.get("code"), tuple(sorted(set(blockers))), placement
