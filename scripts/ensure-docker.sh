#!/usr/bin/env bash
# A Docker engine for the end-to-end tests: Debian's docker.io, started without a bridge
# network (nothing may leave loopback) and with the vfs storage driver, plus a small test
# image imported from a busybox-static rootfs (no registry is reachable).
set -euo pipefail
IMAGE=airflow-gpu-test/busybox:1
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

if ! command -v dockerd >/dev/null || ! command -v busybox >/dev/null; then
    $SUDO apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq docker.io busybox-static \
        >/dev/null
fi
if ! docker info >/dev/null 2>&1; then
    mkdir -p "${TMPDIR:-/tmp}/airflow-gpu-dockerd"
    $SUDO sh -c "nohup dockerd --storage-driver=vfs --bridge=none --iptables=false \
        --ip-masq=false >${TMPDIR:-/tmp}/airflow-gpu-dockerd/dockerd.log 2>&1 &"
    for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
    docker info >/dev/null 2>&1 || { echo "dockerd did not start; see ${TMPDIR:-/tmp}/airflow-gpu-dockerd/dockerd.log" >&2; exit 1; }
fi
if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
    root=$(mktemp -d)
    mkdir -p "$root/bin" "$root/tmp" "$root/proc" "$root/sys" "$root/dev" "$root/etc"
    cp "$(command -v busybox)" "$root/bin/busybox"
    for tool in sh cat echo sleep env ls grep true false test printf kill wc head tail; do
        ln -s busybox "$root/bin/$tool"
    done
    tar -C "$root" -c . | docker import - "$IMAGE" >/dev/null
    rm -rf "$root"
fi
echo "docker: $(docker version --format '{{.Server.Version}}') with $IMAGE"
