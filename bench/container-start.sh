#!/bin/bash
# Container start latency: throttlewatch-runtime (the wrapper: spec edit, then
# on `create` runc's create exec'd in its place while a helper applies QoS and
# sends the register to a running agent, `start` waiting for the watch; on
# `run`, the createRuntime hook) against plain runc, on the same bundle,
# interleaved. Each round
# restores the pristine config.json (as containerd and dockerd hand the
# runtime a fresh bundle), times `create` + `start` (or `run -d`), then deletes.
#
#   bench/container-start.sh [ROUNDS]          (default 20; run as root)
#
# Binaries: the wrapper, the hook AND the agent all come from one directory:
# $TW_BIN_DIR when set (nothing is built), else they are built with the
# release profile (a debug agent alone makes the register round trip several
# times slower, so there is no fallback): the wrapper and the hook linked
# statically (-C target-feature=+crt-static, target/<triple>/release: no
# dynamic loader at each container start; musl, see below, unless
# TW_BENCH_LIBC=gnu: static glibc as packaging/ ships them),
# the agent from target/release (long-lived); TW_BENCH_STATIC=0 takes all
# three from target/release (dynamically linked).
# TW_BIN_DIR_BEFORE=DIR adds a third kind per round, `before`: the wrapper,
# hook and agent of another build (e.g. the previous commit's), with its own
# agent, socket, state and logs, so before and after share one run's load.
# TW_BENCH_VARIANTS="NAME=DIR ..." adds a kind per entry: the wrapper and
# hook of DIR (other builds, e.g. one per idea being tried), sharing the
# agent, socket and state of `tw` (so the agent must be the same build);
# each is reported against plain runc like `tw`, create and start apart.
# NAME: lower-case letters and digits, not one of the kinds above.
# TW_BENCH_TIMING=1 also prints the median of each phase of the wrapper, the
# hook and the agent's register (THROTTLEWATCH_TIMING). Prints the median of each and the ratio of
# medians (issue 16: target <= 1.05), with the load average before and after: others
# compiling on a 2-core machine move both figures.
#
# Clocks: bash's $EPOCHREALTIME, read in the shell itself. Runs 1-26
# (bench/README.md) forked `date` for each reading, so a date process's
# start-up (~0.7 ms here) was inside every timed interval, both kinds':
# the ratio of medians came out lower than it is.
[ -n "${BASH_VERSION:-}" ] || exec bash "$0" "$@"
set -eu

ROUNDS=${1:-20}
# TW_BENCH_MODE=create (default): `create` then `start`, as containerd's
# runc shim and hence dockerd call the runtime (the wrapper applies QoS and
# registers between the two, no createRuntime hook); run: `run -d` (one runc
# process; the wrapper puts the createRuntime hook in the spec).
MODE=${TW_BENCH_MODE:-create}
case $MODE in
    create | run) ;;
    *) echo "TW_BENCH_MODE: expected create or run, got $MODE" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
BUILT=
if [ -z "${TW_BIN_DIR:-}" ]; then
    cargo build --release -q -p throttlewatch-hook -p throttlewatch-runtime -p throttlewatch --bins
    TW_BIN_DIR=target/release
    if [ "${TW_BENCH_STATIC:-1}" = 1 ]; then
        TRIPLE=$(rustc -vV | sed -n 's/^host: //p')
        # musl when its target is installed (TW_BENCH_LIBC=gnu: static glibc):
        # a static glibc binary probes the caches with CPUID at every start
        # (init_cacheinfo), which traps to the hypervisor in a VM: ~1 ms per
        # process here, twice per container (wrapper and hook). musl does not.
        MUSL=$(echo "$TRIPLE" | sed 's/-gnu$/-musl/')
        if [ "${TW_BENCH_LIBC:-musl}" = musl ] && rustup target list --installed 2>/dev/null | grep -qx "$MUSL"; then
            TRIPLE=$MUSL
        elif [ "${TW_BENCH_LIBC:-musl}" = musl ]; then
            echo "note: $MUSL not installed (rustup target add $MUSL): hook and wrapper linked with static glibc" >&2
        fi
        RUSTFLAGS="-C target-feature=+crt-static" cargo build --release -q --target "$TRIPLE" \
            -p throttlewatch-hook -p throttlewatch-runtime
        # The wrapper finds the hook beside its own (resolved) path.
        BUILT=$(mktemp -d /tmp/tw-bench-bin.XXXXXX)
        ln -s "$PWD/target/$TRIPLE/release/throttlewatch-runtime" "$PWD/target/$TRIPLE/release/throttlewatch-hook" \
            "$PWD/target/release/throttlewatch" "$BUILT/"
        TW_BIN_DIR=$BUILT
    fi
fi
TW_BIN_DIR=$(cd "$TW_BIN_DIR" && pwd)
AGENT=$TW_BIN_DIR/throttlewatch
RUNC=${RUNC:-$(command -v runc)}
BEFORE=
if [ -n "${TW_BIN_DIR_BEFORE:-}" ]; then
    BEFORE=$(cd "$TW_BIN_DIR_BEFORE" && pwd)
    [ -x "$BEFORE/throttlewatch-runtime" ] && [ -x "$BEFORE/throttlewatch-hook" ] && [ -x "$BEFORE/throttlewatch" ] ||
        { echo "TW_BIN_DIR_BEFORE=$BEFORE: expected throttlewatch-runtime, throttlewatch-hook and throttlewatch there" >&2; exit 2; }
fi
for b in "$TW_BIN_DIR/throttlewatch-runtime" "$TW_BIN_DIR/throttlewatch-hook" "$AGENT" "$RUNC" /bin/busybox; do
    [ -x "$b" ] || { echo "missing $b (cargo build --release --workspace --bins; apt-get install runc busybox-static)" >&2; exit 1; }
done
# TW_BENCH_VARIANTS: names and directories.
VARIANTS=
declare -A VARIANT_DIR=()
for v in ${TW_BENCH_VARIANTS:-}; do
    name=${v%%=*}; dir=${v#*=}
    case $name in
        plain | tw | before | hooktrue | hookonly | *[!a-z0-9]* | "")
            echo "TW_BENCH_VARIANTS: $v: expected NAME=DIR, NAME of lower-case letters and digits other than plain, tw, before, hooktrue, hookonly" >&2; exit 2 ;;
    esac
    [ "$dir" != "$v" ] && [ -x "$dir/throttlewatch-runtime" ] && [ -x "$dir/throttlewatch-hook" ] ||
        { echo "TW_BENCH_VARIANTS: $v: expected throttlewatch-runtime and throttlewatch-hook in $dir" >&2; exit 2; }
    [ -z "${VARIANT_DIR[$name]:-}" ] || { echo "TW_BENCH_VARIANTS: $name named twice" >&2; exit 2; }
    VARIANT_DIR[$name]=$(cd "$dir" && pwd)
    VARIANTS="$VARIANTS $name"
done
# THROTTLEWATCH_TIMING files: ours, before's, each variant's.
TIMING_FILES="timing timing-before$(for v in $VARIANTS; do printf ' timing-%s' "$v"; done)"
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

W=$(mktemp -d /tmp/tw-bench.XXXXXX)
# Runtime state (socket, agent state, burst records) on tmpfs, as /run is on
# production hosts; logs on disk, as /var/log is. The bundle's config.json and
# runc's --root are on tmpfs too, as containerd and dockerd keep them
# (/run/containerd/io.containerd.runtime.v2.task/..., /run/containerd/runc,
# /run/docker/...), with the root filesystem on disk.
# TW_BENCH_BUNDLE=disk puts bundle and runc state on disk (/tmp) instead.
RUN=$(mktemp -d /dev/shm/tw-bench-run.XXXXXX)
case ${TW_BENCH_BUNDLE:-tmpfs} in
    tmpfs) B=$RUN/bundle; ROOTS=$RUN ;;
    disk) B=$W/bundle; ROOTS=$W ;;
    *) echo "TW_BENCH_BUNDLE: expected tmpfs or disk, got ${TW_BENCH_BUNDLE}" >&2; exit 2 ;;
esac
AGENT_PID=
AGENT_BEFORE_PID=
cleanup() {
    for r in plain tw before hooktrue hookonly $VARIANTS; do
        for id in $("$RUNC" --root "$ROOTS/root-$r" list -q 2>/dev/null); do
            "$RUNC" --root "$ROOTS/root-$r" delete -f "$id" >/dev/null 2>&1 || true
        done
    done
    [ -n "$AGENT_PID" ] && kill "$AGENT_PID" 2>/dev/null && wait "$AGENT_PID" 2>/dev/null || true
    [ -n "$AGENT_BEFORE_PID" ] && kill "$AGENT_BEFORE_PID" 2>/dev/null && wait "$AGENT_BEFORE_PID" 2>/dev/null || true
    rmdir /sys/fs/cgroup/*/tw-bench-$$ 2>/dev/null || true
    rm -rf "$W" "$RUN" ${BUILT:+"$BUILT"}
}
trap cleanup EXIT INT TERM

# A busybox-static bundle with a CPU quota and a burst annotation (real QoS work for the hook).
mkdir -p "$B" "$W/rootfs/bin" "$W/rootfs/proc" "$W/rootfs/dev" "$W/rootfs/sys"
cp /bin/busybox "$W/rootfs/bin/busybox"
ln -s busybox "$W/rootfs/bin/sh"
ln -s busybox "$W/rootfs/bin/sleep"
"$RUNC" spec --bundle "$B"
python3 - "$B/config.json" "$$" "$W/rootfs" <<'PY'
import json, sys
p, pid, rootfs = sys.argv[1], sys.argv[2], sys.argv[3]
c = json.load(open(p))
c["root"]["path"] = rootfs
c["process"]["terminal"] = False
c["process"]["args"] = ["sleep", "60"]
c["annotations"] = {"throttlewatch.io/cpu-burst": "10ms"}
c["linux"]["resources"]["cpu"] = {"quota": 50000, "period": 100000}
c["linux"]["cgroupsPath"] = "/tw-bench-%s/c" % pid
json.dump(c, open(p, "w"))
PY
cp "$B/config.json" "$W/pristine.json"

# TW_BENCH_CONFIG=shipped: configs/throttlewatch.toml (112 lines, every key
# with its comment, as packaging/ installs it) with these five keys set
# instead of a five-line file: what the wrapper and hook parse on a node.
bench_config() { # OUT LOG_DIR SOCKET STATE_DIR
    if [ "${TW_BENCH_CONFIG:-short}" = shipped ]; then
        sed -e "s|^log_dir = .*|log_dir = \"$2\"|" -e "s|^socket = .*|socket = \"$3\"|" \
            -e "s|^state_dir = .*|state_dir = \"$4\"|" -e 's|^metrics_addr = .*|metrics_addr = ""|' \
            -e 's|^start_agent = .*|start_agent = false|' configs/throttlewatch.toml >"$1"
    else
        printf 'log_dir = "%s"\nsocket = "%s"\nstate_dir = "%s"\nmetrics_addr = ""\nstart_agent = false\n' "$2" "$3" "$4" >"$1"
    fi
}
case ${TW_BENCH_CONFIG:-short} in
    short | shipped) ;;
    *) echo "TW_BENCH_CONFIG: expected short or shipped, got $TW_BENCH_CONFIG" >&2; exit 2 ;;
esac
bench_config "$W/tw.toml" "$W/logs" "$RUN/agent.sock" "$RUN"
# TW_BENCH_TIMING=1: the agents time their registers too (agent/src/pipeline/timing.rs).
agent_timing() { [ "${TW_BENCH_TIMING:-0}" = 1 ] && echo "$W/$1" || echo ""; }
THROTTLEWATCH_TIMING=$(agent_timing timing) "$AGENT" agent --config "$W/tw.toml" >"$W/agent.out" 2>&1 &
AGENT_PID=$!
i=0
until [ -S "$RUN/agent.sock" ]; do
    i=$((i + 1)); [ $i -lt 200 ] || { echo "agent did not start:" >&2; cat "$W/agent.out" >&2; exit 1; }
    sleep 0.05
done
if [ -n "$BEFORE" ]; then
    mkdir -p "$RUN/before"
    bench_config "$W/tw-before.toml" "$W/logs-before" "$RUN/before/agent.sock" "$RUN/before"
    THROTTLEWATCH_TIMING=$(agent_timing timing-before) "$BEFORE/throttlewatch" agent --config "$W/tw-before.toml" >"$W/agent-before.out" 2>&1 &
    AGENT_BEFORE_PID=$!
    i=0
    until [ -S "$RUN/before/agent.sock" ]; do
        i=$((i + 1)); [ $i -lt 200 ] || { echo "the before agent did not start:" >&2; cat "$W/agent-before.out" >&2; exit 1; }
        sleep 0.05
    done
fi
sleep 0.5

if [ "${TW_BENCH_TIMING:-0}" = 1 ]; then
    export THROTTLEWATCH_TIMING="$W/timing"
fi

# one KIND ID: restore the bundle, time `create` + `start` (or `run -d`),
# delete; prints microseconds (create + start, then create and start
# apart: "TOTAL CREATE START"; run: "TOTAL").
one() {
    kind=$1; id=$2
    case $kind in
        hooktrue) cp "$W/hooktrue.json" "$B/config.json" ;;
        hookonly) cp "$W/modified.json" "$B/config.json" ;;
        *) cp "$W/pristine.json" "$B/config.json" ;;
    esac
    case $kind in
        tw) set -- "$TW_BIN_DIR/throttlewatch-runtime" --throttlewatch-config "$W/tw.toml" --root "$ROOTS/root-tw" ;;
        before) set -- "$BEFORE/throttlewatch-runtime" --throttlewatch-config "$W/tw-before.toml" --root "$ROOTS/root-before" ;;
        plain | hooktrue | hookonly) set -- "$RUNC" --root "$ROOTS/root-$kind" ;;
        *) set -- "${VARIANT_DIR[$kind]}/throttlewatch-runtime" --throttlewatch-config "$W/tw.toml" --root "$ROOTS/root-$kind" ;;
    esac
    if [ "${TW_BENCH_TIMING:-0}" = 1 ]; then
        case $kind in
            before) THROTTLEWATCH_TIMING="$W/timing-before" ;;
            tw | plain | hooktrue | hookonly) THROTTLEWATCH_TIMING="$W/timing" ;;
            *) THROTTLEWATCH_TIMING="$W/timing-$kind" ;;
        esac
    fi
    local t0 t1= t2
    t0=$EPOCHREALTIME
    if [ "$MODE" = create ]; then
        # With --pid-file, as containerd's runc shim always calls it.
        "$@" create --bundle "$B" --pid-file "$B/init.pid" "$id" </dev/null >/dev/null 2>"$W/err" || { cat "$W/err" >&2; exit 1; }
        t1=$EPOCHREALTIME
        "$@" start "$id" </dev/null >/dev/null 2>"$W/err" || { cat "$W/err" >&2; exit 1; }
    else
        "$@" run -d --bundle "$B" "$id" </dev/null >/dev/null 2>"$W/err" || { cat "$W/err" >&2; exit 1; }
    fi
    t2=$EPOCHREALTIME
    "$@" delete -f "$id" >/dev/null 2>&1
    t0=${t0/./}; t2=${t2/./}
    if [ -n "$t1" ]; then
        t1=${t1/./}
        echo "$((t2 - t0)) $((t1 - t0)) $((t2 - t1))"
    else
        echo "$((t2 - t0))"
    fi
}

: >"$W/plain"; : >"$W/tw"; : >"$W/before"
one plain warm-p >/dev/null; one tw warm-t >/dev/null
[ -z "$BEFORE" ] || one before warm-b >/dev/null
for v in $VARIANTS; do one "$v" "warm-$v" >/dev/null; done
# TW_BENCH_BREAKDOWN=1 adds two runs per round with plain runc, to split
# the overhead: `hooktrue` (a createRuntime hook that is /bin/true: what
# any OCI hook costs) and `hookonly` (the config.json the wrapper's `run`
# writes: our createRuntime hook and its register, without the wrapper).
kinds="tw plain"
[ -z "$BEFORE" ] || kinds="tw plain before"
kinds="$kinds$VARIANTS"
if [ "${TW_BENCH_BREAKDOWN:-0}" = 1 ]; then
    # The spec as the wrapper's `run` leaves it (our createRuntime hook in it).
    cp "$W/pristine.json" "$B/config.json"
    "$TW_BIN_DIR/throttlewatch-runtime" --throttlewatch-config "$W/tw.toml" --root "$ROOTS/root-tw" \
        run -d --bundle "$B" warm-r </dev/null >/dev/null 2>"$W/err" || { cat "$W/err" >&2; exit 1; }
    "$RUNC" --root "$ROOTS/root-tw" delete -f warm-r >/dev/null 2>&1
    cp "$B/config.json" "$W/modified.json"
    python3 - "$W/pristine.json" "$W/hooktrue.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.setdefault("hooks", {})["createRuntime"] = [{"path": "/bin/true", "args": ["true"]}]
json.dump(c, open(sys.argv[2], "w"))
PY
    : >"$W/hooktrue"; : >"$W/hookonly"
    one hooktrue warm-h >/dev/null; one hookonly warm-o >/dev/null
    kinds="$kinds hooktrue hookonly"
fi
n=1
while [ $n -le "$ROUNDS" ]; do
    # rotate the order round by round
    order=$(echo $kinds | awk -v r=$n '{ for (i = 0; i < NF; i++) printf "%s ", $(((i + r) % NF) + 1) }')
    for k in $order; do
        read -r total parts < <(one "$k" "b$k$n")
        echo "$total" >>"$W/$k"
        [ -z "$parts" ] || echo "$parts" >>"$W/$k.parts"
    done
    n=$((n + 1))
done

# TW_BENCH_SAMPLES=DIR keeps each kind's per-round times (µs, in round order)
# and the THROTTLEWATCH_TIMING lines.
if [ -n "${TW_BENCH_SAMPLES:-}" ]; then
    mkdir -p "$TW_BENCH_SAMPLES"
    for k in $kinds; do cp "$W/$k" "$TW_BENCH_SAMPLES/$k"; [ ! -s "$W/$k.parts" ] || cp "$W/$k.parts" "$TW_BENCH_SAMPLES/$k.parts"; done
    for tf in $TIMING_FILES; do [ ! -s "$W/$tf" ] || cp "$W/$tf" "$TW_BENCH_SAMPLES/$tf"; done
fi
median() { sort -n "$1" | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
ms() { awk "BEGIN{printf \"%.2f\", $1/1000}"; } # µs -> ms
mp=$(median "$W/plain"); mt=$(median "$W/tw")
linkage() { # what a binary is linked as, read off the file itself
    if readelf -l "$1" 2>/dev/null | grep -q 'program interpreter'; then echo dynamic
    elif grep -qa 'glibc\.\(malloc\|cpu\)' "$1"; then echo "static glibc" # its tunables' names
    else echo "static musl"; fi
}
echo "binaries: $TW_BIN_DIR (wrapper: $(linkage "$(readlink -f "$TW_BIN_DIR/throttlewatch-runtime")"), hook: $(linkage "$(readlink -f "$TW_BIN_DIR/throttlewatch-hook")"), agent: $(linkage "$(readlink -f "$AGENT")")); runc: $RUNC; rounds: $ROUNDS (interleaved, order alternating); bundle and runc state on ${TW_BENCH_BUNDLE:-tmpfs}"
if [ -n "${BEFORE:-}" ]; then
    echo "before: $BEFORE (wrapper: $(linkage "$(readlink -f "$BEFORE/throttlewatch-runtime")"), hook: $(linkage "$(readlink -f "$BEFORE/throttlewatch-hook")"))"
    # A dynamic wrapper pays the loader at each exec (about 1 ms a
    # create + start here): compare builds linked alike.
    [ "$(linkage "$(readlink -f "$BEFORE/throttlewatch-runtime")")" = "$(linkage "$(readlink -f "$TW_BIN_DIR/throttlewatch-runtime")")" ] ||
        echo "WARNING: the wrapper of before and of this build are linked differently; after - before measures the linking too (scripts/build-front-ends.sh DIR links them as setup does)" >&2
fi
echo "load average: before $LOAD_BEFORE, after $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) CPUs)"
if [ "$MODE" = create ]; then what="create + start"; how="wrapper execs runc create, its helper: QoS, register sent; start waits for the watch"; else what="run -d"; how="wrapper + createRuntime hook + register"; fi
echo "plain runc $what:                median $(awk "BEGIN{printf \"%.1f\", $mp/1000}") ms"
echo "throttlewatch-runtime $what:     median $(awk "BEGIN{printf \"%.1f\", $mt/1000}") ms ($how)"
echo "ratio of medians (wrapper/plain): $(awk "BEGIN{printf \"%.3f\", $mt/$mp}") (issue 16: target <= 1.05)"
# Each round's two runs share the machine's load of the moment: the median of
# the per-round differences is steadier than the difference of the medians.
paste "$W/tw" "$W/plain" | awk '{print $1 - $2}' >"$W/diff"
echo "paired: median per-round overhead $(awk "BEGIN{printf \"%.2f\", $(median "$W/diff")/1000}") ms ($(awk "BEGIN{printf \"%.3f\", 1 + $(median "$W/diff")/$mp}") x the plain median)"
if [ "$MODE" = create ]; then
    # create and start apart (medians), and each one's paired difference
    # from plain runc's: where the overhead falls.
    echo "create / start apart (median ms; paired against plain):"
    for k in $kinds; do
        awk '{print $1}' "$W/$k.parts" >"$W/$k.c"; awk '{print $2}' "$W/$k.parts" >"$W/$k.s"
        line="  $k: create $(ms "$(median "$W/$k.c")"), start $(ms "$(median "$W/$k.s")")"
        if [ "$k" != plain ]; then
            paste "$W/$k.parts" "$W/plain.parts" | awk '{print $1 - $3}' >"$W/$k.dc"
            paste "$W/$k.parts" "$W/plain.parts" | awk '{print $2 - $4}' >"$W/$k.ds"
            line="$line; paired: create $(ms "$(median "$W/$k.dc")"), start $(ms "$(median "$W/$k.ds")")"
        fi
        echo "$line"
    done
fi
if [ -s "$W/before" ]; then
    mb=$(median "$W/before")
    paste "$W/before" "$W/plain" | awk '{print $1 - $2}' >"$W/diff-before"
    echo "before ($BEFORE): median $(awk "BEGIN{printf \"%.1f\", $mb/1000}") ms, ratio of medians $(awk "BEGIN{printf \"%.3f\", $mb/$mp}"), paired overhead $(awk "BEGIN{printf \"%.2f\", $(median "$W/diff-before")/1000}") ms"
    paste "$W/tw" "$W/before" | awk '{print $1 - $2}' >"$W/diff-tw-before"
    echo "after - before, paired: median $(awk "BEGIN{printf \"%.2f\", $(median "$W/diff-tw-before")/1000}") ms"
fi
for k in $VARIANTS; do
    paste "$W/$k" "$W/plain" | awk '{print $1 - $2}' >"$W/diff-$k"
    paste "$W/$k" "$W/tw" | awk '{print $1 - $2}' >"$W/diff-tw-$k"
    echo "variant $k (${VARIANT_DIR[$k]}): median $(ms "$(median "$W/$k")") ms, ratio of medians $(awk "BEGIN{printf \"%.3f\", $(median "$W/$k")/$mp}"), paired overhead $(ms "$(median "$W/diff-$k")") ms; $k - tw, paired: $(ms "$(median "$W/diff-tw-$k")") ms"
done
if [ -s "$W/hooktrue" ]; then
    for k in hooktrue hookonly; do
        paste "$W/$k" "$W/plain" | awk '{print $1 - $2}' >"$W/diff-$k"
        echo "breakdown: runc + $k: median $(awk "BEGIN{printf \"%.1f\", $(median "$W/$k")/1000}") ms, paired overhead $(awk "BEGIN{printf \"%.2f\", $(median "$W/diff-$k")/1000}") ms"
    done
fi
for tf in $TIMING_FILES; do
    [ -s "$W/$tf" ] || continue
    # "NAME SUBCOMMAND total=Nus phase=Nus ..." lines: the median of each phase, per program.
    echo "phases (median µs over the timed runs; THROTTLEWATCH_TIMING)$( [ $tf = timing ] || echo ", ${tf#timing-}"):"
    # `runtime created`: the wrapper's helper, after the runtime's create.
    # The agent: `register` until the answer (the hook waits for it),
    # `complete` (log, start record, state file) after it.
    for who in "throttlewatch-runtime create" "throttlewatch-runtime created" "throttlewatch-runtime start" "throttlewatch-runtime run" "throttlewatch-hook createRuntime" "throttlewatch-agent register" "throttlewatch-agent complete"; do
        grep -q "^$who " "$W/$tf" || continue
        grep "^$who " "$W/$tf" | awk -v who="$who" '
            { for (i = 3; i <= NF; i++) { split($i, kv, "="); sub("us", "", kv[2]); v[kv[1], ++n[kv[1]]] = kv[2]; if (!(kv[1] in seen)) { seen[kv[1]] = 1; order[++k] = kv[1] } } }
            END { line = "  " who ":"; for (j = 1; j <= k; j++) { p = order[j]; m = n[p]; for (a = 1; a <= m; a++) x[a] = v[p, a];
                  for (a = 1; a <= m; a++) for (b = a + 1; b <= m; b++) if (x[b] + 0 < x[a] + 0) { t = x[a]; x[a] = x[b]; x[b] = t }
                  line = line " " p "=" x[int((m + 1) / 2)] }; print line }'
    done
done
if ! grep -q '"type":"start"' "$W"/logs/*.jsonl 2>/dev/null; then
    echo "warning: no start record in $W/logs: the hook did not register (see $W/logs/hook.log)" >&2
fi
