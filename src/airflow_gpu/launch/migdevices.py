"""MIG devices for a launcher: what names them to CUDA, to the NVIDIA container toolkit
and to CDI.

A granted MIG device is `{gpu, index, profile, uuid, label}` (the job API's replica
`mig`), `index` its position among its GPU's MIG devices (nvidia-smi -L's "MIG ...
Device N"). Where the node agent reported the host, the UUID (`MIG-...`) is known.
Where only the cluster file declares the layout, it is not, and each launcher resolves
the device on the host itself:
- containers: the NVIDIA toolkit takes `GPU:INDEX` in a device request and in
  NVIDIA_VISIBLE_DEVICES (`2:3`), and CDI names MIG devices `nvidia.com/gpu=GPU:INDEX`
  (nvidia-ctk's default naming); the runtime finds the device on the host;
- local processes: CUDA_VISIBLE_DEVICES needs the UUID, read from NVML on this host
  (nvmlDeviceGetMigDeviceHandleByIndex(GPU, INDEX) -> nvmlDeviceGetUUID), checked to be
  of the granted profile.

A local process is confined to its MIG devices as to its GPUs (devices.py): the cgroup
lets it open only their capability nodes. Each device's GPU instance and compute
instance ids come from NVML; the driver lists their nodes' minors under
/proc/driver/nvidia/capabilities/gpuM/mig/giG/access and .../giG/ciC/access
("DeviceFileMinor: N"), and every capability's minor in
/proc/driver/nvidia-caps/mig-minors.
"""

from __future__ import annotations

from pathlib import Path

from .devices import Caps, gpu_minors
from .handle import LaunchError

PROC_DEVICES = Path("/proc/devices")
CAPS_ROOT = Path("/proc/driver/nvidia/capabilities")
MIG_MINORS = Path("/proc/driver/nvidia-caps/mig-minors")
NOT_CONFINED = ("the process can open every MIG device's /dev/nvidia-caps node; only "
                "CUDA_VISIBLE_DEVICES hides the others")


def parent_gpus(mig: list[dict]) -> list[int]:
    """The GPUs the MIG devices are on (whose device nodes the process must open)."""
    return sorted({m["gpu"] for m in mig})


def toolkit_ids(mig: list[dict]) -> list[str]:
    """Device ids for a device request or NVIDIA_VISIBLE_DEVICES: the UUID, else GPU:INDEX."""
    return [m.get("uuid") or f"{m['gpu']}:{m['index']}" for m in mig]


def cdi_names(mig: list[dict]) -> list[str]:
    return [f"nvidia.com/gpu={m['gpu']}:{m['index']}" for m in mig]


def load_nvml():
    import pynvml

    return pynvml


def resolve_uuids(mig: list[dict], nvml=None) -> list[str]:
    """The MIG devices' UUIDs: the reported ones, the others read from NVML here."""
    missing = [m for m in mig if not m.get("uuid")]
    if not missing:
        return [m["uuid"] for m in mig]
    try:
        nvml = nvml or load_nvml()
        nvml.nvmlInit()
    except Exception as exc:          # no driver, no pynvml: nothing can resolve them
        raise LaunchError(
            f"MIG devices {', '.join(m['label'] for m in missing)} have no UUID (the "
            f"cluster file declares the layout) and NVML cannot be read on this machine "
            f"({exc}); run the node agent on the host so it reports the devices' UUIDs, or "
            "launch on the host itself") from None
    try:
        found = {}
        for m in missing:
            found[(m["gpu"], m["index"])] = _uuid_of(nvml, m)
    finally:
        nvml.nvmlShutdown()
    return [m.get("uuid") or found[(m["gpu"], m["index"])] for m in mig]


def _uuid_of(nvml, m: dict) -> str:
    from ..agent.mig import read_mig
    from ..agent.nvmlcalls import text

    h = nvml.nvmlDeviceGetHandleByIndex(m["gpu"])
    name = text(nvml.nvmlDeviceGetName(h))
    devices = read_mig(nvml, h, name, nvml.nvmlDeviceGetMemoryInfo(h).total)
    if m["index"] >= len(devices) or devices[m["index"]]["profile"] != m["profile"]:
        has = ", ".join(f"#{k} {d['profile']}" for k, d in enumerate(devices)) or "none"
        raise LaunchError(f"{m['label']}: GPU {m['gpu']} of this host has MIG devices "
                          f"{has}, not the cluster file's layout; make the cluster file's "
                          "mig layout match nvidia-smi -L, or run the node agent on the host")
    return devices[m["index"]]["uuid"]


# -- confinement: the capability nodes a replica may open ------------------------------
def caps_major() -> int | None:
    """The character major of nvidia-caps (None: no driver with MIG support here)."""
    try:
        lines = PROC_DEVICES.read_text().splitlines()
    except OSError:
        return None
    char = False
    for line in lines:
        if line.endswith("devices:"):
            char = line.startswith("Character")
        elif char and line.split()[1:] == ["nvidia-caps"]:
            return int(line.split()[0])
    return None


def _minor(path: Path) -> int:
    for line in path.read_text().splitlines():
        if line.startswith("DeviceFileMinor:"):
            return int(line.split(":", 1)[1])
    raise OSError(f"{path} names no DeviceFileMinor")


def every_minor() -> tuple[int, ...]:
    """Every MIG capability minor the driver has ({} where it lists none)."""
    try:
        return tuple(sorted({int(line.split()[-1]) for line in
                             MIG_MINORS.read_text().splitlines() if line.strip()}))
    except (OSError, ValueError):
        return ()


def instance_ids(mig: list[dict], nvml=None) -> list[tuple[int, int]]:
    """(GPU instance id, compute instance id) of each MIG device, from NVML here."""
    from ..agent.mig import read_mig
    from ..agent.nvmlcalls import text

    nvml = nvml or load_nvml()
    nvml.nvmlInit()
    try:
        found: dict[int, list[dict]] = {}
        for g in {m["gpu"] for m in mig}:
            h = nvml.nvmlDeviceGetHandleByIndex(g)
            found[g] = read_mig(nvml, h, text(nvml.nvmlDeviceGetName(h)),
                                nvml.nvmlDeviceGetMemoryInfo(h).total)
    finally:
        nvml.nvmlShutdown()
    out = []
    for m in mig:
        devices = found[m["gpu"]]
        d = devices[m["index"]] if m["index"] < len(devices) else {}
        if d.get("gpu_instance") is None or d.get("compute_instance") is None:
            raise LaunchError(f"{m['label']}: NVML shows no such MIG device on this host")
        out.append((d["gpu_instance"], d["compute_instance"]))
    return out


def caps_rule(mig: list[dict]) -> tuple[Caps | None, list[str]]:
    """The MIG capability nodes a replica may open (its devices' own), and warnings. None
    where the machine has no nvidia-caps (nothing to confine), or where the devices'
    nodes cannot be found (then a warning says the process is not confined)."""
    major = caps_major()
    if major is None:
        return None, []
    every = every_minor()
    if not mig:
        return Caps(major, (), every), []
    try:
        allowed = []
        for m, (gi, ci) in zip(mig, instance_ids(mig), strict=True):
            base = CAPS_ROOT / f"gpu{gpu_minors([m['gpu']])[0]}" / "mig" / f"gi{gi}"
            allowed += [_minor(base / "access"), _minor(base / f"ci{ci}" / "access")]
    except Exception as exc:          # no NVML, no such device, no capability file
        return None, [f"cannot find the capability nodes of MIG devices "
                      f"{', '.join(m['label'] for m in mig)} ({exc}): {NOT_CONFINED}"]
    return Caps(major, tuple(sorted(set(allowed))), every), []
