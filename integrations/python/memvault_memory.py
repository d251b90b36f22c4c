"""memvault as the backend of the Anthropic Python SDK's memory tool.

`MemvaultMemoryTool` is a `BetaAbstractMemoryTool` (from `anthropic.tools`)
that starts one `memvault serve` process and forwards each memory command
to it as one JSON line, reading back the `tool_result` line memvault writes.
A success comes back as the result text (or image blocks); an error result
is raised as the SDK's `ToolError`, so the tool runner sends it to Claude
with `is_error: true`, word for word.

    from anthropic import Anthropic
    from memvault_memory import MemvaultMemoryTool

    with MemvaultMemoryTool(vault="vault", key_file="vault.key", session="ticket-4711") as memory:
        runner = Anthropic().beta.messages.tool_runner(
            model="claude-sonnet-4-5", max_tokens=2048, tools=[memory],
            messages=[{"role": "user", "content": "Help me with this ticket."}])
        final = runner.until_done()

What it promises:

- one server for the tool's lifetime (the vault is unlocked once), calls
  serialised with a lock, answers matched to requests by id;
- `close()` (or leaving the `with` block) ends input, waits for the server
  to exit and kills it only if it does not;
- a server that died, hung past `timeout`, or answered out of step raises
  `MemvaultServerError` naming the exit status and the server's last
  diagnostic lines (memvault never writes memory content or secrets to its
  stderr); every later call raises it again at once.

What it does not do: validate paths or commands (memvault does, and answers
with the contract's own error text), or hold any secret: the key file or
passphrase file is read by memvault itself.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import queue
import subprocess
import threading
import uuid
import weakref
from typing import Any, Optional, Union

from anthropic.tools import BetaAbstractMemoryTool, ToolError

__all__ = ["MemvaultMemoryTool", "MemvaultServerError"]
__version__ = "0.1.0"

PathLike = Union[str, "os.PathLike[str]"]
_EOF = object()


class MemvaultServerError(RuntimeError):
    """The `memvault serve` process is gone, hung or out of step."""


def _stop(proc: subprocess.Popen) -> None:
    """Last-resort cleanup when a tool is garbage-collected unclosed."""
    if proc.poll() is None:
        try:
            if proc.stdin:
                proc.stdin.close()
            proc.wait(timeout=5)
        except Exception:
            proc.kill()
            proc.wait()


class MemvaultMemoryTool(BetaAbstractMemoryTool):
    """The memory tool (`memory_20250818`) backed by a memvault vault.

    Arguments:
        vault: the vault directory (else memvault's default: $MEMVAULT_DIR, ...).
        session: the session id stored with every change (default: a new
            random `s-...` id, available as `.session`).
        key_file: a key file made by `memvault keygen`.
        passphrase_file: a file whose first line is the passphrase (use one of
            the two; with neither, memvault reads MEMVAULT_KEY_FILE or
            MEMVAULT_PASSPHRASE from the environment).
        actor: who is acting, stored with every change.
        binary: the memvault executable (default: $MEMVAULT_BIN, else
            `memvault` on the PATH).
        timeout: seconds to wait for one answer before giving up on the server.
        env: the server's environment (default: this process's).
        cache_control: passed to the tool definition, as in the SDK.
    """

    def __init__(
        self,
        *,
        vault: Optional[PathLike] = None,
        session: Optional[str] = None,
        key_file: Optional[PathLike] = None,
        passphrase_file: Optional[PathLike] = None,
        actor: str = "agent",
        binary: Optional[PathLike] = None,
        timeout: float = 120.0,
        env: Optional[dict] = None,
        cache_control: Any = None,
    ) -> None:
        super().__init__(cache_control=cache_control)
        if key_file is not None and passphrase_file is not None:
            raise ValueError("give key_file or passphrase_file, not both")
        self.session = session if session is not None else f"s-{uuid.uuid4().hex[:16]}"
        self.timeout = timeout
        argv = [os.fspath(binary or os.environ.get("MEMVAULT_BIN") or "memvault")]
        if vault is not None:
            argv += ["--vault", os.fspath(vault)]
        if key_file is not None:
            argv += ["--key-file", os.fspath(key_file)]
        if passphrase_file is not None:
            argv += ["--passphrase-file", os.fspath(passphrase_file)]
        argv += ["serve", "--session", self.session, "--actor", actor]
        self._argv0 = argv[0]
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._dead: Optional[str] = None
        self._closed = False
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=20)
        self._lines: "queue.Queue[object]" = queue.Queue()
        try:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
            )
        except OSError as e:
            raise MemvaultServerError(f"cannot start memvault ({self._argv0}): {e}") from e
        self._finalizer = weakref.finalize(self, _stop, self._proc)
        threading.Thread(target=self._read_stdout, name="memvault-stdout", daemon=True).start()
        self._stderr_reader = threading.Thread(target=self._read_stderr, name="memvault-stderr", daemon=True)
        self._stderr_reader.start()

    # -- the SDK's interface -------------------------------------------------

    def call(self, input: object) -> Any:
        """Forward Claude's input object unchanged, so memvault (not the SDK's
        model layer) judges it and answers malformed input with its own text."""
        return self._forward(input)

    def view(self, command: Any) -> Any:
        return self._forward(command)

    def create(self, command: Any) -> Any:
        return self._forward(command)

    def str_replace(self, command: Any) -> Any:
        return self._forward(command)

    def insert(self, command: Any) -> Any:
        return self._forward(command)

    def delete(self, command: Any) -> Any:
        return self._forward(command)

    def rename(self, command: Any) -> Any:
        return self._forward(command)

    # -- lifecycle -----------------------------------------------------------

    def close(self) -> Optional[int]:
        """End the server's input and wait for it to exit; returns its exit
        status. Idempotent. Kills the server if it does not exit in time."""
        with self._lock:
            if self._closed:
                return self._proc.returncode
            self._closed = True
            try:
                if self._proc.stdin:
                    self._proc.stdin.close()
            except OSError:
                pass
            try:
                return self._proc.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                return self._proc.wait()
            finally:
                self._finalizer.detach()

    def __enter__(self) -> "MemvaultMemoryTool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pid(self) -> int:
        return self._proc.pid

    # -- the wire ------------------------------------------------------------

    def _forward(self, command: Any) -> Any:
        if hasattr(command, "model_dump"):
            command = command.model_dump(mode="json", exclude_unset=True)
        with self._lock:
            if self._closed:
                raise MemvaultServerError("this memvault memory tool was closed")
            if self._dead is not None:
                raise MemvaultServerError(self._dead)
            rid = f"toolu_memvault_{next(self._ids)}"
            line = json.dumps({"type": "tool_use", "id": rid, "name": "memory", "input": command})
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.write(line.encode("utf-8") + b"\n")
                self._proc.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                self._give_up("the memvault server stopped before it could take the request")
            try:
                answer = self._lines.get(timeout=self.timeout)
            except queue.Empty:
                self._proc.kill()
                self._give_up(f"the memvault server gave no answer within {self.timeout:g} s")
            if answer is _EOF:
                self._give_up("the memvault server exited without answering")
            try:
                block = json.loads(answer)  # type: ignore[arg-type]
            except ValueError:
                self._give_up("the memvault server wrote a line that is not JSON")
            # A request memvault could not read as one gets a null id; ours always parse.
            if block.get("type") != "tool_result" or block.get("tool_use_id") not in (rid, None):
                self._give_up(f"the memvault server answered out of step (expected {rid})")
        content = block.get("content")
        if block.get("is_error"):
            raise ToolError(content)
        return content

    def _give_up(self, what: str) -> None:
        """Record the server as dead with a message that says why; raise it."""
        try:
            code = self._proc.wait(timeout=2)
            status = f"exit status {code}"
            self._stderr_reader.join(timeout=2)  # its last words
        except subprocess.TimeoutExpired:
            status = "still running"
        tail = " | ".join(self._stderr_tail)
        self._dead = (
            f"{what} ({self._argv0}, session {self.session}, {status})"
            + (f"; its last diagnostics: {tail}" if tail else "")
            + ". Start a new MemvaultMemoryTool to continue."
        )
        raise MemvaultServerError(self._dead)

    def _read_stdout(self) -> None:
        assert self._proc.stdout is not None
        for raw in self._proc.stdout:
            self._lines.put(raw.decode("utf-8", errors="replace"))
        self._lines.put(_EOF)

    def _read_stderr(self) -> None:
        assert self._proc.stderr is not None
        for raw in self._proc.stderr:
            text = raw.decode("utf-8", errors="replace").rstrip()
            if text:
                self._stderr_tail.append(text[:500])

