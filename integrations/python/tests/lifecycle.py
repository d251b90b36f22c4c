"""The adapter's own guarantees, apart from a conversation (run by
tests/integrations/run.sh):

  lifecycle.py BIN VAULT SECRET_FLAG SECRET

1. a tool nobody closed is garbage-collected, and its `memvault serve`
   stops with it;
2. HTTP mode: `timeout` bounds the whole request (a server that trickles
   its answer a byte at a time is cut at it), and the error's traceback
   does not carry the token;
3. HTTP mode: a 400 (a request the server could not read) is a `ToolError`
   with the server's words, as process mode answers malformed input.

Exits 1 with the reason on failure.
"""

from __future__ import annotations

import gc
import os
import socket
import sys
import threading
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from anthropic.tools import ToolError  # noqa: E402
from memvault_memory import MemvaultMemoryTool, MemvaultServerError  # noqa: E402

TOKEN = "mvt_lifecycle_check_token_0123456789"


def fail(why: str) -> None:
    print(f"lifecycle: FAIL: {why}", file=sys.stderr)
    sys.exit(1)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has exited too.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def unclosed_tool_stops_its_server(binary: str, vault: str, flag: str, secret: str) -> None:
    kw = {"key_file": secret} if flag == "--key-file" else {"passphrase_file": secret}
    tool = MemvaultMemoryTool(vault=vault, binary=binary, **kw)
    tool.call({"command": "view", "path": "/memories"})
    pid = tool.pid
    del tool
    gc.collect()
    for _ in range(100):
        if not alive(pid):
            print("lifecycle: an unclosed tool's server stopped when the tool was collected")
            return
        time.sleep(0.1)
    fail(f"the server of a tool nobody closed (pid {pid}) still runs after the tool was dropped")


def fake_server(answer: bytes, delay: float) -> int:
    """One-connection-at-a-time HTTP server on loopback that reads a
    request and sends `answer`, a byte every `delay` seconds."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def run() -> None:
        while True:
            conn, _ = srv.accept()
            conn.settimeout(5)
            try:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                while len(body) < length:
                    body += conn.recv(65536)
                if delay:
                    for i in range(len(answer)):
                        conn.sendall(answer[i : i + 1])
                        time.sleep(delay)
                else:
                    conn.sendall(answer)
            except OSError:
                pass
            finally:
                conn.close()

    threading.Thread(target=run, daemon=True).start()
    return srv.getsockname()[1]


def timeout_bounds_the_whole_request() -> None:
    body = b'{"type":"tool_result","tool_use_id":"x","content":"ok","is_error":false}'
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    port = fake_server(answer, 0.2)
    tool = MemvaultMemoryTool(url=f"http://127.0.0.1:{port}", token=TOKEN, timeout=1.5)
    start = time.monotonic()
    try:
        tool.call({"command": "view", "path": "/memories"})
        fail("a server trickling its answer was taken as an answer")
    except MemvaultServerError as e:
        took = time.monotonic() - start
        if "gave no answer within" not in str(e):
            fail(f"a trickling server gave: {e}")
        if took > 5:
            fail(f"timeout=1.5 s, but the call took {took:.1f} s")
        tb = "".join(traceback.format_exception(e))
        if TOKEN in tb:
            fail("the token is in the traceback")
    print(f"lifecycle: a server trickling its answer is given up on after {took:.1f} s (timeout 1.5 s)")


def bad_request_is_a_tool_error() -> None:
    body = b'{"error":"the request body is not valid JSON (lone surrogate); send one JSON object"}'
    answer = b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body
    port = fake_server(answer, 0)
    tool = MemvaultMemoryTool(url=f"http://127.0.0.1:{port}", token=TOKEN, timeout=10)
    try:
        tool.call({"command": "create", "path": "/memories/a.md", "file_text": "a\ud800b"})
        fail("a 400 was taken as success")
    except ToolError as e:
        if "not valid JSON" not in str(e.content):
            fail(f"the ToolError does not carry the server's words: {e.content}")
    except MemvaultServerError as e:
        fail(f"a 400 was a MemvaultServerError, not a ToolError: {e}")
    print("lifecycle: a 400 is a ToolError with the server's words")


def main() -> None:
    binary, vault, flag, secret = sys.argv[1:5]
    unclosed_tool_stops_its_server(binary, vault, flag, secret)
    timeout_bounds_the_whole_request()
    bad_request_is_a_tool_error()


if __name__ == "__main__":
    main()
