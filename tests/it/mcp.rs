//! `memvault mcp` spoken to as raw JSON-RPC lines: the handshake, the one
//! tool, and tool calls answered with the same text as `serve`. (The test
//! with a real MCP client is tests/mcp/, run by .ci/mcp.sh.)

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Stdio};

use serde_json::{Value, json};

use crate::util::*;

/// A running `memvault mcp`, one request line in, one response line out.
struct McpServer {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
}

impl McpServer {
    fn start(v: &TestVault, args: &[&str]) -> McpServer {
        let mut child = v
            .cmd()
            .arg("mcp")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut s = McpServer {
            child,
            stdin,
            stdout,
            next_id: 0,
        };
        let init = s.request(
            "initialize",
            json!({
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "memvault-it", "version": "0"}
            }),
        );
        assert_eq!(init["result"]["serverInfo"]["name"], "memvault", "{init}");
        assert!(
            init["result"]["capabilities"]["tools"].is_object(),
            "{init}"
        );
        s.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        s
    }

    fn send(&mut self, msg: &Value) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{msg}").unwrap();
        stdin.flush().unwrap();
    }

    /// Send a request and read lines until its response (every line must
    /// be a JSON-RPC message).
    fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let mut line = String::new();
            let n = self.stdout.read_line(&mut line).unwrap();
            assert!(n > 0, "the server closed stdout before answering {method}");
            let msg: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line}"));
            assert_eq!(msg["jsonrpc"], "2.0", "{msg}");
            if msg["id"] == id {
                return msg;
            }
        }
    }

    fn call(&mut self, arguments: Value) -> Value {
        let msg = self.request(
            "tools/call",
            json!({"name": "memory", "arguments": arguments}),
        );
        msg["result"].clone()
    }

    /// Close stdin; the server must exit 0 and print nothing more.
    fn finish(mut self) {
        drop(self.stdin.take());
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut self.stdout, &mut rest).unwrap();
        assert_eq!(rest, "", "nothing after the last response");
        let status = self.child.wait().unwrap();
        assert!(status.success(), "mcp exited with {status}");
    }
}

/// The text and error flag of an MCP tool result.
fn mcp_text(result: &Value) -> (&str, bool) {
    let content = result["content"].as_array().unwrap();
    assert_eq!(content.len(), 1, "{result}");
    assert_eq!(content[0]["type"], "text", "{result}");
    (
        content[0]["text"].as_str().unwrap(),
        result["isError"].as_bool().unwrap(),
    )
}

#[test]
fn mcp_lists_one_tool_and_answers_like_serve() {
    let twin = TestVault::new();
    let v = TestVault::new();
    let mut server = McpServer::start(&v, &["--session", "it-mcp", "--actor", "it"]);

    let listed = server.request("tools/list", json!({}));
    let tools = listed["result"]["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 1, "{listed}");
    assert_eq!(tools[0]["name"], "memory");
    let schema = &tools[0]["inputSchema"];
    assert_eq!(
        schema["properties"]["command"]["enum"],
        json!([
            "view",
            "create",
            "str_replace",
            "insert",
            "delete",
            "rename"
        ])
    );
    assert_eq!(schema["required"], json!(["command"]));

    let script = [
        json!({"command": "view", "path": "/memories"}),
        json!({"command": "create", "path": "/memories/a.md", "file_text": "one\ntwo\n"}),
        json!({"command": "create", "path": "/memories/a.md", "file_text": "x"}),
        json!({"command": "str_replace", "path": "/memories/a.md", "old_str": "zzz", "new_str": "y"}),
        json!({"command": "str_replace", "path": "/memories/a.md", "old_str": "two", "new_str": "2"}),
        json!({"command": "view", "path": "/memories/nope.md"}),
        json!({"command": "view", "path": "/memories/../etc"}),
        json!({"command": "frobnicate"}),
        json!({"command": "view", "path": "/memories/a.md"}),
    ];
    let via_mcp: Vec<Value> = script.iter().map(|a| server.call(a.clone())).collect();
    // No arguments at all: the same answer as a tool_use with an empty input.
    let no_args = server.request("tools/call", json!({"name": "memory"}));
    let unknown = server.request("tools/call", json!({"name": "bash", "arguments": {}}));
    server.finish();

    let mut lines: Vec<String> = script
        .iter()
        .map(|a| json!({"type": "tool_use", "id": "t", "name": "memory", "input": a}).to_string())
        .collect();
    lines.push(json!({"type": "tool_use", "id": "t", "name": "memory", "input": {}}).to_string());
    let via_serve = twin.serve(&lines);
    assert_eq!(via_serve.len(), script.len() + 1);

    for (i, (m, s)) in via_mcp.iter().zip(&via_serve).enumerate() {
        let (t, err) = mcp_text(m);
        assert_eq!(t, text(s), "step {i}");
        assert_eq!(err, is_error(s), "step {i}");
    }
    let (t, err) = mcp_text(&no_args["result"]);
    assert_eq!((t, err), (text(&via_serve[script.len()]), true));

    let expect = [
        (1, "File created successfully at: /memories/a.md", false),
        (2, "Error: File /memories/a.md already exists", true),
        (
            5,
            "The path /memories/nope.md does not exist. Please provide a valid path.",
            true,
        ),
        (
            8,
            "Here's the content of /memories/a.md with line numbers:\n     1\tone\n     2\t2",
            false,
        ),
    ];
    for (i, want, want_err) in expect {
        assert_eq!(mcp_text(&via_mcp[i]), (want, want_err), "step {i}");
    }
    assert!(
        mcp_text(&via_mcp[3])
            .0
            .starts_with("No replacement was performed")
    );
    assert!(mcp_text(&via_mcp[6]).1, "a traversal is refused");
    assert!(mcp_text(&via_mcp[7]).0.contains("frobnicate"));
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");

    // Two successful writes, attributed to --session/--actor.
    assert_eq!(v.commits(), 3);
    let out = v.cmd().args(["history", "--json"]).output().unwrap();
    let history = parse_lines(&out.stdout);
    assert_eq!(history[0]["session"], "it-mcp");
    assert_eq!(history[0]["actor"], "it");
    assert_eq!(history[0]["op"], "str_replace");
}

#[test]
fn mcp_with_a_wrong_key_exits_1_with_nothing_on_stdout() {
    let v = TestVault::new();
    let other = v.tmp.path().join("other.key");
    let out = std::process::Command::new(bin())
        .arg("keygen")
        .arg(&other)
        .output()
        .unwrap();
    assert!(out.status.success());
    let out = run_with_stdin(
        std::process::Command::new(bin())
            .arg("--vault")
            .arg(&v.vault)
            .arg("--key-file")
            .arg(&other)
            .arg("mcp")
            .env_remove("MEMVAULT_DIR")
            .env_remove("MEMVAULT_KEY_FILE")
            .env_remove("MEMVAULT_PASSPHRASE"),
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{}}\n",
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "stdout is for the protocol only");
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("memvault: "));
}

#[test]
fn mcp_without_a_handshake_exits_quietly_or_with_a_kind_only() {
    let v = TestVault::new();
    // End of input before anything: nothing was asked, status 0.
    let out = run_with_stdin(v.cmd().arg("mcp").args(["--session", "s"]), b"");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(out.stdout.is_empty());
    // A tool call instead of `initialize`: refused without quoting it.
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "memory", "arguments": {"command": "create",
        "path": "/memories/secret-name.md", "file_text": "secret text"}}});
    let out = run_with_stdin(
        v.cmd().arg("mcp").args(["--session", "s"]),
        format!("{call}\n").as_bytes(),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("secret"), "stderr quotes the request: {err}");
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let msg: Value = serde_json::from_str(line).unwrap();
        assert_eq!(msg["jsonrpc"], "2.0");
    }
    assert_eq!(v.commits(), 1, "nothing was written");
    // A notification or a response before the first request is dropped
    // (JSON-RPC answers neither); the requests after it are answered.
    for first in [
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}),
        json!({"jsonrpc": "2.0", "id": 5, "result": {}}),
        json!({"jsonrpc": "2.0", "id": 7, "error": {"code": 1, "message": "x"}}),
    ] {
        let ping = json!({"jsonrpc": "2.0", "id": "p", "method": "ping"});
        let out = run_with_stdin(
            v.cmd().arg("mcp").args(["--session", "s"]),
            format!("{first}\n{ping}\n").as_bytes(),
        );
        assert_eq!(out.status.code(), Some(0), "{first}: {out:?}");
        let answers: Vec<Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(answers.len(), 1, "{first}: {answers:?}");
        assert_eq!(answers[0]["id"], "p", "{first}: {answers:?}");
        assert!(answers[0].get("result").is_some(), "{first}: {answers:?}");
    }
}

impl McpServer {
    /// Send a raw line and read the next response line.
    fn raw(&mut self, line: &[u8]) -> Value {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(line).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
        let mut out = String::new();
        let n = self.stdout.read_line(&mut out).unwrap();
        assert!(n > 0, "no answer to a bad line");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
    }
}

/// Input rmcp alone drops without an answer, or answers "method not
/// found": each gets an answer, a `tools/call` the tool error `serve`
/// gives for the same input, and nothing runs; the server goes on.
#[test]
fn mcp_answers_every_bad_line_as_serve_does_and_runs_none_of_them() {
    let v = TestVault::new();
    let mut s = McpServer::start(&v, &[]);
    let serve_text = |line: &str| {
        let out = v.serve(&[line.to_string()]);
        out[0]["content"].as_str().unwrap().to_string()
    };
    // Not JSON at all: a JSON-RPC parse error, id null.
    let r = s.raw(b"not json");
    assert_eq!(r["id"], Value::Null, "{r}");
    assert_eq!(r["error"]["code"], -32700, "{r}");
    // A tools/call that serve refuses: serve's text, as a tool error. The
    // second `arguments` would have deleted everything.
    let create = json!({"command": "create", "path": "/memories/keep.md", "file_text": "kept\n"});
    let created = s.call(create);
    assert!(!mcp_text(&created).1, "{created}");
    let cases: [(&str, String); 3] = [
        (
            r#"{"jsonrpc":"2.0","id":101,"method":"tools/call","params":{"name":"memory","arguments":{"command":"view","path":"/memories"},"arguments":{"command":"delete","path":"/memories/keep.md"}}}"#,
            serve_text(r#"{"type":"tool_use","id":"t","name":"memory","input":{"command":"view","path":"/memories"},"input":{"command":"delete","path":"/memories/keep.md"}}"#)
                .replace("`input`", "`arguments`"),
        ),
        (
            r#"{"jsonrpc":"2.0","id":102,"method":"tools/call","params":{"name":"memory","arguments":"delete"}}"#,
            serve_text(r#"{"type":"tool_use","id":"t","name":"memory","input":"delete"}"#),
        ),
        (
            r#"{"jsonrpc":"2.0","id":"s","method":"tools/call","params":{"name":"memory","arguments":{"command":"delete","path":"/memories/keep.md\ud800"}}}"#,
            serve_text(r#"{"command":"delete","path":"/memories/keep.md\ud800"}"#),
        ),
    ];
    for (line, expected) in cases {
        let r = s.raw(line.as_bytes());
        let id: Value =
            serde_json::from_str::<Value>(&line.replace("\\ud800", "")).unwrap()["id"].clone();
        assert_eq!(r["id"], id, "{r}");
        let (text, is_error) = mcp_text(&r["result"]);
        assert!(is_error, "{r}");
        // The parser's position differs between the two framings.
        let unplaced = |t: &str| match t.find(" at line 1 column ") {
            Some(i) => t[..i].to_string() + t[i..].split_once(')').map_or("", |x| x.1),
            None => t.to_string(),
        };
        assert_eq!(unplaced(text), unplaced(&expected), "{line}");
    }
    // JSON, but not a JSON-RPC 2.0 request rmcp takes: an error that
    // names the id when it can be read (else null), never no answer.
    for (line, id, code) in [
        (
            r#"{"jsonrpc":"1.0","id":110,"method":"tools/list"}"#,
            json!(110),
            -32600,
        ),
        (r#"{"id":111,"method":"tools/list"}"#, json!(111), -32600),
        (
            r#"{"jsonrpc":"2.0","id":{"a":1},"method":"tools/list"}"#,
            Value::Null,
            -32600,
        ),
        (
            r#"{"jsonrpc":"2.0","id":1.5,"method":"tools/list"}"#,
            Value::Null,
            -32600,
        ),
        (
            r#"[{"jsonrpc":"2.0","id":112,"method":"tools/list"}]"#,
            Value::Null,
            -32600,
        ),
        (
            r#"{"jsonrpc":"2.0","id":"n","method":"tools/call","params":{"arguments":{"command":"view","path":"/memories"}}}"#,
            json!("n"),
            -32602,
        ),
        (
            r#"{"jsonrpc":"2.0","id":113,"method":"tools/call"}"#,
            json!(113),
            -32602,
        ),
        // Round 38a: params rmcp cannot read, and an id past i64 (rmcp
        // answered these with no id at all).
        (
            r#"{"jsonrpc":"2.0","id":114,"method":"ping","params":"junk"}"#,
            json!(114),
            -32602,
        ),
        (
            r#"{"jsonrpc":"2.0","id":115,"method":"tools/list","params":[1]}"#,
            json!(115),
            -32602,
        ),
        (
            r#"{"jsonrpc":"2.0","id":116,"method":"tools/call","params":{"name":"memory","arguments":{"command":"view","path":"/memories"},"_meta":"x"}}"#,
            json!(116),
            -32602,
        ),
        (
            r#"{"jsonrpc":"2.0","id":9223372036854775808,"method":"ping"}"#,
            json!(9223372036854775808u64),
            -32600,
        ),
    ] {
        let r = s.raw(line.as_bytes());
        assert_eq!(r["id"], id, "{line}: {r}");
        assert_eq!(r["error"]["code"], code, "{line}: {r}");
    }
    // A notification rmcp cannot read gets no answer, and the server goes
    // on: the next line's answer is the next one out.
    s.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized", "params": "junk"}));
    let r = s.raw(br#"{"jsonrpc":"2.0","id":117,"method":"ping"}"#);
    assert_eq!(r["id"], 117, "{r}");
    assert!(r["result"].is_object(), "{r}");
    // A line over the limit: serve's error, as the call's tool error.
    let big = json!({"jsonrpc": "2.0", "id": 103, "method": "tools/call", "params": {"name": "memory", "arguments": {"command": "create", "path": "/memories/big.md", "file_text": "x".repeat(9 << 20)}}}).to_string();
    let r = s.raw(big.as_bytes());
    assert_eq!(r["id"], 103, "{r}");
    let (text, is_error) = mcp_text(&r["result"]);
    assert!(
        is_error && text.contains("over this server's limit"),
        "{text}"
    );
    // Nothing ran: the file is there, big.md is not; the server goes on.
    let listing = s.call(json!({"command": "view", "path": "/memories"}));
    let (text, _) = mcp_text(&listing);
    assert!(
        text.contains("keep.md") && !text.contains("big.md"),
        "{text}"
    );
    s.finish();
}

/// Round 36c: a last request whose line has no newline before the input
/// ends is run and answered, as `serve` answers one (rmcp's reader
/// dropped it: exit 0, no answer, no file).
#[test]
fn mcp_answers_a_last_request_without_its_newline() {
    let v = TestVault::new();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}});
    let inited = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "memory", "arguments": {"command": "create",
        "path": "/memories/last.md", "file_text": "x\n"}}});
    let out = run_with_stdin(
        v.cmd().arg("mcp").args(["--session", "s"]),
        format!("{init}\n{inited}\n{call}").as_bytes(),
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let answers: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let created = answers.iter().find(|a| a["id"] == 2);
    assert!(
        created.is_some_and(|a| a["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("File created successfully"))),
        "{answers:?}"
    );
    assert_eq!(v.commits(), 2, "the file was written");
}
