#!/usr/bin/env bash
# Build the throttlewatch node image (packaging/kubernetes) from local files
# only: nothing is pulled, no docker or buildah is needed. The result is one
# tar that is both an OCI image layout (index.json: `ctr images import`,
# `podman load`) and a docker archive (manifest.json: `docker load`).
#
#   packaging/build-image.sh [--bin-dir DIR] [--out FILE] [--name NAME:TAG] [--allow-dynamic [--with-host-libs]]
#
# One layer: the four binaries in /usr/local/bin and busybox-static in /bin
# (the DaemonSet's installer steps are shell scripts: sh, cp, mv, mkdir, rm).
# Without --bin-dir the binaries are built statically (the image has no libc,
# and they are copied onto hosts whose libc is unknown): the agent and the shim
# with RUSTFLAGS="-C target-feature=+crt-static" --target <host triple>, the
# hook and the wrapper by scripts/build-front-ends.sh (musl).
# --allow-dynamic accepts dynamically linked binaries (the tests use debug
# builds; such an image imports, but its binaries do not run); with
# --with-host-libs the shared libraries they load on this machine (ldd) go
# into the image at the same paths, so they run there (the DaemonSet test
# runs the image's own pods from debug builds; not for shipping).
# Deterministic: fixed mtimes, owners and order, so the same binaries give
# the same image digest.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
NAME="throttlewatch-node:${VERSION}"
BIN_DIR=""
OUT=""
ALLOW_DYNAMIC=0
HOST_LIBS=0
BUSYBOX=${BUSYBOX:-/bin/busybox}
BINS=(throttlewatch throttlewatch-hook throttlewatch-runtime containerd-shim-throttlewatch-v2 throttlewatch-nri)

die() { echo "build-image: $*" >&2; exit 2; }
while (($#)); do
  case $1 in
    --bin-dir) BIN_DIR=${2:?--bin-dir needs a directory}; shift 2 ;;
    --out) OUT=${2:?--out needs a file}; shift 2 ;;
    --name) NAME=${2:?--name needs NAME:TAG}; shift 2 ;;
    --allow-dynamic) ALLOW_DYNAMIC=1; shift ;;
    --with-host-libs) HOST_LIBS=1; shift ;;
    *) die "unknown argument ${1@Q}; accepted: --bin-dir DIR, --out FILE, --name NAME:TAG, --allow-dynamic, --with-host-libs" ;;
  esac
done
[[ $NAME == *:* && $NAME != *:*:* && $NAME != *[[:space:]]* ]] || die "--name ${NAME@Q}: accepted: NAME:TAG (e.g. throttlewatch-node:${VERSION})"
OUT=${OUT:-target/throttlewatch-node-${VERSION}.tar}

if [[ -z $BIN_DIR ]]; then
  # The agent, the shim and the NRI plugin against static glibc; the hook and the wrapper,
  # which run at every container start, as scripts/build-front-ends.sh links
  # them (musl where its target is installed: no CPUID cache probe per start).
  TRIPLE=$(rustc -vV | sed -n 's/^host: //p')
  RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --quiet --target "$TRIPLE" \
    -p throttlewatch -p containerd-shim-throttlewatch-v2 -p throttlewatch-nri --bins
  BIN_DIR=${CARGO_TARGET_DIR:-target}/$TRIPLE/release
  scripts/build-front-ends.sh "$BIN_DIR"
fi
for b in "${BINS[@]}"; do
  [[ -x $BIN_DIR/$b ]] || die "$BIN_DIR/$b: missing or not executable; accepted: a directory with ${BINS[*]}"
  if ((!ALLOW_DYNAMIC)) && readelf -l "$BIN_DIR/$b" | grep -q 'program interpreter'; then
    die "$BIN_DIR/$b is dynamically linked; the image has no libc: build it with -C target-feature=+crt-static, or pass --allow-dynamic"
  fi
done
[[ -x $BUSYBOX ]] || die "$BUSYBOX missing (apt-get install busybox-static)"
readelf -l "$BUSYBOX" | grep -q 'program interpreter' && die "$BUSYBOX is not static (apt-get install busybox-static)"

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
ROOTFS=$WORK/rootfs
IMG=$WORK/image
mkdir -p "$ROOTFS/bin" "$ROOTFS/usr/local/bin" "$ROOTFS/etc" "$ROOTFS/tmp" "$IMG/blobs/sha256"
install -m 0755 "$BUSYBOX" "$ROOTFS/bin/busybox"
for a in sh cp mv mkdir rm rmdir cat ls test sleep chmod install echo tr grep; do ln -s busybox "$ROOTFS/bin/$a"; done
for b in "${BINS[@]}"; do install -m 0755 "$BIN_DIR/$b" "$ROOTFS/usr/local/bin/$b"; done
if ((HOST_LIBS)); then
  ((ALLOW_DYNAMIC)) || die "--with-host-libs: only with --allow-dynamic"
  # Each library ldd resolves (and the loader) at its own path, links followed.
  for lib in $(for b in "${BINS[@]}"; do ldd "$BIN_DIR/$b" 2>/dev/null; done |
      grep -o '/[^ ]*' | sort -u); do
    mkdir -p "$ROOTFS$(dirname "$lib")"
    cp -L "$lib" "$ROOTFS$lib"
  done
fi
printf 'root:x:0:0:root:/:/bin/sh\n' >"$ROOTFS/etc/passwd"
printf 'root:x:0:\n' >"$ROOTFS/etc/group"
chmod 1777 "$ROOTFS/tmp"

EPOCH=0
tar -C "$ROOTFS" --sort=name --numeric-owner --owner=0 --group=0 --mtime="@$EPOCH" \
  --format=posix --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
  -cf "$WORK/layer.tar" .

# put FILE: move it into blobs/sha256 under its digest; prints "HEX SIZE".
put() {
  local hex size
  hex=$(sha256sum "$1" | cut -d' ' -f1)
  size=$(stat -c %s "$1")
  mv "$1" "$IMG/blobs/sha256/$hex"
  echo "$hex $size"
}
read -r LAYER LAYER_SIZE < <(put "$WORK/layer.tar")
CREATED=1970-01-01T00:00:00Z
printf '%s' "{\"architecture\":\"amd64\",\"os\":\"linux\",\"created\":\"$CREATED\",\
\"config\":{\"Entrypoint\":[\"/usr/local/bin/throttlewatch\"],\"Env\":[\"PATH=/usr/local/bin:/bin\"],\
\"Labels\":{\"org.opencontainers.image.title\":\"throttlewatch-node\",\"org.opencontainers.image.version\":\"$VERSION\"}},\
\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[\"sha256:$LAYER\"]},\
\"history\":[{\"created\":\"$CREATED\",\"created_by\":\"packaging/build-image.sh\"}]}" >"$WORK/config.json"
read -r CONFIG CONFIG_SIZE < <(put "$WORK/config.json")
printf '%s' "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\
\"config\":{\"mediaType\":\"application/vnd.oci.image.config.v1+json\",\"digest\":\"sha256:$CONFIG\",\"size\":$CONFIG_SIZE},\
\"layers\":[{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar\",\"digest\":\"sha256:$LAYER\",\"size\":$LAYER_SIZE}]}" \
  >"$WORK/manifest.json"
read -r MANIFEST MANIFEST_SIZE < <(put "$WORK/manifest.json")

# The full reference containerd and kubelet use for a short name.
case $NAME in
  */*) FULL=$NAME ;;
  *) FULL=docker.io/library/$NAME ;;
esac
[[ ${FULL%%/*} == *.* || ${FULL%%/*} == localhost* ]] || FULL=docker.io/$FULL
printf '%s' "{\"schemaVersion\":2,\"manifests\":[{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\
\"digest\":\"sha256:$MANIFEST\",\"size\":$MANIFEST_SIZE,\"annotations\":{\"io.containerd.image.name\":\"$FULL\",\
\"org.opencontainers.image.ref.name\":\"${NAME##*:}\"}}]}" >"$IMG/index.json"
printf '{"imageLayoutVersion":"1.0.0"}' >"$IMG/oci-layout"
printf '%s' "[{\"Config\":\"blobs/sha256/$CONFIG\",\"RepoTags\":[\"$NAME\"],\"Layers\":[\"blobs/sha256/$LAYER\"]}]" \
  >"$IMG/manifest.json"

mkdir -p "$(dirname "$OUT")"
tar -C "$IMG" --sort=name --numeric-owner --owner=0 --group=0 --mtime="@$EPOCH" -cf "$OUT.tmp" .
mv "$OUT.tmp" "$OUT"
echo "build-image: $OUT ($FULL, manifest sha256:$MANIFEST)" >&2
echo "  containerd: ctr -n k8s.io images import $OUT    docker: docker load -i $OUT" >&2
