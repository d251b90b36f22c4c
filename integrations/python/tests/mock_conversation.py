"""Drive the real `anthropic` SDK's tool runner with MemvaultMemoryTool
against tests/mock_messages_api.py, then check the tool's own behaviour.

Process mode: a dead server is a clear MemvaultServerError, and close() is
clean. HTTP mode (a `memvault server`): the url and token come from
MEMVAULT_URL and MEMVAULT_TOKEN, concurrent calls stay in step, and a wrong
token, an unreachable server and a silent one are each a MemvaultServerError
with the status and without the token.

Usage: python mock_conversation.py BASE_URL VAULT PASSPHRASE_FILE SESSION
       (memvault from $MEMVAULT_BIN)
   or: python mock_conversation.py --http BASE_URL SERVER_URL SESSION
       (the bearer token in $MEMVAULT_TOKEN)
Exits non-zero with a message on any failure.
"""

from __future__ import annotations

import os
import socket
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import anthropic  # noqa: E402
from anthropic.tools import ToolError  # noqa: E402

from memvault_memory import MemvaultMemoryTool, MemvaultServerError  # noqa: E402

MOVED = "/memories/clients/acme.md"
MISSING = "The path /memories/missing.md does not exist. Please provide a valid path."


def fail(msg: str) -> None:
    print(f"python integration: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def converse(base_url: str, memory: MemvaultMemoryTool) -> None:
    """The scripted conversation through the tool runner, then direct calls."""
    client = anthropic.Anthropic(api_key="sk-ant-mock-not-a-key", base_url=base_url, max_retries=0)
    if memory.to_dict() != {"type": "memory_20250818", "name": "memory"}:
        fail(f"tool definition {memory.to_dict()!r}")
    runner = client.beta.messages.tool_runner(
        model="claude-memvault-mock",
        max_tokens=1024,
        max_iterations=20,
        messages=[{"role": "user", "content": "Remember that Acme Corp prefers email follow-ups."}],
        tools=[memory],
    )
    final = runner.until_done()
    if final.stop_reason != "end_turn":
        fail(f"the runner ended on stop_reason {final.stop_reason!r}")
    texts = [b.text for b in final.content if b.type == "text"]
    if not texts or "prefers email" not in texts[0]:
        fail(f"unexpected final message {final.content!r}")

    # Direct calls: success text, and an error raised as the SDK's ToolError.
    listing = memory.call({"command": "view", "path": "/memories/clients"})
    if not isinstance(listing, str) or MOVED not in listing:
        fail(f"direct view returned {listing!r}")
    try:
        memory.call({"command": "view", "path": "/memories/../etc/passwd"})
    except ToolError as e:
        if ".." not in str(e.content):
            fail(f"the traversal error does not name the rule: {e.content!r}")
    else:
        fail("a traversal path did not raise ToolError")


def process_mode(base_url: str, vault: str, passphrase_file: str, session: str) -> None:
    with MemvaultMemoryTool(
        vault=vault, passphrase_file=passphrase_file, session=session, actor="python-sdk"
    ) as memory:
        converse(base_url, memory)
        pid = memory.pid
    if memory.close() != 0:
        fail("the server did not exit 0 after close()")
    try:
        os.kill(pid, 0)
        fail("the server process is still running after close()")
    except ProcessLookupError:
        pass
    try:
        memory.call({"command": "view", "path": "/memories"})
        fail("a call after close() did not raise")
    except MemvaultServerError:
        pass

    # A server that cannot unlock the vault dies; the call says so clearly.
    wrong = os.path.join(os.path.dirname(passphrase_file), "wrong-passphrase")
    with open(wrong, "w") as f:
        f.write("not the passphrase\n")
    dead = MemvaultMemoryTool(vault=vault, passphrase_file=wrong, session=session + "-dead")
    try:
        dead.call({"command": "view", "path": "/memories"})
        fail("a call to a server that could not unlock did not raise")
    except MemvaultServerError as e:
        msg = str(e)
        if "exit status 1" not in msg or "passphrase" not in msg:
            fail(f"the dead-server error is not clear: {msg}")
        print(f"python integration: dead server reported as: {msg}")
    dead.close()
    os.unlink(wrong)


def expect_server_error(memory: MemvaultMemoryTool, status, words: str, secrets: list[str]) -> str:
    """A view must raise MemvaultServerError with this status and words, and no secret."""
    try:
        memory.call({"command": "view", "path": "/memories"})
    except MemvaultServerError as e:
        msg = str(e)
        if e.status != status or words not in msg:
            fail(f"expected a MemvaultServerError with status {status} saying {words!r}: {e.status} {msg}")
        for s in secrets:
            if s in msg or s in repr(e):
                fail("a token appears in the MemvaultServerError")
        return msg
    except ToolError as e:
        fail(f"expected a MemvaultServerError, got ToolError {e.content!r}")
    fail(f"expected a MemvaultServerError with status {status}, the call succeeded")
    return ""


def http_mode(base_url: str, server_url: str, session: str) -> None:
    token = os.environ.get("MEMVAULT_TOKEN", "")
    if not token:
        fail("MEMVAULT_TOKEN is not set")
    try:
        MemvaultMemoryTool(url=server_url, vault="some-vault")
        fail("url with vault did not raise ValueError")
    except ValueError as e:
        if "not both" not in str(e):
            fail(f"url with vault: {e}")

    # The url from MEMVAULT_URL, the token from MEMVAULT_TOKEN.
    os.environ["MEMVAULT_URL"] = server_url
    with MemvaultMemoryTool(session=session, actor="python-sdk") as memory:
        if memory.url != server_url.rstrip("/") or memory.pid is not None or memory.session != session:
            fail(f"HTTP mode from the environment: url {memory.url!r} pid {memory.pid!r}")
        converse(base_url, memory)

        # Calls from several threads, each answered in step.
        paths = [MOVED, "/memories/missing.md", "/memories/clients", "/memories/../x"] * 3
        got: list = [None] * len(paths)

        def view(i: int) -> None:
            try:
                got[i] = ("ok", memory.call({"command": "view", "path": paths[i]}))
            except ToolError as e:
                got[i] = ("ToolError", e.content)
            except Exception as e:  # noqa: BLE001 - reported below
                got[i] = (type(e).__name__, str(e))

        threads = [threading.Thread(target=view, args=(i,)) for i in range(len(paths))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i, (path, (kind, content)) in enumerate(zip(paths, got)):
            ok = {
                0: kind == "ok" and str(content).startswith(f"Here's the content of {MOVED}"),
                1: kind == "ToolError" and content == MISSING,
                2: kind == "ok" and MOVED in str(content),
                3: kind == "ToolError" and ".." in str(content),
            }[i % 4]
            if not ok:
                fail(f"concurrent view {i} of {path}: {kind} {content!r}")
    if memory.close() is not None:
        fail("close() in HTTP mode returned something")
    try:
        memory.call({"command": "view", "path": "/memories"})
        fail("a call after close() did not raise")
    except MemvaultServerError:
        pass

    # A wrong token: 401, the server's message, and no token in the error.
    wrong = "mvt_0123456789abcdef_" + "e" * 64
    bad = MemvaultMemoryTool(url=server_url, token=wrong, session=session + "-bad")
    msg = expect_server_error(bad, 401, "HTTP 401: a valid bearer token is required", [wrong, token])
    print(f"python integration: wrong token reported as: {msg}")
    bad.close()

    # Nobody listening: no status, no token.
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    gone = MemvaultMemoryTool(url=f"http://127.0.0.1:{port}", session=session + "-gone")
    # A connection that could not be made sent nothing: said so, not
    # "the outcome is unknown" (round 41a).
    expect_server_error(gone, None, "could not be reached", [token])
    expect_server_error(gone, None, "nothing was sent, so nothing was changed", [token])
    gone.close()

    # A proxy whose error page echoes the request's headers, the token
    # past the 300 characters a message keeps: no piece of it is shown.
    echo_token = "mvt_0123456789abcdef_" + "ab" * 32
    with socket.socket() as proxy:
        proxy.bind(("127.0.0.1", 0))
        proxy.listen(1)
        port = proxy.getsockname()[1]

        def answer() -> None:
            conn, _ = proxy.accept()
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    head += conn.recv(65536)
                auth = next(h for h in head.split(b"\r\n") if h.lower().startswith(b"authorization:"))
                page = b"<html><body>" + b"x" * 260 + b" you sent " + auth + b"</body></html>"
                conn.sendall(
                    b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/html\r\nConnection: close\r\n"
                    + f"Content-Length: {len(page)}\r\n\r\n".encode()
                    + page
                )

        t = threading.Thread(target=answer)
        t.start()
        echo = MemvaultMemoryTool(url=f"http://127.0.0.1:{port}", token=echo_token, session=session + "-echo")
        expect_server_error(echo, 502, "outcome is unknown", [echo_token[:24], echo_token[-24:]])
        echo.close()
        t.join()

    # A server whose 200 is a success carrying no id: not taken as the
    # answer to this call (memvault gives a null id only to an error).
    with socket.socket() as stray:
        stray.bind(("127.0.0.1", 0))
        stray.listen(1)
        port = stray.getsockname()[1]

        def stray_answer() -> None:
            conn, _ = stray.accept()
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    head += conn.recv(65536)
                body = b'{"type":"tool_result","tool_use_id":null,"is_error":false,"content":"done"}'
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )

        t = threading.Thread(target=stray_answer)
        t.start()
        odd = MemvaultMemoryTool(url=f"http://127.0.0.1:{port}", token=echo_token, session=session + "-stray")
        expect_server_error(odd, 200, "answered out of step", [echo_token])
        odd.close()
        t.join()

    # Labels with spaces at their edges cannot go through HTTP headers as they are.
    for label in (" lead", "lead ", "  "):
        try:
            MemvaultMemoryTool(url=server_url, token=token, session=label)
            fail(f"session {label!r} was taken in HTTP mode")
        except ValueError as e:
            if "no space at either end" not in str(e):
                fail(f"session {label!r}: {e}")

    # A server that takes the connection and never answers: a timeout.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        port = silent.getsockname()[1]
        hung = MemvaultMemoryTool(url=f"http://127.0.0.1:{port}", session=session + "-hung", timeout=0.5)
        expect_server_error(hung, None, "gave no answer within 0.5 s", [token])
        hung.close()


def main() -> None:
    if sys.argv[1] == "--http":
        http_mode(*sys.argv[2:5])
    else:
        process_mode(*sys.argv[1:5])
    print("python integration: ok")


if __name__ == "__main__":
    main()
