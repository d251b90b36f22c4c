#!/usr/bin/env bash
# The MCP client test: the `mcp` Python SDK (pinned in requirements.txt)
# drives `memvault mcp` and compares every answer with `memvault serve`.
#
#   tests/mcp/run.sh [pytest args...]
#
# Makes the venv ($MEMVAULT_MCP_VENV, default target/mcp-venv) when it is
# missing, installs the pinned packages into it (a no-op when they are there),
# builds the debug binary (unless MEMVAULT_BIN names one) and runs pytest. Needs python3 with venv and pip.
set -euo pipefail
cd "$(dirname "$0")/../.."

die() {
  echo "tests/mcp/run.sh: $*" >&2
  exit 1
}

target_dir=${CARGO_TARGET_DIR:-target}
venv=${MEMVAULT_MCP_VENV:-$target_dir/mcp-venv}

command -v python3 >/dev/null || die "python3 is not on the PATH"
if [ ! -x "$venv/bin/python" ]; then
  echo "== making the test venv in $venv"
  python3 -m venv "$venv" || die "python3 -m venv failed (on Debian: apt-get install python3-venv)"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r tests/mcp/requirements.txt ||
  die "could not install tests/mcp/requirements.txt into $venv"

if [ -n "${MEMVAULT_BIN:-}" ]; then
  # A binary built already (.ci/test passes the debug build it made).
  bin=$MEMVAULT_BIN
else
  echo "== cargo build --bin memvault"
  cargo build --bin memvault || die "cargo build failed"
  bin="$target_dir/debug/memvault"
fi
[ -x "$bin" ] || die "no binary at $bin"

echo "== pytest tests/mcp"
MEMVAULT_BIN="$(cd "$(dirname "$bin")" && pwd)/memvault" \
  "$venv/bin/python" -m pytest -p no:cacheprovider tests/mcp "$@"
