#!/usr/bin/env bash
# CI for the SDK integrations: make sure python3 (with venv), node and npm
# are there, then run tests/integrations/run.sh, which installs the pinned
# packages (integrations/python/requirements.txt with pip into a venv,
# integrations/typescript/package-lock.json with npm ci) inside the clone
# and runs the scripted conversations (Python and TypeScript, each through
# `memvault serve` and through a `memvault server` over HTTP, and the Rust
# example). Call it after `cargo test`: it reuses the debug build.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_updated=
apt_install() {
  if [[ -z "$apt_updated" ]]; then
    apt-get update -q
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@"
}

command -v git >/dev/null 2>&1 || apt_install git
command -v python3 >/dev/null 2>&1 || apt_install python3 python3-venv
python3 -c 'import venv, ensurepip' 2>/dev/null || apt_install python3-venv
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  apt_install nodejs npm
fi
node_major=$(node -p 'process.versions.node.split(".")[0]')
if [[ "$node_major" -lt 20 ]]; then
  echo "integrations: Node.js $(node --version) is too old; the TypeScript integration needs 20 or later" >&2
  exit 1
fi

echo "== SDK integration tests (python $(python3 -c 'import platform; print(platform.python_version())'), node $(node --version))"
MEMVAULT_INTEG_FRESH=${MEMVAULT_INTEG_FRESH:-1} exec bash tests/integrations/run.sh
