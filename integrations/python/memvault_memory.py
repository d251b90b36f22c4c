"""memvault as the backend of the Anthropic Python SDK's memory tool.

`MemvaultMemoryTool` is a `BetaAbstractMemoryTool` (from `anthropic.tools`)
that starts one `memvault serve` process and forwards each memory command
to it as one JSON line, reading back the `tool_result` line memvault writes;
or, given a `url` and a bearer `token`, posts each command to a
`memvault server` (`POST /v1/memory`) instead. Either way a success comes
back as the result text (or image blocks); an error result is raised as the
SDK's `ToolError`, so the tool runner sends it to Claude with
`is_error: true`, word for word.

    from anthropic import Anthropic
    from memvault_memory import MemvaultMemoryTool

    with MemvaultMemoryTool(vault="vault", key_file="vault.key", session="ticket-4711") as memory:
        runner = Anthropic().beta.messages.tool_runner(
            model="claude-sonnet-4-5", max_tokens=2048, tools=[memory],
            messages=[{"role": "user", "content": "Help me with this ticket."}])
        final = runner.until_done()

    # HTTP mode: the token may also come from $MEMVAULT_TOKEN, the url from $MEMVAULT_URL.
    with MemvaultMemoryTool(url="http://127.0.0.1:8700", token=token, session="ticket-4711") as memory:
        ...

What it promises (process mode):

- one server for the tool's lifetime (the vault is unlocked once), calls
  serialised with a lock, answers matched to requests by id;
- `close()` (or leaving the `with` block) ends input, waits for the server
  to exit and kills it only if it does not;
- a server that died, hung past `timeout`, or answered out of step raises
  `MemvaultServerError` naming the exit status and the server's last
  diagnostic lines (memvault never writes memory content or secrets to its
  stderr); every later call raises it again at once.

In HTTP mode: session and actor travel as the `Memvault-Session` and
`Memvault-Actor` headers; idle keep-alive connections are reused (calls from
several threads each take their own); an answer other than 200, a connection
that fails and a server silent past `timeout` raise `MemvaultServerError`
with the HTTP status (`.status`, None when there was no answer) and the
server's `{"error"}` message, and the next call tries again. The token is
sent only in the `Authorization` header, never in a message.

What it does not do: validate paths or commands (memvault does, and answers
with the contract's own error text), or hold a vault secret: the key file or
passphrase file is read by memvault itself (HTTP mode holds the bearer
token, in memory only).
"""

from __future__ import annotations

import collections
import http.client
import itertools
import json
import os
import queue
import select
import socket
import ssl
import subprocess
import threading
import time
import urllib.parse
import uuid
import weakref
from typing import Any, Optional, Union

from anthropic.tools import BetaAbstractMemoryTool, ToolError

__all__ = ["MemvaultMemoryTool", "MemvaultServerError"]
__version__ = "0.1.0"

PathLike = Union[str, "os.PathLike[str]"]
_EOF = object()
# An idle keep-alive connection is reused only this soon (memvault server
# closes one after 10 s without a request).
_REUSE_WITHIN = 5.0


class MemvaultServerError(RuntimeError):
    """The `memvault serve` process is gone, hung or out of step; or (HTTP
    mode) the `memvault server` refused a request, could not be reached or
    gave no answer in time. `status` is the HTTP status, else None."""

    def __init__(self, message: str, status: Optional[int] = None) -> None:
        super().__init__(message)
        self.status = status


# Said whenever a request may have run without its answer arriving.
_UNKNOWN = "the request's outcome is unknown (a change may have been made): view the file before repeating it"


def _label_ok(value: str) -> bool:
    """What `memvault server` takes as a session or actor header (HTTP drops
    spaces at a header value's edges, so a label has none)."""
    return 1 <= len(value) <= 128 and all(" " <= c <= "~" for c in value) and value == value.strip()


def _in_step(block: Any, rid: str) -> bool:
    """A reply is ours when it carries our id. A request memvault could not
    read as one is answered with a null id, always as an error; ours always
    parse, so a success without our id answers some other request."""
    if not isinstance(block, dict) or block.get("type") != "tool_result":
        return False
    rid_back = block.get("tool_use_id")
    return rid_back == rid or (rid_back is None and block.get("is_error") is True)


def _masked(text: str, token: str) -> str:
    """`text` with the token, and any piece of 12 or more of its first
    characters (what a cut left of it), replaced by `[token]`."""
    text = text.replace(token, "[token]")
    for n in range(len(token) - 1, 11, -1):
        text = text.replace(token[:n], "[token]")
    return text


def _pump_stdout(stream: Any, lines: "queue.Queue[object]") -> None:
    """The server's answers, a line each, then the end."""
    for raw in stream:
        lines.put(raw.decode("utf-8", errors="replace"))
    lines.put(_EOF)


def _pump_stderr(stream: Any, tail: "collections.deque[str]") -> None:
    """The server's last diagnostics."""
    for raw in stream:
        text = raw.decode("utf-8", errors="replace").rstrip()
        if text:
            tail.append(text[:500])


def _cut(conn: http.client.HTTPConnection, fired: threading.Event) -> None:
    """At a request's deadline: end its connection, so the read that waits
    on it returns at once (a server trickling bytes resets the socket's own
    timeout at each one)."""
    fired.set()
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle connection was closed by the server (it is readable)."""
    if conn.sock is None:
        return True
    try:
        return bool(select.select([conn.sock], [], [], 0)[0])
    except (OSError, ValueError):
        return True


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

    Process mode (a `memvault serve` process of its own) takes `vault`,
    `key_file` or `passphrase_file`, `binary` and `env`; HTTP mode (a
    `memvault server`) takes `url` and `token`. Giving `url` with any
    process argument is a ValueError.

    Arguments:
        url: HTTP mode: the server's base URL, such as http://127.0.0.1:8700
            (default: $MEMVAULT_URL when no process argument is given).
        token: HTTP mode: the bearer token from `memvault tenant add` or
            `memvault tenant token` (default: $MEMVAULT_TOKEN).
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
        timeout: seconds to wait for one answer before giving up on the server
            (HTTP mode: for the connection, and for each read of the answer).
        env: the server's environment (default: this process's).
        cache_control: passed to the tool definition, as in the SDK.
        ssl_context: HTTP mode, https:// only: the `ssl.SSLContext` to
            connect with, such as `ssl.create_default_context(cafile=...)`
            for a server whose certificate a private authority signed
            (default: the system's trusted authorities, or $SSL_CERT_FILE).
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
        url: Optional[str] = None,
        token: Optional[str] = None,
        ssl_context: Optional[ssl.SSLContext] = None,
    ) -> None:
        super().__init__(cache_control=cache_control)
        process_args = [
            name
            for name, value in (
                ("vault", vault),
                ("key_file", key_file),
                ("passphrase_file", passphrase_file),
                ("binary", binary),
                ("env", env),
            )
            if value is not None
        ]
        if url is not None and process_args:
            raise ValueError(
                f"give url (HTTP mode, a memvault server) or {', '.join(process_args)} "
                "(process mode, memvault serve), not both"
            )
        if url is None and not process_args:
            url = os.environ.get("MEMVAULT_URL") or None
        if token is not None and url is None:
            raise ValueError("token is for HTTP mode: give url too (or set MEMVAULT_URL)")
        if ssl_context is not None and url is None:
            raise ValueError("ssl_context is for HTTP mode: give url too (or set MEMVAULT_URL)")
        if key_file is not None and passphrase_file is not None:
            raise ValueError("give key_file or passphrase_file, not both")
        self.session = session if session is not None else f"s-{uuid.uuid4().hex[:16]}"
        self.timeout = timeout
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._closed = False
        self.url: Optional[str] = None
        self._proc: Optional[subprocess.Popen] = None
        if url is not None:
            self._init_http(url, token, actor, ssl_context)
            return
        argv = [os.fspath(binary or os.environ.get("MEMVAULT_BIN") or "memvault")]
        if vault is not None:
            argv += ["--vault", os.fspath(vault)]
        if key_file is not None:
            argv += ["--key-file", os.fspath(key_file)]
        if passphrase_file is not None:
            argv += ["--passphrase-file", os.fspath(passphrase_file)]
        argv += ["serve", "--session", self.session, "--actor", actor]
        self._argv0 = argv[0]
        self._dead: Optional[str] = None
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
        # The readers hold the pipes, never the tool: a tool nobody closed
        # is still collected, and its finalizer stops the server.
        threading.Thread(
            target=_pump_stdout, args=(self._proc.stdout, self._lines), name="memvault-stdout", daemon=True
        ).start()
        self._stderr_reader = threading.Thread(
            target=_pump_stderr, args=(self._proc.stderr, self._stderr_tail), name="memvault-stderr", daemon=True
        )
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
        status. Idempotent. Kills the server if it does not exit in time.
        HTTP mode: closes the idle connections; returns None."""
        with self._lock:
            if self._proc is None:
                self._closed = True
                for conn, _ in self._idle:
                    conn.close()
                self._idle.clear()
                return None
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
    def pid(self) -> Optional[int]:
        """The process id of the server (None in HTTP mode)."""
        return self._proc.pid if self._proc is not None else None

    # -- the wire ------------------------------------------------------------

    def _forward(self, command: Any) -> Any:
        if hasattr(command, "model_dump"):
            command = command.model_dump(mode="json", exclude_unset=True)
        block = self._post(command) if self.url is not None else self._exchange(command)
        content = block.get("content")
        if block.get("is_error"):
            raise ToolError(content)
        return content

    def _exchange(self, command: Any) -> dict:
        """One request line to the `memvault serve` process, one answer back."""
        with self._lock:
            if self._closed:
                raise MemvaultServerError("this memvault memory tool was closed")
            if self._dead is not None:
                raise MemvaultServerError(self._dead)
            rid = f"toolu_memvault_{next(self._ids)}"
            block = {"type": "tool_use", "id": rid, "name": "memory", "input": command}
            try:
                # Text as UTF-8, not \uXXXX escapes (see `_post`).
                line = json.dumps(block, ensure_ascii=False)
                line.encode("utf-8")
            except UnicodeEncodeError:
                line = json.dumps(block)
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
                self._give_up(f"the memvault server gave no answer within {self.timeout:g} s; {_UNKNOWN}")
            if answer is _EOF:
                self._give_up(f"the memvault server exited without answering; {_UNKNOWN}")
            try:
                block = json.loads(answer)  # type: ignore[arg-type]
            except ValueError:
                self._give_up("the memvault server wrote a line that is not JSON")
            # A request memvault could not read as one gets a null id, and is
            # always an error; ours always parse, so a success without our id
            # is an answer to some other request.
            if not _in_step(block, rid):
                self._give_up(f"the memvault server answered out of step (expected {rid})")
        return block

    def _give_up(self, what: str) -> None:
        """Record the server as dead with a message that says why; raise it."""
        assert self._proc is not None
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


    # -- HTTP mode -----------------------------------------------------------

    def _init_http(
        self, url: str, token: Optional[str], actor: str, ssl_context: Optional[ssl.SSLContext]
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("url must be an http:// or https:// base URL, such as http://127.0.0.1:8700")
        if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
            raise ValueError(
                "url takes no user, password, query or fragment: give the bearer token as token= "
                "or in MEMVAULT_TOKEN"
            )
        token = (token if token is not None else os.environ.get("MEMVAULT_TOKEN", "")).strip()
        if not token:
            raise ValueError("HTTP mode needs a bearer token: give token= or set MEMVAULT_TOKEN")
        if not all("!" <= c <= "~" for c in token):
            raise ValueError("the token is not a bearer token (printable ASCII, no spaces)")
        for name, value in (("session", self.session), ("actor", actor)):
            if not _label_ok(value):
                raise ValueError(
                    f"in HTTP mode the {name} is 1 to 128 printable ASCII characters, with no space at either end"
                )
        self._https = parts.scheme == "https"
        if ssl_context is not None and not self._https:
            raise ValueError("ssl_context is for an https:// url")
        self._ssl_context = ssl_context
        self._host = parts.hostname
        self._port = parts.port
        self._path = parts.path.rstrip("/") + "/v1/memory"
        self.url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
        self._token = token
        self._headers = {
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Accept": "application/json",
            "Memvault-Session": self.session,
            "Memvault-Actor": actor,
            "User-Agent": f"memvault-memory-python/{__version__}",
        }
        self._idle: list[tuple[http.client.HTTPConnection, float]] = []

    def _post(self, command: Any) -> dict:
        """One `POST /v1/memory`; the `tool_result` object it answers with."""
        with self._lock:
            if self._closed:
                raise MemvaultServerError("this memvault memory tool was closed")
            rid = f"toolu_memvault_{next(self._ids)}"
            conn = None
            while self._idle:
                idle, since = self._idle.pop()
                if time.monotonic() - since < _REUSE_WITHIN and not _dropped(idle):
                    conn = idle
                    break
                idle.close()
        if conn is None:
            if self._https:
                conn = http.client.HTTPSConnection(
                    self._host, self._port, timeout=self.timeout, context=self._ssl_context
                )
            else:
                conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)
        block = {"type": "tool_use", "id": rid, "name": "memory", "input": command}
        try:
            # Text as UTF-8, not \uXXXX escapes: a body of non-ASCII text is
            # up to three times smaller, so it fits the server's body limit
            # as it fits `serve`'s line limit.
            body = json.dumps(block, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            # A lone surrogate: sent escaped, memvault answers as it does in
            # process mode.
            body = json.dumps(block).encode("utf-8")
        # `timeout` bounds the whole request, not only each read.
        fired = threading.Event()
        deadline = threading.Timer(self.timeout, _cut, args=(conn, fired))
        deadline.daemon = True
        deadline.start()
        try:
            if conn.sock is None:
                # A new connection: one that cannot be made (refused, no
                # such host, a certificate not trusted) sent nothing.
                try:
                    conn.connect()
                except (socket.timeout, TimeoutError, OSError) as e:
                    conn.close()
                    raise self._http_error(
                        f"could not be reached ({type(e).__name__}: {_masked(str(e), self._token)}); "
                        "nothing was sent, so nothing was changed",
                        None,
                    ) from None
            conn.request("POST", self._path, body=body, headers=self._headers)
            resp = conn.getresponse()
            data = resp.read()
        except (socket.timeout, TimeoutError, OSError, http.client.HTTPException) as e:
            conn.close()
            # (`from None`: the cause may quote what a proxy echoed, the
            # token among it, into a logged traceback.)
            if fired.is_set() or isinstance(e, (socket.timeout, TimeoutError)):
                raise self._http_error(f"gave no answer within {self.timeout:g} s; {_UNKNOWN}", None) from None
            raise self._http_error(
                f"could not be reached ({type(e).__name__}: {_masked(str(e), self._token)}); "
                f"if the request reached it, {_UNKNOWN}",
                None,
            ) from None
        finally:
            deadline.cancel()
        # (Cut at the deadline just after the answer came: the answer
        # stands, the connection does not.)
        if resp.will_close or fired.is_set():
            conn.close()
        else:
            with self._lock:
                if self._closed:
                    conn.close()
                else:
                    self._idle.append((conn, time.monotonic()))
        if resp.status != 200:
            try:
                message = json.loads(data)["error"]
                if not isinstance(message, str):
                    raise TypeError
            except (ValueError, KeyError, TypeError):
                message = data.decode("utf-8", errors="replace").strip() or resp.reason
            # The token is masked before the text is cut, so no piece of it
            # survives the cut.
            message = _masked(message, self._token)[:300]
            # A request memvault could not read (a lone surrogate, which
            # JSON can escape but not carry): Claude's input was malformed,
            # as `serve` answers it in process mode, not the server unusable.
            if resp.status == 400:
                raise ToolError(message)
            # A gateway between (502, 504) may have lost memvault's answer.
            lost = f"; {_UNKNOWN}" if resp.status in (502, 504) else ""
            raise self._http_error(f"answered HTTP {resp.status}: {message}{lost}", resp.status)
        try:
            block = json.loads(data)
        except ValueError:
            block = None
        if not isinstance(block, dict):
            raise self._http_error("answered HTTP 200 with a body that is not a JSON object", 200)
        if not _in_step(block, rid):
            raise self._http_error(f"answered out of step (expected a tool_result for {rid})", 200)
        return block

    def _http_error(self, what: str, status: Optional[int]) -> MemvaultServerError:
        message = f"the memvault server at {self.url} {what} (session {self.session})"
        # Whatever a server or proxy echoes, the token is not repeated.
        return MemvaultServerError(_masked(message, self._token), status)
