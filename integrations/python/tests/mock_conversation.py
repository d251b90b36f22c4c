"""Drive the real `anthropic` SDK's tool runner with MemvaultMemoryTool
against tests/mock_messages_api.py, then check the tool's own behaviour:
a dead server is a clear MemvaultServerError, and close() is clean.

Usage: python mock_conversation.py BASE_URL VAULT PASSPHRASE_FILE SESSION
(memvault from $MEMVAULT_BIN). Exits non-zero with a message on any failure.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import anthropic  # noqa: E402
from anthropic.tools import ToolError  # noqa: E402

from memvault_memory import MemvaultMemoryTool, MemvaultServerError  # noqa: E402


def fail(msg: str) -> None:
    print(f"python integration: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def main() -> None:
    base_url, vault, passphrase_file, session = sys.argv[1:5]
    client = anthropic.Anthropic(api_key="sk-ant-mock-not-a-key", base_url=base_url, max_retries=0)

    with MemvaultMemoryTool(
        vault=vault, passphrase_file=passphrase_file, session=session, actor="python-sdk"
    ) as memory:
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
        if not isinstance(listing, str) or "/memories/clients/acme.md" not in listing:
            fail(f"direct view returned {listing!r}")
        try:
            memory.call({"command": "view", "path": "/memories/../etc/passwd"})
        except ToolError as e:
            if ".." not in str(e.content):
                fail(f"the traversal error does not name the rule: {e.content!r}")
        else:
            fail("a traversal path did not raise ToolError")
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

    print("python integration: ok")


if __name__ == "__main__":
    main()
