#!/usr/bin/env bash
# benches/binary.sh — what `cargo install --path .` puts on a user's disk, and whether a panic's
# backtrace from that binary still names colony's files and lines.
#
#   benches/binary.sh              # installs into target/binary-check (a release build, ~16 min
#                                  # from nothing on 2 cores), prints the figures, checks the panic
#
# Prints the installed binary's size, its largest sections, and the backtrace of
# COLONY_PANIC_ON_PURPOSE=1 RUST_BACKTRACE=1, with the .dwo file under target/ and without it,
# and says whether the binary meets the aim of issue 18 (under 30 MB). Exits 1 when no frame
# reads `at .../runtime/cli/mod.rs:LINE` (with the .dwo or without) or `colony::cli::main`
# (with it).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=${DEST:-$ROOT/target/binary-check}
LIMIT=$((30 * 1000 * 1000))

cd "$ROOT"
cargo install --locked --path . --root "$DEST" --force --quiet
BIN=$DEST/bin/colony
SIZE=$(stat -c %s "$BIN")
awk -v b="${BIN#"$ROOT"/}" -v s="$SIZE" 'BEGIN { printf "installed binary: %s, %.1f MB (%d bytes)\n", b, s / 1e6, s }'

echo "largest sections (bytes as stored; the .debug_* ones are zlib-compressed):"
size -A "$BIN" | awk '$1 ~ /^\./ { printf "  %-20s %10d\n", $1, $2 }' | sort -k2 -n -r | head -12
# What the sections hold in the file (.bss and .tbss take no room there); the rest of the file
# is the symbol table and the headers.
STORED=$(size -A "$BIN" | awk '$1 ~ /^\./ && $1 != ".bss" && $1 != ".tbss" { n += $2 } END { print n }')
printf '  %-20s %10d\n' "(symbols, headers)" $((SIZE - STORED))

echo "the panic on purpose:"
TRACE=$(COLONY_PANIC_ON_PURPOSE=1 RUST_BACKTRACE=1 "$BIN" providers 2>&1 || true)
echo "$TRACE" | sed 's/^/  /'

# The same without the .dwo file (after `cargo clean`, or on another machine): the frames lose
# their names, not their files and lines.
DWO=$(readelf --debug-dump=info "$BIN" 2>/dev/null | sed -n 's/.*DW_AT_dwo_name.*: \(\/.*\.dwo\)$/\1/p' | head -1)
BARE=""
if [[ -n $DWO && -f $DWO ]]; then
  mv "$DWO" "$DWO.away"
  trap 'mv "$DWO.away" "$DWO"' EXIT
  BARE=$(COLONY_PANIC_ON_PURPOSE=1 RUST_BACKTRACE=1 "$BIN" providers 2>&1 || true)
  mv "$DWO.away" "$DWO"
  trap - EXIT
  echo "the same without $(basename "$DWO"), the frames around runtime/cli/mod.rs:"
  echo "$BARE" | grep -B1 -A1 'runtime/cli/mod\.rs' | sed 's/^/  /' || true
fi

if ((SIZE < LIMIT)); then
  echo "aim, under 30 MB: met"
else
  echo "aim, under 30 MB: missed by $(((SIZE - LIMIT + 500000) / 1000000)) MB"
fi
if ! echo "$TRACE" | grep -Eq '^ +at .*runtime/cli/mod\.rs:[0-9]+'; then
  echo "FAIL: no frame of the backtrace names runtime/cli/mod.rs:LINE" >&2
  exit 1
fi
if ! echo "$TRACE" | grep -Eq '^ +[0-9]+: colony::cli::main$'; then
  echo "FAIL: no frame of the backtrace names colony::cli::main" >&2
  exit 1
fi
if [[ -n $BARE ]] && ! echo "$BARE" | grep -Eq '^ +at .*runtime/cli/mod\.rs:[0-9]+'; then
  echo "FAIL: without the .dwo file no frame names runtime/cli/mod.rs:LINE" >&2
  exit 1
fi
echo "ok: the backtrace names file:line and function"
