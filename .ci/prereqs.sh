#!/usr/bin/env bash
# What the SDK integration and MCP tests need from the system: git,
# python3 with venv (and pip), and unless called with `python` alone,
# Node.js 20+ and npm. Installs what is
# missing from Debian's packages (needs root then). .ci/test runs it
# before it starts .ci/integrations.sh and .ci/mcp.sh side by side, so
# that the two never run apt at once; each script runs it too, so either
# also works alone.
set -euo pipefail

apt_updated=
apt_install() {
  if [[ -z "$apt_updated" ]]; then
    apt-get update -q
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@"
}

command -v git >/dev/null 2>&1 || apt_install git
command -v python3 >/dev/null 2>&1 || apt_install python3 python3-venv python3-pip
python3 -c 'import venv, ensurepip' 2>/dev/null || apt_install python3-venv python3-pip
[[ "${1:-}" == python ]] && exit 0
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  apt_install nodejs npm
fi
node_major=$(node -p 'process.versions.node.split(".")[0]')
if [[ "$node_major" -lt 20 ]]; then
  echo "Node.js $(node --version) is too old; the TypeScript integration needs 20 or later" >&2
  exit 1
fi
