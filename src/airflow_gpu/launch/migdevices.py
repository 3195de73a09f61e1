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
"""

from __future__ import annotations

from .handle import LaunchError


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
