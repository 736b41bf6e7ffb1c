#!/usr/bin/env bash
# `make image`: the agent and collector images, from Debian packages and the wheel.
#
# No container registry is needed: each root filesystem is Debian 12 from mmdebstrap
# (its python3 is the CPython 3.11 the wheel and its dependencies are built for),
# with fabricscope and its Python dependencies installed under
# /usr/local/lib/python3.11/dist-packages and /usr/local/bin/fabricscope. The agent's
# adds Debian's BCC (python3-bpfcc) and the NCCL profiler plugin
# (/usr/local/lib/fabricscope/, for the DaemonSet's init container to put on the node);
# kernel headers come from the node (/lib/modules and /usr/src, mounted by the
# DaemonSet). The collector's has neither.
#
# Environment:
#   IMAGE_OUT      where to build (default build/image; emptied first)
#   IMAGE_FORMAT   tar (default: agent.tar, collector.tar, then `podman import`ed as
#                  localhost/fabricscope-{agent,collector}:VERSION) or dir (agent/ and
#                  collector/ root filesystems, nothing imported: for tests/kernel)
#   DEBIAN_MIRROR, DEBIAN_SECURITY_MIRROR   the archives (default deb.debian.org)
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${VENV:-.venv}
OUT=$(realpath -m "${IMAGE_OUT:-build/image}")
FORMAT=${IMAGE_FORMAT:-tar}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
SITE=usr/local/lib/python3.11/dist-packages

fail() { echo "image: $1; fix: $2" >&2; exit 2; }
[ "$(id -u)" = 0 ] || fail "building root filesystems needs root" "run make image as root"
case $FORMAT in tar|dir) ;; *) fail "IMAGE_FORMAT=$FORMAT is not tar or dir" "set tar or dir" ;; esac
tools=(mmdebstrap)
[ "$FORMAT" = tar ] && tools+=(podman)
for tool in "${tools[@]}"; do
  command -v "$tool" >/dev/null || { apt-get install -y -qq --no-install-recommends "$tool" >/dev/null \
    || fail "cannot install $tool" "apt-get install $tool"; }
done
version=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("fabricscope"))')

rm -rf "$OUT"
mkdir -p "$OUT"
log=$OUT/build.log
# the wheel, and it with every dependency installed into one tree for the images
"$VENV/bin/pip" wheel -q --no-deps --no-build-isolation -w "$OUT/wheels" . >>"$log" 2>&1 \
  || fail "building the wheel failed (see $log)" "run pip wheel . to see why"
"$VENV/bin/pip" install -q --target "$OUT/site" "$OUT"/wheels/fabricscope-*.whl >>"$log" 2>&1 \
  || fail "installing the wheel's dependencies failed (see $log)" "check access to PyPI"
rm -rf "$OUT/site/bin"            # console scripts for this venv's python; the image has its own
# the NCCL profiler plugin (C, libc only), which the agent's image carries for the
# DaemonSet's init container to drop on the node for training pods
make -s -C profiler >>"$log" 2>&1 || fail "building the NCCL profiler plugin failed (see $log)" \
                                          "install gcc and make"

rootfs() {   # NAME PACKAGES [HOOK...]
  local name=$1 packages=$2 target=$OUT/$1.tar
  shift 2
  [ "$FORMAT" = dir ] && { target=$OUT/$name/; mkdir -p "$target"; }
  mmdebstrap --quiet --variant=apt --include="$packages" "$@" \
    --customize-hook="mkdir -p \"\$1/$SITE\" && cp -a '$OUT/site/.' \"\$1/$SITE/\"" \
    --customize-hook="printf '#!/usr/bin/python3\nimport sys\nfrom fabricscope.cli import main\nsys.exit(main())\n' > \"\$1/usr/local/bin/fabricscope\" && chmod 755 \"\$1/usr/local/bin/fabricscope\"" \
    --customize-hook="rm -rf \"\$1\"/var/lib/apt/lists/* \"\$1\"/var/cache/apt/*" \
    bookworm "$target" "deb $MIRROR bookworm main" "deb $SECURITY bookworm-security main" \
    >>"$log" 2>&1 || fail "mmdebstrap failed for the $name image (see $log)" \
                           "check access to $MIRROR"
}
plugin=$PWD/profiler/build/libnccl-profiler-fabricscope.so
rootfs agent python3,python3-bpfcc,iproute2 \
  --customize-hook="install -D -m 644 '$plugin' \"\$1/usr/local/lib/fabricscope/libnccl-profiler-fabricscope.so\""
rootfs collector python3

if [ "$FORMAT" = tar ]; then
  for name in agent collector; do
    podman import -q \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'ENTRYPOINT ["/usr/local/bin/fabricscope"]' --change "CMD [\"$name\"]" \
      "$OUT/$name.tar" "localhost/fabricscope-$name:$version" >>"$log" 2>&1 \
      || fail "podman import failed for $name (see $log)" "check podman's storage"
    echo "image: localhost/fabricscope-$name:$version ($(du -h "$OUT/$name.tar" | cut -f1) uncompressed)"
  done
else
  echo "image: root filesystems in $OUT/agent and $OUT/collector"
fi
