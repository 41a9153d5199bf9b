#!/usr/bin/env bash
# Remove what packaging/install.sh installed, with the same environment
# (PREFIX, DESTDIR, NRI_PLUGIN_PATH, NRI_CONF_PATH). The binaries and units go;
# a configuration file goes only while it is byte for byte the packaged one
# (a changed one is kept, and said). Stop the units first
# (systemctl disable --now throttlewatch-nri throttlewatch-agent), and undo
# `throttlewatch install ...` with `throttlewatch uninstall ...`.
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${PREFIX:-/usr/local}
DESTDIR=${DESTDIR:-}
NRI_PLUGIN_PATH=${NRI_PLUGIN_PATH:-/opt/nri/plugins}
NRI_CONF_PATH=${NRI_CONF_PATH:-/etc/nri/conf.d}
NRI_NAME=90-throttlewatch
bins=(throttlewatch throttlewatch-hook throttlewatch-runtime containerd-shim-throttlewatch-v2 throttlewatch-nri)
for b in "${bins[@]}"; do
  rm -f "$DESTDIR$PREFIX/bin/$b"
done
rm -f "$DESTDIR$NRI_PLUGIN_PATH/$NRI_NAME"
for u in throttlewatch-agent.service throttlewatch-nri.service; do
  f=$DESTDIR/etc/systemd/system/$u
  if [[ -e $f ]] && ! cmp -s "packaging/$u" "$f"; then
    echo "uninstall: keeping /etc/systemd/system/$u: it differs from packaging/$u" >&2
  else
    rm -f "$f"
  fi
done
remove_if_packaged() { # SRC DEST
  local f=$DESTDIR$2
  [[ -e $f ]] || return 0
  if cmp -s "$1" "$f"; then
    rm -f "$f"
  else
    echo "uninstall: keeping $2: it differs from $1 (your changes)" >&2
  fi
}
remove_if_packaged configs/throttlewatch.toml /etc/throttlewatch/throttlewatch.toml
remove_if_packaged "packaging/nri/$NRI_NAME.conf" "$NRI_CONF_PATH/$NRI_NAME.conf"
for d in README.md docs/*.md; do
  rm -f "$DESTDIR/usr/share/doc/throttlewatch/$(basename "$d")"
done
# Directories of ours, when empty (never $PREFIX/bin or the runtime's).
for d in /usr/share/doc/throttlewatch /etc/throttlewatch; do
  if [[ -d $DESTDIR$d ]]; then rmdir --ignore-fail-on-non-empty "$DESTDIR$d"; fi
done
echo "uninstall: done (the logs in /var/log/throttlewatch are kept)" >&2
