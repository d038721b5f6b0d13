#!/usr/bin/env bash
# Installs what the sandbox backends need and makes sure a Docker engine answers. Idempotent.
#  - Debian's bubblewrap, docker.io and libseccomp2 (the sandboxes' seccomp filter), when missing
#    (needs root);
#  - dockerd in the background, when no engine answers at FLYWHEEL_SANDBOX_DOCKER_HOST
#    (default unix:///var/run/docker.sock), with its data under FLYWHEEL_DOCKER_DATA_ROOT
#    (default /var/lib/docker) and its log in /var/log/flywheel-dockerd.log.
set -euo pipefail

HOST="${FLYWHEEL_SANDBOX_DOCKER_HOST:-${DOCKER_HOST:-unix:///var/run/docker.sock}}"
DATA_ROOT="${FLYWHEEL_DOCKER_DATA_ROOT:-/var/lib/docker}"
LOG=/var/log/flywheel-dockerd.log

missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v dockerd >/dev/null || missing+=(docker.io)
ldconfig -p | grep -q 'libseccomp\.so\.2 ' || missing+=(libseccomp2)
/usr/bin/python3 -c 'import pytest' 2>/dev/null || missing+=(python3-pytest)  # pytest-format items
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "sandboxes need: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

engine_answers() { docker -H "$HOST" version >/dev/null 2>&1; }
if ! engine_answers; then
  if [ "$(id -u)" != 0 ]; then
    echo "no Docker engine answers at $HOST; start one (as root: make sandbox-deps)" >&2
    exit 1
  fi
  setsid nohup dockerd --host "$HOST" --data-root "$DATA_ROOT" >>"$LOG" 2>&1 < /dev/null &
  for _ in $(seq 60); do
    engine_answers && break
    sleep 0.5
  done
  engine_answers || { echo "dockerd did not start; see $LOG" >&2; tail -20 "$LOG" >&2; exit 1; }
fi
echo "sandbox deps ready: $(bwrap --version), Docker engine at $HOST"
