"""Small helpers around an NVML module (pynvml, or a fake with the same API)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

WORD_BITS = 64          # pynvml returns affinity masks as arrays of c_ulonglong


def optional(nvml, fn: Callable, *args) -> Any:
    """`fn(*args)`, or None where this GPU, driver or NVML build does not offer it."""
    try:
        return fn(*args)
    except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound,
            nvml.NVMLError_InvalidArgument, nvml.NVMLError_NoPermission):
        return None


def mask_bits(words) -> list[int]:
    """The set bits of an affinity array (CPU ids or NUMA node ids)."""
    return [w * WORD_BITS + b for w, word in enumerate(words) for b in range(WORD_BITS)
            if int(word) >> b & 1]


def text(value: str | bytes) -> str:
    """nvidia-ml-py returns str in recent versions and bytes in older ones."""
    return value.decode() if isinstance(value, bytes) else value
