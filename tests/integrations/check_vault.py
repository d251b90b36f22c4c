#!/usr/bin/env python3
"""After one scripted conversation (tests/mock_messages_api.py), check the
vault it wrote to, through the real memvault binary:

- /memories/clients/acme.md holds the final text, and the old path is gone;
- `history --session S --json` lists exactly the four changes, newest first
  (rename, insert, str_replace, create), under that session and actor, and
  no other session changed anything but `init`;
- the marker written into memory appears nowhere in plaintext: not in any
  file below --scan (raw bytes), nor in any decompressed git object of the
  vault (`git cat-file --batch-all-objects --batch`).

Stdlib only. Prints what it checked; exits 1 with the reasons on failure.
Memory content is never printed: only whether it matched.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

MOVED = "/memories/clients/acme.md"
OLD = "/memories/notes/customer.md"


def final_text(marker: str) -> str:
    lines = [
        "# Acme Corp",
        "",
        "- tier: gold",
        "- contact: Dana Whitfield",
        "- plan: business",
        "- prefers email follow-ups, never before 10:00",
        "- timezone: Europe/Lisbon",
        f"- canary: {marker}",
    ]
    body = "\n".join(f"{n:>6}\t{t}" for n, t in enumerate(lines, start=1))
    return f"Here's the content of {MOVED} with line numbers:\n{body}"


def files_containing(root: str, needle: bytes) -> list[str]:
    found = []
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            if os.path.islink(p) or not os.path.isfile(p):
                continue
            with open(p, "rb") as f:
                if needle in f.read():
                    found.append(p)
    return found


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--vault", required=True)
    secret = ap.add_mutually_exclusive_group(required=True)
    secret.add_argument("--key-file")
    secret.add_argument("--passphrase-file")
    ap.add_argument("--session", required=True)
    ap.add_argument("--actor", required=True)
    ap.add_argument("--marker", required=True)
    ap.add_argument("--scan", action="append", default=[], help="a directory that must not hold the marker")
    a = ap.parse_args()
    base = [a.bin, "--vault", a.vault]
    base += ["--key-file", a.key_file] if a.key_file else ["--passphrase-file", a.passphrase_file]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMVAULT_")}
    problems: list[str] = []

    def exec_view(path: str) -> dict:
        cmd = json.dumps({"command": "view", "path": path})
        out = subprocess.run([*base, "exec", "--session", "check", cmd], capture_output=True, env=env)
        try:
            return json.loads(out.stdout)
        except ValueError:
            problems.append(f"`exec view {path}` printed no JSON line (status {out.returncode})")
            return {}

    got = exec_view(MOVED)
    if got.get("is_error") is not False or got.get("content") != final_text(a.marker):
        problems.append(f"{MOVED} does not hold the expected text (is_error={got.get('is_error')})")
    gone = exec_view(OLD)
    if gone.get("is_error") is not True or "does not exist" not in str(gone.get("content")):
        problems.append(f"{OLD} should not exist after the rename")

    out = subprocess.run([*base, "history", "--session", a.session, "--json"], capture_output=True, env=env, text=True)
    if out.returncode != 0:
        problems.append(f"history --session failed: {out.stderr.strip()}")
    entries = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    ops = [(e.get("op"), e.get("path"), e.get("new_path")) for e in entries]
    want = [("rename", OLD, MOVED), ("insert", OLD, None), ("str_replace", OLD, None), ("create", OLD, None)]
    if ops != want:
        problems.append(f"history --session {a.session}: {ops}, expected {want}")
    for e in entries:
        if e.get("session") != a.session or e.get("actor") != a.actor:
            problems.append(f"history entry {e.get('op')} has session {e.get('session')!r} actor {e.get('actor')!r}")
        if e.get("redactions"):
            problems.append(f"history entry {e.get('op')} reports redactions {e.get('redactions')}")
    out = subprocess.run([*base, "history", "--json"], capture_output=True, env=env, text=True)
    others = sorted(
        {(e["session"], e["op"]) for e in map(json.loads, out.stdout.splitlines()) if e["session"] != a.session}
    )
    if others != [("init", "init")]:
        problems.append(f"changes outside session {a.session}: {others}")

    needle = a.marker.encode()
    for root in [a.vault, *a.scan]:
        for p in files_containing(root, needle):
            problems.append(f"plaintext marker found in {p}")
    objects = subprocess.run(
        ["git", "--git-dir", a.vault, "cat-file", "--batch-all-objects", "--batch", "--unordered"],
        capture_output=True,
    )
    if objects.returncode != 0 or len(objects.stdout) < 100:
        problems.append("git cat-file --batch-all-objects printed almost nothing")
    if needle in objects.stdout:
        problems.append("plaintext marker found in a decompressed git object")

    if problems:
        for p in problems:
            print(f"check_vault: FAIL: {p}", file=sys.stderr)
        return 1
    print(
        f"check_vault: ok: final file matches, {len(entries)} changes under session {a.session}, "
        f"marker absent from {1 + len(a.scan)} dir(s) and {objects.stdout.count(b' blob ')} blob(s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
