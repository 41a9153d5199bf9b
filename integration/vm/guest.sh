#!/bin/sh
# Runs inside the VM lane's guest (busybox sh, PID 1 via the initramfs /init),
# copied onto the job share by run.sh for every run.  It sets up a chroot of
# the read-only host root with the guest's own /proc, /sys, /dev, cgroup2,
# bpffs, tracefs and tmpfs /tmp /run, runs the job's commands inside it and
# records each command's output, exit status and timing on the job share.
#
# Job share layout (/job, written by run.sh unless noted):
#   config      sourced: VM_CWD, VM_KEEP, VM_NCMDS, VM_CACHE_MODULES, VM_MODPROBE
#   env         extra NAME=VALUE lines for the commands' environment
#   cmd.N       command line N (bash)
#   out.N       (guest) stdout+stderr of command N
#   rc.N        (guest) "RC START END" (guest uptime seconds)
#   running     (guest) index of the command in progress
#   preamble    (guest) environment check report, preamble.fail on failure
#   boot        (guest) guest uptime when the job started
#   kallsyms    (guest) text lines of /proc/kallsyms, for run.sh's vCPU dump
#   heartbeat   (guest) rewritten every 2 s while the guest runs
#   done        (guest) written last, before power-off
#   artifacts/  writable dir, visible to commands as $THROTTLEWATCH_VM_ARTIFACTS

PATH=/bin:/sbin
export PATH
J=/job
H=/host

uptime_s() { cut -d' ' -f1 /proc/uptime; }
die() {
    echo "vm-guest: $*" >&2
    echo "vm-guest: $*" >>"$J/setup.err"
    sync
    poweroff -f
}

cut -d' ' -f1 /proc/uptime >"$J/boot"
# shellcheck disable=SC1091
. "$J/config"

mkdir -p /host
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=loose,ro hostroot "$H" \
    || die "cannot mount the host root (9p tag hostroot)"

# The chroot's own kernel file systems, mounted over the (read-only) host's
# directories: the guest never sees the host's /proc, /sys or /dev.
mount -t proc proc "$H/proc" || die "mount proc"
mount -t sysfs sysfs "$H/sys" || die "mount sysfs"
mount -t devtmpfs devtmpfs "$H/dev" || die "mount devtmpfs"
mkdir -p "$H/dev/pts" "$H/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666 devpts "$H/dev/pts" || die "mount devpts"
mount -t tmpfs -o mode=1777 tmpfs "$H/dev/shm" || die "mount /dev/shm"
mount -t tmpfs -o mode=0755 tmpfs "$H/run" || die "mount /run"
# the host's /tmp stays reachable (read-only) under /run before the guest's
# own tmpfs covers /tmp
mkdir -p "$H/run/throttlewatch-vm/host-tmp"
mount -o bind "$H/tmp" "$H/run/throttlewatch-vm/host-tmp" || die "bind host /tmp"
mount -t tmpfs -o mode=1777 tmpfs "$H/tmp" || die "mount /tmp"
mount -t tmpfs -o mode=1777 tmpfs "$H/var/tmp" || die "mount /var/tmp"
# A checkout under the host's /tmp (CI clones there), and a target directory
# there (VM_KEEP), stay visible at their own paths: bind each top directory
# back over the guest's tmpfs.
for keep in "$VM_CWD" ${VM_KEEP:+"$VM_KEEP"}; do
    case "$keep" in
    /tmp/?*)
        top=${keep#/tmp/}
        top=${top%%/*}
        mountpoint -q "$H/tmp/$top" && continue
        mkdir -p "$H/tmp/$top"
        mount -o bind "$H/run/throttlewatch-vm/host-tmp/$top" "$H/tmp/$top" || die "bind /tmp/$top"
        ;;
    esac
done
mount -t cgroup2 -o nsdelegate cgroup2 "$H/sys/fs/cgroup" || die "mount cgroup2"
mount -t bpf -o mode=0700 bpf "$H/sys/fs/bpf" || die "mount bpffs"
mount -t tracefs tracefs "$H/sys/kernel/tracing" || die "mount tracefs"
mount -t debugfs debugfs "$H/sys/kernel/debug" 2>/dev/null || true

# Kernel trouble prints its stacks on the console, which run.sh watches and
# fails on at the first lockup, stall, hung task or oops (the boot itself
# stays quiet at loglevel 4): console level 7, every CPU's backtrace at a
# hung task too (soft lockups: softlockup_all_cpu_backtrace=1 on the
# command line), hung tasks reported after 60 s instead of 120 s.
echo 7 >/proc/sys/kernel/printk
for kv in hung_task_all_cpu_backtrace=1 hung_task_timeout_secs=60; do
    [ -w "/proc/sys/kernel/${kv%%=*}" ] && echo "${kv#*=}" >"/proc/sys/kernel/${kv%%=*}"
done

# The text symbols, for run.sh's vCPU dump (0.7 s, in the background).
(grep -E ' [tTwW] ' /proc/kallsyms >"$J/kallsyms.tmp" && mv "$J/kallsyms.tmp" "$J/kallsyms") &

# Loopback up: the agent serves metrics on 127.0.0.1.
ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up 2>/dev/null || die "loopback up"

# Delegate every controller the root offers (cpu and cpuset included) to
# children, as systemd does on a pure-v2 host.
ctrls=""
for c in $(cat "$H/sys/fs/cgroup/cgroup.controllers"); do ctrls="$ctrls +$c"; done
[ -n "$ctrls" ] && echo "$ctrls" >"$H/sys/fs/cgroup/cgroup.subtree_control"

# The guest kernel's full module tree (from the cache) at /lib/modules/$(uname -r)
# of the initramfs, so that busybox modprobe can load what --modprobe asked
# for; commands see the tree at $THROTTLEWATCH_VM_MODULES (busybox insmod).
kver=$(uname -r)
if [ -n "${VM_CACHE_MODULES:-}" ] && [ -d "$H$VM_CACHE_MODULES" ]; then
    mkdir -p "/lib/modules/$kver"
    mount -o bind "$H$VM_CACHE_MODULES" "/lib/modules/$kver" || die "bind the module tree"
    for m in overlay ${VM_MODPROBE:-}; do
        modprobe "$m" || die "modprobe $m failed"
    done
else
    die "no module tree (overlay for /var/lib, --modprobe)"
fi

# A writable /var/lib, as a node has (the host root is read-only): the
# host's /var/lib as the lower layer of an overlay whose upper layer is a
# tmpfs. CNI keeps its results cache in /var/lib/cni (libcni's default; a
# pod network fails when it cannot write there).
mkdir -p /varlib
mount -t tmpfs -o mode=0755 tmpfs /varlib || die "mount the /var/lib upper tmpfs"
mkdir -p /varlib/upper /varlib/work
mount -t overlay overlay -o "lowerdir=$H/var/lib,upperdir=/varlib/upper,workdir=/varlib/work" "$H/var/lib" \
    || die "mount the /var/lib overlay"

mkdir -p "$J/artifacts" "$H/run/throttlewatch-vm/artifacts"
mount -o bind "$J/artifacts" "$H/run/throttlewatch-vm/artifacts" || die "bind artifacts"

# ---- preamble: is this the environment the lane promises? ----
{
    fail=""
    echo "kernel: $kver"
    fstype=$(stat -f -c %t "$H/sys/fs/cgroup" 2>/dev/null)   # f_type in hex
    case "$fstype" in
        63677270) echo "cgroup: /sys/fs/cgroup is cgroup2" ;;
        *) echo "cgroup: /sys/fs/cgroup is '$fstype', not cgroup2"; fail="$fail cgroup2" ;;
    esac
    if grep -qs '^cgroup ' /proc/mounts; then
        echo "cgroup: a cgroup v1 hierarchy is mounted"; fail="$fail v1"
    fi
    ctl=$(cat "$H/sys/fs/cgroup/cgroup.subtree_control")
    echo "cgroup: root subtree_control: $ctl"
    for c in cpu cpuset; do
        case " $ctl " in *" $c "*) ;; *) echo "cgroup: controller $c missing"; fail="$fail $c" ;; esac
    done
    probe="$H/sys/fs/cgroup/vm-preamble.$$"
    if mkdir "$probe" 2>/dev/null; then
        if [ -e "$probe/cpu.max.burst" ] \
            && echo "50000 100000" >"$probe/cpu.max" \
            && echo "20000" >"$probe/cpu.max.burst"; then
            echo "cgroup: child accepts cpu.max='$(cat "$probe/cpu.max")' cpu.max.burst=$(cat "$probe/cpu.max.burst")"
        else
            echo "cgroup: cpu.max / cpu.max.burst missing or rejected in a child"; fail="$fail cpu.max.burst"
        fi
        rmdir "$probe"
    else
        echo "cgroup: cannot create a child cgroup"; fail="$fail mkdir"
    fi
    if touch "$H/var/lib/.vm-preamble" 2>/dev/null && rm "$H/var/lib/.vm-preamble"; then
        echo "var/lib: writable (overlay on a tmpfs)"
    else
        echo "var/lib: not writable"; fail="$fail var-lib"
    fi
    if [ -e "$H/sys/kernel/btf/vmlinux" ]; then
        echo "btf: /sys/kernel/btf/vmlinux present"
    else
        echo "btf: /sys/kernel/btf/vmlinux MISSING"; fail="$fail btf"
    fi
    [ -n "$fail" ] && echo "$fail" >"$J/preamble.fail"
    if [ -z "$fail" ]; then
        echo "guest $kver: cgroup2 only, controllers [$ctl], cpu.max.burst ok, BTF ok, /var/lib writable" >"$J/preamble.short"
    fi
} >"$J/preamble" 2>&1

# ---- heartbeat: run.sh fails the run when it stops (a guest wedged with
# interrupts off on every CPU prints nothing on the console) ----
( while :; do cut -d' ' -f1 /proc/uptime >"$J/heartbeat"; sleep 2; done ) &

# ---- the commands ----
set -- PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root TMPDIR=/tmp LANG=C.UTF-8 THROTTLEWATCH_VM=1 \
    THROTTLEWATCH_VM_ARTIFACTS=/run/throttlewatch-vm/artifacts \
    "THROTTLEWATCH_VM_MODULES=${VM_CACHE_MODULES:-}"
if [ -s "$J/env" ]; then
    while IFS= read -r kv || [ -n "$kv" ]; do
        [ -n "$kv" ] && set -- "$@" "$kv"
    done <"$J/env"
fi

i=1
while [ "$i" -le "$VM_NCMDS" ]; do
    cmd=$(cat "$J/cmd.$i")
    echo "$i" >"$J/running"
    t0=$(uptime_s)
    # shellcheck disable=SC2016  # expanded by the inner bash
    chroot "$H" /usr/bin/env -i "$@" /bin/bash -c 'cd -- "$1" || exit 125; eval "$2"' \
        vm "$VM_CWD" "$cmd" </dev/null >"$J/out.$i" 2>&1
    rc=$?
    t1=$(uptime_s)
    echo "$rc $t0 $t1" >"$J/rc.$i"
    i=$((i + 1))
done

rm -f "$J/running"
sync
echo ok >"$J/done"
sync
poweroff -f
