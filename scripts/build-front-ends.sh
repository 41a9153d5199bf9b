#!/usr/bin/env bash
# The hook and the wrapper, which run at every container start, linked
# statically into DIR (default: target/release, where scripts/setup.sh's
# build leaves the other binaries). Against musl when its Rust target is
# installed: no dynamic loader and relocations on the create path (0.4-0.7 ms
# per exec), and no static glibc's CPUID cache probe (~1 ms per start on a
# VM; bench/README.md, runs 7-10). Else against static glibc.
#   scripts/build-front-ends.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
T=${CARGO_TARGET_DIR:-target}
OUT=${1:-$T/release}
host=$(rustc -vV | sed -n 's/^host: //p')
musl=${host%-gnu}-musl
fronts=(throttlewatch-hook throttlewatch-runtime)
if command -v rustup >/dev/null && rustup target list --installed 2>/dev/null | grep -qx "$musl"; then
  t=$musl
  cargo build --release --quiet -p throttlewatch-hook -p throttlewatch-runtime --target "$t"
else
  t=$host
  echo "build-front-ends: Rust target $musl not installed (rustup target add $musl): static glibc instead" >&2
  RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --quiet \
    -p throttlewatch-hook -p throttlewatch-runtime --target "$t"
fi
install -d -m 0755 "$OUT"
for b in "${fronts[@]}"; do
  s=$T/$t/release/$b
  if readelf -l "$s" | grep -q 'program interpreter'; then
    echo "build-front-ends: $s is dynamically linked" >&2; exit 1
  fi
  # A rename, not a copy over: cargo's own hard link in deps/ stays as it was.
  cp "$s" "$OUT/.$b.new" && mv -f "$OUT/.$b.new" "$OUT/$b"
done
