#!/usr/bin/env python3
"""Longest Rust functions (non-test code): fnlen.py N DIR... -> 'lines file:line name'.
N = 0: every function of 80 lines or more (issue 49's limit: under 80)."""
import re, sys, pathlib
n = int(sys.argv[1]); out = []
for d in sys.argv[2:]:
    for p in pathlib.Path(d).rglob('*.rs'):
        # Test code is not production code: *_tests.rs, tests.rs, tests/ folders.
        if p.name.endswith('_tests.rs') or p.name == 'tests.rs' or 'tests' in p.parts: continue
        lines = p.read_text().split('\n')
        # stop at #[cfg(test)]
        end = next((i for i, l in enumerate(lines) if l.strip() == '#[cfg(test)]'), len(lines))
        i = 0
        while i < end:
            m = re.match(r'\s*(pub(\([^)]*\))?\s+)?(const\s+|async\s+|unsafe\s+)*fn\s+(\w+)', lines[i])
            if m:
                depth = 0; started = False; j = i
                while j < end:
                    s = re.sub(r'"(\\.|[^"\\])*"', '""', lines[j]); s = re.sub(r"'(\\.|[^'\\])'", "''", s); s = s.split('//')[0]
                    for ch in s:
                        if ch == '{': depth += 1; started = True
                        elif ch == '}': depth -= 1
                    if started and depth == 0: break
                    if not started and s.rstrip().endswith(';'): break
                    j += 1
                if started: out.append((j - i + 1, f'{p}:{i+1}', m.group(4)))
            i += 1
out.sort(reverse=True)
if n == 0: out = [o for o in out if o[0] >= 80]
for l, loc, name in (out if n == 0 else out[:n]): print(f'{l:4d} {loc} {name}')
