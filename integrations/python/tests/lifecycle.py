"""The adapter's own guarantees, apart from a conversation (run by
tests/integrations/run.sh):

  lifecycle.py BIN VAULT SECRET_FLAG SECRET

1. a tool nobody closed is garbage-collected, and its `memvault serve`
   stops with it;
2. HTTP mode: `timeout` bounds the whole request (a server that trickles
   its answer a byte at a time is cut at it), and the error's traceback
   does not carry the token;
3. HTTP mode: a 400 (a request the server could not read) is a `ToolError`
   with the server's words, as process mode answers malformed input;
4. HTTPS: a real `memvault server --tls-cert` whose certificate the
   system does not trust is refused with "nothing was sent", served with
   `ssl_context` trusting it, and plain HTTP to its port is a 426.

Exits 1 with the reason on failure.
"""

from __future__ import annotations

import gc
import os
import re
import socket
import ssl
import subprocess
import sys
import tempfile
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


def https_with_a_private_authority(binary: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cert, key = os.path.join(tmp, "cert.pem"), os.path.join(tmp, "key.pem")
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-days", "2", "-subj", "/CN=localhost",
             "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", cert],
            check=True, capture_output=True,
        )
        skey, root = os.path.join(tmp, "server.key"), os.path.join(tmp, "root")
        subprocess.run([binary, "keygen", skey], check=True, capture_output=True)
        token = subprocess.run(
            [binary, "--key-file", skey, "tenant", "add", "t", "--root", root, "--scopes", "memory"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
        err = open(os.path.join(tmp, "server.err"), "w+")
        server = subprocess.Popen(
            [binary, "--key-file", skey, "server", "--root", root, "--listen", "127.0.0.1:0",
             "--tls-cert", cert, "--tls-key", key],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
        )
        try:
            port = None
            for _ in range(100):
                err.seek(0)
                m = re.search(r"on https://127\.0\.0\.1:(\d+)", err.read())
                if m:
                    port = int(m.group(1))
                    break
                if server.poll() is not None:
                    break
                time.sleep(0.1)
            if port is None:
                fail("memvault server --tls-cert printed no https address")
            url = f"https://127.0.0.1:{port}"
            untrusted = MemvaultMemoryTool(url=url, token=token, timeout=10)
            try:
                untrusted.call({"command": "create", "path": "/memories/a.md", "file_text": "a"})
                fail("a certificate nobody trusts was taken")
            except MemvaultServerError as e:
                if "nothing was sent" not in str(e) or e.status is not None:
                    fail(f"an untrusted certificate was not said to have sent nothing: {e}")
            trusted = MemvaultMemoryTool(
                url=url, token=token, timeout=10, ssl_context=ssl.create_default_context(cafile=cert)
            )
            trusted.call({"command": "create", "path": "/memories/b.md", "file_text": "over tls"})
            if "over tls" not in trusted.call({"command": "view", "path": "/memories/b.md"}):
                fail("what was written over HTTPS does not read back")
            if "a.md" in trusted.call({"command": "view", "path": "/memories"}):
                fail("the create refused for its certificate was made")
            plain = MemvaultMemoryTool(url=f"http://127.0.0.1:{port}", token=token, timeout=10)
            try:
                plain.call({"command": "view", "path": "/memories"})
                fail("plain HTTP to the TLS port was answered")
            except MemvaultServerError as e:
                if e.status != 426 or "https://" not in str(e):
                    fail(f"plain HTTP to the TLS port: {e.status} {e}")
            for t in (untrusted, trusted, plain):
                t.close()
        finally:
            server.terminate()
            server.wait(timeout=60)
            err.close()
    print("lifecycle: HTTPS: an untrusted certificate sends nothing, ssl_context trusts one, plain HTTP is a 426")


def main() -> None:
    binary, vault, flag, secret = sys.argv[1:5]
    unclosed_tool_stops_its_server(binary, vault, flag, secret)
    timeout_bounds_the_whole_request()
    bad_request_is_a_tool_error()
    https_with_a_private_authority(binary)


if __name__ == "__main__":
    main()
