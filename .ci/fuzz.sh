#!/usr/bin/env bash
# Builds memvault's fuzz targets (fuzz/, a cargo-fuzz project outside the
# main workspace) and runs each one briefly on its committed corpus.
#
#   bash .ci/fuzz.sh                 # build, then 10 s per target
#   FUZZ_SECONDS=0 bash .ci/fuzz.sh  # build only
#
# Needs cargo-fuzz; installs the pinned version when it is missing (about
# one minute on these machines). On a clean machine the whole script takes
# about 7 minutes: install ~1 min, cold ASan build ~4.5 min, 7 x 10 s runs. Stable toolchain only: RUSTC_BOOTSTRAP=1
# lets stable rustc take the -Z sanitizer flags cargo-fuzz passes.
# A crash leaves its input in fuzz/artifacts/<target>/ and fails the script.
# The committed inputs also replay without libFuzzer on every `cargo test`
# (tests/it/fuzz_replay.rs).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

CARGO_FUZZ_VERSION=0.13.1
FUZZ_SECONDS=${FUZZ_SECONDS:-10}
export CARGO_TERM_COLOR=never
export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version 2>/dev/null | grep -qF "$CARGO_FUZZ_VERSION"; then
  echo "== [$(date -u +%T)] cargo install cargo-fuzz $CARGO_FUZZ_VERSION"
  cargo install cargo-fuzz --locked --version "$CARGO_FUZZ_VERSION"
fi

echo "== [$(date -u +%T)] cargo fuzz build"
cargo fuzz build

if [ "$FUZZ_SECONDS" -gt 0 ]; then
  for target in $(cargo fuzz list); do
    # pack_merge runs like the others: memvault validates every pack before
    # libgit2 reads it (src/vault/objects.rs), so the damaged pack that
    # crashed libgit2's pack reader (now artifacts/pack_merge/, replayed by
    # cargo test) is refused as damage; each run starts from it too.
    echo "== [$(date -u +%T)] cargo fuzz run $target (${FUZZ_SECONDS}s)"
    # New inputs go to work/ (ignored by git); the committed seeds are read only.
    mkdir -p "work/$target"
    extra=()
    if [ -f "dict/$target.dict" ]; then
      extra+=("-dict=dict/$target.dict")
    fi
    seeds=("corpus/$target")
    if [ "$target" = pack_merge ]; then
      seeds+=("artifacts/pack_merge")
    fi
    cargo fuzz run "$target" "work/$target" "${seeds[@]}" -- \
      -max_total_time="$FUZZ_SECONDS" -timeout=20 -rss_limit_mb=2048 \
      -print_final_stats=1 "${extra[@]}" 2>&1 | tail -n 25
  done
fi
echo "== [$(date -u +%T)] fuzz: ok"
