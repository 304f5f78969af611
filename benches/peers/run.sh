#!/usr/bin/env bash
# benches/peers/run.sh — colony in the shared agent-framework benchmark (bench-peers).
#
# Builds the two Rust clients in release: colony's example peers_colony, and the floor,
# peers_reqwest_floor, as a package of its own in floor/ (with colony's Cargo.lock) so that
# colony's release profile does not reach it. Copies bench-peers to target/bench-peers (the
# original stays read-only), patches the copy so its run.sh knows the two clients and its
# results.py takes raw-reqwest-rust as colony's floor, runs ./setup.sh once (npm + a Python venv,
# ~500 MB) and then the copy's ./run.sh.
#
#   benches/peers/run.sh                                  # every client, RUNS=2 (RUNS=3 took 10.5 min)
#   ONLY="raw-reqwest-rust colony raw-fetch-node" RUNS=1 benches/peers/run.sh
#
# Passed through to bench-peers' run.sh: ONLY, RUNS, SEQ_T, CONC_T, CONC_C, COLD_REPS, LIMIT_S,
# PORT, OUT. Also: PEERS_SRC (default ../shared/bench-peers, beside the repository), BENCH_DIR
# (default target/bench-peers), CARGO_TARGET_DIR (default target).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SRC=${PEERS_SRC:-$ROOT/../shared/bench-peers}
BENCH=${BENCH_DIR:-$ROOT/target/bench-peers}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
case $TARGET in /*) ;; *) TARGET=$ROOT/$TARGET ;; esac
BIN=$TARGET/release/examples

echo "building the clients (release, target dir $TARGET)"
(cd "$ROOT" && CARGO_TARGET_DIR=$TARGET cargo build --release --locked --example peers_colony)
# The floor resolves against a copy of colony's lock, so it runs the same reqwest, hyper and tokio.
cp "$ROOT/Cargo.lock" "$ROOT/benches/peers/floor/Cargo.lock"
(cd "$ROOT/benches/peers/floor" && CARGO_TARGET_DIR=$TARGET/peers-floor cargo build --release)
FLOOR_BIN=$TARGET/peers-floor/release

# --- the copy: sources refreshed every time, installed packages and results kept -----------------
[[ -f $SRC/run.sh ]] || { echo "no bench-peers at $SRC (set PEERS_SRC)" >&2; exit 1; }
mkdir -p "$BENCH/results"
(cd "$SRC" && tar cf - --exclude=./node/node_modules --exclude=./venv --exclude=./results .) |
  (cd "$BENCH" && tar xf - --no-same-owner)
cp -n "$SRC"/results/* "$BENCH/results/" 2>/dev/null || true
chmod -R u+w "$BENCH" 2>/dev/null || true

python3 - "$BENCH" "$BIN" "$FLOOR_BIN" <<'EOF'
import sys
bench, bin_dir, floor_dir = sys.argv[1], sys.argv[2], sys.argv[3]

def patch(path, anchor, insert, marker):
    text = open(path).read()
    if marker in text:
        return
    if anchor not in text:
        sys.exit(f"cannot patch {path}: {anchor!r} not found")
    open(path, "w").write(text.replace(anchor, anchor + insert, 1))

# The two Rust clients run first; their folder is the copy's root (they need no files there).
patch(f"{bench}/run.sh", "CLIENTS=(\n",
      f'  "raw-reqwest-rust|.|{floor_dir}/peers_reqwest_floor"\n'
      f'  "colony|.|{bin_dir}/peers_colony"\n',
      "peers_colony")
patch(f"{bench}/run.sh", '--runtimes "node $(node --version), $(venv/bin/python --version)',
      ', $(rustc --version | cut -d" " -f1-2)', "rustc --version")
patch(f"{bench}/results.py", "FLOOR = {\n", '    "colony": "raw-reqwest-rust",\n', '"colony": "raw-reqwest-rust"')
patch(f"{bench}/results.py", "Python: /proc/self/stat, 10 ms resolution",
      "; Rust: from main(), so exec and dynamic loading count in *rest*", "Rust: from main()")
EOF

# --- the peers' packages, once ----------------------------------------------------------------------
if [[ ! -x $BENCH/venv/bin/python || ! -d $BENCH/node/node_modules ]]; then
  echo "installing the peers (setup.sh: npm + PyPI, about 500 MB)"
  "$BENCH/setup.sh"
fi

# The date-named default would overwrite the reference results copied from bench-peers.
export OUT=${OUT:-results/peers-colony-$(date +%F)}
"$BENCH/run.sh"
echo "tables:  $BENCH/$OUT.md"
echo "records: $BENCH/$OUT.jsonl (one per process; client stderr and /usr/bin/time in $OUT.raw)"
