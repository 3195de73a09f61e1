# The two commands: `make demo` runs the main job, `make test` runs every test.
# Both set up everything a fresh clone needs (a local virtual environment).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Test processes (pytest-xdist): one per core (`TEST_WORKERS=0`: one process). Three on
# two cores end 1-2 minutes sooner, not on every run, and load the machine enough that
# tests with short leases and grace periods fail now and then. How they are dealt out: tests/conftest.py
# (pytest_xdist_make_scheduler).
TEST_WORKERS ?= 2

.PHONY: demo test lint bench clean airflow-standalone

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,plot,airflow]'
	touch $@

demo: $(BIN)/.installed
	$(BIN)/airflow-gpu demo

test: $(BIN)/.installed
	scripts/ensure-postgres.sh
	scripts/ensure-docker.sh
	scripts/ensure-redis.sh
	scripts/ensure-docker-remote.sh
	scripts/ensure-chromium.sh
	$(BIN)/ruff check src tests bench
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist load

# Airflow on this machine (SQLite, LocalExecutor; AIRFLOW_HOME, default ~/airflow).
# `airflow standalone` starts its scheduler, dag-processor, triggerer and API server as
# `airflow ...` looked up on PATH: this venv's bin goes first, so they are this Airflow
# with this provider, whatever PATH holds.
airflow-standalone: $(BIN)/.installed
	PATH="$(abspath $(BIN)):$$PATH" \
	AIRFLOW__CORE__LOAD_EXAMPLES="$${AIRFLOW__CORE__LOAD_EXAMPLES:-False}" \
	$(BIN)/airflow standalone

bench: $(BIN)/.installed
	command -v wrk >/dev/null || apt-get install -y -qq wrk >/dev/null || true
	$(BIN)/python bench/placement.py
	$(BIN)/python bench/scheduling_pass.py
	$(BIN)/python bench/reads.py
	$(BIN)/python bench/replay.py --jobs 2
	$(BIN)/python bench/preemption.py
	$(BIN)/python bench/nvlink_domain.py
	$(BIN)/python bench/mig.py
	$(BIN)/python bench/mig.py --validation-per-hour 300 --out bench/results/mig-300
	$(BIN)/python bench/report_cost.py
	$(BIN)/python bench/api_load.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
