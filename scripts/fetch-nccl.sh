#!/usr/bin/env bash
# Fetch the real NCCL library (PyPI wheel nvidia-nccl-cu12) for the nccl probe's
# tests and benchmark, and extract libnccl.so.2 and nccl.h into a cache directory.
#
# Idempotent: when both files are already there (and match the pinned version),
# it does nothing. Cache: $FABRICSCOPE_NCCL_CACHE (default /var/cache/fabricscope/nccl).
# Usage: scripts/fetch-nccl.sh            # prints the cache directory on success
set -euo pipefail
VERSION=${FABRICSCOPE_NCCL_VERSION:-2.32.3}
CACHE=${FABRICSCOPE_NCCL_CACHE:-/var/cache/fabricscope/nccl}
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
log() { printf '[fetch-nccl] %s\n' "$*" >&2; }

stamp="$CACHE/.version"
if [ -f "$CACHE/libnccl.so.2" ] && [ -f "$CACHE/nccl.h" ] && \
   [ "$(cat "$stamp" 2>/dev/null)" = "$VERSION" ]; then
  echo "$CACHE"
  exit 0
fi

if ! mkdir -p "$CACHE" 2>/dev/null; then
  echo "fetch-nccl: cannot create $CACHE; fix: run as root or set FABRICSCOPE_NCCL_CACHE" >&2
  exit 2
fi
# One fetch at a time (tests and benchmarks may run this concurrently).
exec 9>"$CACHE/.lock"
flock 9
if [ -f "$CACHE/libnccl.so.2" ] && [ -f "$CACHE/nccl.h" ] && \
   [ "$(cat "$stamp" 2>/dev/null)" = "$VERSION" ]; then
  echo "$CACHE"
  exit 0
fi
wheel_dir="$CACHE/wheel"
mkdir -p "$wheel_dir"
wheel=$(ls "$wheel_dir"/nvidia_nccl_cu12-"$VERSION"-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$wheel" ]; then
  log "downloading nvidia-nccl-cu12==$VERSION (about 350 MB)"
  if ! "$PY" -m pip download -q --no-deps --only-binary=:all: \
        "nvidia-nccl-cu12==$VERSION" -d "$wheel_dir" >&2; then
    echo "fetch-nccl: pip download of nvidia-nccl-cu12==$VERSION failed;" \
         "fix: check access to PyPI (or put the wheel into $wheel_dir)" >&2
    exit 2
  fi
  wheel=$(ls "$wheel_dir"/nvidia_nccl_cu12-"$VERSION"-*.whl | head -n1)
fi

log "extracting libnccl.so.2 and nccl.h from $(basename "$wheel")"
# A wheel is a zip; extract to temporary names and rename, so that a reader
# never sees a half-written library.
"$PY" - "$wheel" "$CACHE" <<'PYEOF'
import os, sys, zipfile
wheel, cache = sys.argv[1], sys.argv[2]
wanted = {"nvidia/nccl/lib/libnccl.so.2": "libnccl.so.2",
          "nvidia/nccl/include/nccl.h": "nccl.h"}
with zipfile.ZipFile(wheel) as z:
    names = set(z.namelist())
    for src, dst in wanted.items():
        if src not in names:
            sys.exit(f"fetch-nccl: {src} not in {wheel}; fix: delete the wheel and rerun")
        tmp = os.path.join(cache, dst + ".tmp")
        with z.open(src) as fin, open(tmp, "wb") as fout:
            while chunk := fin.read(1 << 20):
                fout.write(chunk)
        os.chmod(tmp, 0o755 if dst.endswith(".2") else 0o644)
        os.replace(tmp, os.path.join(cache, dst))
PYEOF
echo "$VERSION" > "$stamp"
# The wheel is no longer needed once extracted (350 MB).
rm -rf "$wheel_dir"
echo "$CACHE"
