"""`airflow-gpu agent` (run the node agent on a host) and `airflow-gpu topo` (print a host
model as `nvidia-smi topo -m` would)."""

from __future__ import annotations

import argparse
from pathlib import Path

FLAGS = ("server", "token", "name", "rack", "switch", "docker_url", "address", "interval",
         "declared", "max_temperature", "telemetry", "dcgm_exporter")


def _config(args: argparse.Namespace):
    """The agent's settings: the --config file, with the flags given on top. Without a
    name: $AIRFLOW_GPU_LOCAL_HOST (the name the local runner of an Airflow worker on this
    machine knows it by), else the short host name."""
    import os
    import socket

    from ..scheduler_core.errors import validate
    from .config import AgentConfig, load_config

    config = load_config(args.config) if args.config else AgentConfig()
    given = {k: getattr(args, k) for k in FLAGS if getattr(args, k) is not None}
    merged = validate(AgentConfig, {**config.model_dump(exclude_unset=True), **given},
                      "flags")
    if not merged.name:
        here = os.environ.get("AIRFLOW_GPU_LOCAL_HOST", "").strip()
        if here and here != "*":      # * is the local runner's "any host" (simulation)
            merged = validate(AgentConfig, {**merged.model_dump(exclude_unset=True),
                                            "name": here}, "AIRFLOW_GPU_LOCAL_HOST")
        else:
            merged = merged.model_copy(update={"name": socket.gethostname().split(".")[0]})
    return merged


def _source(config, args: argparse.Namespace, nvml=None, dcgm=None):
    from .telemetry import make_source

    return make_source(config, Path(args.sysfs), Path(args.procfs), nvml, dcgm)


def _diag(args: argparse.Namespace, nvml=None, dcgm=None) -> int:
    """`airflow-gpu agent --diag GPU`: DCGM's diagnostic on one GPU of this host (its
    nvidia-smi index), printed; exit status 0 when it passed, 1 when not."""
    from ..scheduler_core.errors import InputError
    from .dcgm_bindings import DcgmError, DcgmTelemetry, PyDcgm, missing_bindings
    from .source import load_nvml
    from .telemetry import discover_host

    if args.diag_level not in (1, 2, 3, 4):
        raise InputError(f"--diag-level: {args.diag_level} is not a level; use 1 (quick) "
                         "to 4 (longest), as dcgmi diag -r")
    try:
        api = (dcgm or PyDcgm)()
    except DcgmError as exc:
        raise missing_bindings(str(exc), "--diag") from None
    try:
        topo = discover_host(nvml or load_nvml(), Path(args.sysfs), Path(args.procfs), None)
        if not any(g.index == args.diag for g in topo.gpus):
            raise InputError(f"--diag: this host has no GPU {args.diag}; its GPUs are "
                             f"{', '.join(str(g.index) for g in topo.gpus)}")
        passed, report = DcgmTelemetry(api, topo).diagnose(args.diag, args.diag_level)
    except DcgmError as exc:
        raise InputError(f"--diag: DCGM did not answer ({exc}); is nv-hostengine "
                         "running?") from None
    finally:
        api.close()
    print(report)
    print(f"GPU {args.diag}: DCGM diagnostic level {args.diag_level} "
          f"{'passed' if passed else 'FAILED'}")
    return 0 if passed else 1


def cmd_agent(args: argparse.Namespace, nvml=None, dcgm=None) -> int:
    import logging
    import signal
    import threading

    from ..scheduler_core.client import Client
    from .run import Agent

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.diag is not None:
        return _diag(args, nvml, dcgm)
    config = _config(args)
    source = _source(config, args, nvml, dcgm)
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        with Client(config.server, config.token) as client:
            return Agent(config, source, client).run(stop, once=args.once)
    except KeyboardInterrupt:
        return 0
    finally:
        source.close()


def cmd_topo(args: argparse.Namespace, nvml=None) -> int:
    import yaml

    from .topoprint import topo_text

    if args.model == "discovered":
        from .source import NvmlSource, load_nvml

        source = NvmlSource(nvml or load_nvml(), Path(args.sysfs), Path(args.procfs))
        topo = source.topology
        source.close()
    else:
        from ..scheduler_core.engine.topology import load_topology

        topo = load_topology(args.model)
    if args.yaml:
        print(yaml.safe_dump(topo.document(), sort_keys=False, width=120), end="")
    else:
        print(topo_text(topo))
    return 0


def _host_paths(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sysfs", default="/sys", help=argparse.SUPPRESS)
    p.add_argument("--procfs", default="/proc", help=argparse.SUPPRESS)


def add_commands(sub) -> None:
    a = sub.add_parser("agent", help="run the node agent: discover this host with NVML, "
                       "register it, heartbeat GPU health and utilization")
    a.add_argument("--server", help="the service (default $AIRFLOW_GPU_URL or "
                   "http://127.0.0.1:8080)")
    a.add_argument("--token", help="the host's agent token, from airflow-gpu token create --agent "
                   "--host NAME (default $AIRFLOW_GPU_TOKEN)")
    a.add_argument("--name", help="this host's name in the cluster (default: "
                   "$AIRFLOW_GPU_LOCAL_HOST, else the short hostname)")
    a.add_argument("--rack", help="rack of a host the cluster file does not list")
    a.add_argument("--switch", help="leaf switch of a host the cluster file does not list")
    a.add_argument("--docker-url", help="where containers start on this host")
    a.add_argument("--address", help="address other hosts reach this one at")
    a.add_argument("--config", help="YAML file with any of the settings above")
    a.add_argument("--declared", metavar="MODEL",
                   help="report this built-in model (or gpu-topology/v1 file) as if "
                   "discovered: hosts without NVML, simulation")
    a.add_argument("--interval", type=float, help="seconds between heartbeats (default 10)")
    a.add_argument("--max-temperature", type=float,
                   help="GPU temperature (C) that makes a GPU unhealthy (default: the "
                   "GPU's slowdown temperature)")
    a.add_argument("--telemetry", choices=("nvml", "dcgm", "auto"),
                   help="where GPU health and utilization come from (default auto: DCGM "
                   "when it is there, else NVML)")
    a.add_argument("--dcgm-exporter", metavar="URL",
                   help="read GPU health and utilization from this dcgm-exporter "
                   "(e.g. http://localhost:9400/metrics)")
    a.add_argument("--diag", type=int, metavar="GPU",
                   help="run DCGM's diagnostic on this GPU (an idle, drained one), print "
                   "the result and exit (0: passed); needs DCGM")
    a.add_argument("--diag-level", type=int, default=1,
                   help="the diagnostic's level, 1 (about a minute) to 4, as dcgmi diag -r")
    a.add_argument("--once", action="store_true", help="register, send one heartbeat, exit")
    a.add_argument("--log-level", default="info", help="debug, info (default), warning or "
                   "error; debug logs each exporter read and each report")
    _host_paths(a)
    a.set_defaults(func=cmd_agent)
    t = sub.add_parser("topo", help="print this host's topology (or a built-in model's) "
                       "like nvidia-smi topo -m")
    t.add_argument("--model", default="discovered",
                   help="a built-in model or gpu-topology/v1 file (default: discover this "
                   "host with NVML)")
    t.add_argument("--yaml", action="store_true",
                   help="print the gpu-topology/v1 document instead (a model file)")
    _host_paths(t)
    t.set_defaults(func=cmd_topo)
