#!/usr/bin/env bash
# Install throttlewatch on a node from a release build (scripts/setup.sh makes one):
# binaries to $PREFIX/bin (the hook, the wrapper and the shim linked statically,
# built here when stale), the config to /etc/throttlewatch (kept if present),
# the systemd unit. Then: systemctl enable --now throttlewatch-agent, and
# `throttlewatch install containerd|docker` for the engine.
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${PREFIX:-/usr/local}
DESTDIR=${DESTDIR:-}
REL=target/release
bins=(throttlewatch throttlewatch-hook throttlewatch-runtime containerd-shim-throttlewatch-v2)
for b in "${bins[@]}"; do
  [[ -x $REL/$b ]] || { echo "install: $REL/$b missing: run scripts/setup.sh first" >&2; exit 1; }
done
# Linked statically: the shim (runs once per pod: about 1.2 MB less RSS per
# shim than against the shared glibc; 2.9 MB instead of 4.0 MB measured), and
# the wrapper and the hook, which run at every container start (no dynamic
# loader and relocations on the create path: 0.4-0.7 ms per exec measured,
# bench/container-start.sh). The agent is long-lived and stays dynamic.
# The hook and the wrapper against musl when its Rust target is installed
# (scripts/setup.sh adds it): a static glibc process probes the CPU caches with
# CPUID at each start, ~1 ms on a VM (bench/README.md, runs 7-10); else glibc.
ARCH_TARGET=$(rustc -vV | sed -n 's/^host: //p')
MUSL_TARGET="${ARCH_TARGET%-gnu}-musl"
FRONT_TARGET=$ARCH_TARGET
if command -v rustup >/dev/null && rustup target list --installed 2>/dev/null | grep -qx "$MUSL_TARGET"; then
  FRONT_TARGET=$MUSL_TARGET
fi
static=(throttlewatch-hook throttlewatch-runtime containerd-shim-throttlewatch-v2)
target_of() { case $1 in containerd-shim-throttlewatch-v2) echo "$ARCH_TARGET" ;; *) echo "$FRONT_TARGET" ;; esac; }
for t in $(printf '%s\n' "$ARCH_TARGET" "$FRONT_TARGET" | sort -u); do
  stale=()
  for b in "${static[@]}"; do
    [[ $(target_of "$b") == "$t" ]] || continue
    s=target/$t/release/$b
    if [[ ! -x $s || $s -ot $REL/$b ]]; then stale+=(-p "$b"); fi
  done
  if ((${#stale[@]})); then
    RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --quiet "${stale[@]}" --target "$t"
  fi
done
install -d -m 0755 "$DESTDIR$PREFIX/bin"
install -m 0755 "$REL/throttlewatch" "$DESTDIR$PREFIX/bin/throttlewatch"
for b in "${static[@]}"; do
  s=target/$(target_of "$b")/release/$b
  if readelf -l "$s" | grep -q 'program interpreter'; then
    echo "install: $s is dynamically linked (expected -C target-feature=+crt-static)" >&2; exit 1
  fi
  install -m 0755 "$s" "$DESTDIR$PREFIX/bin/$b"
done
install -d -m 0755 "$DESTDIR/etc/throttlewatch"
if [[ -e $DESTDIR/etc/throttlewatch/throttlewatch.toml ]]; then
  echo "install: keeping existing /etc/throttlewatch/throttlewatch.toml" >&2
else
  install -m 0644 configs/throttlewatch.toml "$DESTDIR/etc/throttlewatch/throttlewatch.toml"
fi
if [[ -d $DESTDIR/etc/systemd/system || -n $DESTDIR ]]; then
  install -d -m 0755 "$DESTDIR/etc/systemd/system"
  install -m 0644 packaging/throttlewatch-agent.service "$DESTDIR/etc/systemd/system/throttlewatch-agent.service"
fi
install -d -m 0755 "$DESTDIR/usr/share/doc/throttlewatch"
install -m 0644 README.md docs/*.md "$DESTDIR/usr/share/doc/throttlewatch/"
echo "install: done. Next: systemctl daemon-reload && systemctl enable --now throttlewatch-agent;" \
  "then throttlewatch install containerd (or docker, podman, crio) --dry-run; on Kubernetes see docs/kubernetes.md" >&2
