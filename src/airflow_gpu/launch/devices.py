"""Which NVIDIA GPU device nodes a local replica may open, as Slurm's ConstrainDevices.

Every GPU is a character device of major 195: /dev/nvidiaN is minor N's node for N in
0..253; 254 is /dev/nvidia-modeset and 255 /dev/nvidiactl, which every CUDA process opens
(as /dev/nvidia-uvm*, another major), so they stay allowed. A replica may open its own
GPUs' minors and no other GPU's, whatever it does with CUDA_VISIBLE_DEVICES:

- cgroup v1: `devices.deny` of `c 195:N rwm` for every GPU minor not granted, in the
  replica's `devices` cgroup (a child never gets more than its parent allows);
- cgroup v2: a BPF_PROG_TYPE_CGROUP_DEVICE program attached to the replica's cgroup with
  BPF_F_ALLOW_MULTI (so programs of the cgroups above still apply), loaded with the bpf
  syscall through ctypes.

A GPU's minor number comes from NVML (`nvmlDeviceGetMinorNumber`) on a machine with the
driver; without it the minor is taken to be the GPU's index, as on DGX systems with the
default driver setup (and on a simulated host, which has no GPU to open).

MIG devices get the same rule (`Caps`): a process uses a MIG device by opening its GPU's
node and the device's capability nodes, /dev/nvidia-caps/nvidia-capN (the major of
`nvidia-caps` in /proc/devices), one for its GPU instance and one for its compute
instance. A replica may open its own MIG devices' capability minors and no other
(migdevices.py finds them); one without MIG devices may open none.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

NVIDIA_MAJOR = 195
GPU_MINORS = range(254)         # /dev/nvidia0..253; 254 nvidia-modeset, 255 nvidiactl
NOT_CONFINED = ("the process can open every GPU's device node; only "
                "CUDA_VISIBLE_DEVICES hides the others")


class Caps(NamedTuple):
    """The MIG capability nodes a replica may open: of major `major` (nvidia-caps), only
    `allowed`; `every` lists the capability minors the driver has (for v1's deny rules)."""

    major: int
    allowed: tuple[int, ...]
    every: tuple[int, ...]


def minors_from_nvml(nvml) -> dict[int, int]:
    """GPU index -> device minor number of every GPU NVML sees ({} without the driver)."""
    error = getattr(nvml, "NVMLError", Exception)
    try:
        nvml.nvmlInit()
    except (error, OSError):
        return {}
    try:
        return {i: int(nvml.nvmlDeviceGetMinorNumber(nvml.nvmlDeviceGetHandleByIndex(i)))
                for i in range(nvml.nvmlDeviceGetCount())}
    except (error, OSError):
        return {}
    finally:
        nvml.nvmlShutdown()


@functools.cache
def _this_machine() -> dict[int, int]:
    try:
        import pynvml
    except ImportError:
        return {}
    return minors_from_nvml(pynvml)


def gpu_minors(gpus: Iterable[int], known: dict[int, int] | None = None) -> list[int]:
    """The device minors of host GPU indices: NVML's where it knows the GPU (`known`, by
    default this machine's), else the index."""
    known = _this_machine() if known is None else known
    return sorted(known.get(g, g) for g in gpus)


# -- cgroup v1 ----------------------------------------------------------------------------
def deny_rules(allowed: Iterable[int], caps: Caps | None = None) -> list[str]:
    """`devices.deny` lines for every GPU minor not in `allowed` (and every MIG capability
    minor not in `caps.allowed`), one rule per write."""
    keep = set(allowed)
    rules = [f"c {NVIDIA_MAJOR}:{m} rwm" for m in GPU_MINORS if m not in keep]
    if caps is not None:
        rules += [f"c {caps.major}:{m} rwm" for m in caps.every if m not in caps.allowed]
    return rules


def open_minors_v1(devices_list: str, allowed: Iterable[int]) -> list[str]:
    """Entries of a v1 `devices.list` that still let a GPU outside `allowed` be opened.
    A cgroup that allows all by default lists only `a *:* rwm` (its denials are not
    listed); one that denies by default lists what it allows, where a wildcard such as
    `c 195:* rwm` (a container run with --device-cgroup-rule) cannot be narrowed by deny
    rules of single minors."""
    lines = devices_list.split()
    if lines == ["a", "*:*", "rwm"]:
        return []
    keep, found = set(allowed), []
    for line in filter(None, map(str.strip, devices_list.splitlines())):
        kind, number, access = line.split()
        major, minor = number.split(":")
        if kind in ("a", "c") and major in ("*", str(NVIDIA_MAJOR)) and set(access) & set("rw") \
                and (minor == "*" or (int(minor) in GPU_MINORS and int(minor) not in keep)):
            found.append(line)
    return found


# -- cgroup v2: a device program ----------------------------------------------------------
BPF_SYSCALL = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351}
BPF_PROG_LOAD, BPF_PROG_ATTACH = 5, 8
BPF_PROG_TYPE_CGROUP_DEVICE, BPF_CGROUP_DEVICE, BPF_F_ALLOW_MULTI = 15, 6, 2
BPF_DEVCG_DEV_CHAR = 2


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def device_program(allowed: Iterable[int], caps: Caps | None = None) -> bytes:
    """eBPF for `struct bpf_cgroup_dev_ctx {u32 access_type; u32 major; u32 minor;}`:
    returns 0 (deny) for a character device of major 195 whose minor is a GPU's and not
    in `allowed`, and for one of major `caps.major` whose minor is not in `caps.allowed`;
    1 (allow) for everything else."""
    deny = [_insn(0xB7, 0, imm=0), _insn(0x95)]      # r0 = 0: deny; exit
    code: list = [
        _insn(0x61, 2, 1, 0),                   # r2 = ctx->access_type
        _insn(0x54, 2, imm=0xFFFF),             # w2 &= 0xffff: the device type
        ("jne", 2, BPF_DEVCG_DEV_CHAR, "allow"),   # not a character device: allow
        _insn(0x61, 3, 1, 4),                   # r3 = ctx->major
        _insn(0x61, 4, 1, 8),                   # r4 = ctx->minor
        *((("jeq", 3, caps.major, "caps"),) if caps else ()),
        ("jne", 3, NVIDIA_MAJOR, "allow"),
        ("jgt", 4, GPU_MINORS[-1], "allow"),    # nvidia-modeset, nvidiactl: allow
        *(("jeq", 4, m, "allow") for m in sorted(set(allowed))),
        *deny,
    ]
    labels = {}
    if caps:
        labels["caps"] = len(code)
        code += [*(("jeq", 4, m, "allow") for m in sorted(set(caps.allowed))), *deny]
    labels["allow"] = len(code)
    code += [_insn(0xB7, 0, imm=1), _insn(0x95)]     # r0 = 1: allow; exit
    ops = {"jne": 0x55, "jgt": 0x25, "jeq": 0x15}    # BPF_JMP | op | BPF_K
    return b"".join(_insn(ops[i[0]], i[1], off=labels[i[3]] - pc - 1, imm=i[2])
                    if isinstance(i, tuple) else i for pc, i in enumerate(code))


def _bpf(cmd: int, attr: bytes) -> int:
    number = BPF_SYSCALL.get(platform.machine())
    if number is None:
        raise OSError(f"no bpf system call number known for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    buf = ctypes.create_string_buffer(attr, len(attr))
    result = libc.syscall(ctypes.c_long(number), ctypes.c_int(cmd), buf,
                          ctypes.c_uint(len(attr)))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def attach_program(group: Path, allowed: Iterable[int], caps: Caps | None = None) -> None:
    """Load the device program and attach it to the v2 cgroup `group` (the cgroup keeps
    it until it is removed). Raises OSError, with the verifier's log when it refuses."""
    code = device_program(allowed, caps)
    insns = ctypes.create_string_buffer(code, len(code))
    license_ = ctypes.create_string_buffer(b"Apache-2.0")
    log = ctypes.create_string_buffer(16384)
    # union bpf_attr for BPF_PROG_LOAD, up to expected_attach_type
    attr = struct.pack("<IIQQIIQII16sII", BPF_PROG_TYPE_CGROUP_DEVICE, len(code) // 8,
                       ctypes.addressof(insns), ctypes.addressof(license_), 1, len(log),
                       ctypes.addressof(log), 0, 0, b"airflow_gpu_dev", 0, 0)
    try:
        prog = _bpf(BPF_PROG_LOAD, attr)
    except OSError as exc:
        detail = log.value.decode(errors="replace").strip()
        raise OSError(exc.errno, f"{exc.strerror}{': ' + detail if detail else ''}") from None
    try:
        target = os.open(group, os.O_RDONLY | os.O_DIRECTORY)
        try:
            _bpf(BPF_PROG_ATTACH, struct.pack("<IIIII", target, prog, BPF_CGROUP_DEVICE,
                                              BPF_F_ALLOW_MULTI, 0))
        finally:
            os.close(target)
    finally:
        os.close(prog)
