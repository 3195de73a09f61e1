"""GPUs that are wearing out: their correctable ECC or NVLink error counters rose within
WINDOW, or they are thermally throttled now. Such a GPU stays schedulable; the engine's
health scorer steers long jobs away from it first (placement only; a hard fault is
health's business, agent/health.py)."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from ..store.models import GpuRow

WINDOW = timedelta(hours=24)


def wear(row: GpuRow, g: dict, now: datetime) -> None:
    """Take a report's counters; a counter that grew marks when it rose (a counter that
    fell was reset with the driver: nothing rose)."""
    for key, rose in (("ecc_corrected_total", "ecc_rose_at"),
                      ("nvlink_errors_total", "nvlink_rose_at")):
        if key not in g or g[key] is None:
            continue
        before = getattr(row, key)
        if before is not None and g[key] > before:
            setattr(row, rose, now)
        setattr(row, key, g[key])


def reasons(row: GpuRow, now: datetime) -> list[str]:
    from .common import _ts

    out = []
    cutoff = _ts(now - WINDOW)
    if row.ecc_rose_at is not None and _ts(row.ecc_rose_at) >= cutoff:
        out.append(f"correctable ECC errors rising ({row.ecc_corrected_total} so far)")
    if row.nvlink_rose_at is not None and _ts(row.nvlink_rose_at) >= cutoff:
        out.append(f"NVLink errors rising ({row.nvlink_errors_total} so far)")
    if row.thermal_throttle:
        out.append("thermal throttling")
    return out


def worn_gpus(s: Session, now: datetime) -> dict[str, dict[int, str]]:
    """host -> {GPU index: why it is worn} of healthy GPUs that are worn."""
    out: dict[str, dict[int, str]] = {}
    cutoff = now - WINDOW
    for row in s.scalars(select(GpuRow).where(GpuRow.healthy.is_(True), or_(
            GpuRow.thermal_throttle.is_(True), GpuRow.ecc_rose_at >= cutoff,
            GpuRow.nvlink_rose_at >= cutoff))):
        why = reasons(row, now)
        if why:
            out.setdefault(row.host, {})[row.index] = "; ".join(why)
    return out
