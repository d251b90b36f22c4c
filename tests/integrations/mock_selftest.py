#!/usr/bin/env python3
"""Show that tests/mock_messages_api.py can fail: answer its first tool call
with a result one character off and flagged the wrong way, and require the
mock to report both mismatches. Stdlib only.

Usage: mock_selftest.py BASE_URL
"""

from __future__ import annotations

import json
import sys
import urllib.request


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "x-api-key": "k", "anthropic-version": "2023-06-01"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def main() -> int:
    base = sys.argv[1]
    tools = [{"type": "memory_20250818", "name": "memory"}]
    first = {"role": "user", "content": "hello"}
    msg = post(
        f"{base}/v1/messages",
        {"model": "claude-memvault-mock", "max_tokens": 10, "tools": tools, "messages": [first]},
    )
    call = next(b for b in msg["content"] if b["type"] == "tool_use")
    wrong = {
        "type": "tool_result",
        "tool_use_id": call["id"],
        # One character off ("Here are" for "Here're"), and flagged as an error.
        "content": "Here are the files and directories up to 2 levels deep in /memories, "
        "excluding hidden items and node_modules:\n0B\t/memories",
        "is_error": True,
    }
    post(
        f"{base}/v1/messages",
        {
            "model": "claude-memvault-mock",
            "max_tokens": 10,
            "tools": tools,
            "messages": [first, {"role": "assistant", "content": msg["content"]}, {"role": "user", "content": [wrong]}],
        },
    )
    with urllib.request.urlopen(f"{base}/_report", timeout=30) as r:
        report = json.load(r)
    failures = " ".join(report["failures"])
    if report["ok"] or "content" not in failures or "is_error" not in failures:
        print(f"mock self-test: FAIL: the mock did not report the bad result: {report}", file=sys.stderr)
        return 1
    print(f"mock self-test: ok: the mock reported {len(report['failures'])} mismatches as it should")
    return 0


if __name__ == "__main__":
    sys.exit(main())
