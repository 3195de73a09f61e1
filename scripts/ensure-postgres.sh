#!/usr/bin/env bash
# Make sure the machine's PostgreSQL (127.0.0.1:5432, trust auth, user postgres,
# database test) answers; start the local cluster if it does not. The service tests use it.
set -euo pipefail
ready() { pg_isready -q -h 127.0.0.1 -p 5432; }
if ready; then exit 0; fi
version=$(ls /etc/postgresql | sort -V | tail -1)
echo "PostgreSQL is not answering; starting cluster $version/main" >&2
pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
for _ in $(seq 1 30); do
    if ready; then exit 0; fi
    sleep 1
done
echo "PostgreSQL did not start on 127.0.0.1:5432; the service tests need it" >&2
exit 1
