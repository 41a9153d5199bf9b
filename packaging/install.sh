#!/usr/bin/env bash
# Install throttlewatch on a node from a release build (scripts/setup.sh makes one):
# binaries to $PREFIX/bin (the hook, the wrapper and the shim linked statically,
# built here when stale), the config to /etc/throttlewatch (kept if present),
# the systemd units, the NRI plugin's configuration. packaging/uninstall.sh
# removes exactly what this put there. Then: systemctl enable --now
# throttlewatch-agent, and the way in for the runtime (docs/nri.md for
# containerd >= 2.0 and CRI-O >= 1.30; `throttlewatch install containerd|docker|crio`).
#
# Environment:
#   PREFIX=/usr/local  DESTDIR=  (staged installs, packages)
#   NRI_LAUNCH=1       also put the NRI plugin in the runtime's plugin_path, so the
#                      runtime launches it at its next start (instead of the
#                      throttlewatch-nri.service unit; never both)
#   NRI_PLUGIN_PATH=/opt/nri/plugins  NRI_CONF_PATH=/etc/nri/conf.d
#                      containerd's plugin_path / plugin_config_path (CRI-O's
#                      nri_plugin_dir / nri_plugin_config_dir; same defaults)
#   BIN_DIR=DIR        install the binaries in DIR as they are, building nothing
#   ALLOW_DYNAMIC=1    with BIN_DIR: accept dynamically linked front ends (tests)
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${PREFIX:-/usr/local}
DESTDIR=${DESTDIR:-}
NRI_PLUGIN_PATH=${NRI_PLUGIN_PATH:-/opt/nri/plugins}
NRI_CONF_PATH=${NRI_CONF_PATH:-/etc/nri/conf.d}
NRI_NAME=90-throttlewatch
T=${CARGO_TARGET_DIR:-target}
REL=${BIN_DIR:-$T/release}
bins=(throttlewatch throttlewatch-hook throttlewatch-runtime containerd-shim-throttlewatch-v2 throttlewatch-nri)
for b in "${bins[@]}"; do
  [[ -x $REL/$b ]] || { echo "install: $REL/$b missing: run scripts/setup.sh first" >&2; exit 1; }
done
dynamic() { readelf -l "$1" | grep -q 'program interpreter'; }
# Linked statically: the wrapper and the hook, which run at every container
# start (no dynamic loader and relocations on the create path: 0.4-0.7 ms per
# exec measured, bench/container-start.sh; against musl, scripts/build-front-ends.sh,
# which scripts/setup.sh runs: static glibc probes the CPU caches with CPUID at
# each start, ~1 ms on a VM), and the shim, which runs once per pod (about
# 1.2 MB less RSS per shim than against the shared glibc; 2.9 MB instead of
# 4.0 MB measured). The agent and the NRI plugin are long-lived and stay dynamic.
SHIM=$REL/containerd-shim-throttlewatch-v2
if [[ -z ${BIN_DIR:-} ]]; then
  if dynamic "$REL/throttlewatch-hook" || dynamic "$REL/throttlewatch-runtime"; then
    scripts/build-front-ends.sh "$REL"
  fi
  HOST=$(rustc -vV | sed -n 's/^host: //p')
  SHIM=$T/$HOST/release/containerd-shim-throttlewatch-v2
  if [[ ! -x $SHIM || $SHIM -ot $REL/containerd-shim-throttlewatch-v2 ]]; then
    RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --quiet \
      -p containerd-shim-throttlewatch-v2 --target "$HOST"
  fi
fi
install -d -m 0755 "$DESTDIR$PREFIX/bin"
for s in "$REL/throttlewatch" "$REL/throttlewatch-nri"; do
  install -m 0755 "$s" "$DESTDIR$PREFIX/bin/$(basename "$s")"
done
for s in "$REL/throttlewatch-hook" "$REL/throttlewatch-runtime" "$SHIM"; do
  if dynamic "$s" && [[ ${ALLOW_DYNAMIC:-0} != 1 ]]; then
    echo "install: $s is dynamically linked (expected static)" >&2; exit 1
  fi
  install -m 0755 "$s" "$DESTDIR$PREFIX/bin/$(basename "$s")"
done
# Configuration files: copied byte for byte; one already there is kept.
keep_or_install() { # SRC DEST MODE
  if [[ -e $DESTDIR$2 ]]; then
    cmp -s "$1" "$DESTDIR$2" || echo "install: keeping existing $2" >&2
  else
    install -d -m 0755 "$(dirname "$DESTDIR$2")"
    install -m "$3" "$1" "$DESTDIR$2"
  fi
}
keep_or_install configs/throttlewatch.toml /etc/throttlewatch/throttlewatch.toml 0644
keep_or_install packaging/nri/$NRI_NAME.conf "$NRI_CONF_PATH/$NRI_NAME.conf" 0644
if [[ ${NRI_LAUNCH:-0} == 1 ]]; then
  install -d -m 0755 "$DESTDIR$NRI_PLUGIN_PATH"
  install -m 0755 "$REL/throttlewatch-nri" "$DESTDIR$NRI_PLUGIN_PATH/$NRI_NAME"
fi
if [[ -d $DESTDIR/etc/systemd/system || -n $DESTDIR ]]; then
  install -d -m 0755 "$DESTDIR/etc/systemd/system"
  for u in throttlewatch-agent.service throttlewatch-nri.service; do
    install -m 0644 "packaging/$u" "$DESTDIR/etc/systemd/system/$u"
  done
fi
install -d -m 0755 "$DESTDIR/usr/share/doc/throttlewatch"
install -m 0644 README.md docs/*.md "$DESTDIR/usr/share/doc/throttlewatch/"
if [[ ${NRI_LAUNCH:-0} == 1 ]]; then
  nri="the runtime launches $NRI_PLUGIN_PATH/$NRI_NAME at its next start (containerd >= 2.0, CRI-O >= 1.30)"
else
  nri="on containerd >= 2.0 or CRI-O >= 1.30: systemctl enable --now throttlewatch-nri (docs/nri.md)"
fi
echo "install: done. Next: systemctl daemon-reload && systemctl enable --now throttlewatch-agent;" \
  "then $nri; on containerd 1.6/1.7, Docker, Podman: throttlewatch install containerd (or docker, podman, crio) --dry-run;" \
  "on Kubernetes see docs/kubernetes.md" >&2
