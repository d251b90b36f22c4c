"""`memvault server`'s `/mcp` driven by a real MCP client (the `mcp` Python
SDK's streamable HTTP client), tenant by bearer token.

Every call of the script in test_mcp.py goes through `/mcp` with one
tenant's token and, as a `tool_use` block, to `memvault serve` on a twin
vault: same text, same error flag. Then: another tenant's token sees none
of it whatever the MCP arguments say, a missing or wrong token is refused
with 401, and the audit route names the token as the principal.

Run through tests/mcp/run.sh, which sets MEMVAULT_BIN.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import urllib.request
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from test_mcp import BIN, SCRIPT, SPEC_TEXT, Vault, call_texts, run


class Server:
    """A `memvault server` on loopback with tenants alice and bob."""

    def __init__(self, tmp: Path):
        self.root = tmp / "root"
        self.key = tmp / "server.key"
        assert run("keygen", str(self.key)).returncode == 0
        self.tokens = {}
        for name, scopes in (("alice", "memory,audit"), ("bob", "memory")):
            out = run("--key-file", str(self.key), "tenant", "add", name, "--root", str(self.root),
                      "--scopes", scopes)
            assert out.returncode == 0, out.stderr.decode()
            self.tokens[name] = out.stdout.decode().strip()
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMVAULT_")}
        self.proc = subprocess.Popen(
            [BIN, "--key-file", str(self.key), "server", "--root", str(self.root), "--listen", "127.0.0.1:0"],
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env)
        line = self.proc.stderr.readline().decode()
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert m, line
        self.url = f"http://127.0.0.1:{m.group(1)}"

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)

    def post(self, route: str, token: str, body: dict) -> tuple[int, dict]:
        req = urllib.request.Request(self.url + route, data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())


@pytest.fixture()
def server(tmp_path: Path):
    assert BIN and Path(BIN).is_file(), "set MEMVAULT_BIN to the memvault binary (tests/mcp/run.sh does)"
    s = Server(tmp_path)
    yield s
    if s.proc.poll() is None:
        s.proc.kill()
        s.proc.wait()


async def http_session(url: str, headers: dict, body):
    async with httpx2.AsyncClient(headers=headers, timeout=60) as client:
        async with streamable_http_client(url + "/mcp", http_client=client) as (read, write):
            async with ClientSession(read, write) as session:
                init = await session.initialize()
                return await body(session, init)


def test_every_command_answers_as_serve_does_and_tenants_stay_apart(server, tmp_path: Path):
    inputs = [args for args, _ in SCRIPT]
    alice = {"Authorization": f"Bearer {server.tokens['alice']}", "Memvault-Session": "mcp-http",
             "Memvault-Actor": "claude-code"}

    async def script(session, init):
        assert init.server_info.name == "memvault"
        listed = await session.list_tools()
        assert [t.name for t in listed.tools] == ["memory"]
        return [call_texts(await session.call_tool("memory", a)) for a in inputs]

    via_mcp = anyio.run(http_session, server.url, alice, script)
    (tmp_path / "twin").mkdir()
    via_serve = Vault(tmp_path / "twin").serve(inputs)
    for i, ((args, expect_error), (text, is_error), reply) in enumerate(zip(SCRIPT, via_mcp, via_serve)):
        where = f"step {i}: {json.dumps(args)}"
        assert text == reply["content"], f"{where}\n mcp:   {text!r}\n serve: {reply['content']!r}"
        assert is_error == reply["is_error"] == expect_error, where
        if i in SPEC_TEXT:
            assert text == SPEC_TEXT[i], where

    # Bob's token sees an empty memory, whatever the arguments name.
    bob = {"Authorization": f"Bearer {server.tokens['bob']}"}

    async def snoop(session, _init):
        out = []
        for args in (
            {"command": "view", "path": "/memories"},
            {"command": "view", "path": "/memories/done/todo.md"},
            {"command": "view", "path": "/memories", "tenant": "alice"},
            {"command": "view", "path": "/memories/../alice/memories"},
            {"command": "view", "path": "/alice/memories/done/todo.md"},
        ):
            out.append(call_texts(await session.call_tool("memory", args)))
        return out

    seen = anyio.run(http_session, server.url, {**bob, "X-Tenant": "alice"}, snoop)
    assert seen[0] == ("Here're the files and directories up to 2 levels deep in /memories, "
                       "excluding hidden items and node_modules:\n0B\t/memories", False), seen[0]
    for text, _ in seen[1:]:
        assert "line 2" not in text and "inserted" not in text, text

    # The audit route: every change of the MCP session, by alice's token.
    status, history = server.post("/v1/history", server.tokens["alice"], {"session": "mcp-http"})
    assert status == 200, history
    writes = [a for a, err in SCRIPT if not err and a["command"] != "view"]
    assert len(history["changes"]) == len(writes), history
    assert {(c["actor"], c["principal"]) for c in history["changes"]} == {("claude-code", "alice")}
    assert server.stop() == 0


def test_no_or_a_wrong_token_is_refused_with_401(server):
    for headers in ({}, {"Authorization": "Bearer mvt_0000000000000000_" + "0" * 64},
                    {"Authorization": f"Basic {server.tokens['alice']}"}):
        req = urllib.request.Request(
            server.url + "/mcp", method="POST", headers={**headers, "Content-Type": "application/json",
                                                         "Accept": "application/json, text/event-stream"},
            data=json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"}}}).encode())
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=30)
        assert err.value.code == 401, headers
        assert json.loads(err.value.read())["error"]

    async def body(session, init):
        return init

    with pytest.raises(Exception):
        anyio.run(http_session, server.url, {"Authorization": "Bearer nope"}, body)
