#!/usr/bin/env python3
"""A scripted stand-in for the Messages API, for memvault's integration tests.

Stdlib only. Listens on 127.0.0.1 (port 0 by default) and prints the port it
got as the first line on stdout. Every POST to /v1/messages gets the next
assistant turn of one fixed conversation in which "Claude" uses the memory
tool (memory_20250818):

  1. view /memories                       (empty store)
  2. create /memories/notes/customer.md
  3. str_replace in it
  4. insert a line into it
  5. rename it to /memories/clients/acme.md
  6. two calls in one turn: view the new path, view the old path (an error)
  7. a final text answer, stop_reason "end_turn"

Each request is checked: the memory tool must be declared, and every
tool_result must be exactly what memvault has to answer (the strings of
shared/SPEC.md), with is_error set on the error and only there. A mismatch
is recorded, never fatal to the conversation, so one run reports every
difference.

  GET  /_report    JSON: {"ok", "finished", "failures", "requests", "threaded"}
  POST /_shutdown  stops the server; exit status 0 only if the conversation
                   finished and nothing mismatched (also on SIGTERM/timeout)

Works with clients that send the whole history each turn and with the SDKs'
message threads (`thread: {"type": "continue", ...}` carrying only the new
messages): the turn is chosen from the tool_result ids of the last user
message. Streaming is refused (the tests use the non-streaming runners).

Usage: mock_messages_api.py --marker WORD [--port 0] [--timeout 300]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "claude-memvault-mock"
NEW = "/memories/notes/customer.md"
MOVED = "/memories/clients/acme.md"


def numbered(lines: list[str], first: int = 1) -> str:
    """Lines in the view format: number right-aligned in 6, a tab, the text."""
    return "\n".join(f"{n:>6}\t{t}" for n, t in enumerate(lines, start=first))


def script(marker: str) -> list[dict]:
    """The conversation: each turn's tool calls and the exact results due."""
    created = [
        "# Acme Corp",
        "",
        "- contact: Dana Whitfield",
        "- plan: business",
        "- prefers phone follow-ups",
        "- timezone: Europe/Lisbon",
        f"- canary: {marker}",
    ]
    replaced = list(created)
    replaced[4] = "- prefers email follow-ups, never before 10:00"
    inserted = replaced[:2] + ["- tier: gold"] + replaced[2:]
    # str_replace changes line 5: the snippet runs from line 3 to line 7.
    snippet = numbered(replaced[2:7], first=3)
    return [
        {
            "text": "Let me check my memory directory first.",
            "calls": [
                (
                    "toolu_mv_01_view_root",
                    {"command": "view", "path": "/memories"},
                    "Here're the files and directories up to 2 levels deep in /memories, "
                    "excluding hidden items and node_modules:\n0B\t/memories",
                    False,
                )
            ],
        },
        {
            "text": "Nothing yet. I'll record what I learned about this customer.",
            "calls": [
                (
                    "toolu_mv_02_create",
                    {"command": "create", "path": NEW, "file_text": "\n".join(created) + "\n"},
                    f"File created successfully at: {NEW}",
                    False,
                )
            ],
        },
        {
            "text": "The customer changed their preference; updating.",
            "calls": [
                (
                    "toolu_mv_03_str_replace",
                    {
                        "command": "str_replace",
                        "path": NEW,
                        "old_str": "prefers phone follow-ups",
                        "new_str": "prefers email follow-ups, never before 10:00",
                    },
                    "The memory file has been edited. Here is the snippet showing the change "
                    "(with line numbers):\n" + snippet,
                    False,
                )
            ],
        },
        {
            "text": None,
            "calls": [
                (
                    "toolu_mv_04_insert",
                    {"command": "insert", "path": NEW, "insert_line": 2, "insert_text": "- tier: gold\n"},
                    f"The file {NEW} has been edited.",
                    False,
                )
            ],
        },
        {
            "text": "Filing it under clients.",
            "calls": [
                (
                    "toolu_mv_05_rename",
                    {"command": "rename", "old_path": NEW, "new_path": MOVED},
                    f"Successfully renamed {NEW} to {MOVED}",
                    False,
                )
            ],
        },
        {
            "text": "Checking the result.",
            "calls": [
                (
                    "toolu_mv_06_view_file",
                    {"command": "view", "path": MOVED},
                    f"Here's the content of {MOVED} with line numbers:\n" + numbered(inserted),
                    False,
                ),
                (
                    "toolu_mv_07_view_old",
                    {"command": "view", "path": NEW},
                    f"The path {NEW} does not exist. Please provide a valid path.",
                    True,
                ),
            ],
        },
        {"text": "Saved: Acme Corp prefers email follow-ups, never before 10:00.", "calls": []},
    ]


class State:
    def __init__(self, marker: str) -> None:
        self.turns = script(marker)
        self.lock = threading.Lock()
        self.failures: list[str] = []
        self.requests = 0
        self.served: set[int] = set()
        self.answered: set[str] = set()
        self.finished = False
        self.threaded = False
        self.last_message_id: str | None = None
        self.expected = {
            call[0]: (call[2], call[3], i) for i, turn in enumerate(self.turns) for call in turn["calls"]
        }

    def fail(self, msg: str) -> None:
        self.failures.append(f"request {self.requests}: {msg}")

    def report(self) -> dict:
        missing = sorted(set(self.expected) - self.answered)
        failures = list(self.failures)
        if self.finished and missing:
            failures.append(f"tool calls never answered: {missing}")
        return {
            "ok": self.finished and not failures,
            "finished": self.finished,
            "failures": failures,
            "requests": self.requests,
            "threaded": self.threaded,
        }


def result_text(content) -> str | None:
    """The text of a tool_result's content: a string, or text blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(b, dict) and b.get("type") == "text" for b in content):
        return "".join(b.get("text", "") for b in content)
    return None


def check_request(st: State, body: dict, headers) -> int:
    """Check one request; return the index of the turn to answer with."""
    if not headers.get("x-api-key") and not headers.get("authorization"):
        st.fail("no x-api-key or authorization header")
    if not headers.get("anthropic-version"):
        st.fail("no anthropic-version header")
    if body.get("stream"):
        st.fail("streaming was requested; this mock answers non-streaming requests only")
    if body.get("model") != MODEL:
        st.fail(f"model is {body.get('model')!r}, expected {MODEL!r}")
    thread = body.get("thread")
    if isinstance(thread, dict):
        st.threaded = True
        if thread.get("type") == "continue" and thread.get("previous_message_id") != st.last_message_id:
            st.fail(
                f"thread continues from {thread.get('previous_message_id')!r}, "
                f"but the last reply was {st.last_message_id!r}"
            )
    tools = body.get("tools")
    continuing = isinstance(thread, dict) and thread.get("type") == "continue"
    if tools is None and not continuing:
        st.fail("the request declares no tools")
    elif tools is not None:
        memory = [t for t in tools if isinstance(t, dict) and t.get("name") == "memory"]
        if len(memory) != 1 or memory[0].get("type") != "memory_20250818":
            st.fail(f"the memory tool is not declared as memory_20250818: {tools!r}")

    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        st.fail("no messages")
        return len(st.turns) - 1
    last = messages[-1]
    if last.get("role") != "user":
        st.fail(f"the last message is from {last.get('role')!r}, not the user")
        return len(st.turns) - 1
    content = last.get("content")
    results = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"] if isinstance(content, list) else []
    if not results:
        if st.requests != 1:
            st.fail("a request after the first carries no tool_result")
        return 0

    turn_of = set()
    for r in results:
        tid = r.get("tool_use_id")
        if tid not in st.expected:
            st.fail(f"tool_result for an unknown tool_use_id {tid!r}")
            continue
        if tid in st.answered:
            st.fail(f"a second tool_result for {tid}")
        st.answered.add(tid)
        want_text, want_error, turn = st.expected[tid]
        turn_of.add(turn)
        got_text = result_text(r.get("content"))
        got_error = bool(r.get("is_error", False))
        if got_text != want_text:
            st.fail(f"{tid}: content {r.get('content')!r}, expected {want_text!r}")
        if got_error != want_error:
            st.fail(f"{tid}: is_error is {r.get('is_error')!r}, expected {want_error}")
    if len(turn_of) != 1:
        st.fail(f"the tool results answer turns {sorted(turn_of)}, expected exactly one")
        return len(st.turns) - 1
    turn = turn_of.pop()
    due = {c[0] for c in st.turns[turn]["calls"]}
    got = {r.get("tool_use_id") for r in results}
    if got != due:
        st.fail(f"turn {turn}: results for {sorted(got)}, expected {sorted(due)}")
    return turn + 1


def reply(st: State, turn: int) -> dict:
    t = st.turns[turn]
    content = []
    if t["text"]:
        content.append({"type": "text", "text": t["text"]})
    for tid, inp, _, _ in t["calls"]:
        content.append({"type": "tool_use", "id": tid, "name": "memory", "input": inp})
    msg_id = f"msg_mock_{st.requests:02d}"
    st.last_message_id = msg_id
    if not t["calls"]:
        st.finished = True
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": content,
        "stop_reason": "tool_use" if t["calls"] else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 100 + 10 * turn, "output_tokens": 20},
    }


def make_handler(st: State, stop: threading.Event):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):  # noqa: A002 - quiet: the tests read stderr
            pass

        def send_json(self, code: int, obj: dict) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.send_header("request-id", f"req_mock_{st.requests:02d}")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/_report":
                with st.lock:
                    self.send_json(200, st.report())
            else:
                self.send_json(404, {"type": "error", "error": {"type": "not_found_error", "message": self.path}})

        def do_POST(self):
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length)
            if self.path == "/_shutdown":
                self.send_json(200, {"ok": True})
                stop.set()
                return
            if self.path.split("?")[0] != "/v1/messages":
                with st.lock:
                    st.requests += 1
                    st.fail(f"POST to {self.path}, expected /v1/messages")
                self.send_json(404, {"type": "error", "error": {"type": "not_found_error", "message": self.path}})
                return
            with st.lock:
                st.requests += 1
                try:
                    body = json.loads(raw)
                except ValueError:
                    st.fail("the request body is not JSON")
                    self.send_json(400, {"type": "error", "error": {"type": "invalid_request_error", "message": "not JSON"}})
                    return
                if st.finished:
                    st.fail("a request after the final end_turn answer")
                turn = check_request(st, body, self.headers)
                if turn in st.served:
                    st.fail(f"turn {turn} was asked for twice")
                st.served.add(turn)
                self.send_json(200, reply(st, turn))

    return Handler


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--marker", required=True, help="a word the conversation writes into memory")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=300.0, help="stop after this many seconds")
    args = ap.parse_args()

    st = State(args.marker)
    stop = threading.Event()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(st, stop))
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(server.server_address[1], flush=True)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    if not stop.wait(args.timeout):
        with st.lock:
            st.failures.append(f"the mock timed out after {args.timeout:.0f} s")
    server.shutdown()
    with st.lock:
        rep = st.report()
    for f in rep["failures"]:
        print(f"mock: MISMATCH {f}", file=sys.stderr)
    if not rep["finished"]:
        print("mock: the conversation did not reach its final answer", file=sys.stderr)
    return 0 if rep["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
