#!/usr/bin/env bash
# CI for the SDK integrations: make sure python3 (with venv), node and npm
# are there (.ci/prereqs.sh), then run tests/integrations/run.sh, which installs the pinned
# packages (integrations/python/requirements.txt with pip into a venv,
# integrations/typescript/package-lock.json with npm ci) inside the clone
# and runs the scripted conversations (Python and TypeScript, each through
# `memvault serve` and through a `memvault server` over HTTP, and the Rust
# example). Call it after `cargo test`: it reuses the debug build.
set -euo pipefail
cd "$(dirname "$0")/.."

bash .ci/prereqs.sh

echo "== SDK integration tests (python $(python3 -c 'import platform; print(platform.python_version())'), node $(node --version))"
MEMVAULT_INTEG_FRESH=${MEMVAULT_INTEG_FRESH:-1} exec bash tests/integrations/run.sh
