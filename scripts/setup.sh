#!/usr/bin/env bash
# Idempotent set-up for building and running throttlewatch on a Debian/Ubuntu
# machine: the BPF toolchain (and a release build unless --no-build).
#   scripts/setup.sh            build dependencies + release build
#   scripts/setup.sh --test     packages only, including what the test suite drives
#                               (runc, conmon and skopeo for CRI-O, containerd, dockerd,
#                               busybox, perf, QEMU, protoc)
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_PKGS=(clang llvm libbpf-dev bpftool libelf-dev zlib1g-dev pkg-config make gcc)
TEST_PKGS=(runc conmon skopeo busybox-static containerd docker.io podman linux-perf qemu-system-x86 cpio iproute2 containernetworking-plugins procps protobuf-compiler prometheus chromium)

want=("${BUILD_PKGS[@]}")
[[ "${1:-}" == "--test" ]] && want+=("${TEST_PKGS[@]}")

missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null; then
  echo "setup: cargo not found; install Rust with rustup (https://rustup.rs) first" >&2
  exit 1
fi

# BTF is what makes the probes portable (CO-RE); without it nothing loads.
[[ -r /sys/kernel/btf/vmlinux ]] || { echo "setup: this kernel has no BTF (/sys/kernel/btf/vmlinux)" >&2; exit 1; }

[[ "${1:-}" == "--test" ]] && exit 0
# The hook and the wrapper run at every container start: scripts/build-front-ends.sh
# links them statically, against musl when its Rust target is installed (added
# here, best effort), and leaves them in target/release beside the rest.
if command -v rustup >/dev/null; then
  musl="$(uname -m)-unknown-linux-musl"
  rustup target list --installed 2>/dev/null | grep -qx "$musl" ||
    rustup target add "$musl" >/dev/null 2>&1 ||
    echo "setup: could not add the Rust target $musl; the hook and wrapper get static glibc" >&2
fi
# The test helpers (throttlewatch-integration, whose CRI client needs protoc) are not shipped.
cargo build --release --workspace --exclude throttlewatch-integration \
  --exclude throttlewatch-hook --exclude throttlewatch-runtime --bins --quiet
scripts/build-front-ends.sh
echo "setup: built ${CARGO_TARGET_DIR:-target}/release/{throttlewatch,throttlewatch-hook,throttlewatch-runtime,containerd-shim-throttlewatch-v2}" >&2
