#!/usr/bin/env bash
# Idempotent setup: OS packages, kernel headers link, venv, project.
# A second run on a ready machine takes seconds: each step checks before it acts.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${FABRICSCOPE_VENV:-.venv}
PY=${PYTHON:-python3.11}
APT_PACKAGES=(bpfcc-tools python3-bpfcc libbpfcc linux-headers-amd64 influxdb
  prometheus prometheus-alertmanager nftables iperf3 iproute2 ethtool curl
  procps binutils victoria-metrics gcc util-linux chromium tmux bubblewrap)
log() { printf '[setup] %s\n' "$*"; }

if [ "$(id -u)" != 0 ]; then
  echo "setup: must run as root (installs OS packages and loads BPF); fix: sudo make $*" >&2
  exit 2
fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing OS packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Packaged daemons (influxd, prometheus, alertmanager) must not start on install:
  # the tests and the demo start their own on loopback.
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  rm -f /usr/sbin/policy-rc.d
fi

if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtualenv $VENV"
  "$PY" -m venv "$VENV"
fi
# BCC is Debian's python3-bpfcc (pure Python over libbcc.so); PyPI's `bcc` is unrelated.
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$VENV/debian-bcc"
ln -sfn /usr/lib/python3/dist-packages/bcc "$VENV/debian-bcc/bcc"
echo "$PWD/$VENV/debian-bcc" > "$site/debian_bcc.pth"

stamp="$VENV/.installed-$(cat pyproject.toml setup.py | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  log "installing fabricscope and its dependencies into $VENV"
  pip_log=$(mktemp)
  if ! { "$VENV/bin/pip" install -q --upgrade pip && "$VENV/bin/pip" install -q -e '.[lab,dev]'; } >"$pip_log" 2>&1; then
    tail -n 30 "$pip_log" >&2
    echo "setup: pip install failed (log above); fix: check network access to PyPI" >&2
    rm -f "$pip_log"; exit 2
  fi
  rm -f "$pip_log"
  rm -f "$VENV"/.installed-*; touch "$stamp"
fi
# Generated wire code: regenerated whenever the .proto is newer.
make -s proto VENV="$VENV" >/dev/null
# The real libnccl.so.2 (nvidia-nccl-cu12 wheel), cached; used by the nccl probe's tests.
bash scripts/fetch-nccl.sh >/dev/null
log "ready"
