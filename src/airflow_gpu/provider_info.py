"""What Airflow's provider manager reads about this package (its version is added by
`airflow_gpu.get_provider_info`, so that this module need not import the package)."""

_INTEGRATION = "GPU scheduler"

PROVIDER_INFO = {
    "package-name": "airflow-provider-gpu",
    "name": "GPU scheduler (airflow-provider-gpu)",
    "description": "GPU-aware workload management for NVIDIA DGX clusters: topology-aware "
                   "admission, gangs, fair share and backfill, CPU/NUMA/cgroup isolation.",
    "integrations": [{"integration-name": _INTEGRATION, "tags": ["service"]}],
    "hooks": [{"integration-name": _INTEGRATION,
               "python-modules": ["airflow_gpu.hooks.scheduler"]}],
    "operators": [{"integration-name": _INTEGRATION,
                   "python-modules": ["airflow_gpu.operators.docker",
                                      "airflow_gpu.operators.bash",
                                      "airflow_gpu.operators.gang"]}],
    "triggers": [{"integration-name": _INTEGRATION,
                  "python-modules": ["airflow_gpu.triggers.admission"]}],
    "extra-links": ["airflow_gpu.operators.links.GpuJobLink"],
    "task-decorators": [{"name": "gpu", "class-name": "airflow_gpu.decorators.gpu.gpu_task"}],
    "config": {"gpu_scheduler": {
        "description": "Defaults of the GPU operators (an operator's own argument wins) "
                       "and the settings of the Airflow UI plugin.",
        "options": {
            "docker_gpu_mode": {
                "description": "How containers get their GPUs: device-request (the NVIDIA "
                               "container toolkit's device request), cdi (CDI device names "
                               "nvidia.com/gpu=N) or env (NVIDIA_VISIBLE_DEVICES with the "
                               "docker_runtime).",
                "version_added": "0.1.0", "type": "string", "example": "cdi",
                "default": "device-request"},
            "docker_runtime": {
                "description": "Container runtime for GPU containers, e.g. nvidia with "
                               "docker_gpu_mode = env; empty: the engine's default.",
                "version_added": "0.1.0", "type": "string", "example": "nvidia",
                "default": ""},
            "docker_conn_id": {
                "description": "The Airflow connection (type docker) of each host's Docker "
                               "engine: address, TLS or SSH, registry login. {host} is the "
                               "host name with characters other than letters, digits and _ "
                               "as _. With the default, a host without such a connection "
                               "uses its docker_url; any other pattern must name connections "
                               "that exist. See docs/docker-connections.md.",
                "version_added": "0.1.0", "type": "string", "example": "dgx_engine_{host}",
                "default": "docker_{host}"},
            "local_host": {
                "description": "This worker machine's host name in the GPU cluster. The local "
                               "runner (GpuBashOperator, @task.gpu, GpuGangOperator(runner="
                               "\"local\")) asks the scheduler for this host only and "
                               "fails a task on a worker that is no cluster host, on another "
                               "host's queue, or whose replicas were granted on another "
                               "host. Empty: $AIRFLOW_GPU_LOCAL_HOST, else the "
                               "machine's host name (full or short). * accepts every host: "
                               "only for a simulated cluster whose hosts are all this machine.",
                "version_added": "0.1.0", "type": "string", "example": "dgx-a-01",
                "default": ""},
            "ui_conn_id": {
                "description": "The connection the Airflow UI plugin's pages read the "
                               "scheduler-core with.",
                "version_added": "0.1.0", "type": "string", "example": "gpu_scheduler_ro",
                "default": "gpu_scheduler_default"},
            "ui_refresh_seconds": {
                "description": "How often an open GPU cluster page reloads its data.",
                "version_added": "0.1.0", "type": "integer", "example": "10",
                "default": "5"},
        }}},
    "connection-types": [{
        "hook-class-name": "airflow_gpu.hooks.scheduler.GpuSchedulerHook",
        "hook-name": "GPU scheduler",
        "connection-type": "gpu_scheduler",
        "conn-fields": {
            "tls": {"label": "Use TLS (https)",
                    "schema": {"type": ["boolean", "null"], "default": False}},
            "verify": {"label": "CA bundle path (or false to skip verification)",
                       "schema": {"type": ["string", "boolean", "null"]}},
            "team": {"label": "Team (default: the token's team)",
                     "schema": {"type": ["string", "null"]}},
        },
        "ui-field-behaviour": {
            "hidden-fields": ["schema", "login", "extra"],
            "relabeling": {"password": "Token"},
            "placeholders": {"host": "127.0.0.1", "port": "8080",
                             "password": "token from `airflow-gpu token create --team T`"},
        },
    }],
}
