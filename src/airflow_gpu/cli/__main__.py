"""`python -m airflow_gpu.cli ...`, as the `airflow-gpu` command."""

import sys

from .main import main

sys.exit(main())
