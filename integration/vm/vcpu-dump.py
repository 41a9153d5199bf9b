#!/usr/bin/env python3
"""Dump every vCPU of a running VM-lane guest from QEMU's monitor.

    vcpu-dump.py MONITOR_SOCKET KALLSYMS [WORDS]

For each vCPU: whether it is halted, whether interrupts are enabled (RFLAGS.IF),
RIP resolved against the guest's text symbols (KALLSYMS: the text lines of its
/proc/kallsyms, which guest.sh copies to the job share at boot; BPF programs
and trampolines are in it as bpf_prog_TAG_NAME / bpf_trampoline_ID), and a scan of WORDS (default 512) stack words
from RSP for kernel text addresses (like the kernel's own "? func+off" frames:
candidates, not a verified unwind). run.sh calls it when the guest console
shows a lockup, stall or oops, and at the lane timeout, so that a CPU that
cannot print its own stack (interrupts off, the NMI not taken) still shows
where it is.
"""
import bisect
import re
import socket
import sys
import time

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b.")


class Monitor:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(10)
        self.s.connect(path)
        self.read_prompt()

    def read_prompt(self):
        buf = b""
        deadline = time.time() + 10
        while not buf.endswith(b"(qemu) ") and time.time() < deadline:
            chunk = self.s.recv(65536)
            if not chunk:
                break
            buf += chunk
        return ANSI.sub("", buf.decode("utf-8", "replace")).replace("\r", "")

    def cmd(self, line):
        self.s.sendall(line.encode() + b"\n")
        out = self.read_prompt()
        lines = out.split("\n")
        # drop the echoed command and the trailing prompt
        body = [l for l in lines if l.strip() and not l.startswith("(qemu)") and l.strip() != line]
        return "\n".join(body)


def load_symbols(path):
    """Text symbols sorted by address, and the core kernel's text range."""
    syms = []
    lo = hi = None
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) < 3:
                continue
            a, t, n = int(parts[0], 16), parts[1], parts[2]
            if n == "_stext":
                lo = a
            elif n == "_etext":
                hi = a
            if t in "tTwW" and a:
                syms.append((a, n))
    syms.sort()
    return [a for a, _ in syms], [n for _, n in syms], lo, hi


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    sock, sysmap = sys.argv[1], sys.argv[2]
    nwords = int(sys.argv[3]) if len(sys.argv) > 3 else 512
    try:
        addrs, names, lo, hi = load_symbols(sysmap)
    except OSError as e:
        # A guest that wedged before it copied its kallsyms: raw addresses,
        # and kernel text taken as the usual x86-64 kernel mapping.
        print(f"vcpu-dump: no symbols ({e}); addresses are raw", file=sys.stderr)
        addrs, names, lo, hi = [], [], 0xffffffff80000000, 0xffffffffc0000000

    def sym(a):
        i = bisect.bisect_right(addrs, a) - 1
        return f"{names[i]}+0x{a - addrs[i]:x}" if i >= 0 else f"0x{a:x}"

    def is_text(a):
        if lo is not None and hi is not None and lo <= a < hi:
            return True
        # modules, BPF programs and trampolines: close above a text symbol
        i = bisect.bisect_right(addrs, a) - 1
        return a >= 0xffffffffa0000000 and i >= 0 and (hi is None or a >= hi) and a - addrs[i] < 0x2000

    mon = Monitor(sock)
    cpus = re.findall(r"CPU #(\d+)", mon.cmd("info cpus"))
    # Three snapshots a moment apart, the vCPUs stopped for each: a vCPU
    # whose RIP does not move is stuck there; the last one gets the stack.
    for snap in range(3):
        if snap:
            mon.cmd("cont")
            time.sleep(0.3)
        mon.cmd("stop")
        last = snap == 2
        print(f"snapshot {snap + 1}/3:")
        for c in cpus:
            mon.cmd(f"cpu {c}")
            regs = mon.cmd("info registers")
            get = lambda r: (re.search(rf"\b{r}=([0-9a-f]+)", regs) or [None, "0"])[1]
            rip, rsp, rfl = int(get("RIP"), 16), int(get("RSP"), 16), int(get("RFL"), 16)
            cr2 = int(get("CR2"), 16)
            hlt = (re.search(r"HLT=(\d)", regs) or [None, "?"])[1]
            cpl = (re.search(r"CPL=(\d)", regs) or [None, "?"])[1]
            where = sym(rip) if is_text(rip) else f"0x{rip:x}"
            print(f"  vCPU {c}: RIP {where} CPL={cpl} halted={hlt} "
                  f"interrupts={'on' if rfl & 0x200 else 'OFF'} RSP=0x{rsp:x} CR2=0x{cr2:x}")
            if not last or cpl != "0":
                continue
            # the stack page by page (an unmapped page ends the scan)
            words, addr, frames = [], rsp, []
            while len(words) < nwords:
                n = min(nwords - len(words), (4096 - (addr & 4095)) // 8)
                dump = mon.cmd(f"x/{n}gx 0x{addr:x}")
                got = [int(m.group(1), 16) for m in re.finditer(r"0x([0-9a-f]{16})", dump)]
                if not got:
                    break
                words += got
                addr += 8 * n
            if rsp >= 0xfffffe0000000000 and len(words) >= 5:
                # cpu_entry_area: an exception frame pushed by the CPU
                # (error code for #PF, then RIP, CS, RFLAGS, RSP, SS)
                print("    entry-area frame: " + " ".join(f"0x{w:x}" for w in words[:6]))
                for w in words[:6]:
                    if is_text(w):
                        print(f"    interrupted at {sym(w)}")
            for w in words:
                if is_text(w):
                    frames.append(sym(w))
            for f in frames[:40]:
                print(f"    ? {f}")
    mon.cmd("cont")
    return 0


if __name__ == "__main__":
    sys.exit(main())
