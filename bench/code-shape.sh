#!/bin/sh
# The code-shape figures of issues 10, 34 and 49 (crate graph, longest functions, state-file names,
# agent clients, atomic writers), from the repository root: bench/code-shape.sh
echo "## crate graph (cargo metadata --format-version 1 --no-deps): workspace deps of each crate"
cargo metadata --format-version 1 --no-deps 2>/dev/null | python3 -c '
import json,sys
m=json.load(sys.stdin); names={p["name"] for p in m["packages"]}
for p in sorted(m["packages"], key=lambda p:p["name"]):
    d=sorted({x["name"] for x in p["dependencies"] if x["name"] in names and x["kind"] is None})
    print("  "+p["name"]+" -> "+(", ".join(d) or "-"))'
echo "## ten longest functions in the front-end crates (hook runtime shim + lifecycle when present; non-test)"
python3 "$(dirname "$0")/fnlen.py" 10 hook runtime shim $( [ -d lifecycle ] && echo lifecycle )
echo "## ten longest functions, all front-end related libraries (adds qos cgroup core)"
python3 "$(dirname "$0")/fnlen.py" 10 hook runtime shim qos cgroup core $( [ -d lifecycle ] && echo lifecycle )
SRC="agent/src bpf/src cgroup/src core/src qos/src hook/src runtime/src shim/src integration/src $( [ -d lifecycle ] && echo lifecycle/src )"
echo "## places naming each state file (string literals, code lines, excluding comments)"
for s in '"agent.lock"' '"containers"' '"bursts"' '"cpusets"' '"cpusets.json"' '"cpusets.lock"' '.replace(".jsonl"' '"config.json"'; do
  n=$(grep -rnF -- "$s" $SRC 2>/dev/null | grep -v '^[^:]*:[0-9]*:\s*//' | wc -l)
  echo "  $s: $n"; grep -rnF -- "$s" $SRC 2>/dev/null | grep -v '^[^:]*:[0-9]*:\s*//' | sed 's/^/      /' | cut -c1-140
done
echo "## agent clients (code that sends a protocol Request to the agent socket, outside core::protocol and tests)"
grep -rnE 'protocol::\{?[^}]*\bcall\b|call_on\(|fn call\(' $SRC 2>/dev/null | grep -v '^integration' | sed 's/^/  /'
echo "## atomic-write helpers (temp file then rename)"
grep -rnE 'fs::rename\(&?tmp' $SRC agent/src/install*.rs agent/src/install/ 2>/dev/null | sort -u | sed 's/^/  /'
ALL="agent bpf cgroup core qos hook runtime shim report nri $( [ -d lifecycle ] && echo lifecycle )"
echo "## ten longest functions, whole workspace (non-test; issue 34)"
python3 "$(dirname "$0")/fnlen.py" 10 $ALL
echo "## Result<_, String> in production code (issue 34)"
n=0
for c in $ALL; do
  # A function's return type (", String>" then the body, a where, the
  # line's end, or a parameter's comma), above the file's #[cfg(test)]
  # module; not a String inside another type (Result<Map<String, String>, E>).
  k=$(find "$c/src" -name '*.rs' ! -name '*_tests.rs' ! -path '*/tests/*' 2>/dev/null \
      | xargs -r awk 't && /^mod / { t = 0; nextfile } { t = /^#\[cfg\(test\)\]/; print }' \
      | grep -cP 'Result<[^;{]*, String>+ *(\{|where|$|,(?! *[A-Z]))')
  echo "  $c: $k"; n=$((n + k))
done
echo "  total: $n"
echo "## type names defined in more than one place (pub or not; struct, enum, trait; issue 34)"
grep -rhoE '^\s*(pub(\([a-z]+\))? )?(struct|enum|trait) [A-Z][A-Za-z0-9]*' $(for c in $ALL; do echo "$c/src"; done) 2>/dev/null \
  | awk '{print $NF}' | sort | uniq -c | awk '$1 > 1 {print "  " $2 " x" $1}'
echo "## files per source folder (issue 34)"
for d in $(find $(for c in $ALL; do echo "$c/src"; done) -type d 2>/dev/null | sort); do
  echo "  $d: $(find "$d" -maxdepth 1 -name '*.rs' | wc -l)"
done
echo "## production files of 500 lines or more (issue 49: under 500; whole files, test files excluded: *_tests.rs, tests.rs, tests/)"
n=0
for f in $(find $(for c in $ALL fleet; do echo "$c/src"; done) -name '*.rs' ! -name '*_tests.rs' ! -name 'tests.rs' ! -path '*/tests/*' 2>/dev/null | sort); do
  l=$(wc -l < "$f"); [ "$l" -ge 500 ] && { echo "  $f: $l"; n=$((n + 1)); }
done
echo "  total: $n"
echo "## production functions of 80 lines or more (issue 49: under 80; above a file's #[cfg(test)], test files excluded)"
python3 "$(dirname "$0")/fnlen.py" 0 $ALL fleet | sed 's/^/  /'
echo "  total: $(python3 "$(dirname "$0")/fnlen.py" 0 $ALL fleet | wc -l)"
echo "## file-level import loops per crate (issue 49; lifecycle/tests/file_cycles.rs, which says what it reads)"
cargo test -q -p throttlewatch-lifecycle --test file_cycles no_file_imports_loop_back_inside_a_crate -- --nocapture 2>/dev/null \
  | grep -E '^(throttlewatch|containerd-shim)[^ ]*: |^    [a-z].* takes ' | sed 's/^/  /'
true
