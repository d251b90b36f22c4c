#!/usr/bin/env python3
"""The peer of `benches/peer.rs`: the official Python SDK's memory tool
(`BetaLocalFilesystemMemoryTool`, package `anthropic`, pinned in
integrations/python/requirements.txt) behind the JSON-lines protocol of
`memvault serve`.

One request per line on stdin: a `tool_use` block
(`{"type":"tool_use","id":..,"name":"memory","input":{..}}`) or a bare
command object (`{"command":"view",..}`). One line back on stdout per
request: `{"type":"tool_result","tool_use_id":..,"content":..,"is_error":..}`.
Blank lines get no answer. The command runs as the SDK's tool runner runs
it (`tool.call(input)`); a `ToolError` or any other exception becomes an
`is_error` result with the content the runner would send.

    python sdk_serve.py --root DIR [--no-fsync]

The files live under DIR/memories. `--no-fsync` makes `os.fsync` a no-op
(the SDK syncs a created file, and the temporary file of an edit before
its rename), for the benchmark's fsync-off comparison.
"""

import argparse
import json
import os
import sys


def _no_duplicates(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key `{key}` is given twice")
        out[key] = value
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True, help="the tool's base_path (files under ROOT/memories)")
    ap.add_argument("--no-fsync", action="store_true", help="make os.fsync a no-op")
    args = ap.parse_args()
    if args.no_fsync:
        # The SDK calls `os.fsync` through the module at each write.
        os.fsync = lambda fd: None

    from anthropic.lib.tools import ToolError
    from anthropic.tools.memory import BetaLocalFilesystemMemoryTool

    try:
        from anthropic.lib.tools._tool_dispatch import tool_error_content, tool_result_content
    except ImportError:  # another SDK release: what its runner does, roughly
        tool_result_content = lambda c: c  # noqa: E731
        tool_error_content = lambda e: e.content if isinstance(e, ToolError) else repr(e)  # noqa: E731

    tool = BetaLocalFilesystemMemoryTool(base_path=args.root)

    def reply(id_, content, is_error):
        return {"type": "tool_result", "tool_use_id": id_, "content": content, "is_error": is_error}

    def run(id_, command):
        try:
            return reply(id_, tool_result_content(tool.call(command)), False)
        except Exception as exc:  # the runner's two branches: ToolError, anything else
            return reply(id_, tool_error_content(exc), True)

    def handle(raw: bytes):
        try:
            value = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
        except (UnicodeDecodeError, ValueError) as exc:
            return reply(None, f"Error: the request is not valid JSON ({exc}).", True)
        if not isinstance(value, dict):
            return reply(None, "Error: the request must be a JSON object: a tool_use block or a command object.", True)
        kind = value.get("type")
        if kind == "tool_use":
            id_ = value.get("id")
            if not isinstance(id_, str):
                return reply(None, "Error: the tool_use block has no string `id`.", True)
            if value.get("name") != "memory":
                return reply(id_, "Error: this server only runs the `memory` tool.", True)
            if "input" not in value:
                return reply(id_, "Error: the tool_use block has no `input` object.", True)
            return run(id_, value["input"])
        if kind is not None:
            return reply(None, "Error: unexpected block type; send a tool_use block or a command object.", True)
        return run(None, value)

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        line = stdin.readline()
        if not line:
            return 0
        if not line.strip():
            continue
        out = json.dumps(handle(line), ensure_ascii=False, separators=(",", ":"))
        stdout.write(out.encode("utf-8") + b"\n")
        stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
