# What a page that starts mid-story assumes, as README.md's "The service" sets it up:
# a server on the example cluster, AIRFLOW_GPU_URL and a team token (vision; `admin`
# as the first argument: an admin token), ADMIN_TOKEN, and with `--agents HOST...`
# a node agent in declared mode per HOST=MODEL (telemetry). Sourced from a page's hidden
# <!-- invisible-code-block: sh --> block; the page's shell stops all of it at the end.
airflow-gpu db upgrade --db sqlite:///airflow-gpu.db > /dev/null
airflow-gpu server --db sqlite:///airflow-gpu.db --cluster example --host 127.0.0.1 \
    --port "$DOCS_PORT" --interval 0.5 --log-level warning > server.log 2>&1 &
docs_wait_server "http://127.0.0.1:$DOCS_PORT"
export AIRFLOW_GPU_URL="http://127.0.0.1:$DOCS_PORT"
export ADMIN_TOKEN=$(airflow-gpu token create --team ops --admin --db sqlite:///airflow-gpu.db)
if [ "${1:-}" = admin ]; then
  export AIRFLOW_GPU_TOKEN=$ADMIN_TOKEN
  shift
else
  export AIRFLOW_GPU_TOKEN=$(airflow-gpu token create --team vision --db sqlite:///airflow-gpu.db)
fi
if [ "${1:-}" = --agents ]; then
  shift
  for pair in "$@"; do
    host=${pair%%=*}
    AIRFLOW_GPU_TOKEN=$(airflow-gpu token create --agent --host "$host" --db sqlite:///airflow-gpu.db) \
        airflow-gpu agent --declared "${pair#*=}" --name "$host" --interval 1 > "agent-$host.log" 2>&1 &
  done
fi
