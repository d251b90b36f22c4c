#!/usr/bin/env bash
# Builds memvault's fuzz targets (fuzz/, a cargo-fuzz project outside the
# main workspace) and runs each one briefly on its committed corpus.
#
#   bash .ci/fuzz.sh                 # build, then 10 s per target
#   FUZZ_SECONDS=5 bash .ci/fuzz.sh  # 5 s per target (.ci/test runs this
#                                    # in the background, beside its
#                                    # later steps)
#   FUZZ_SECONDS=0 bash .ci/fuzz.sh  # build only
#   FUZZ_FLAGS= bash .ci/fuzz.sh     # the release build with
#                                    # AddressSanitizer instead
#
# By default the targets are built for this smoke run as a debug build
# without a sanitizer (`--dev --sanitizer none`: overflow checks and debug
# assertions on, libFuzzer's coverage as usual): about 1.5 minutes on these
# machines against 6 for the release build with AddressSanitizer, for about
# a quarter of its executions per second. Long runs (fuzz/README.md) use
# the release build.
#
# Needs cargo-fuzz; installs the pinned version when it is missing (about
# one minute on these machines). The targets use the library without its
# command line (fuzz/Cargo.toml: memvault without the default `cli`
# feature). Stable toolchain only: RUSTC_BOOTSTRAP=1 lets stable rustc take
# the -Z sanitizer flags cargo-fuzz passes.
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

# Word-split on purpose: flags for both `cargo fuzz build` and `run`.
# shellcheck disable=SC2206
FUZZ_FLAGS=(${FUZZ_FLAGS---dev --sanitizer none})

echo "== [$(date -u +%T)] cargo fuzz build ${FUZZ_FLAGS[*]}"
cargo fuzz build "${FUZZ_FLAGS[@]}"

# One target per core at a time: each run is one libFuzzer process, so
# FUZZ_JOBS (default: the core count) targets run side by side, each for
# its full FUZZ_SECONDS on a core of its own. Output is printed per target
# once its run ends.
run_target() {
  local target=$1
  # New inputs go to work/ (ignored by git); the committed seeds are read only.
  mkdir -p "work/$target"
  local extra=()
  if [ -f "dict/$target.dict" ]; then
    extra+=("-dict=dict/$target.dict")
  fi
  local seeds=("corpus/$target")
  # pack_merge runs like the others: memvault validates every pack before
  # libgit2 reads it (src/vault/objects.rs), so the damaged pack that
  # crashed libgit2's pack reader (now artifacts/pack_merge/, replayed by
  # cargo test) is refused as damage; each run starts from it too.
  if [ "$target" = pack_merge ]; then
    seeds+=("artifacts/pack_merge")
  fi
  cargo fuzz run "${FUZZ_FLAGS[@]}" "$target" "work/$target" "${seeds[@]}" -- \
    -max_total_time="$FUZZ_SECONDS" -timeout=20 -rss_limit_mb=2048 \
    -print_final_stats=1 "${extra[@]}"
}

if [ "$FUZZ_SECONDS" -gt 0 ]; then
  FUZZ_JOBS=${FUZZ_JOBS:-$(nproc)}
  logs=$(mktemp -d)
  targets=($(cargo fuzz list))
  failed=()
  for ((i = 0; i < ${#targets[@]}; i += FUZZ_JOBS)); do
    batch=("${targets[@]:i:FUZZ_JOBS}")
    pids=()
    for target in "${batch[@]}"; do
      echo "== [$(date -u +%T)] cargo fuzz run $target (${FUZZ_SECONDS}s)"
      run_target "$target" >"$logs/$target" 2>&1 &
      pids+=($!)
    done
    for j in "${!batch[@]}"; do
      target=${batch[$j]}
      rc=0
      wait "${pids[$j]}" || rc=$?
      echo "== [$(date -u +%T)] $target: exit $rc; the end of its output:"
      tail -n 25 "$logs/$target"
      if [ "$rc" -ne 0 ]; then
        failed+=("$target")
      fi
    done
  done
  rm -rf "$logs"
  if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz: failed: ${failed[*]} (inputs in fuzz/artifacts/<target>/)" >&2
    exit 1
  fi
fi
echo "== [$(date -u +%T)] fuzz: ok"
