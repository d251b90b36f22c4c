#!/usr/bin/env bash
# memvault's SDK integration tests. Against the scripted Messages API stand-in
# (tests/mock_messages_api.py), each on its own fresh vault:
#   (a) the real `anthropic` Python SDK tool runner + integrations/python
#   (b) the real `@anthropic-ai/sdk` npm tool runner + integrations/typescript
#   (c) examples/agent.rs (cargo run --example agent)
# and (a) and (b) again in HTTP mode, each against its own `memvault server`
# on loopback (a throwaway root and key file; one tenant).
# After each: the mock saw exactly the contract's results, the vault holds the
# final file, `history --session S --json` shows each change under S, and the
# marker written into memory is nowhere in plaintext (vault files, decompressed
# git objects, the client's working and temp directories). In HTTP mode the
# file is read with `POST /v1/memory`, the history with `POST /v1/history` (an
# audit token; each change's principal must be the adapter's token name), the
# server must exit 0 on SIGTERM, the scan covers the server root and every
# tenant vault's git objects, and the token must not be in the client's output
# or the server's stderr. Each adapter must also refuse a wrong token with its
# server error, status 401, no token in the message.
#
# Usage: tests/integrations/run.sh [--release]
#   MEMVAULT_INTEG_ONLY="python ts rust"  run only some of (a)(b)(c)
#   MEMVAULT_INTEG_FRESH=1                reinstall the venv and node_modules
#   MEMVAULT_INTEG_KEEP=1                 keep the temporary directory
# Needs cargo, git, python3 (with venv) and node/npm; the pinned Python and
# npm packages are installed into integrations/python/.venv and
# integrations/typescript/node_modules when missing or out of date.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
PROFILE=debug
CARGO_PROFILE=()
if [[ "${1:-}" == "--release" ]]; then
  PROFILE=release
  CARGO_PROFILE=(--release)
fi
ONLY=${MEMVAULT_INTEG_ONLY:-python ts rust}
FAILED=()
PASSED=0

die() {
  echo "integrations: FAIL: $*" >&2
  exit 1
}
note() { echo "== integrations: $*"; }
wants() { [[ " $ONLY " == *" $1 "* ]]; }

for tool in cargo git python3; do
  command -v "$tool" >/dev/null || die "$tool is not on the PATH"
done
if wants ts; then
  command -v node >/dev/null || die "node is not on the PATH (Node.js 20+ is needed for the TypeScript test)"
  command -v npm >/dev/null || die "npm is not on the PATH"
fi

# --- the environments, from the pinned lists --------------------------------
PY_DIR=$ROOT/integrations/python
TS_DIR=$ROOT/integrations/typescript
VENV=$PY_DIR/.venv

stamp_ok() { # stamp-file source-file
  [[ -f "$1" ]] && [[ "$(cat "$1")" == "$(sha256sum "$2" | cut -d' ' -f1)" ]]
}

if wants python; then
  if [[ -n "${MEMVAULT_INTEG_FRESH:-}" ]] || ! stamp_ok "$VENV/.memvault-stamp" "$PY_DIR/requirements.txt"; then
    note "creating $VENV from integrations/python/requirements.txt"
    rm -rf "$VENV"
    python3 -m venv "$VENV" || die "python3 -m venv failed (on Debian: apt-get install python3-venv)"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-input -r "$PY_DIR/requirements.txt" ||
      die "pip could not install integrations/python/requirements.txt"
    sha256sum "$PY_DIR/requirements.txt" | cut -d' ' -f1 >"$VENV/.memvault-stamp"
  fi
  "$VENV/bin/python" -c 'import anthropic, sys; sys.exit(anthropic.__version__ != "2.14.0")' ||
    die "the venv does not hold anthropic 2.14.0 (rerun with MEMVAULT_INTEG_FRESH=1)"
fi
if wants ts; then
  if [[ -n "${MEMVAULT_INTEG_FRESH:-}" ]] || ! stamp_ok "$TS_DIR/node_modules/.memvault-stamp" "$TS_DIR/package-lock.json"; then
    note "installing integrations/typescript/node_modules from package-lock.json (npm ci)"
    (cd "$TS_DIR" && npm ci --no-audit --no-fund --loglevel=error) || die "npm ci failed in integrations/typescript"
    sha256sum "$TS_DIR/package-lock.json" | cut -d' ' -f1 >"$TS_DIR/node_modules/.memvault-stamp"
  fi
  (cd "$TS_DIR" && node -e 'process.exit(require("@anthropic-ai/sdk/version").VERSION === "1.14.0" ? 0 : 1)') ||
    die "node_modules does not hold @anthropic-ai/sdk 1.14.0 (rerun with MEMVAULT_INTEG_FRESH=1)"
fi

# --- the binaries -------------------------------------------------------------
note "building memvault and examples/agent ($PROFILE)"
cargo build --quiet "${CARGO_PROFILE[@]}" --bin memvault --example agent || die "cargo build failed"
BIN=$ROOT/target/$PROFILE/memvault
[[ -x "$BIN" ]] || die "no binary at $BIN"

# --- scratch space and cleanup ------------------------------------------------
TMP=$(mktemp -d "${TMPDIR:-/tmp}/memvault-integ.XXXXXX")
LOGS=$TMP/logs
mkdir -p "$LOGS"
MOCK_PID=
SERVER_PID=
cleanup() {
  if [[ -n "$MOCK_PID" ]]; then
    kill "$MOCK_PID" 2>/dev/null || true
    wait "$MOCK_PID" 2>/dev/null || true
  fi
  if [[ -n "$SERVER_PID" ]]; then
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  if [[ -n "${MEMVAULT_INTEG_KEEP:-}" ]]; then
    echo "integrations: kept $TMP"
  else
    rm -rf "$TMP"
  fi
}
trap cleanup EXIT

# A word that exists only in the memory the conversation writes.
MARKER=plaintext-canary-$(python3 -c 'import secrets, string; print("".join(secrets.choice(string.ascii_lowercase) for _ in range(16)))')

start_mock() { # name
  local out=$LOGS/mock-$1.out
  python3 "$ROOT/tests/mock_messages_api.py" --marker "$MARKER" --timeout 600 >"$out" 2>"$LOGS/mock-$1.err" &
  MOCK_PID=$!
  for _ in $(seq 100); do
    [[ -s "$out" ]] && break
    kill -0 "$MOCK_PID" 2>/dev/null || die "the mock server for $1 exited at start: $(cat "$LOGS/mock-$1.err")"
    sleep 0.1
  done
  MOCK_PORT=$(head -n1 "$out")
  [[ "$MOCK_PORT" =~ ^[0-9]+$ ]] || die "the mock server for $1 printed no port"
  MOCK_URL=http://127.0.0.1:$MOCK_PORT
}

stop_mock() { # name -> 0 if the conversation finished with no mismatch
  local status=0
  python3 - "$MOCK_URL" <<'EOF' || true
import sys, urllib.request
urllib.request.urlopen(urllib.request.Request(sys.argv[1] + "/_shutdown", data=b"", method="POST"), timeout=10).read()
EOF
  wait "$MOCK_PID" || status=$?
  MOCK_PID=
  if [[ $status -ne 0 ]]; then
    echo "integrations: the mock Messages API reported for $1:" >&2
    sed 's/^/    /' "$LOGS/mock-$1.err" >&2
  fi
  return $status
}

new_vault() { # name kind(key|passphrase) -> sets DIR VAULT SECRET_FLAG SECRET
  DIR=$TMP/$1
  mkdir -p "$DIR/cwd" "$DIR/tmp"
  VAULT=$DIR/vault
  if [[ $2 == key ]]; then
    SECRET_FLAG=--key-file
    SECRET=$DIR/vault.key
    "$BIN" keygen "$SECRET" 2>/dev/null || die "keygen failed"
    "$BIN" --vault "$VAULT" --key-file "$SECRET" init 2>/dev/null || die "init failed"
  else
    SECRET_FLAG=--passphrase-file
    SECRET=$DIR/passphrase
    (umask 077 && echo "integration test passphrase $RANDOM$RANDOM" >"$SECRET")
    # Tiny Argon2 parameters: the test is about the integration, not the KDF.
    "$BIN" --vault "$VAULT" --passphrase-file "$SECRET" init --argon2-memory 64 --argon2-passes 1 2>/dev/null ||
      die "init (passphrase) failed"
  fi
}

check_vault() { # name session actor
  python3 "$ROOT/tests/integrations/check_vault.py" --bin "$BIN" --vault "$VAULT" \
    "$SECRET_FLAG" "$SECRET" --session "$2" --actor "$3" --marker "$MARKER" --scan "$DIR"
}

run_case() { # name session actor client-function
  local name=$1 session=$2 actor=$3 client=$4
  note "($name) scripted conversation, session $session"
  start_mock "$name"
  local status=0
  (cd "$DIR/cwd" && export TMPDIR=$DIR/tmp MEMVAULT_BIN=$BIN && "$client" "$session") || status=$?
  local mock_status=0
  stop_mock "$name" || mock_status=$?
  if [[ $status -ne 0 ]]; then
    FAILED+=("$name: the client exited with status $status")
  elif [[ $mock_status -ne 0 ]]; then
    FAILED+=("$name: the mock Messages API saw wrong tool results (above)")
  elif ! check_vault "$name" "$session" "$actor"; then
    FAILED+=("$name: the vault is not as the conversation left it (above)")
  else
    PASSED=$((PASSED + 1))
  fi
}

# --- HTTP mode: one `memvault server` per case ----------------------------------

start_server() { # name tenant -> sets DIR SERVER_ROOT TOKEN AUDIT_TOKEN SERVER_URL SERVER_PID
  DIR=$TMP/$1
  mkdir -p "$DIR/cwd" "$DIR/tmp"
  SERVER_ROOT=$DIR/root
  local key=$DIR/server.key err=$DIR/server.err
  "$BIN" keygen "$key" 2>/dev/null || die "keygen (server) failed"
  TOKEN=$("$BIN" --key-file "$key" tenant add "$2" --root "$SERVER_ROOT" --scopes memory 2>/dev/null) ||
    die "tenant add failed"
  AUDIT_TOKEN=$("$BIN" --key-file "$key" tenant token "$2" --root "$SERVER_ROOT" --token-name auditor \
    --scopes audit 2>/dev/null) || die "tenant token failed"
  [[ "$TOKEN" == mvt_* && "$AUDIT_TOKEN" == mvt_* ]] || die "tenant add or tenant token printed no token"
  "$BIN" --key-file "$key" server --root "$SERVER_ROOT" --listen 127.0.0.1:0 2>"$err" &
  SERVER_PID=$!
  SERVER_URL=
  for _ in $(seq 100); do
    SERVER_URL=$(sed -n 's#^memvault: serving .* on \(http://127\.0\.0\.1:[0-9][0-9]*\)$#\1#p' "$err" | head -n1)
    [[ -n "$SERVER_URL" ]] && break
    kill -0 "$SERVER_PID" 2>/dev/null || die "memvault server for $1 exited at start: $(cat "$err")"
    sleep 0.1
  done
  [[ -n "$SERVER_URL" ]] || die "memvault server for $1 printed no address"
}

stop_server() { # -> the server's exit status after SIGTERM (killed after 60 s)
  local status=0
  kill -TERM "$SERVER_PID" 2>/dev/null || true
  for _ in $(seq 600); do
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$SERVER_PID" 2>/dev/null && echo "integrations: memvault server did not stop within 60 s of SIGTERM" >&2
  wait "$SERVER_PID" || status=$?
  SERVER_PID=
  return $status
}

run_http_case() { # name session actor tenant client-function
  local name=$1 session=$2 actor=$3 tenant=$4 client=$5
  start_server "$name" "$tenant"
  note "($name) scripted conversation over HTTP ($SERVER_URL, tenant $tenant), session $session"
  start_mock "$name"
  local status=0 log=$LOGS/client-$name.log
  (cd "$DIR/cwd" && unset MEMVAULT_URL && export TMPDIR=$DIR/tmp MEMVAULT_TOKEN=$TOKEN && "$client" "$session") \
    >"$log" 2>&1 || status=$?
  sed -e "s/$TOKEN/[token]/g" -e "s/$AUDIT_TOKEN/[audit token]/g" "$log"
  local mock_status=0
  stop_mock "$name" || mock_status=$?
  local live_ok=1 server_status=0
  CHECK_TOKEN=$TOKEN CHECK_AUDIT_TOKEN=$AUDIT_TOKEN python3 "$ROOT/tests/integrations/check_server.py" live \
    --url "$SERVER_URL" --session "$session" --actor "$actor" --principal "$tenant" --marker "$MARKER" || live_ok=
  stop_server || server_status=$?
  if [[ $status -ne 0 ]]; then
    FAILED+=("$name: the client exited with status $status")
  elif [[ $mock_status -ne 0 ]]; then
    FAILED+=("$name: the mock Messages API saw wrong tool results (above)")
  elif [[ -z "$live_ok" ]]; then
    FAILED+=("$name: the tenant's vault is not as the conversation left it (above)")
  elif [[ $server_status -ne 0 ]]; then
    FAILED+=("$name: memvault server exited with status $server_status after SIGTERM: $(tail -n3 "$DIR/server.err")")
  elif ! python3 "$ROOT/tests/integrations/check_server.py" rest --root "$SERVER_ROOT" --marker "$MARKER" --scan "$DIR"; then
    FAILED+=("$name: the marker is in plaintext under the server root or the client's directories (above)")
  elif grep -qF -e "$TOKEN" -e "$AUDIT_TOKEN" "$log" "$DIR/server.err"; then
    FAILED+=("$name: a bearer token appears in the client's output or the server's stderr")
  else
    PASSED=$((PASSED + 1))
  fi
}

# --- the checks can fail ----------------------------------------------------------
note "self-test: the mock reports a wrong tool_result"
start_mock selftest
if ! python3 "$ROOT/tests/integrations/mock_selftest.py" "$MOCK_URL"; then
  FAILED+=("selftest: the mock missed a mismatch")
  stop_mock selftest 2>/dev/null || true
elif stop_mock selftest 2>/dev/null; then
  FAILED+=("selftest: the mock exited 0 after a mismatch")
else
  PASSED=$((PASSED + 1))
fi
note "self-test: the plaintext scan finds a planted marker"
mkdir -p "$TMP/plant" && echo "x $MARKER y" >"$TMP/plant/f"
if python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); from check_vault import files_containing as f; sys.exit(0 if f(sys.argv[2], sys.argv[3].encode()) else 1)' \
  "$ROOT/tests/integrations" "$TMP/plant" "$MARKER"; then
  PASSED=$((PASSED + 1))
else
  FAILED+=("selftest: the plaintext scan missed a planted marker")
fi
rm -rf "$TMP/plant"

# --- (a) Python ---------------------------------------------------------------------
if wants python; then
  new_vault python passphrase
  client_python() {
    timeout 300 "$VENV/bin/python" "$PY_DIR/tests/mock_conversation.py" "$MOCK_URL" "$VAULT" "$SECRET" "$1"
  }
  run_case python "py-$RANDOM$RANDOM" python-sdk client_python

  client_python_http() {
    timeout 300 "$VENV/bin/python" "$PY_DIR/tests/mock_conversation.py" --http "$MOCK_URL" "$SERVER_URL" "$1"
  }
  run_http_case python-http "py-http-$RANDOM$RANDOM" python-sdk alice client_python_http

  new_vault python-lifecycle key
  note "(python-lifecycle) an unclosed tool, a trickling server, a 400, HTTPS"
  if (cd "$DIR/cwd" && timeout 120 "$VENV/bin/python" "$PY_DIR/tests/lifecycle.py" "$BIN" "$VAULT" "$SECRET_FLAG" "$SECRET"); then
    PASSED=$((PASSED + 1))
  else
    FAILED+=("python-lifecycle: see above")
  fi
fi

# --- (b) TypeScript ---------------------------------------------------------------
if wants ts; then
  new_vault ts key
  client_ts() {
    timeout 300 node "$TS_DIR/test/mock-conversation.mjs" "$MOCK_URL" "$VAULT" "$SECRET" "$1"
  }
  run_case ts "ts-$RANDOM$RANDOM" typescript-sdk client_ts

  client_ts_http() {
    timeout 300 node "$TS_DIR/test/mock-conversation.mjs" --http "$MOCK_URL" "$SERVER_URL" "$1"
  }
  run_http_case ts-http "ts-http-$RANDOM$RANDOM" typescript-sdk bob client_ts_http

  new_vault ts-lifecycle key
  note "(ts-lifecycle) a MemvaultMemory never closed, a 400"
  if (cd "$DIR/cwd" && timeout 120 node "$TS_DIR/test/lifecycle.mjs" "$BIN" "$VAULT" "$SECRET_FLAG" "$SECRET"); then
    PASSED=$((PASSED + 1))
  else
    FAILED+=("ts-lifecycle: see above")
  fi
fi

# --- (c) Rust example ---------------------------------------------------------------
if wants rust; then
  new_vault rust key
  client_rust() {
    ANTHROPIC_API_KEY=sk-ant-mock-not-a-key ANTHROPIC_BASE_URL=$MOCK_URL ANTHROPIC_MODEL=claude-memvault-mock \
      timeout 300 cargo run --quiet --manifest-path "$ROOT/Cargo.toml" "${CARGO_PROFILE[@]}" --example agent -- \
      --vault "$VAULT" --key-file "$SECRET" --session "$1" "Remember that Acme Corp prefers email follow-ups."
  }
  run_case rust "rs-$RANDOM$RANDOM" example-agent client_rust
fi

if [[ ${#FAILED[@]} -gt 0 ]]; then
  echo >&2
  for f in "${FAILED[@]}"; do echo "integrations: FAIL: $f" >&2; done
  echo "integrations: $PASSED passed, ${#FAILED[@]} failed"
  exit 1
fi
echo "integrations: $PASSED passed, 0 failed"
