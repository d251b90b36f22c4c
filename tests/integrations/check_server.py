#!/usr/bin/env python3
"""After one scripted conversation (tests/mock_messages_api.py) run by an
adapter in HTTP mode, check the `memvault server` tenant it wrote to.

  check_server.py live --url URL --session S --actor A --principal P --marker M
      with the server running; the tokens in $CHECK_TOKEN (scope memory)
      and $CHECK_AUDIT_TOKEN (scope audit):
      - `POST /v1/memory` view: /memories/clients/acme.md holds the final
        text, and the old path is gone;
      - `POST /v1/history` {"session": S} lists exactly the four changes,
        newest first (rename, insert, str_replace, create), each under that
        session and actor with "principal" P, and no other session changed
        anything but `init`.

  check_server.py rest --root ROOT --marker M [--scan DIR ...]
      once the server has stopped: the marker appears nowhere in plaintext,
      not in any file below ROOT or --scan (raw bytes), nor in any
      decompressed git object of each tenant vault ROOT/tenants/*/
      (`git cat-file --batch-all-objects --batch`).

Stdlib only. Prints what it checked; exits 1 with the reasons on failure.
Memory content and tokens are never printed: only whether they matched.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

from check_vault import MOVED, OLD, files_containing, final_text


def post(url: str, token: str, body: dict, session: str = "check") -> tuple[int, dict]:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Memvault-Session": session,
            "Memvault-Actor": "check",
        },
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.load(e)
        except ValueError:
            return e.code, {}


def live(a: argparse.Namespace, problems: list[str]) -> str:
    token = os.environ.get("CHECK_TOKEN", "")
    audit = os.environ.get("CHECK_AUDIT_TOKEN", "")
    if not token or not audit:
        problems.append("CHECK_TOKEN and CHECK_AUDIT_TOKEN must be set")
        return ""
    memory = a.url.rstrip("/") + "/v1/memory"

    status, got = post(memory, token, {"command": "view", "path": MOVED})
    if status != 200 or got.get("is_error") is not False or got.get("content") != final_text(a.marker):
        problems.append(f"{MOVED} does not hold the expected text (HTTP {status}, is_error={got.get('is_error')})")
    status, gone = post(memory, token, {"command": "view", "path": OLD})
    if status != 200 or gone.get("is_error") is not True or "does not exist" not in str(gone.get("content")):
        problems.append(f"{OLD} should not exist after the rename (HTTP {status})")

    history = a.url.rstrip("/") + "/v1/history"
    status, out = post(history, audit, {"session": a.session})
    if status != 200:
        problems.append(f"POST /v1/history {{session}} answered HTTP {status}: {out.get('error')}")
    entries = out.get("changes") or []
    ops = [(e.get("op"), e.get("path"), e.get("new_path")) for e in entries]
    want = [("rename", OLD, MOVED), ("insert", OLD, None), ("str_replace", OLD, None), ("create", OLD, None)]
    if ops != want:
        problems.append(f"history of session {a.session}: {ops}, expected {want}")
    for e in entries:
        who = (e.get("session"), e.get("actor"), e.get("principal"))
        if who != (a.session, a.actor, a.principal):
            problems.append(
                f"history entry {e.get('op')} has session, actor, principal {who}, "
                f"expected {(a.session, a.actor, a.principal)}"
            )
        if e.get("redactions"):
            problems.append(f"history entry {e.get('op')} reports redactions {e.get('redactions')}")
    status, out = post(history, audit, {})
    others = sorted({(e.get("session"), e.get("op")) for e in out.get("changes") or [] if e.get("session") != a.session})
    if status != 200 or others != [("init", "init")]:
        problems.append(f"changes outside session {a.session}: {others} (HTTP {status})")
    return f"final file matches, {len(entries)} changes under session {a.session} by principal {a.principal}"


def rest(a: argparse.Namespace, problems: list[str]) -> str:
    needle = a.marker.encode()
    for root in [a.root, *a.scan]:
        for p in files_containing(root, needle):
            problems.append(f"plaintext marker found in {p}")
    tenants = os.path.join(a.root, "tenants")
    vaults = sorted(os.path.join(tenants, d) for d in os.listdir(tenants)) if os.path.isdir(tenants) else []
    if not vaults:
        problems.append(f"no tenant vault under {tenants}")
    blobs = 0
    for v in vaults:
        objects = subprocess.run(
            ["git", "--git-dir", v, "cat-file", "--batch-all-objects", "--batch", "--unordered"],
            capture_output=True,
        )
        if objects.returncode != 0 or len(objects.stdout) < 100:
            problems.append(f"git cat-file --batch-all-objects printed almost nothing for {v}")
        if needle in objects.stdout:
            problems.append(f"plaintext marker found in a decompressed git object of {v}")
        blobs += objects.stdout.count(b" blob ")
    return f"marker absent from {1 + len(a.scan)} dir(s) and {blobs} blob(s) of {len(vaults)} tenant vault(s)"


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="phase", required=True)
    lv = sub.add_parser("live")
    lv.add_argument("--url", required=True)
    lv.add_argument("--session", required=True)
    lv.add_argument("--actor", required=True)
    lv.add_argument("--principal", required=True)
    lv.add_argument("--marker", required=True)
    rs = sub.add_parser("rest")
    rs.add_argument("--root", required=True)
    rs.add_argument("--marker", required=True)
    rs.add_argument("--scan", action="append", default=[], help="a directory that must not hold the marker")
    a = ap.parse_args()
    problems: list[str] = []
    summary = live(a, problems) if a.phase == "live" else rest(a, problems)
    if problems:
        for p in problems:
            print(f"check_server: FAIL: {p}", file=sys.stderr)
        return 1
    print(f"check_server: ok: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
