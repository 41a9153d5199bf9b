#!/usr/bin/env bash
# VM lane: run commands inside a QEMU (TCG) guest with Debian's 6.1 kernel,
# pure cgroup v2 (cpu + cpuset delegated), bpffs, tracefs and BTF, chrooted
# into the host's root file system (shared read-only over virtio-9p).
#
#   integration/vm/run.sh [options] -- CMD [ARGS...]
#   integration/vm/run.sh [options] --script FILE
#
# See integration/vm/README.md.
set -euo pipefail

HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
CACHE=${VM_CACHE:-$HERE/cache}
TIMEOUT=${VM_TIMEOUT:-600}
MEM=${VM_MEM:-2048}
SMP=${VM_SMP:-2}
# Single-threaded TCG: both vCPUs on one host thread, one at a time. With
# multi-threaded TCG a vCPU kept executing a stale translation of code the
# other vCPU had just rewritten (the int3 of text_poke_bp() at __schedule's
# tracepoint call site, while a probe was unloaded), and the two deadlocked
# (docs/vm-lane.md, issue #18). VM_ACCEL=tcg gets the multi-threaded one back.
ACCEL=${VM_ACCEL:-tcg,thread=single}
VERBOSE=0
KEEP=0
REFRESH=0
MODPROBE=""
SCRIPT=""
ENVS=()
CMDS=()

usage() {
    cat >&2 <<'EOF'
usage: integration/vm/run.sh [options] -- CMD [ARGS...]
       integration/vm/run.sh [options] --script FILE

Boots Debian's linux-image-6.1.0-*-amd64 under qemu (TCG), pure cgroup v2,
and runs the command(s) in a chroot of the host root (read-only), cwd = the
current directory, THROTTLEWATCH_VM=1, TMPDIR=/tmp (tmpfs, writable).

  -- CMD [ARGS...]   one command; a single argument is a shell command line,
                     several are quoted as an exact argv
  --script FILE      one shell command line per line (# comments, blank lines
                     skipped), all run in one boot, in order
  --timeout SECS     whole run, boot included (default 600, env VM_TIMEOUT)
  -e, --env NAME=VAL extra environment for the commands (RUST_BACKTRACE and
                     RUST_LOG are passed through when set)
  --modprobe M[,M]   load guest kernel modules (e.g. overlay,veth) before the
                     commands; the module tree is at $THROTTLEWATCH_VM_MODULES
  -v, --verbose      stream the guest console
  --keep             keep the job directory (console log, outputs)
  --refresh          re-pick the newest kernel package and rebuild the cache
env: VM_MEM (MiB, 2048), VM_SMP (2), VM_ACCEL (tcg,thread=single), VM_KERNEL_PKG, VM_CACHE,
     VM_PVH=0 (boot the bzImage, not the extracted vmlinux), VM_WATCH_LINES (80)
     and VM_WATCH_GRACE (20 s): console lines printed after the first sign of
     kernel trouble, VM_HEARTBEAT_S (60): a guest silent that long is wedged,
     VM_TROUBLE_LOG=FILE: keep the console and vCPU dump of a failed run
exit: 0 all passed; 1 a command failed; 2 usage; 3 lane failure (setup,
      boot, timeout, preamble check, or kernel trouble: the run stops at the
      first soft/hard lockup, RCU stall, hung task, oops, BUG or panic on the
      console, or a stopped heartbeat, and prints the stacks)
EOF
    exit 2
}

log() { echo "vm: $*" >&2; }
die() { echo "vm: error: $*" >&2; exit 3; }

while [ $# -gt 0 ]; do
    case "$1" in
        --timeout) [ $# -ge 2 ] || usage; TIMEOUT=$2; shift 2 ;;
        --timeout=*) TIMEOUT=${1#*=}; shift ;;
        --script) [ $# -ge 2 ] || usage; SCRIPT=$2; shift 2 ;;
        --script=*) SCRIPT=${1#*=}; shift ;;
        -e|--env) [ $# -ge 2 ] || usage; ENVS+=("$2"); shift 2 ;;
        --env=*) ENVS+=("${1#*=}"); shift ;;
        -v|--verbose) VERBOSE=1; shift ;;
        --modprobe) [ $# -ge 2 ] || usage; MODPROBE+=" ${2//,/ }"; shift 2 ;;
        --modprobe=*) v=${1#*=}; MODPROBE+=" ${v//,/ }"; shift ;;
        --keep) KEEP=1; shift ;;
        --refresh) REFRESH=1; shift ;;
        -h|--help) usage ;;
        --) shift
            if [ $# -eq 1 ]; then CMDS+=("$1")
            elif [ $# -gt 1 ]; then q=$(printf '%q ' "$@"); CMDS+=("${q% }"); fi
            set --
            ;;
        *) echo "vm: unknown argument: $1" >&2; usage ;;
    esac
done
if ! [[ "$TIMEOUT" =~ ^[0-9]+$ ]] || [ "$TIMEOUT" -eq 0 ]; then echo "vm: bad --timeout" >&2; usage; fi
if [ -n "$SCRIPT" ]; then
    [ -r "$SCRIPT" ] || die "cannot read $SCRIPT"
    while IFS= read -r line || [ -n "$line" ]; do
        trimmed=${line#"${line%%[![:space:]]*}"}
        case "$trimmed" in ''|'#'*) continue ;; esac
        CMDS+=("$line")
    done <"$SCRIPT"
fi
[ ${#CMDS[@]} -gt 0 ] || usage
for kv in "${ENVS[@]}"; do [[ "$kv" == [A-Za-z_]*=* ]] || die "bad --env '$kv' (NAME=VALUE)"; done
[ "$(id -u)" = 0 ] || die "run as root (apt-get, and the guest sees the host root as root)"

now() { date +%s.%N; }
T_START=$(now)

# ---------------------------------------------------------------- host tools
need_pkgs=()
command -v qemu-system-x86_64 >/dev/null || need_pkgs+=(qemu-system-x86)
dpkg -s busybox-static >/dev/null 2>&1 || need_pkgs+=(busybox-static)
command -v cpio >/dev/null || need_pkgs+=(cpio)
command -v gzip >/dev/null || need_pkgs+=(gzip)
command -v flock >/dev/null || need_pkgs+=(util-linux)
if [ ${#need_pkgs[@]} -gt 0 ]; then
    log "installing ${need_pkgs[*]}"
    apt_log=$(mktemp)
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=300 \
            "${need_pkgs[@]}" >"$apt_log" 2>&1; then
        apt-get update -q >>"$apt_log" 2>&1 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=300 \
            "${need_pkgs[@]}" >>"$apt_log" 2>&1 || { cat "$apt_log" >&2; die "apt-get install failed"; }
    fi
    rm -f "$apt_log"
fi

# ------------------------------------------------- kernel + initramfs (cache)
# The initramfs holds static busybox and the virtio-9p modules; /init mounts
# the job share and hands over to guest.sh (copied per run, so editing it
# needs no rebuild).  Bump INITRD_REV when the /init text below changes.
INITRD_REV=1
MODULES=(virtio_pci 9pnet_virtio 9p)

mkdir -p "$CACHE"
stage=""
trap 'rm -rf "${stage:-/nonexistent}" "${KDIR:-/nonexistent}.tmp" "$CACHE/dl"' EXIT
exec 9>"$CACHE/.lock"
flock 9

pick_kernel_pkg() {
    if [ -n "${VM_KERNEL_PKG:-}" ]; then echo "$VM_KERNEL_PKG"; return; fi
    # newest 6.1.0-N generic amd64 image; prefer -unsigned (same image and modules)
    local n
    n=$(apt-cache search --names-only '^linux-image-6\.1\.0-[0-9]+-amd64(-unsigned)?$' \
        | sed -n 's/^linux-image-6\.1\.0-\([0-9]\+\)-amd64.*/\1/p' | sort -n | tail -1)
    [ -n "$n" ] || return 1
    if apt-cache show "linux-image-6.1.0-$n-amd64-unsigned" >/dev/null 2>&1; then
        echo "linux-image-6.1.0-$n-amd64-unsigned"
    else
        echo "linux-image-6.1.0-$n-amd64"
    fi
}

KPKG=""
[ "$REFRESH" = 0 ] && [ -z "${VM_KERNEL_PKG:-}" ] && [ -s "$CACHE/kernel-pkg" ] && KPKG=$(cat "$CACHE/kernel-pkg")
if [ -z "$KPKG" ]; then
    KPKG=$(pick_kernel_pkg) || die "no linux-image-6.1.0-*-amd64 in the apt index (apt-get update?)"
fi
KVER=${KPKG#linux-image-}; KVER=${KVER%-unsigned}
KDIR="$CACHE/$KVER"

if [ ! -e "$KDIR/.complete" ] || [ "$REFRESH" = 1 ]; then
    log "fetching $KPKG (once; cached in $KDIR)"
    rm -rf "$KDIR" "$CACHE/dl"
    mkdir -p "$CACHE/dl"
    chmod 0777 "$CACHE/dl"   # so apt's _apt user can write (no sandbox warning)
    (cd "$CACHE/dl" && apt-get download -q "$KPKG" >download.log 2>&1) \
        || { apt-get update -q >/dev/null 2>&1 || true
             (cd "$CACHE/dl" && apt-get download -q "$KPKG" >>download.log 2>&1); } \
        || { cat "$CACHE/dl/download.log" >&2; die "apt-get download $KPKG failed"; }
    rm -rf "$KDIR.tmp"
    mkdir -p "$KDIR.tmp"
    dpkg -x "$CACHE"/dl/"$KPKG"_*.deb "$KDIR.tmp"
    [ -f "$KDIR.tmp/boot/vmlinuz-$KVER" ] || die "no /boot/vmlinuz-$KVER in $KPKG"
    [ -d "$KDIR.tmp/lib/modules/$KVER" ] || die "no modules in $KPKG"
    # the package ships no modules.dep (depmod runs at install time)
    busybox depmod -b "$KDIR.tmp" "$KVER" || die "depmod failed"
    mv "$KDIR.tmp" "$KDIR"
    rm -rf "$CACHE/dl"
    touch "$KDIR/.complete"
    echo "$KPKG" >"$CACHE/kernel-pkg"
elif [ ! -s "$CACHE/kernel-pkg" ]; then
    echo "$KPKG" >"$CACHE/kernel-pkg"
fi
KERNEL="$KDIR/boot/vmlinuz-$KVER"
# Boot the uncompressed ELF through its PVH entry when the kernel has one:
# xz-decompressing the bzImage under TCG costs ~3 s per boot.
if [ "${VM_PVH:-1}" = 1 ] && grep -q '^CONFIG_PVH=y' "$KDIR/boot/config-$KVER" 2>/dev/null; then
    if [ ! -s "$KDIR/vmlinux" ]; then
        off=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$KERNEL" | head -1 | cut -d: -f1) || true
        if [ -n "$off" ] && command -v xz >/dev/null \
            && tail -c +$((off + 1)) "$KERNEL" >"$KDIR/vmlinux.xz.tmp" \
            && xz -dc --single-stream "$KDIR/vmlinux.xz.tmp" >"$KDIR/vmlinux.tmp" 2>/dev/null \
            && [ "$(head -c 4 "$KDIR/vmlinux.tmp" | od -An -tx1 | tr -d ' ')" = 7f454c46 ]; then
            mv "$KDIR/vmlinux.tmp" "$KDIR/vmlinux"
            rm -f "$KDIR/vmlinux.xz.tmp"
        else
            rm -f "$KDIR/vmlinux.tmp" "$KDIR/vmlinux.xz.tmp"
            log "warning: cannot extract an uncompressed vmlinux; booting the bzImage (slower)"
        fi
    fi
    [ -s "$KDIR/vmlinux" ] && KERNEL="$KDIR/vmlinux"
fi
MODDIR="$KDIR/lib/modules/$KVER"

INITRD="$CACHE/initramfs-$KVER-r$INITRD_REV.cpio.gz"
if [ ! -s "$INITRD" ] || [ "$REFRESH" = 1 ]; then
    stage=$(mktemp -d)
    mkdir -p "$stage"/{bin,sbin,proc,sys,dev,job,lib/modules}
    cp /bin/busybox "$stage/bin/busybox"
    ln -s busybox "$stage/bin/sh"
    # dependency order from modules.dep: dependencies first, each module once
    declare -A seen=()
    order=()
    resolve() {
        local name=$1 line rel deps d
        line=$(grep -E "(^|/)${name}\.ko(\.[a-z]+)?:" "$MODDIR/modules.dep" | head -1) || true
        [ -n "$line" ] || { grep -qE "/${name}\.ko" "$MODDIR/modules.builtin" 2>/dev/null \
            || die "module $name not in $KPKG"; return 0; }
        rel=${line%%:*}
        [ -n "${seen[$rel]:-}" ] && return 0
        seen[$rel]=1
        deps=${line#*:}
        for d in $deps; do
            d=${d##*/}; d=${d%%.ko*}
            resolve "$d"
        done
        order+=("$rel")
    }
    for m in "${MODULES[@]}"; do resolve "$m"; done
    : >"$stage/modules.load"
    for rel in "${order[@]}"; do
        base=${rel##*/}
        case "$rel" in
            *.ko) cp "$MODDIR/$rel" "$stage/lib/modules/$base" ;;
            *.ko.xz) xz -dc "$MODDIR/$rel" >"$stage/lib/modules/${base%.xz}"; base=${base%.xz} ;;
            *.ko.zst) zstd -qdc "$MODDIR/$rel" >"$stage/lib/modules/${base%.zst}"; base=${base%.zst} ;;
            *) die "unsupported module file $rel" ;;
        esac
        echo "$base" >>"$stage/modules.load"
    done
    cat >"$stage/init" <<'EOF'
#!/bin/sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
while read -r m; do
    insmod "/lib/modules/$m" || echo "vm-init: insmod $m failed"
done </modules.load
if ! mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 job /job; then
    echo "vm-init: cannot mount the job share"; poweroff -f
fi
exec sh /job/guest.sh
EOF
    chmod 0755 "$stage/init"
    (cd "$stage" && find . -print0 | cpio --null -o -H newc --quiet | gzip -1) >"$INITRD.tmp"
    mv "$INITRD.tmp" "$INITRD"
    rm -rf "$stage"
fi
exec 9>&-

# ---------------------------------------------------------------- the job
JOB=$(mktemp -d "${TMPDIR:-/tmp}/throttlewatch-vm.XXXXXX")
QPID=""
# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
    local rc=$?
    if [ -n "$QPID" ] && kill -0 "$QPID" 2>/dev/null; then
        kill "$QPID" 2>/dev/null || true
        sleep 0.5
        kill -KILL "$QPID" 2>/dev/null || true
    fi
    if [ "$KEEP" = 1 ]; then log "job directory kept: $JOB"; else rm -rf "$JOB"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

cp "$HERE/guest.sh" "$JOB/guest.sh"
mkdir -p "$JOB/artifacts"
{
    printf 'VM_CWD=%q\n' "$PWD"
    # Host paths under /tmp the job reads besides its cwd: cargo's target
    # directory when it is elsewhere (CI builds into its own).
    printf 'VM_KEEP=%q\n' "${CARGO_TARGET_DIR:-}"
    printf 'VM_NCMDS=%d\n' "${#CMDS[@]}"
    printf 'VM_CACHE_MODULES=%q\n' "$(cd "$MODDIR" && pwd -P)"
    printf 'VM_MODPROBE=%q\n' "$MODPROBE"
} >"$JOB/config"
: >"$JOB/env"
for v in RUST_BACKTRACE RUST_LOG RUST_LIB_BACKTRACE; do
    [ -n "${!v:-}" ] && printf '%s=%s\n' "$v" "${!v}" >>"$JOB/env"
done
for kv in "${ENVS[@]}"; do printf '%s\n' "$kv" >>"$JOB/env"; done
for i in "${!CMDS[@]}"; do printf '%s' "${CMDS[$i]}" >"$JOB/cmd.$((i + 1))"; done

# tsc=reliable: under TCG the guest calibrates the TSC against the PIT to
# about 1 %, marks it unstable and keeps CLOCK_MONOTONIC on the HPET, while
# sched_clock() (the scheduler's clock, in which cpu.stat is counted) stays
# on the TSC: the two clocks then drift apart by the calibration error.
# One clocksource for both keeps kernel accounting and probe timestamps on
# the same time base, as on real hardware.
APPEND="console=ttyS0 quiet loglevel=4 panic=-1 rdinit=/init tsc=reliable"
APPEND+=" systemd.unified_cgroup_hierarchy=1 cgroup_no_v1=all"
# Kernel trouble must show its stack: every CPU's backtrace at a soft
# lockup or hung task (guest.sh raises the console level once booted), and
# the vCPU dump below.
APPEND+=" softlockup_all_cpu_backtrace=1"
QEMU=(qemu-system-x86_64 -accel "$ACCEL" -cpu max -m "$MEM" -smp "$SMP"
      -nographic -nodefaults -no-user-config -serial stdio -no-reboot
      -kernel "$KERNEL" -initrd "$INITRD" -append "$APPEND"
      -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap"
      -virtfs "local,path=$JOB,mount_tag=job,security_model=none,multidevs=remap"
      -monitor "unix:$JOB/monitor.sock,server=on,wait=off")

# qboot (qemu-system-data) boots faster than SeaBIOS and prints nothing
for d in /usr/share/qemu /usr/share/qemu-system-data; do
    [ -f "$d/qboot.rom" ] && { QEMU+=(-bios qboot.rom); break; }
done

T_QEMU=$(now)
"${QEMU[@]}" </dev/null >"$JOB/console.log" 2>&1 &
QPID=$!
[ "$VERBOSE" = 1 ] && tail -n +1 -f --pid="$QPID" "$JOB/console.log" >&2 &
# The console is watched while the guest runs: the first line that says the
# kernel is in trouble (soft or hard lockup, RCU stall, hung task, oops, BUG,
# panic) fails the run at once.  The watcher lets the kernel finish printing
# the stacks (VM_WATCH_LINES lines after the match, or VM_WATCH_GRACE
# seconds), asks QEMU for every vCPU's registers and stack (vcpu-dump.py,
# symbolised with the guest's kallsyms, which guest.sh copies to the job
# share; Debian's System.map is a placeholder), then kills QEMU.
TROUBLE_RE='soft lockup|hard LOCKUP|rcu: INFO:|rcu_[a-z_]* (self-)?detected stall|detected stalls on CPUs|rcu_[a-z_]* kthread (timer wakeup didn.t happen|starved)|hung_task|blocked for more than|Oops|BUG:|kernel BUG|Kernel panic|general protection'
WATCH_LINES=${VM_WATCH_LINES:-80}
WATCH_GRACE=${VM_WATCH_GRACE:-20}
SYSMAP="$JOB/kallsyms"
HEARTBEAT_S=${VM_HEARTBEAT_S:-60}
timed_out=0
wedged=0
trouble=""        # line number of the first match in console.log
trouble_at=0
deadline=$(( $(date +%s) + TIMEOUT ))
T_BOOT=""
while kill -0 "$QPID" 2>/dev/null; do
    [ -z "$T_BOOT" ] && [ -e "$JOB/boot" ] && T_BOOT=$(now)
    if [ -z "$trouble" ]; then
        m=$(grep -anm1 -E "$TROUBLE_RE" "$JOB/console.log" 2>/dev/null | cut -d: -f1) || true
        if [ -n "$m" ]; then
            trouble=$m
            trouble_at=$(date +%s)
            log "guest kernel trouble at console line $m: $(sed -n "${m}p" "$JOB/console.log" | tr -d '\r')"
        fi
    elif [ "$(wc -l <"$JOB/console.log")" -ge $((trouble + WATCH_LINES)) ] \
            || [ "$(date +%s)" -ge $((trouble_at + WATCH_GRACE)) ]; then
        python3 "$HERE/vcpu-dump.py" "$JOB/monitor.sock" "$SYSMAP" >"$JOB/vcpus.txt" 2>&1 || true
        kill "$QPID" 2>/dev/null || true
        sleep 1
        kill -KILL "$QPID" 2>/dev/null || true
        break
    fi
    # a guest that stops rewriting its heartbeat is wedged (every CPU
    # spinning with interrupts off prints nothing): fail it the same way
    if [ -z "$trouble" ] && [ -e "$JOB/heartbeat" ] \
            && [ $(( $(date +%s) - $(stat -c %Y "$JOB/heartbeat") )) -ge "$HEARTBEAT_S" ]; then
        log "guest heartbeat stopped ${HEARTBEAT_S}s ago: the guest is wedged"
        wedged=1
        python3 "$HERE/vcpu-dump.py" "$JOB/monitor.sock" "$SYSMAP" >"$JOB/vcpus.txt" 2>&1 || true
        kill "$QPID" 2>/dev/null || true
        sleep 1
        kill -KILL "$QPID" 2>/dev/null || true
        break
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
        [ -z "$trouble" ] && python3 "$HERE/vcpu-dump.py" "$JOB/monitor.sock" "$SYSMAP" \
            >"$JOB/vcpus.txt" 2>&1 || true
        timed_out=1
        kill "$QPID" 2>/dev/null || true
        sleep 1
        kill -KILL "$QPID" 2>/dev/null || true
        break
    fi
    sleep 0.2
done
wait "$QPID" 2>/dev/null || true
QPID=""
T_END=$(now)

# ---------------------------------------------------------------- report
lane_fail=()
fmt() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

if [ -s "$JOB/preamble" ]; then
    if [ -e "$JOB/preamble.fail" ] || [ "$VERBOSE" = 1 ]; then sed 's/^/vm: /' "$JOB/preamble" >&2
    elif [ -s "$JOB/preamble.short" ]; then sed 's/^/vm: /' "$JOB/preamble.short" >&2; fi
    [ -e "$JOB/preamble.fail" ] && lane_fail+=("preamble check failed:$(cat "$JOB/preamble.fail")")
fi

n=${#CMDS[@]}
summary=()
any_fail=0
for i in $(seq 1 "$n"); do
    cmd=${CMDS[$((i - 1))]}
    if [ -e "$JOB/out.$i" ]; then
        [ "$n" -gt 1 ] && echo "=== [$i/$n] $cmd"
        cat "$JOB/out.$i"
    fi
    if [ -s "$JOB/rc.$i" ]; then
        read -r rc t0 t1 <"$JOB/rc.$i"
        if [ "$rc" = 0 ]; then summary+=("PASS $cmd ($(fmt "$t0" "$t1")s)")
        else summary+=("FAIL $cmd rc=$rc ($(fmt "$t0" "$t1")s)"); any_fail=1; fi
    elif [ -e "$JOB/out.$i" ]; then
        summary+=("FAIL $cmd (did not finish)"); any_fail=1
    else
        summary+=("FAIL $cmd (not run)"); any_fail=1
    fi
done

console="$JOB/console.log"
clean() { sed 's/\x1b\[[0-9;?]*[A-Za-z]//g; s/\x1b.//g; s/\r//g'; }
[ "$timed_out" = 1 ] && lane_fail+=("guest did not finish within ${TIMEOUT}s (qemu killed)")
[ "$wedged" = 1 ] && lane_fail+=("guest kernel wedged: no heartbeat for ${HEARTBEAT_S}s and nothing on the console (see the vCPU dump)")
# the loop above stops at the first match; a guest that ended on its own
# (a panic with panic=-1) is checked here too
[ -z "$trouble" ] && trouble=$(grep -anm1 -E "$TROUBLE_RE" "$console" 2>/dev/null | cut -d: -f1) || true
if [ -n "$trouble" ]; then
    lane_fail+=("guest kernel: $(sed -n "${trouble}p" "$console" | clean)")
    {
        echo "vm: ---- guest console from the first sign of trouble (line $trouble) ----"
        sed -n "$((trouble > 5 ? trouble - 5 : 1)),$((trouble + WATCH_LINES))p" "$console" | clean
        if [ -s "$JOB/vcpus.txt" ]; then
            echo "vm: ---- vCPU registers and stacks from QEMU ----"
            cat "$JOB/vcpus.txt"
        fi
        echo "vm: ----"
    } >&2
elif grep -q 'WARNING: CPU' "$console" 2>/dev/null; then
    log "warning: the guest kernel logged a WARNING (see the console with --keep/-v)"
fi
[ -s "$JOB/setup.err" ] && lane_fail+=("guest setup: $(tr '\n' ' ' <"$JOB/setup.err")")
[ "$timed_out" = 0 ] && [ ! -e "$JOB/done" ] && [ ${#lane_fail[@]} -eq 0 ] \
    && lane_fail+=("guest stopped before finishing the job")

# VM_TROUBLE_LOG=FILE keeps the whole console and the vCPU dump of a failed run
if [ ${#lane_fail[@]} -gt 0 ] && [ -n "${VM_TROUBLE_LOG:-}" ]; then
    { clean <"$console"; echo "---- vcpus"; cat "$JOB/vcpus.txt" 2>/dev/null; } >"$VM_TROUBLE_LOG" || true
fi
boot="boot ?"
[ -n "$T_BOOT" ] && boot="boot $(fmt "$T_QEMU" "$T_BOOT")s"
[ -s "$JOB/boot" ] && boot+=" (guest uptime $(cat "$JOB/boot")s)"
for s in "${summary[@]}"; do echo "$s"; done
if [ ${#lane_fail[@]} -gt 0 ]; then
    if [ "$VERBOSE" = 0 ] && [ -z "$trouble" ]; then
        echo "vm: ---- guest console (last 60 lines) ----" >&2
        tail -n 60 "$console" | clean >&2 || true
        if [ -s "$JOB/vcpus.txt" ]; then
            echo "vm: ---- vCPU registers and stacks from QEMU ----" >&2
            cat "$JOB/vcpus.txt" >&2
        fi
        echo "vm: ----" >&2
    fi
    for f in "${lane_fail[@]}"; do echo "vm: LANE FAIL: $f" >&2; done
fi
echo "vm: $KVER, $boot, total $(fmt "$T_START" "$T_END")s (qemu $(fmt "$T_QEMU" "$T_END")s)" >&2

[ ${#lane_fail[@]} -gt 0 ] && exit 3
[ "$any_fail" = 1 ] && exit 1
exit 0
