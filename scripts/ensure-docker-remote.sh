#!/usr/bin/env bash
# What the Docker-connection tests (tests/launch/test_docker_tls.py, test_docker_ssh.py)
# start on loopback besides the engine of ensure-docker.sh: an sshd (openssh-server) to
# reach an engine over SSH, and a registry with basic auth (docker-registry) to log in and
# pull through. The tests start their own instances on free ports; this only installs.
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

missing=()
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v docker-registry >/dev/null || missing+=(docker-registry)
command -v openssl >/dev/null || missing+=(openssl)
if [ ${#missing[@]} -gt 0 ]; then
    $SUDO apt-get update -qq >/dev/null
    # the registry package would start its own service on :5000; the tests start theirs
    DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 $SUDO apt-get install -y -qq \
        --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "sshd: $(/usr/sbin/sshd -V 2>&1 | head -1); registry: $(docker-registry --version)"
