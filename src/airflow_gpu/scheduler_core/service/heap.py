"""The leader's state is a large heap (at 50,000 pending, millions of objects: parsed
specs, the engine's queue and cluster state). Python's garbage collector walks the whole
oldest generation when enough objects have reached it since its last walk (a quarter of
those there): each pass's reasons reach it before they are freed, so every few seconds
it paused the process for about a second, in a scheduling pass most often.

So, after each walk of the oldest generation, what survived it is frozen (`gc.freeze`):
later walks see only the objects that came since. Objects frozen are still freed when
their last reference goes; only one in a reference cycle would stay, so every
`THAW_EVERY` seconds the frozen objects are thawed, and the next walk (one long one)
collects such cycles and freezes again."""

from __future__ import annotations

import gc
import time

THAW_EVERY = 600.0          # seconds between walks of the whole heap
_state = {"installed": False, "thawed": time.monotonic()}


def _after_walk(phase: str, info: dict) -> None:
    if phase == "stop" and info["generation"] == 2:
        gc.freeze()             # what lives now: out of the next walks


def keep_walks_short() -> None:
    """Freeze after each walk of the oldest generation (once per process)."""
    if not _state["installed"]:
        _state["installed"] = True
        gc.callbacks.append(_after_walk)


def thaw_now_and_then(now: float | None = None) -> bool:
    """Thaw the frozen objects once every THAW_EVERY seconds (the next walk collects
    cycles among them); returns whether it did."""
    now = time.monotonic() if now is None else now
    if now - _state["thawed"] < THAW_EVERY:
        return False
    _state["thawed"] = now
    gc.unfreeze()
    return True
