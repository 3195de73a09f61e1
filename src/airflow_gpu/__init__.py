"""GPU-aware workload management for Apache Airflow on NVIDIA DGX clusters."""

__version__ = "0.1.0"
