#!/bin/sh
# The cleanup DaemonSet's step, in the node image, with the host's root at
# $HOST_ROOT: `throttlewatch uninstall containerd` (containerd's files back
# as they were, containerd restarted), then what node-install.sh copied and
# the state directory are removed, unless pods still run through our shim
# (their deletion needs the binary): then the binaries stay and it says so.
set -eu
HOST_ROOT=${HOST_ROOT:-/host}
BIN_DIR=${BIN_DIR:-/usr/local/bin}
SRC=${SRC:-/usr/local/bin}
RESTART=${RESTART:-systemd}
HOST_PROC=${HOST_PROC:-/proc}        # the host's (hostPID)
"$SRC/throttlewatch" uninstall containerd --etc-root "$HOST_ROOT" --restart "$RESTART"
shims=0
for p in "$HOST_PROC"/[0-9]*; do
  [ -r "$p/cmdline" ] || continue
  if tr '\0' ' ' <"$p/cmdline" | grep -q containerd-shim-throttlewatch-v2; then shims=$((shims + 1)); fi
done
if [ "$shims" -gt 0 ]; then
  echo "node-uninstall: $shims throttlewatch shims still run (pods with runtimeClassName: throttlewatch);" \
    "the binaries in $BIN_DIR stay until they are gone: delete those pods and run the cleanup again" >&2
  exit 0
fi
for b in throttlewatch throttlewatch-hook throttlewatch-runtime containerd-shim-throttlewatch-v2; do
  rm -f "$HOST_ROOT$BIN_DIR/$b"
done
rm -f "$HOST_ROOT/etc/throttlewatch/throttlewatch.toml"
rmdir "$HOST_ROOT/etc/throttlewatch" 2>/dev/null || true
# The state the agent, the hook and the NRI plugin kept (registrations, burst
# records, the agent's resume state): run after the DaemonSet is deleted, no
# agent uses it any more.
rm -rf "$HOST_ROOT${STATE_DIR:-/run/throttlewatch}"
echo "node-uninstall: done (logs kept in /var/log/throttlewatch)"
