"""GPU-aware workload management for Apache Airflow on NVIDIA DGX clusters."""

__version__ = "0.1.0"


def get_provider_info() -> dict:
    """What Airflow's provider manager reads (entry point `apache_airflow_provider`)."""
    from .provider_info import PROVIDER_INFO

    return {**PROVIDER_INFO, "versions": [__version__]}
