"""`memvault mcp` driven by a real MCP client (the `mcp` Python SDK).

Every tool call goes through the SDK's stdio client to `memvault mcp` on one
vault; the same command goes as a `tool_use` block to `memvault serve` on a
twin vault. The two must answer with the same text and the same error flag,
and a few answers are also checked against the contract strings of SPEC.md,
so that both being wrong in the same way still fails.

Run through tests/mcp/run.sh, which sets MEMVAULT_BIN.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp import MCPError

BIN = os.environ.get("MEMVAULT_BIN", "")

# A secret the redaction filter recognises (AWS access key id shape).
AWS_ID = "AKIAZ7QX3RBN2WLT4YHK"

# The script: (arguments of one memory call, expected is_error).
SCRIPT: list[tuple[dict, bool]] = [
    ({"command": "view", "path": "/memories"}, False),
    ({"command": "create", "path": "/memories/notes/todo.md",
      "file_text": "line one\nline two\nline three\n"}, False),
    ({"command": "create", "path": "/memories/notes/todo.md", "file_text": "again\n"}, True),
    ({"command": "view", "path": "/memories/notes/todo.md"}, False),
    ({"command": "view", "path": "/memories/notes/todo.md", "view_range": [2, -1]}, False),
    ({"command": "str_replace", "path": "/memories/notes/todo.md",
      "old_str": "line two", "new_str": "line 2"}, False),
    ({"command": "str_replace", "path": "/memories/notes/todo.md",
      "old_str": "no such text", "new_str": "x"}, True),
    ({"command": "str_replace", "path": "/memories/notes/todo.md", "old_str": "line"}, True),
    ({"command": "str_replace", "path": "/memories/missing.md",
      "old_str": "a", "new_str": "b"}, True),
    ({"command": "insert", "path": "/memories/notes/todo.md",
      "insert_line": 1, "insert_text": "inserted\n"}, False),
    ({"command": "insert", "path": "/memories/notes/todo.md",
      "insert_line": 99, "insert_text": "x"}, True),
    ({"command": "view", "path": "/memories/missing.md"}, True),
    ({"command": "view", "path": "/memories/../x"}, True),
    ({"command": "view", "path": "/memoriesX/a"}, True),
    ({"command": "create", "path": "/memories/%2e%2e/x", "file_text": "x"}, True),
    ({"command": "create", "path": "/memories/creds.md",
      "file_text": f"aws key {AWS_ID}\n"}, False),
    ({"command": "rename", "path": "ignored", "old_path": "/memories/notes/todo.md",
      "new_path": "/memories/done/todo.md"}, False),
    ({"command": "rename", "old_path": "/memories/missing.md",
      "new_path": "/memories/x.md"}, True),
    ({"command": "rename", "old_path": "/memories/creds.md",
      "new_path": "/memories/done/todo.md"}, True),
    ({"command": "create", "path": "/memories/x.md"}, True),
    ({"command": "insert", "path": "/memories/creds.md",
      "insert_line": "two", "insert_text": "x"}, True),
    ({"command": "explode", "path": "/memories"}, True),
    ({}, True),
    ({"command": "view", "path": "/memories"}, False),
    ({"command": "delete", "path": "/memories"}, True),
    ({"command": "delete", "path": "/memories/creds.md"}, False),
    ({"command": "delete", "path": "/memories/creds.md"}, True),
    ({"command": "view", "path": "/memories"}, False),
]

# Answers fixed by SPEC.md, by index in SCRIPT.
SPEC_TEXT = {
    1: "File created successfully at: /memories/notes/todo.md",
    2: "Error: File /memories/notes/todo.md already exists",
    6: "No replacement was performed, old_str `no such text` did not appear verbatim "
       "in /memories/notes/todo.md.",
    8: "Error: The path /memories/missing.md does not exist. Please provide a valid path.",
    9: "The file /memories/notes/todo.md has been edited.",
    11: "The path /memories/missing.md does not exist. Please provide a valid path.",
    15: "File created successfully at: /memories/creds.md\n"
        "Note: 1 secret was redacted before saving (aws-access-key-id).",
    16: "Successfully renamed /memories/notes/todo.md to /memories/done/todo.md",
    17: "Error: The path /memories/missing.md does not exist",
    18: "Error: The destination /memories/done/todo.md already exists",
    25: "Successfully deleted /memories/creds.md",
    26: "Error: The path /memories/creds.md does not exist",
}


def run(*args: str, input: bytes | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMVAULT_")}
    return subprocess.run([BIN, *args], input=input, capture_output=True, env=env, timeout=120)


class Vault:
    """A fresh vault unlocked by a key file (no Argon2: cheap)."""

    def __init__(self, root: Path):
        self.dir = root / "vault"
        self.key = root / "vault.key"
        for args in (["keygen", str(self.key)], [*self.opts(), "init"]):
            out = run(*args)
            assert out.returncode == 0, f"memvault {args[-1]} failed: {out.stderr.decode()}"

    def opts(self) -> list[str]:
        return ["--vault", str(self.dir), "--key-file", str(self.key)]

    def serve(self, inputs: list[dict]) -> list[dict]:
        lines = "".join(
            json.dumps({"type": "tool_use", "id": f"toolu_{i}", "name": "memory", "input": a}) + "\n"
            for i, a in enumerate(inputs)
        )
        out = run(*self.opts(), "serve", "--session", "twin", input=lines.encode())
        assert out.returncode == 0, f"serve failed: {out.stderr.decode()}"
        return [json.loads(line) for line in out.stdout.decode().splitlines()]

    def history(self) -> list[dict]:
        out = run(*self.opts(), "history", "--json")
        assert out.returncode == 0, out.stderr.decode()
        return [json.loads(line) for line in out.stdout.decode().splitlines()]

    def mcp_params(self, *extra: str, env: dict | None = None) -> StdioServerParameters:
        return StdioServerParameters(command=BIN, args=[*self.opts(), "mcp", *extra], env=env)


async def mcp_session(params: StdioServerParameters, body):
    with open(os.devnull, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as session:
                init = await session.initialize()
                return await body(session, init)


def call_texts(result) -> tuple[str, bool]:
    assert len(result.content) == 1, result
    block = result.content[0]
    assert block.type == "text", block
    return block.text, bool(result.is_error)


@pytest.fixture()
def vaults(tmp_path: Path) -> tuple[Vault, Vault]:
    assert BIN and Path(BIN).is_file(), "set MEMVAULT_BIN to the memvault binary (tests/mcp/run.sh does)"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    return Vault(tmp_path / "a"), Vault(tmp_path / "b")


def test_lists_one_memory_tool_with_the_memory_schema(vaults):
    vault, _ = vaults

    async def body(session, init):
        assert init.server_info.name == "memvault"
        assert init.capabilities.tools is not None
        return await session.list_tools()

    listed = anyio.run(mcp_session, vault.mcp_params(), body)
    assert [t.name for t in listed.tools] == ["memory"]
    tool = listed.tools[0]
    schema = tool.input_schema
    assert schema["type"] == "object"
    assert schema["required"] == ["command"]
    props = schema["properties"]
    assert props["command"]["enum"] == ["view", "create", "str_replace", "insert", "delete", "rename"]
    assert set(props) == {
        "command", "path", "view_range", "file_text", "old_str", "new_str",
        "insert_line", "insert_text", "old_path", "new_path",
    }
    assert props["view_range"]["type"] == "array"
    assert props["insert_line"]["type"] == "integer"
    for field in ("path", "file_text", "old_str", "new_str", "insert_text", "old_path", "new_path"):
        assert props[field]["type"] == "string", field
    desc = tool.description
    assert "ALWAYS VIEW YOUR MEMORY DIRECTORY" in desc
    assert "/memories" in desc
    for name in props["command"]["enum"]:
        assert f"- {name}:" in desc, name


def test_every_command_answers_as_serve_does(vaults):
    mcp_vault, serve_vault = vaults
    inputs = [args for args, _ in SCRIPT]

    async def body(session, _init):
        answers = []
        for args in inputs:
            answers.append(call_texts(await session.call_tool("memory", args)))
        return answers

    via_mcp = anyio.run(
        mcp_session, mcp_vault.mcp_params("--session", "mcp-test", "--actor", "claude-code"), body
    )
    via_serve = serve_vault.serve(inputs)
    assert len(via_mcp) == len(via_serve) == len(SCRIPT)
    for i, ((args, expect_error), (text, is_error), reply) in enumerate(zip(SCRIPT, via_mcp, via_serve)):
        where = f"step {i}: {json.dumps(args)}"
        assert reply["tool_use_id"] == f"toolu_{i}", where
        assert text == reply["content"], f"{where}\n mcp:   {text!r}\n serve: {reply['content']!r}"
        assert is_error == reply["is_error"], where
        assert is_error == expect_error, f"{where}: is_error={is_error}: {text}"
        if i in SPEC_TEXT:
            assert text == SPEC_TEXT[i], f"{where}: {text!r}"
    assert "`..`" in via_mcp[12][0], via_mcp[12]
    assert "explode" in via_mcp[21][0]
    assert "file_text" in via_mcp[19][0]
    assert "insert_line" in via_mcp[20][0]
    assert AWS_ID not in json.dumps(via_mcp)
    assert via_mcp[-1][0].splitlines()[1:] == [
        "36B\t/memories",
        "36B\t/memories/done/",
        "36B\t/memories/done/todo.md",
    ], via_mcp[-1][0]

    # Attribution from --session/--actor, one commit per successful change.
    changes = [h for h in mcp_vault.history() if h["op"] != "init"]
    writes = [a for a, err in SCRIPT if not err and a["command"] != "view"]
    assert len(changes) == len(writes), changes
    assert {(h["session"], h["actor"]) for h in changes} == {("mcp-test", "claude-code")}


def test_session_and_actor_from_the_environment(vaults):
    vault, _ = vaults
    params = vault.mcp_params(env={"MEMVAULT_SESSION": "env-session", "MEMVAULT_ACTOR": "env-actor"})

    async def body(session, _init):
        return call_texts(
            await session.call_tool("memory", {"command": "create", "path": "/memories/e.md", "file_text": "e\n"})
        )

    assert anyio.run(mcp_session, params, body) == ("File created successfully at: /memories/e.md", False)
    latest = vault.history()[0]
    assert (latest["session"], latest["actor"], latest["path"]) == ("env-session", "env-actor", "/memories/e.md")


def test_unknown_tool_is_a_protocol_error_and_the_server_keeps_going(vaults):
    vault, _ = vaults

    async def body(session, _init):
        with pytest.raises(MCPError) as err:
            await session.call_tool("bash", {"command": "ls"})
        after = await session.call_tool("memory", {"command": "view", "path": "/memories"})
        return str(err.value), call_texts(after)

    message, (text, is_error) = anyio.run(mcp_session, vault.mcp_params(), body)
    assert "memory" in message
    assert not is_error and text.endswith("0B\t/memories")


def test_wrong_key_fails_before_serving(vaults, tmp_path: Path):
    vault, _ = vaults
    other = tmp_path / "other.key"
    assert run("keygen", str(other)).returncode == 0
    out = run("--vault", str(vault.dir), "--key-file", str(other), "mcp",
              input=b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}\n')
    assert out.returncode == 1, out
    assert out.stdout == b"", "nothing but protocol on stdout"
    assert b"memvault:" in out.stderr
