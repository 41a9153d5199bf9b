#!/bin/sh
# The DaemonSet's installer step, in the node image, with the host's root at
# $HOST_ROOT: the static binaries copied to the host, the node configuration
# installed for the hook, then the same `throttlewatch install containerd`
# an operator runs by hand (integration/tests/kubernetes.rs runs this file).
set -eu
HOST_ROOT=${HOST_ROOT:-/host}
BIN_DIR=${BIN_DIR:-/usr/local/bin}   # on the host (in containerd's PATH)
SRC=${SRC:-/usr/local/bin}           # in the image
CONFIG=${CONFIG:-/config/throttlewatch.toml}
RESTART=${RESTART:-systemd}          # none | systemd (containerd loads runtimes only at start)
mkdir -p "$HOST_ROOT$BIN_DIR" "$HOST_ROOT/etc/throttlewatch"
for b in throttlewatch throttlewatch-hook throttlewatch-runtime containerd-shim-throttlewatch-v2; do
  # A new file renamed over the old one: running shims keep their binary.
  cp "$SRC/$b" "$HOST_ROOT$BIN_DIR/.$b.new"
  chmod 0755 "$HOST_ROOT$BIN_DIR/.$b.new"
  mv "$HOST_ROOT$BIN_DIR/.$b.new" "$HOST_ROOT$BIN_DIR/$b"
done
cp "$CONFIG" "$HOST_ROOT/etc/throttlewatch/.throttlewatch.toml.new"
chmod 0644 "$HOST_ROOT/etc/throttlewatch/.throttlewatch.toml.new"
mv "$HOST_ROOT/etc/throttlewatch/.throttlewatch.toml.new" "$HOST_ROOT/etc/throttlewatch/throttlewatch.toml"
exec "$SRC/throttlewatch" --config "$CONFIG" install containerd \
  --etc-root "$HOST_ROOT" --bin-dir "$BIN_DIR" --restart "$RESTART"
