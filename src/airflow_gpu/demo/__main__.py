"""`python -m airflow_gpu.demo --dag-test DAG_FILE DAG_ID [CONF_JSON]` (dagtest.py)."""

import sys

from .dagtest import dag_test

if sys.argv[1:2] == ["--dag-test"]:
    sys.exit(dag_test(*sys.argv[2:]))
sys.exit("usage: python -m airflow_gpu.demo --dag-test DAG_FILE DAG_ID [CONF_JSON]")
