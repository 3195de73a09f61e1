"""The node agent: discovers a host's GPUs and topology through NVML and sysfs, watches
their health and utilization (through DCGM where it is there, else NVML), and reports both
to the scheduler-core service.

NVML is always passed in as a module (`pynvml` on a host, a fake in tests), so nothing
here loads the NVML library at import time."""
