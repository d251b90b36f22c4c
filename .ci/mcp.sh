#!/usr/bin/env bash
# CI for `memvault mcp`: the dependency tree has one version of each crate,
# then a real MCP client (Python `mcp`, pinned) drives the server. Installs
# what it needs (python3 venv support from Debian when missing, .ci/prereqs.sh; the pinned
# Python packages into a venv under target/). Run from anywhere.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TERM_COLOR=never

echo "== cargo tree -d (must print nothing: no duplicate crate versions)"
dups=$(cargo tree -d --locked)
if [ -n "$dups" ]; then
  echo "$dups"
  echo ".ci/mcp.sh: duplicate crate versions in the dependency tree (see above)" >&2
  exit 1
fi

bash .ci/prereqs.sh python

tests/mcp/run.sh
