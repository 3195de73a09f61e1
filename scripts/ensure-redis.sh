#!/usr/bin/env bash
# Redis for the multi-machine Airflow tests (the Celery broker): Debian's redis-server,
# installed when missing. The tests start their own server on a free loopback port, so
# nothing is started here.
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

if ! command -v redis-server >/dev/null; then
    $SUDO apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
fi
echo "redis: $(redis-server --version | cut -d' ' -f3)"
