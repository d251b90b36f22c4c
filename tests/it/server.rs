//! `memvault server` and `memvault tenant`: the real binary on loopback,
//! spoken to over real TCP connections.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::util::{bin, contains, plaintext_anywhere};

/// A server root with tenants, unlocked by a key file.
pub struct Root {
    pub tmp: tempfile::TempDir,
    pub root: PathBuf,
    pub key: PathBuf,
    /// Each tenant's first token.
    pub tokens: HashMap<String, String>,
}

pub fn tenant_cmd(key: &Path) -> Command {
    let mut c = Command::new(bin());
    c.arg("--key-file").arg(key);
    c.env_remove("MEMVAULT_DIR")
        .env_remove("MEMVAULT_KEY_FILE")
        .env_remove("MEMVAULT_PASSPHRASE")
        .env_remove("MEMVAULT_SESSION")
        .env_remove("MEMVAULT_ACTOR");
    c
}

impl Root {
    /// A root with `tenants`: (name, comma-separated scopes).
    pub fn new(tenants: &[(&str, &str)]) -> Root {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        let key = tmp.path().join("server.key");
        let out = Command::new(bin())
            .arg("keygen")
            .arg(&key)
            .output()
            .unwrap();
        assert!(out.status.success());
        let mut r = Root {
            tmp,
            root,
            key,
            tokens: HashMap::new(),
        };
        for (name, scopes) in tenants {
            let token = r.add(name, scopes);
            r.tokens.insert(name.to_string(), token);
        }
        r
    }

    pub fn tenant(&self) -> Command {
        let mut c = tenant_cmd(&self.key);
        c.arg("tenant");
        c
    }

    /// `tenant add`; the token it printed.
    pub fn add(&self, name: &str, scopes: &str) -> String {
        let token = self
            .ok(&["add", name, "--scopes", scopes])
            .trim()
            .to_string();
        assert!(token.starts_with("mvt_"), "{token}");
        token
    }

    /// `tenant ARGS... --root ROOT`, which must succeed; its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self
            .tenant()
            .args(args)
            .arg("--root")
            .arg(&self.root)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "tenant {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// `tenant list --json`: one JSON object per tenant, a line each.
    pub fn list_json(&self) -> String {
        let out = self
            .tenant()
            .args(["list", "--json", "--root"])
            .arg(&self.root)
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    }

    /// Each tenant's id (its vault's directory under `tenants/`), by name.
    pub fn ids(&self) -> HashMap<String, String> {
        self.list_json()
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                (
                    v["name"].as_str().unwrap().to_string(),
                    v["id"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    /// `tenant token NAME ARGS...`; the token printed, if any.
    pub fn token(&self, name: &str, args: &[&str]) -> (bool, String, String) {
        let out = self
            .tenant()
            .args(["token", name, "--root"])
            .arg(&self.root)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    pub fn start(&self, extra: &[&str]) -> Server {
        Server::start(&self.root, &self.key, extra)
    }
}

/// A running `memvault server`, stopped (SIGKILL) when dropped.
pub struct Server {
    pub child: Child,
    pub port: u16,
    /// Everything it wrote to stderr.
    pub stderr: Arc<Mutex<String>>,
}

impl Server {
    pub fn start(root: &Path, key: &Path, extra: &[&str]) -> Server {
        Server::start_env(root, key, extra, &[])
    }

    /// [`Server::start`] with environment variables (test hooks).
    pub fn start_env(root: &Path, key: &Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut c = tenant_cmd(key);
        c.envs(env.iter().copied());
        Server::start_cmd(c, root, extra)
    }

    /// [`Server::start`] under a shell's `ulimit` first (e.g. `-Sn 256`).
    pub fn start_under_ulimit(root: &Path, key: &Path, ulimit: &str) -> Server {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(format!("ulimit {ulimit} && exec \"$0\" \"$@\""))
            .arg(bin())
            .arg("--key-file")
            .arg(key);
        Server::start_cmd(c, root, &[])
    }

    fn start_cmd(mut c: Command, root: &Path, extra: &[&str]) -> Server {
        let mut child = c
            .arg("server")
            .arg("--root")
            .arg(root)
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut reader = BufReader::new(child.stderr.take().unwrap());
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut port = None;
        let mut line = String::new();
        while reader.read_line(&mut line).unwrap_or(0) > 0 {
            stderr.lock().unwrap().push_str(&line);
            if let Some(at) = line.find("://127.0.0.1:") {
                port = line[at + 13..].trim().parse().ok();
                break;
            }
            line.clear();
        }
        let port = port.unwrap_or_else(|| {
            let _ = child.kill();
            panic!("the server did not start: {}", stderr.lock().unwrap())
        });
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap_or(0) > 0 {
                sink.lock().unwrap().push_str(&line);
                line.clear();
            }
        });
        Server {
            child,
            port,
            stderr,
        }
    }

    pub fn req(&self, method: &str, path: &str, token: Option<&str>, body: &str) -> (u16, Value) {
        let mut headers = vec![];
        let auth;
        if let Some(t) = token {
            auth = format!("Bearer {t}");
            headers.push(("Authorization", auth.as_str()));
        }
        self.req_with(method, path, &headers, body.as_bytes())
    }

    pub fn req_with(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> (u16, Value) {
        let (status, bytes) = http(self.port, method, path, headers, body);
        let v = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        (status, v)
    }

    /// The status of a view of `/memories` with `token`.
    pub fn view_status(&self, token: &str) -> u16 {
        self.req(
            "POST",
            "/v1/memory",
            Some(token),
            r#"{"command":"view","path":"/memories"}"#,
        )
        .0
    }

    /// A memory command; the `tool_result` (asserting a 200).
    pub fn memory(&self, token: &str, command: Value) -> Value {
        let (status, v) = self.req("POST", "/v1/memory", Some(token), &command.to_string());
        assert_eq!(status, 200, "{v}");
        v
    }

    pub fn stop(mut self) -> std::process::ExitStatus {
        // SIGTERM: a graceful stop.
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(Instant::now() < deadline, "the server did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request on its own connection: status and body.
pub fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Vec<u8>) {
    try_http(port, method, path, headers, body).expect("no HTTP response")
}

/// The same; None when the connection fails or ends without a response.
pub fn try_http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Option<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(60))).ok()?;
    // Loopback's `Host`, unless the caller gives one.
    let host = if headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        ""
    } else {
        "Host: 127.0.0.1\r\n"
    };
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\n{host}Connection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).ok()?;
    s.write_all(body).ok()?;
    let mut resp = Vec::new();
    let _ = s.read_to_end(&mut resp);
    parse_response(&resp)
}

pub fn parse_response(resp: &[u8]) -> Option<(u16, Vec<u8>)> {
    let text = String::from_utf8_lossy(resp);
    let status = text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()?;
    let at = resp.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    Some((status, resp[at..].to_vec()))
}

fn content(v: &Value) -> String {
    v["content"].as_str().unwrap_or_default().to_string()
}

#[test]
fn tenants_get_tokens_once_and_rotation_revocation_and_removal_take_effect_at_once() {
    let r = Root::new(&[("alice", "memory"), ("bob", "memory")]);
    let s = r.start(&[]);
    let alice = r.tokens["alice"].clone();
    let v = s.memory(
        &alice,
        json!({"command": "create", "path": "/memories/a.md", "file_text": "alpha"}),
    );
    assert_eq!(v["is_error"], false, "{v}");

    // list: names and scopes, no token, no key.
    let list = r.list_json();
    assert!(
        list.contains("\"alice\"") && list.contains("\"bob\""),
        "{list}"
    );
    assert!(
        !list.contains(&alice[..20]) && !list.contains("mvt_"),
        "{list}"
    );

    // A second token, then rotation of the first.
    let (ok, second, _) = r.token("alice", &["--token-name", "laptop"]);
    assert!(ok && second.starts_with("mvt_"));
    assert_eq!(
        s.memory(
            &second,
            json!({"command": "view", "path": "/memories/a.md"})
        )["is_error"],
        false
    );
    let (ok, rotated, err) = r.token("alice", &["--rotate"]);
    assert!(ok, "{err}");
    assert_ne!(rotated, alice);
    let (status, _) = s.req(
        "POST",
        "/v1/memory",
        Some(&alice),
        r#"{"command":"view","path":"/memories"}"#,
    );
    assert_eq!(status, 401, "the rotated-out token still works");
    let v = s.memory(
        &rotated,
        json!({"command": "view", "path": "/memories/a.md"}),
    );
    assert!(content(&v).contains("alpha"), "{v}");
    // An existing name without --rotate changes nothing.
    let (ok, printed, _) = r.token("alice", &[]);
    assert!(!ok && printed.is_empty());
    assert_eq!(s.view_status(&rotated), 200);
    // Revocation.
    let (ok, _, _) = r.token("alice", &["--token-name", "laptop", "--revoke"]);
    assert!(ok);
    assert_eq!(s.view_status(&second), 401);

    // Names are refused, not folded.
    for bad in ["Alice", "ALICE", "alicé", "a/b", "..", ""] {
        let out = r
            .tenant()
            .args(["add", bad, "--root"])
            .arg(&r.root)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
    }
    let out = r
        .tenant()
        .args(["add", "alice", "--root"])
        .arg(&r.root)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "a second alice");

    // Removal: the token stops working and the vault is gone.
    let dirs_before = std::fs::read_dir(r.root.join("tenants")).unwrap().count();
    r.ok(&["remove", "alice"]);
    assert_eq!(s.view_status(&rotated), 401);
    assert_eq!(
        std::fs::read_dir(r.root.join("tenants")).unwrap().count(),
        dirs_before - 1
    );
    let bob = &r.tokens["bob"];
    assert_eq!(
        s.memory(bob, json!({"command": "view", "path": "/memories"}))["is_error"],
        false
    );

    // The server's log names no token, content or path.
    drop(s);
    std::thread::sleep(Duration::from_millis(100));
}

#[test]
fn a_wrong_key_or_a_missing_root_is_refused_with_a_clear_error() {
    let r = Root::new(&[("alice", "memory")]);
    let other = r.tmp.path().join("other.key");
    assert!(
        Command::new(bin())
            .arg("keygen")
            .arg(&other)
            .output()
            .unwrap()
            .status
            .success()
    );
    let out = tenant_cmd(&other)
        .args(["server", "--listen", "127.0.0.1:0", "--root"])
        .arg(&r.root)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("does not unlock"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = tenant_cmd(&r.key)
        .args(["server", "--listen", "127.0.0.1:0", "--root"])
        .arg(r.tmp.path().join("nope"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a memvault server root"));
    // Plain HTTP off loopback needs the explicit flag.
    let out = tenant_cmd(&r.key)
        .args(["server", "--listen", "0.0.0.0:0", "--root"])
        .arg(&r.root)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--behind-tls-proxy"));
}

#[test]
fn scopes_limit_routes_and_history_names_the_token_whatever_the_headers_say() {
    let r = Root::new(&[("acme", "memory")]);
    let (ok, audit, _) = r.token("acme", &["--token-name", "auditor", "--scopes", "audit"]);
    assert!(ok);
    let (ok, admin, _) = r.token("acme", &["--token-name", "ops", "--scopes", "admin"]);
    assert!(ok);
    let agent = r.tokens["acme"].clone();
    let s = r.start(&[]);
    let (status, v) = s.req_with(
        "POST",
        "/v1/memory",
        &[
            ("Authorization", &format!("Bearer {agent}")),
            ("Memvault-Session", "sess-1"),
            ("Memvault-Actor", "ops"),
        ],
        br#"{"command":"create","path":"/memories/plan.md","file_text":"step one\n"}"#,
    );
    assert_eq!(status, 200, "{v}");
    // An empty label is no label: refused, as the message says (round 33c).
    for (name, value) in [("Memvault-Actor", ""), ("Memvault-Session", " ")] {
        let (status, v) = s.req_with(
            "POST",
            "/v1/memory",
            &[("Authorization", &format!("Bearer {agent}")), (name, value)],
            br#"{"command":"create","path":"/memories/empty-label.md","file_text":"x\n"}"#,
        );
        assert_eq!(status, 400, "{name}: {v}");
        assert!(v["error"].as_str().unwrap().contains("1 to 128"), "{v}");
    }
    // Nor one with two spaces in a row (history's column separator), nor
    // one of memvault's own (round 39a).
    for (name, value, says) in [
        ("Memvault-Session", "s  operator  revert", "two spaces"),
        ("Memvault-Actor", "bot  x", "two spaces"),
        ("Memvault-Session", "init", "memvault's own"),
        ("Memvault-Session", "sync", "memvault's own"),
        ("Memvault-Actor", "memvault", "memvault's own"),
    ] {
        let (status, v) = s.req_with(
            "POST",
            "/v1/memory",
            &[("Authorization", &format!("Bearer {agent}")), (name, value)],
            br#"{"command":"create","path":"/memories/label.md","file_text":"x\n"}"#,
        );
        assert_eq!(status, 400, "{name} {value:?}: {v}");
        assert!(v["error"].as_str().unwrap().contains(says), "{v}");
    }
    // Scopes.
    assert_eq!(s.req("POST", "/v1/history", Some(&agent), "{}").0, 403);
    assert_eq!(s.req("POST", "/v1/revert", Some(&agent), "{}").0, 403);
    assert_eq!(s.view_status(&audit), 403);
    assert_eq!(
        s.req(
            "POST",
            "/v1/revert",
            Some(&audit),
            r#"{"session":"sess-1"}"#
        )
        .0,
        403
    );
    assert_eq!(s.req("POST", "/mcp", Some(&audit), "{}").0, 403);
    // History: the principal is the token's name; the actor label is the header's.
    let (status, h) = s.req("POST", "/v1/history", Some(&audit), r#"{"op":"create"}"#);
    assert_eq!(status, 200, "{h}");
    let change = &h["changes"][0];
    assert_eq!(change["principal"], "acme", "{h}");
    assert_eq!(change["actor"], "ops");
    assert_eq!(change["session"], "sess-1");
    let (status, h) = s.req("GET", "/v1/sessions", Some(&audit), "");
    assert_eq!(status, 200, "{h}");
    assert!(
        h["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["session"] == "sess-1")
    );
    let (status, v) = s.req(
        "POST",
        "/v1/show",
        Some(&audit),
        &json!({"rev": change["rev"], "path": "/memories/plan.md", "raw": true}).to_string(),
    );
    assert_eq!(
        (status, v["content"].as_str()),
        (200, Some("step one\n")),
        "{v}"
    );
    let (status, v) = s.req("POST", "/v1/verify", Some(&admin), "");
    assert_eq!((status, &v["ok"]), (200, &json!(true)), "{v}");
    // Unknown options and absurd ones are 400, not ignored.
    assert_eq!(
        s.req("POST", "/v1/history", Some(&audit), r#"{"tenant":"other"}"#)
            .0,
        400
    );
    assert_eq!(
        s.req("POST", "/v1/history", Some(&audit), r#"{"json":false}"#)
            .0,
        400
    );
    assert_eq!(
        s.req(
            "POST",
            "/v1/revert",
            Some(&admin),
            r#"{"session":"sess-1","actor":"mallory"}"#
        )
        .0,
        400
    );
    // Admin: undo the session; history records the admin token.
    let (status, v) = s.req(
        "POST",
        "/v1/revert",
        Some(&admin),
        r#"{"session":"sess-1"}"#,
    );
    assert_eq!(status, 200, "{v}");
    assert!(
        v["text"].as_str().unwrap().contains("undid session sess-1"),
        "{v}"
    );
    let v = s.memory(
        &agent,
        json!({"command": "view", "path": "/memories/plan.md"}),
    );
    assert_eq!(v["is_error"], true, "{v}");
    let (_, h) = s.req("POST", "/v1/history", Some(&admin), r#"{"limit":1}"#);
    assert_eq!(h["changes"][0]["op"], "revert");
    assert_eq!(h["changes"][0]["principal"], "ops");
    // A refused undo is a clear 422 and changes nothing.
    let (status, v) = s.req("POST", "/v1/revert", Some(&admin), r#"{"rev":"0000000"}"#);
    assert!(status == 400 || status == 422, "{status} {v}");
}

/// Every route, with each tenant's token, against the other tenants'
/// data: names and ids in paths, queries, headers, bodies and MCP
/// arguments, path tricks, case and Unicode variants. Nothing of another
/// tenant comes back, and no plaintext is on disk.
/// An audit answer over `--max-answer` is refused with what to ask for
/// instead; a narrower one, and the tenant's other routes, still work.
#[test]
fn an_audit_answer_over_the_limit_is_refused_and_a_narrower_one_served() {
    let r = Root::new(&[("acme", "memory,audit,admin")]);
    let token = r.tokens["acme"].clone();
    let s = r.start(&["--max-answer", "4000"]);
    for i in 0..40 {
        s.memory(
            &token,
            json!({"command": "create", "path": format!("/memories/n{i}.md"), "file_text": "x\n"}),
        );
    }
    let (status, v) = s.req("POST", "/v1/history", Some(&token), "{}");
    assert_eq!(status, 422, "{v}");
    let why = v.to_string();
    assert!(
        why.contains("--max-answer") && why.contains("limit"),
        "{why}"
    );
    let (status, v) = s.req("POST", "/v1/history", Some(&token), r#"{"limit":3}"#);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["changes"].as_array().unwrap().len(), 3, "{v}");
    let (status, v) = s.req(
        "POST",
        "/v1/show",
        Some(&token),
        r#"{"rev":"HEAD","path":"/memories/n7.md"}"#,
    );
    assert_eq!(
        (status, v["text"].as_str().unwrap().contains('x')),
        (200, true),
        "{v}"
    );
    // An admin route's answer follows its change: never refused for its
    // size (an expiry's list of what it destroyed). Two days later (the
    // test hooks' clock), every note is older than a day.
    drop(s);
    let later = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 2 * 86_400_000;
    let later = later.to_string();
    let s = Server::start_env(
        &r.root,
        &r.key,
        &["--max-answer", "4000"],
        &[("MEMVAULT_TEST_NOW_MS", &later)],
    );
    let (status, v) = s.req("POST", "/v1/expire", Some(&token), r#"{"older_than":"1d"}"#);
    assert_eq!(status, 200, "{v}");
    assert!(v.to_string().len() > 4000, "{v}");
    assert_eq!(v["files"].as_array().unwrap().len(), 40, "{v}");
    let out = tenant_cmd(&r.key)
        .args(["server", "--max-answer", "0", "--root"])
        .arg(&r.root)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn no_token_reaches_another_tenants_data() {
    let names = ["alice", "bob", "carol"];
    let r = Root::new(&[
        ("alice", "memory,admin"),
        ("bob", "memory,admin"),
        ("carol", "memory,admin"),
    ]);
    let s = r.start(&[]);
    let marker = |n: &str| format!("SECRET-MARKER-OF-{}", n.to_uppercase());
    let ids = r.ids();
    for n in names {
        let v = s.memory(&r.tokens[n], json!({"command": "create", "path": format!("/memories/{n}-notes.md"), "file_text": marker(n)}));
        assert_eq!(v["is_error"], false);
    }
    // Another tenant's content never comes back; its file names only as
    // the echo of a request that named them (a "does not exist" error).
    let leaks = |me: &str, what: &str, status: u16, body: &Value| {
        let text = body.to_string();
        for other in names.iter().filter(|o| **o != me) {
            let name = format!("{other}-notes");
            assert!(
                !text.contains(&marker(other)) && (what.contains(&name) || !text.contains(&name)),
                "{what}: {me}'s token saw {other}'s data ({status}): {text}"
            );
        }
    };
    for me in names {
        let token = &r.tokens[me];
        for other in names.iter().filter(|o| **o != me) {
            let id = &ids[*other];
            let upper = other.to_uppercase();
            let variants = [
                other.to_string(),
                id.clone(),
                upper.clone(),
                format!("{other}\u{301}"),
                format!("ｂ{other}"),
            ];
            let view_other =
                json!({"command": "view", "path": format!("/memories/{other}-notes.md")});
            let view_root = json!({"command": "view", "path": "/memories"});
            for v in &variants {
                let enc: String = v.bytes().map(|b| format!("%{b:02X}")).collect();
                // Names and ids in the path and the query.
                for path in [
                    format!("/v1/memory/{v}"),
                    format!("/v1/{v}/memory"),
                    format!("/{v}/v1/memory"),
                    format!("/v1/memory?tenant={enc}"),
                    format!("/v1/memory?tenant_id={enc}"),
                    format!("/v1/history?tenant={enc}"),
                    format!("/mcp/{v}"),
                    format!("/mcp?tenant={enc}"),
                    format!("/v1/memory/..%2F{enc}"),
                    format!("/v1/%2e%2e/{enc}/memory"),
                ] {
                    let (status, body) = s.req("POST", &path, Some(token), &view_root.to_string());
                    leaks(me, &path, status, &body);
                    if status == 200 {
                        // Only the caller's own tree can come back.
                        assert!(
                            body.to_string().contains(&format!("{me}-notes")),
                            "{path}: {body}"
                        );
                    }
                }
                // Names and ids in headers.
                for h in [
                    "X-Tenant",
                    "Memvault-Tenant",
                    "Memvault-Session",
                    "Memvault-Actor",
                    "X-Forwarded-User",
                    "Host",
                ] {
                    let auth = format!("Bearer {token}");
                    let hv: String = v.chars().filter(char::is_ascii).collect();
                    let hv = if hv.is_empty() { "x".into() } else { hv };
                    for (path, body) in [
                        ("/v1/memory", view_root.to_string()),
                        ("/v1/memory", view_other.to_string()),
                        ("/v1/history", "{}".into()),
                    ] {
                        let (status, resp) = s.req_with(
                            "POST",
                            path,
                            &[("Authorization", &auth), (h, &hv)],
                            body.as_bytes(),
                        );
                        leaks(me, &format!("{h}: {hv} on {path} {body}"), status, &resp);
                    }
                }
                // Names and ids in bodies.
                for body in [
                    json!({"command": "view", "path": "/memories", "tenant": v}),
                    json!({"type": "tool_use", "id": "x", "name": "memory", "input": {"command": "view", "path": "/memories"}, "tenant": v}),
                    json!({"type": "tool_use", "id": "x", "name": v, "input": view_other}),
                    json!({"command": "view", "path": format!("/memories/../{v}")}),
                    json!({"command": "view", "path": format!("/memories/../../tenants/{id}")}),
                    json!({"command": "view", "path": format!("/{v}/memories")}),
                    json!({"command": "view", "path": format!("/memories/%2e%2e/{v}")}),
                    json!({"command": "rename", "old_path": format!("/memories/../{other}/memories/{other}-notes.md"), "new_path": "/memories/stolen.md"}),
                ] {
                    let (status, resp) =
                        s.req("POST", "/v1/memory", Some(token), &body.to_string());
                    leaks(me, &body.to_string(), status, &resp);
                }
                for (route, body) in [
                    (
                        "/v1/history",
                        json!({"path": format!("/memories/{other}-notes.md")}),
                    ),
                    (
                        "/v1/show",
                        json!({"rev": "HEAD", "path": format!("/memories/{other}-notes.md")}),
                    ),
                    (
                        "/v1/show",
                        json!({"rev": "HEAD", "path": "/memories", "tenant": v}),
                    ),
                    ("/v1/diff", json!({"rev": "HEAD"})),
                    ("/v1/sessions", json!({})),
                    ("/v1/resume", json!({})),
                    ("/v1/verify", json!({})),
                    (
                        "/v1/purge",
                        json!({"path": format!("/memories/{other}-notes.md")}),
                    ),
                    (
                        "/v1/restore",
                        json!({"path": format!("/memories/{other}-notes.md"), "at": "HEAD"}),
                    ),
                    ("/v1/expire", json!({"dry_run": true, "older_than": "0m"})),
                ] {
                    let (status, resp) = s.req("POST", route, Some(token), &body.to_string());
                    leaks(me, &format!("{route} {body}"), status, &resp);
                }
            }
            // Another tenant's token with this tenant's id spliced in.
            let other_token = &r.tokens[*other];
            let spliced = format!("{}{}", &token[..21], &other_token[21..]);
            let (status, _) = s.req("POST", "/v1/memory", Some(&spliced), &view_root.to_string());
            assert_eq!(status, 401, "a spliced token was taken");
            let spliced = format!("{}{}", &other_token[..21], &token[21..]);
            assert_eq!(
                s.req("POST", "/v1/memory", Some(&spliced), &view_root.to_string())
                    .0,
                401
            );
        }
        // Case and spacing of the token itself.
        for bad in [
            token.to_uppercase(),
            format!(" {token}"),
            format!("{token}x"),
            token[..token.len() - 1].to_string(),
        ] {
            let (status, _) = s.req_with(
                "POST",
                "/v1/memory",
                &[("Authorization", &format!("Bearer {bad}"))],
                br#"{"command":"view","path":"/memories"}"#,
            );
            assert_eq!(status, 401, "{bad:?}");
        }
        for auth in [
            format!("Basic {token}"),
            token.clone(),
            format!("Bearer  {token}"),
            "Bearer".into(),
        ] {
            let (status, _) = s.req_with(
                "POST",
                "/v1/memory",
                &[("Authorization", &auth)],
                br#"{"command":"view","path":"/memories"}"#,
            );
            assert_eq!(status, 401, "{auth:?}");
        }
        // Two Authorization headers: refused, whichever is valid.
        let other = names.iter().find(|o| **o != me).unwrap();
        let (status, _) = s.req_with(
            "POST",
            "/v1/memory",
            &[
                ("Authorization", &format!("Bearer {token}")),
                ("Authorization", &format!("Bearer {}", r.tokens[*other])),
            ],
            br#"{"command":"view","path":"/memories"}"#,
        );
        assert_eq!(status, 401);
        // And each tenant still sees exactly its own file.
        let v = s.memory(
            token,
            json!({"command": "view", "path": format!("/memories/{me}-notes.md")}),
        );
        assert!(content(&v).contains(&marker(me)), "{v}");
    }
    // The whole root holds no plaintext marker or file name.
    drop(s);
    no_plaintext_in_root(&r.root, &names.map(marker));
    no_plaintext_in_root(&r.root, &names.map(|n| format!("{n}-notes")));
    // The tenants' names are in no file of the server's own (the sealed
    // registry); names this short are not looked for in megabytes of
    // ciphertext, where three given bytes turn up by chance.
    for e in std::fs::read_dir(r.root.join("memvault-server")).unwrap() {
        let bytes = std::fs::read(e.unwrap().path()).unwrap();
        for n in names {
            assert!(
                !contains(&bytes, n.as_bytes()),
                "tenant name {n} in the clear"
            );
        }
    }
}

#[test]
fn bad_requests_get_clear_errors_and_the_server_keeps_serving() {
    let r = Root::new(&[("alice", "memory")]);
    let s = r.start(&[
        "--max-body",
        "4096",
        "--rate",
        "20",
        "--max-connections",
        "16",
    ]);
    let t = r.tokens["alice"].clone();
    let auth = format!("Bearer {t}");
    let h = [("Authorization", auth.as_str())];
    let check = |status: u16, v: &Value, want: u16| {
        assert_eq!(status, want, "{v}");
        assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
    };
    let (st, v) = s.req_with("POST", "/v1/memory", &h, b"{not json");
    check(st, &v, 400);
    let (st, v) = s.req_with(
        "POST",
        "/v1/memory",
        &h,
        br#"{"command":"view","command":"delete","path":"/memories"}"#,
    );
    check(st, &v, 400);
    let (st, v) = s.req_with("POST", "/v1/memory", &h, &vec![b' '; 5000]);
    check(st, &v, 413);
    // A client that sends a large body whole before it reads (as the SDK
    // adapters do) gets the 413 too, not a connection closed under it.
    let big = vec![b' '; 6 << 20];
    let answered = try_http(s.port, "POST", "/v1/memory", &h, &big);
    assert_eq!(answered.map(|(st, _)| st), Some(413));
    let (st, v) = s.req("GET", "/nope", Some(&t), "");
    check(st, &v, 404);
    let (st, v) = s.req("GET", "/v1/memory", Some(&t), "");
    check(st, &v, 405);
    let (st, v) = s.req("POST", "/v1/memory", None, "{}");
    check(st, &v, 401);
    // A memory tool error is a tool_result, same text as serve.
    let v = s.memory(&t, json!({"command": "view", "path": "/memories/none.md"}));
    assert_eq!(v["is_error"], true);
    assert_eq!(v["type"], "tool_result");
    assert!(
        content(&v).starts_with("The path /memories/none.md does not exist"),
        "{v}"
    );
    // Malformed HTTP.
    let mut raw = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    raw.write_all(b"GARBAGE\r\n\r\n").unwrap();
    let mut resp = Vec::new();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = raw.read_to_end(&mut resp);
    assert!(
        resp.is_empty() || String::from_utf8_lossy(&resp).starts_with("HTTP/1.1 400"),
        "{}",
        String::from_utf8_lossy(&resp)
    );
    // Slow clients holding connections do not stop others being served.
    let slow: Vec<TcpStream> = (0..8)
        .map(|_| {
            let mut c = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
            c.write_all(b"POST /v1/memory HTTP/1.1\r\nHost: x\r\n")
                .unwrap();
            c
        })
        .collect();
    let v = s.memory(&t, json!({"command": "view", "path": "/memories"}));
    assert_eq!(v["is_error"], false);
    drop(slow);
    // Over the rate: 429, and the tenant is served again shortly after.
    let mut limited = 0;
    for _ in 0..80 {
        let (st, _) = s.req(
            "POST",
            "/v1/memory",
            Some(&t),
            r#"{"command":"view","path":"/memories"}"#,
        );
        if st == 429 {
            limited += 1;
        } else {
            assert_eq!(st, 200);
        }
    }
    assert!(limited > 0, "no 429 over the rate");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(s.view_status(&t), 200);
    // A label holding a secret is recorded redacted, without a line in the
    // server's log per request (a client could fill it).
    let auth = format!("Bearer {t}");
    for _ in 0..3 {
        let (st, v) = s.req_with(
            "POST",
            "/v1/memory",
            &[
                ("Authorization", auth.as_str()),
                ("Memvault-Actor", "password=Hunter2Hunter2x"),
            ],
            br#"{"command":"view","path":"/memories"}"#,
        );
        assert_eq!(st, 200, "{v}");
    }
    // Nothing of the token, content or paths in the log.
    let log = s.stderr.lock().unwrap().clone();
    assert!(
        !log.contains(&t[4..20]) && !log.contains("/memories") && !log.contains("none.md"),
        "{log}"
    );
    assert!(
        !log.contains("held a secret") && !log.contains("Hunter2"),
        "{log}"
    );
}

/// No `needles` in any file of the server root, raw or in a git object of
/// any tenant's vault.
pub fn no_plaintext_in_root(root: &Path, needles: &[String]) {
    for e in std::fs::read_dir(root.join("tenants")).unwrap() {
        let dir = e.unwrap().path();
        for n in needles {
            assert!(
                plaintext_anywhere(&dir, n).is_empty(),
                "{n} in the clear in a tenant vault"
            );
        }
    }
    let mut stack = vec![root.join("memvault-server")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let bytes = std::fs::read(&p).unwrap();
                for n in needles {
                    assert!(
                        !contains(&bytes, n.as_bytes()),
                        "{n} in the clear in {}",
                        p.display()
                    );
                }
            }
        }
    }
}

/// Open file descriptors of `pid` below `dir`.
fn fds_below(pid: u32, dir: &Path) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|it| {
            it.flatten()
                .filter(|e| std::fs::read_link(e.path()).is_ok_and(|p| p.starts_with(dir)))
                .count()
        })
        .unwrap_or(0)
}

/// A flood of idle connections does not leave the vaults without file
/// descriptors: the server raises its soft open-files limit to what its
/// connections and vaults need (here from 256), and where the hard limit
/// is lower it serves fewer connections and says so. Writes of several
/// tenants beside 400 idle connections all succeed (at a soft limit of
/// 1,024 and 1,100 idle connections, vaults read as damaged and a write
/// was answered "could not be made durable"; round 40c).
#[test]
fn idle_connections_do_not_starve_the_vaults_of_file_descriptors() {
    let r = Root::new(&[("ana", "memory"), ("bob", "memory"), ("cy", "memory")]);
    // The open-files limits of a process: (soft, hard).
    let limits = |pid: &str| -> (u64, u64) {
        let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .unwrap();
        let n: Vec<u64> = line
            .split_whitespace()
            .filter_map(|w| w.parse().ok().or((w == "unlimited").then_some(u64::MAX)))
            .collect();
        (n[0], n[1])
    };
    if limits("self").1 < 4096 {
        eprintln!("skipped the flood: the hard open-files limit here is below 4096");
    } else {
        flood_beside_writes(&r, &limits);
    }
    // Under a hard limit too low for the defaults: fewer connections, said.
    let server = Server::start_under_ulimit(&r.root, &r.key, "-n 200");
    let v = server.memory(
        &r.tokens["ana"],
        json!({"command": "create", "path": "/memories/small.md", "file_text": "kept\n"}),
    );
    assert!(!v["is_error"].as_bool().unwrap(), "{v}");
    let err = server.stderr.lock().unwrap().clone();
    assert!(err.contains("open-files limit (200)"), "{err}");
}

/// The first part of the test above: 400 idle connections beside writes,
/// the server started at a soft limit of 256.
fn flood_beside_writes(r: &Root, limits: &dyn Fn(&str) -> (u64, u64)) {
    let server = Server::start_under_ulimit(&r.root, &r.key, "-Sn 256");
    // Raised to what the defaults need (about 3,650).
    let (soft, _) = limits(&server.child.id().to_string());
    assert!(soft >= 3_600, "the soft limit stayed at {soft}");
    let idle: Vec<TcpStream> = (0..400)
        .map(|_| TcpStream::connect(("127.0.0.1", server.port)).unwrap())
        .collect();
    // Give the server time to accept them all.
    std::thread::sleep(Duration::from_millis(300));
    let mut idle = idle;
    for i in 0..12 {
        // A connection of the flood makes room for this request's own.
        drop(idle.pop());
        let name = ["ana", "bob", "cy"][i % 3];
        let v = server.memory(
            &r.tokens[name],
            json!({"command": "create", "path": format!("/memories/f{i}.md"), "file_text": "kept\n"}),
        );
        assert!(!v["is_error"].as_bool().unwrap(), "{name}: {v}");
    }
    drop(idle);
    let err = server.stderr.lock().unwrap().clone();
    assert!(!err.contains("cannot be read"), "{err}");
}

#[test]
fn vaults_are_closed_when_idle_and_at_most_max_open_are_open() {
    let names: Vec<String> = (0..5).map(|i| format!("t{i}")).collect();
    let spec: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "memory")).collect();
    let r = Root::new(&spec);
    let s = r.start(&["--max-open", "2", "--idle-close", "1s"]);
    let tenants = r.root.join("tenants");
    let ids: Vec<PathBuf> = std::fs::read_dir(&tenants)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    for round in 0..3 {
        for n in &names {
            let v = s.memory(&r.tokens[n], json!({"command": "create", "path": format!("/memories/r{round}.md"), "file_text": format!("{n} {round}")}));
            assert_eq!(v["is_error"], false, "{v}");
        }
        let open = ids
            .iter()
            .filter(|d| fds_below(s.child.id(), d) > 0)
            .count();
        assert!(open <= 2, "{open} vaults open with --max-open 2");
    }
    for n in &names {
        let v = s.memory(
            &r.tokens[n],
            json!({"command": "view", "path": "/memories/r2.md"}),
        );
        assert!(content(&v).contains(&format!("{n} 2")), "{v}");
    }
    // Idle: every vault closed (no file of any tenant held open).
    let deadline = Instant::now() + Duration::from_secs(10);
    while fds_below(s.child.id(), &tenants) > 0 {
        assert!(
            Instant::now() < deadline,
            "vaults still open after the idle period"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// SIGKILL of the server under a mixed load of several tenants, seeded
/// rounds: every acknowledged mutation is there after a restart, and every
/// vault verifies.
#[test]
fn sigkill_under_load_loses_no_acknowledged_mutation_in_any_tenant() {
    let rounds: u64 = std::env::var("MEMVAULT_SERVER_KILL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let names = ["t0", "t1", "t2"];
    let r = Root::new(&[
        ("t0", "memory,admin"),
        ("t1", "memory,admin"),
        ("t2", "memory,admin"),
    ]);
    // Acknowledged: (tenant, file created) and (tenant, worker, line inserted).
    let mut created: Vec<(String, String)> = vec![];
    let mut inserted: Vec<(String, usize, String)> = vec![];
    for round in 0..rounds {
        let s = r.start(&["--rate", "0"]);
        let port = s.port;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let acked = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut workers = vec![];
        // Two clients per tenant, all at once.
        for w in 0..names.len() * 2 {
            let n = names[w % names.len()].to_string();
            let token = r.tokens[&n].clone();
            let stop = stop.clone();
            let acked = acked.clone();
            workers.push(std::thread::spawn(move || {
                let (mut files, mut lines) = (vec![], vec![]);
                let log = format!("/memories/log-{w}.md");
                let auth = format!("Bearer {token}");
                // The log file, unless an earlier round made it.
                let made = json!({"command": "create", "path": log, "file_text": "log\n"});
                if try_http(port, "POST", "/v1/memory", &[("Authorization", &auth)], made.to_string().as_bytes()).is_none() {
                    return (files, lines);
                }
                let mut i = 0u64;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let path = format!("/memories/r{round}/w{w}/f{i}.md");
                    let line = format!("r{round}-w{w}-{i}");
                    let body = match i % 4 {
                        0 | 1 => json!({"command": "create", "path": path, "file_text": format!("{line} of {n}")}),
                        2 => json!({"command": "insert", "path": log, "insert_line": 1, "insert_text": format!("{line}\n")}),
                        _ => json!({"command": "view", "path": "/memories"}),
                    };
                    let Some((200, bytes)) = try_http(port, "POST", "/v1/memory", &[("Authorization", &auth)], body.to_string().as_bytes()) else { break };
                    acked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let v: Value = serde_json::from_slice(&bytes).unwrap();
                    assert_eq!(v["is_error"], false, "{body}: {v}");
                    match body["command"].as_str() {
                        Some("create") if body["path"] == path => files.push((n.clone(), path)),
                        Some("insert") => lines.push((n.clone(), w, line)),
                        _ => {}
                    }
                    i += 1;
                }
                (files, lines)
            }));
        }
        // A seeded kill point, once the load is under way (a loaded
        // machine starts the clients late; a kill before any request was
        // answered would test nothing).
        let waited = std::time::Instant::now();
        while acked.load(std::sync::atomic::Ordering::SeqCst) < 6
            && waited.elapsed() < Duration::from_secs(20)
        {
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(Duration::from_millis(30 + (round * 7919) % 250));
        drop(s);
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let checked = created.len();
        for w in workers {
            let (files, lines) = w.join().unwrap();
            created.extend(files);
            inserted.extend(lines);
        }
        // This round's creates now, every round's at the end.
        let last = round + 1 == rounds;
        let s = r.start(&["--rate", "0"]);
        for (n, p) in &created[if last { 0 } else { checked }..] {
            let v = s.memory(&r.tokens[n.as_str()], json!({"command": "view", "path": p}));
            assert_eq!(
                v["is_error"], false,
                "round {round}: acknowledged {p} of {n} is gone: {v}"
            );
        }
        let mut logs: HashMap<usize, String> = HashMap::new();
        for (n, w, line) in &inserted {
            let text = logs.entry(*w).or_insert_with(|| {
                content(&s.memory(
                    &r.tokens[n.as_str()],
                    json!({"command": "view", "path": format!("/memories/log-{w}.md")}),
                ))
            });
            assert!(
                text.contains(&format!("\t{line}\n")) || text.ends_with(&format!("\t{line}")),
                "round {round}: acknowledged insert {line} of {n} is gone"
            );
        }
        if round % 10 == 9 || round + 1 == rounds {
            for n in names {
                let (status, v) = s.req("POST", "/v1/verify", Some(&r.tokens[n]), "");
                assert_eq!(
                    (status, &v["ok"]),
                    (200, &json!(true)),
                    "round {round}: {n}: {v}"
                );
            }
        }
    }
    // The kills landed under load: most rounds acknowledged writes.
    assert!(
        created.len() as u64 >= rounds * 3,
        "only {} creates acknowledged",
        created.len()
    );
    assert!(
        inserted.len() as u64 >= rounds,
        "only {} inserts acknowledged",
        inserted.len()
    );
}

#[test]
fn sigterm_finishes_requests_in_flight_and_loses_nothing() {
    let r = Root::new(&[("a", "memory"), ("b", "memory")]);
    let s = r.start(&["--rate", "0"]);
    let port = s.port;
    let mut workers = vec![];
    for n in ["a", "b"] {
        let token = r.tokens[n].clone();
        workers.push(std::thread::spawn(move || {
            let mut acked = vec![];
            for i in 0..400 {
                let path = format!("/memories/f{i}.md");
                let body = json!({"command": "create", "path": path, "file_text": format!("{i}")});
                let auth = format!("Bearer {token}");
                let Some((status, bytes)) = try_http(
                    port,
                    "POST",
                    "/v1/memory",
                    &[("Authorization", &auth)],
                    body.to_string().as_bytes(),
                ) else {
                    break;
                };
                if status != 200 {
                    assert_eq!(status, 503, "{}", String::from_utf8_lossy(&bytes));
                    break;
                }
                acked.push(path);
            }
            acked
        }));
    }
    std::thread::sleep(Duration::from_millis(150));
    let status = s.stop();
    assert!(status.success(), "{status:?}");
    let acked: Vec<Vec<String>> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    let s = r.start(&[]);
    for (n, paths) in ["a", "b"].iter().zip(&acked) {
        for p in paths {
            let v = s.memory(&r.tokens[*n], json!({"command": "view", "path": p}));
            assert_eq!(v["is_error"], false, "{p} of {n}: {v}");
        }
    }
}

/// Round 38c: a request whose headers arrived before SIGTERM but whose
/// body was still arriving is in flight: it finishes (it was a 503, "the
/// server is shutting down", and nothing was written).
#[test]
fn sigterm_finishes_a_request_whose_body_is_still_arriving() {
    use std::io::{Read, Write};
    let r = Root::new(&[("a", "memory")]);
    let s = r.start(&[]);
    let body = json!({"command": "create", "path": "/memories/inflight.md", "file_text": "x\n"})
        .to_string();
    let mut c = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        c,
        "POST /v1/memory HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
        r.tokens["a"],
        body.len(),
        &body[..4]
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let pid = s.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    std::thread::sleep(Duration::from_millis(300));
    c.write_all(&body.as_bytes()[4..]).unwrap();
    let mut answer = Vec::new();
    let _ = c.read_to_end(&mut answer);
    let (status, reply) = parse_response(&answer).expect("no answer");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&reply));
    let status = s.stop();
    assert!(status.success(), "{status:?}");
    let s = r.start(&[]);
    let v = s.memory(
        &r.tokens["a"],
        json!({"command": "view", "path": "/memories/inflight.md"}),
    );
    assert_eq!(v["is_error"], false, "{v}");
}

#[test]
fn the_memory_route_answers_as_serve_does() {
    let r = Root::new(&[("alice", "memory")]);
    let s = r.start(&[]);
    let t = &r.tokens["alice"];
    let vault = crate::util::TestVault::new();
    let requests = [
        json!({"type": "tool_use", "id": "toolu_1", "name": "memory", "input": {"command": "view", "path": "/memories"}}),
        json!({"command": "create", "path": "/memories/a.md", "file_text": "one\ntwo\n"}),
        json!({"command": "create", "path": "/memories/a.md", "file_text": "again"}),
        json!({"command": "str_replace", "path": "/memories/a.md", "old_str": "two", "new_str": "2"}),
        json!({"command": "insert", "path": "/memories/a.md", "insert_line": 1, "insert_text": "x\n"}),
        json!({"command": "view", "path": "/memories/a.md", "view_range": [1, 2]}),
        json!({"command": "rename", "old_path": "/memories/a.md", "new_path": "/memories/d/b.md"}),
        json!({"command": "view", "path": "/memories"}),
        json!({"command": "delete", "path": "/memories/d"}),
        json!({"command": "view", "path": "/etc/passwd"}),
        json!({"command": "frobnicate"}),
        json!({"type": "tool_use", "id": "toolu_2", "name": "memory", "input": {"command": "delete", "path": "/memories"}}),
        // Under the 1 MiB file limit, over 4 MiB as JSON (each byte a
        // six-byte escape): the default body limit takes what `serve`'s
        // default line limit takes (it was 4 MiB against 8; round 41a).
        json!({"command": "create", "path": "/memories/ctl.md", "file_text": "\u{1}".repeat(700_000)}),
    ];
    let lines: Vec<String> = requests.iter().map(Value::to_string).collect();
    assert!(lines.last().unwrap().len() > 4 << 20);
    let want = vault.serve(&lines);
    for (req, want) in requests.iter().zip(&want) {
        let got = s.memory(t, req.clone());
        assert_eq!(&got, want, "{req}");
    }
}

/// `--tls-cert`/`--tls-key`: HTTPS with rustls; a client that trusts the
/// certificate is served, plain HTTP on the same port is not.
#[test]
fn tls_serves_https_with_the_given_certificate() {
    let r = Root::new(&[("alice", "memory")]);
    let dir = r.tmp.path();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-addext",
            "basicConstraints=critical,CA:FALSE",
            "-keyout",
        ])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl is needed for this test (.ci/run installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = Server::start(
        &r.root,
        &r.key,
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    assert!(s.stderr.lock().unwrap().contains("https://127.0.0.1:"));

    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&cert).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let conn =
        rustls::ClientConnection::new(Arc::new(config), ServerName::try_from("127.0.0.1").unwrap())
            .unwrap();
    let tcp = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let body = r#"{"command":"create","path":"/memories/tls.md","file_text":"over tls"}"#;
    write!(tls, "POST /v1/memory HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nAuthorization: Bearer {}\r\nContent-Length: {}\r\n\r\n{body}", r.tokens["alice"], body.len()).unwrap();
    let mut resp = Vec::new();
    let _ = tls.read_to_end(&mut resp);
    let (status, bytes) = parse_response(&resp).expect("an HTTPS response");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        v["content"],
        "File created successfully at: /memories/tls.md"
    );
    // Plain HTTP to the TLS port is told so in plain HTTP, a 426 (it got a
    // TLS alert, which clients print as a garbled answer; round 41a).
    let (status, bytes) =
        try_http(s.port, "POST", "/v1/memory", &[], &[b'x'; 50_000]).expect("a plain HTTP answer");
    assert_eq!(status, 426);
    assert!(
        String::from_utf8_lossy(&bytes).contains("https://"),
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    drop(s);
    // A certificate or key file that is no regular file (a device, a
    // FIFO) is refused at once rather than read for ever; an encrypted
    // key is said to be one.
    let fifo = dir.join("fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let encrypted = dir.join("enc.pem");
    let out = Command::new("openssl")
        .args(["pkey", "-aes256", "-passout", "pass:x", "-in"])
        .arg(&key)
        .arg("-out")
        .arg(&encrypted)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (c, k, says) in [
        (
            Path::new("/dev/zero"),
            key.as_path(),
            "--tls-cert /dev/zero: not a regular file",
        ),
        (
            cert.as_path(),
            Path::new("/dev/zero"),
            "--tls-key /dev/zero: not a regular file",
        ),
        (cert.as_path(), fifo.as_path(), "not a regular file"),
        (cert.as_path(), encrypted.as_path(), "is encrypted"),
    ] {
        let out = Command::new(bin())
            .arg("--key-file")
            .arg(&r.key)
            .args(["server", "--root"])
            .arg(&r.root)
            .arg("--tls-cert")
            .arg(c)
            .arg("--tls-key")
            .arg(k)
            .args(["--listen", "127.0.0.1:0"])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains(says), "{says}: {err}");
    }
}

/// A registry put back to an older copy while the server runs (to revive
/// a rotated token) is refused: every request gets 503 until it is put
/// right; a registry that does not authenticate likewise.
#[test]
fn a_registry_put_back_or_changed_under_a_running_server_is_refused() {
    let r = Root::new(&[("alice", "memory")]);
    let s = r.start(&[]);
    let old = r.tokens["alice"].clone();
    let registry = r.root.join("memvault-server/registry");
    let before = std::fs::read(&registry).unwrap();
    let (ok, new, _) = r.token("alice", &["--rotate"]);
    assert!(ok);
    let view = r#"{"command":"view","path":"/memories"}"#;
    assert_eq!(s.req("POST", "/v1/memory", Some(&new), view).0, 200);
    assert_eq!(s.req("POST", "/v1/memory", Some(&old), view).0, 401);
    // Put the old registry back (a new file, as a restore would).
    let tmp = registry.with_extension("put-back");
    std::fs::write(&tmp, &before).unwrap();
    std::fs::rename(&tmp, &registry).unwrap();
    let (status, v) = s.req("POST", "/v1/memory", Some(&old), view);
    assert_eq!(status, 503, "the revoked token was taken again: {v}");
    assert_eq!(s.req("POST", "/v1/memory", Some(&new), view).0, 503);
    assert_eq!(s.req("GET", "/healthz", None, "").0, 503);
    // A flipped byte: still refused.
    let mut bad = before.clone();
    let at = bad.len() / 2;
    bad[at] ^= 1;
    std::fs::write(&tmp, &bad).unwrap();
    std::fs::rename(&tmp, &registry).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(s.req("POST", "/v1/memory", Some(&new), view).0, 503);
    let log = s.stderr.lock().unwrap().clone();
    assert!(
        log.contains("registry") && !log.contains(r.root.to_str().unwrap()),
        "{log}"
    );
}

#[test]
fn tenants_added_at_once_to_a_new_root_all_land_in_one_root() {
    // No tenant yet: the root does not exist.
    let r = Root::new(&[]);
    assert!(!r.root.exists());
    let names = ["t0", "t1", "t2", "t3", "t4", "t5"];
    let children: Vec<_> = names
        .iter()
        .map(|n| {
            r.tenant()
                .args(["add", n, "--root"])
                .arg(&r.root)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut tokens = HashMap::new();
    for (n, c) in names.iter().zip(children) {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "tenant add {n}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        tokens.insert(
            *n,
            String::from_utf8(out.stdout).unwrap().trim().to_string(),
        );
    }
    let listed = r.ok(&["list", "--json"]);
    for n in names {
        assert!(
            listed.contains(&format!("\"{n}\"")),
            "{n} missing: {listed}"
        );
    }
    // Every token printed opens its own tenant's vault.
    let server = r.start(&[]);
    for (n, token) in &tokens {
        let reply = server.memory(
            token,
            json!({"command": "create", "path": "/memories/who.md", "file_text": *n}),
        );
        assert_eq!(reply["is_error"], false, "{n}: {reply}");
    }
}

/// The bodies all requests hold at once are bounded (`--max-bodies`),
/// and one tenant holds at most a quarter of that: a tenant whose clients
/// send bodies slowly gets a 503 with `Retry-After` for the one past its
/// share, and any request past the whole budget gets one too, rather than
/// the server holding them all (60 unfinished 4 MiB bodies held 288 MiB;
/// round 40c); once they are done, requests are served again.
#[test]
fn the_bodies_held_at_once_are_bounded() {
    let names = ["t1", "t2", "t3", "t4", "t5"];
    let tenants: Vec<(&str, &str)> = names.iter().map(|n| (*n, "memory")).collect();
    let r = Root::new(&tenants);
    let server = Server::start(
        &r.root,
        &r.key,
        &["--max-body", "1000", "--max-bodies", "4000"],
    );
    let head = |token: &str, len: usize| {
        format!(
            "POST /v1/memory HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n"
        )
    };
    let open_slow = |name: &str| {
        let mut c = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
        c.write_all(head(&r.tokens[name], 1000).as_bytes()).unwrap();
        c.write_all(&[b' '; 990]).unwrap();
        c
    };
    let body = format!("{:<100}", r#"{"command":"view","path":"/memories"}"#);
    let ask = |name: &str| {
        raw_http(
            server.port,
            "POST",
            "/v1/memory",
            &[
                ("Authorization", &format!("Bearer {}", r.tokens[name])),
                ("Content-Type", "application/json"),
            ],
            body.as_bytes(),
        )
    };
    let refused = |answer: &str| {
        answer.starts_with("HTTP/1.1 503") && answer.to_ascii_lowercase().contains("retry-after: 1")
    };
    // t1 holds 990 bytes of its share of 1,000: its next body is refused,
    // another tenant's is not.
    let mut slow = vec![open_slow("t1")];
    std::thread::sleep(Duration::from_millis(300));
    assert!(refused(&ask("t1")), "t1's share");
    assert!(ask("t5").starts_with("HTTP/1.1 200"));
    // Three more tenants: 3,960 of 4,000 held; another's 100 are refused.
    slow.extend(["t2", "t3", "t4"].map(open_slow));
    std::thread::sleep(Duration::from_millis(300));
    assert!(refused(&ask("t5")), "the whole budget");
    // The slow ones finish (their bodies are not JSON: a 400 each).
    for c in &mut slow {
        c.write_all(&[b' '; 10]).unwrap();
        let mut reply = [0u8; 12];
        c.read_exact(&mut reply).unwrap();
        assert_eq!(
            &reply,
            b"HTTP/1.1 400",
            "{}",
            String::from_utf8_lossy(&reply)
        );
    }
    drop(slow);
    for name in ["t5", "t1"] {
        assert!(ask(name).starts_with("HTTP/1.1 200"), "{name}");
    }
}

/// A registry put back to an older copy while no server runs (to revive a
/// revoked token across a restart) is refused: the server does not start
/// on it, and `tenant` commands refuse it, until the newer one is back.
#[test]
fn a_registry_put_back_across_a_restart_is_refused() {
    let r = Root::new(&[("alice", "memory")]);
    let registry = r.root.join("memvault-server/registry");
    let before = std::fs::read(&registry).unwrap();
    let (ok, _new, _) = r.token("alice", &["--revoke"]);
    assert!(ok);
    let after = std::fs::read(&registry).unwrap();
    std::fs::write(&registry, &before).unwrap();
    let mut server = tenant_cmd(&r.key);
    server
        .arg("server")
        .arg("--root")
        .arg(&r.root)
        .args(["--listen", "127.0.0.1:0"]);
    let out = crate::util::run_bounded(&mut server, "", Duration::from_secs(20))
        .expect("the server started on a registry older than one it had used");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "the server started: {err}");
    assert!(err.contains("older"), "{err}");
    let out = r
        .tenant()
        .args(["list", "--root"])
        .arg(&r.root)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    // The revoked token stays revoked: nothing was changed by the refusals.
    std::fs::write(&registry, &after).unwrap();
    let s = r.start(&[]);
    let view = r#"{"command":"view","path":"/memories"}"#;
    assert_eq!(
        s.req("POST", "/v1/memory", Some(&r.tokens["alice"]), view)
            .0,
        401
    );
}

/// The raw response (status line and headers included) to one request.
fn raw_http(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut resp = Vec::new();
    let _ = s.read_to_end(&mut resp);
    String::from_utf8_lossy(&resp).into_owned()
}

#[test]
fn routes_match_as_sent_take_their_own_methods_and_refuse_malformed_bodies() {
    let r = Root::new(&[("acme", "memory")]);
    let (ok, admin, _) = r.token("acme", &["--token-name", "ops", "--scopes", "admin"]);
    assert!(ok);
    let agent = r.tokens["acme"].clone();
    let s = r.start(&[]);
    let v = s.memory(
        &agent,
        json!({"command": "create", "path": "/memories/keep.md", "file_text": "one\n"}),
    );
    assert_eq!(v["is_error"], false, "{v}");
    let v = s.memory(
        &agent,
        json!({"command": "str_replace", "path": "/memories/keep.md", "old_str": "one", "new_str": "two"}),
    );
    assert_eq!(v["is_error"], false, "{v}");
    let auth = format!("Bearer {admin}");
    let h = [("Authorization", auth.as_str())];
    // A route that only percent-decodes to an admin route is not one: a
    // proxy's rule on `/v1/purge` cannot be gone round.
    for path in [
        "/v1/%70urge",
        "/v1/purg%65",
        "/v1/%72evert",
        "/v1/h%69story",
        "/v1/Purge",
    ] {
        let (st, v) = s.req_with("POST", path, &h, br#"{"path":"/memories/keep.md"}"#);
        assert_eq!(st, 404, "{path}: {v}");
    }
    let (st, v) = s.req_with(
        "GET",
        "/v1/show",
        &h,
        br#"{"rev":"HEAD","path":"/memories/keep.md","raw":true}"#,
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["content"], "two\n", "the file survived: {v}");
    // Each route its methods; any other is a JSON 405 with `Allow`.
    for (method, path, allow) in [
        ("DELETE", "/v1/verify", "GET, HEAD, POST"),
        ("PUT", "/v1/history", "GET, HEAD, POST"),
        ("FOO", "/v1/history", "GET, HEAD, POST"),
        ("GET", "/v1/purge", "POST"),
        ("GET", "/v1/revert", "POST"),
        ("GET", "/v1/memory", "POST"),
        ("GET", "/mcp", "POST"),
        ("DELETE", "/mcp", "POST"),
    ] {
        let resp = raw_http(s.port, method, path, &h, b"{}");
        assert!(resp.starts_with("HTTP/1.1 405"), "{method} {path}: {resp}");
        assert!(
            resp.to_ascii_lowercase()
                .contains(&format!("\r\nallow: {}\r\n", allow.to_ascii_lowercase())),
            "{method} {path}: {resp}"
        );
        let (_, body) = parse_response(resp.as_bytes()).unwrap();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert!(v["error"].is_string(), "{resp}");
    }
    let (st, v) = s.req("GET", "/v1/verify", Some(&admin), "");
    assert_eq!((st, &v["ok"]), (200, &json!(true)), "{v}");
    // Malformed bodies: 400 in JSON, on every route, nothing run.
    let a = format!("Bearer {agent}");
    let mcp_h = [
        ("Authorization", a.as_str()),
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
    ];
    for (path, body) in [
        ("/v1/memory", &b"[]"[..]),
        ("/v1/memory", b"null"),
        ("/v1/memory", b"\"view\""),
        (
            "/v1/memory",
            br#"{"command":"delete","path":"/memories/keep.md","path":"/memories/x"}"#,
        ),
        ("/mcp", b"garbage"),
        ("/mcp", b""),
        (
            "/mcp",
            br#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]"#,
        ),
        (
            "/mcp",
            br#"{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/list"}"#,
        ),
        // Not JSON-RPC 2.0 requests rmcp takes (they were a plain-text 415).
        (
            "/mcp",
            br#"{"jsonrpc":"1.0","id":10,"method":"tools/list"}"#,
        ),
        ("/mcp", br#"{"id":11,"method":"tools/list"}"#),
        (
            "/mcp",
            br#"{"jsonrpc":"2.0","id":1.5,"method":"tools/list"}"#,
        ),
        (
            "/mcp",
            br#"{"jsonrpc":"2.0","id":12,"method":"tools/call"}"#,
        ),
        // Round 38a: params rmcp cannot read, and an id past i64 (each
        // was a 415, the status for a wrong Content-Type).
        (
            "/mcp",
            br#"{"jsonrpc":"2.0","id":13,"method":"ping","params":"junk"}"#,
        ),
        (
            "/mcp",
            br#"{"jsonrpc":"2.0","method":"notifications/initialized","params":"junk"}"#,
        ),
        (
            "/mcp",
            br#"{"jsonrpc":"2.0","id":9223372036854775808,"method":"ping"}"#,
        ),
        (
            "/mcp",
            br#"{"jsonrpc":"2.0","id":14,"method":"tools/call","params":{"name":"memory","arguments":{"command":"view","path":"/memories"},"_meta":"x"}}"#,
        ),
    ] {
        let (st, v) = s.req_with("POST", path, &mcp_h, body);
        assert_eq!(st, 400, "{path} {}: {v}", String::from_utf8_lossy(body));
        let e = v["error"].as_str().unwrap_or_default();
        assert!(!e.is_empty() && !e.starts_with("Error: "), "{v}");
    }
    // A leading byte order mark is ignored on /mcp as on /v1/memory and
    // `memvault mcp` (rmcp refused it with a 415; round 36c).
    let (st, v) = s.req_with(
        "POST",
        "/mcp",
        &mcp_h,
        b"\xEF\xBB\xBF{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/list\"}",
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["result"]["tools"][0]["name"], "memory", "{v}");
    // What rmcp refuses in plain text (a protocol version it does not
    // know, a `Host` or `Origin` not allowed) is a JSON error as well,
    // with rmcp's status.
    let list = br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    for (name, value) in [
        ("Mcp-Protocol-Version", "1999-01-01"),
        ("Host", "evil.example:80"),
        ("Host", "evil.example@127.0.0.1"),
        ("Origin", "http://evil.example"),
        // Not a host and port, or an origin only in its first part
        // (round 33c: rmcp compared the part before the port).
        ("Host", "127.0.0.1:abc"),
        ("Host", "localhost:99999"),
        ("Origin", "http://localhost:evil.example"),
        ("Origin", "http://localhost:1/../@evil.example"),
        ("Origin", "http://localhost:8700.evil.example"),
    ] {
        let mut h: Vec<(&str, &str)> = mcp_h.to_vec();
        h.push((name, value));
        let (st, v) = s.req_with("POST", "/mcp", &h, list);
        assert!((400..500).contains(&st), "{name}: {st} {v}");
        let e = v["error"].as_str().unwrap_or_default();
        assert!(!e.is_empty(), "{name}: {st} {v}");
    }
    // `Accept: */*` is answered (JSON).
    let any = [
        ("Authorization", a.as_str()),
        ("Content-Type", "application/json"),
        ("Accept", "*/*"),
    ];
    let (st, v) = s.req_with("POST", "/mcp", &any, list);
    assert_eq!(st, 200, "{v}");
    assert!(v["result"]["tools"].is_array(), "{v}");
    // A tools/call that `serve` would refuse is the tool's error, with
    // serve's text: `arguments` twice (the second would delete), or not an
    // object. Nothing runs.
    for (body, says) in [
        (
            &br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"memory","arguments":{"command":"view","path":"/memories"},"arguments":{"command":"delete","path":"/memories/keep.md"}}}"#[..],
            "the key `arguments` twice",
        ),
        (
            br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"memory","arguments":"delete"}}"#,
            "got a string",
        ),
    ] {
        let (st, v) = s.req_with("POST", "/mcp", &mcp_h, body);
        assert_eq!(st, 200, "{v}");
        // A JSON body, or one event of a stream.
        let msg: Value = match &v {
            Value::String(text) => text
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .and_then(|d| serde_json::from_str(d).ok())
                .unwrap_or_else(|| panic!("no message in {text}")),
            other => other.clone(),
        };
        assert_eq!(msg["id"], 7, "{msg}");
        assert_eq!(msg["result"]["isError"], true, "{msg}");
        let text = msg["result"]["content"][0]["text"].as_str().unwrap();
        assert!(text.starts_with("Error: ") && text.contains(says), "{text}");
    }
    let kept = s.memory(
        &agent,
        json!({"command": "view", "path": "/memories/keep.md"}),
    );
    assert_eq!(kept["is_error"], false, "{kept}");
    let (st, v) = s.req_with("POST", "/v1/history", &h, b"nope");
    assert_eq!(st, 400, "{v}");
    assert!(!v["error"].as_str().unwrap().contains("tool_use"), "{v}");
    // An admin route's change is the operator's unless a header says
    // otherwise, as the command line's `revert` is.
    let (st, v) = s.req("POST", "/v1/revert", Some(&admin), r#"{"rev":"HEAD"}"#);
    assert_eq!(st, 200, "{v}");
    let (st, v) = s.req("POST", "/v1/history", Some(&admin), r#"{"limit":1}"#);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["changes"][0]["op"], "revert", "{v}");
    assert_eq!(v["changes"][0]["actor"], "operator", "{v}");
    assert_eq!(v["changes"][0]["principal"], "ops", "{v}");
    // diff takes REV..REV2, or rev2 by name.
    let (st, v) = s.req(
        "POST",
        "/v1/diff",
        Some(&admin),
        r#"{"rev":"HEAD~2..HEAD~1"}"#,
    );
    assert_eq!(st, 200, "{v}");
    let d = v["diff"].as_str().unwrap();
    assert!(d.contains("-one") && d.contains("+two"), "{v}");
    let (st, v2) = s.req(
        "POST",
        "/v1/diff",
        Some(&admin),
        r#"{"rev":"HEAD~2","rev2":"HEAD~1","path":"/memories/keep.md"}"#,
    );
    assert_eq!(st, 200, "{v2}");
    assert_eq!(v2["diff"], v["diff"]);
    let (st, v) = s.req(
        "POST",
        "/v1/diff",
        Some(&admin),
        r#"{"rev":"HEAD~2..HEAD~1","rev2":"HEAD"}"#,
    );
    assert_eq!(st, 400, "{v}");
    s.stop();
    // Over the rate: 429, with Retry-After.
    let s = r.start(&["--rate", "1"]);
    let mut limited = None;
    for _ in 0..20 {
        let resp = raw_http(
            s.port,
            "POST",
            "/v1/memory",
            &[("Authorization", a.as_str())],
            br#"{"command":"view","path":"/memories"}"#,
        );
        if resp.starts_with("HTTP/1.1 429") {
            limited = Some(resp);
            break;
        }
    }
    let resp = limited.expect("no 429 at 1 request a second");
    assert!(
        resp.to_ascii_lowercase().contains("\r\nretry-after: 1\r\n"),
        "{resp}"
    );
    assert!(resp.contains("rate of 1 request a second"), "{resp}");
}

/// A view through the server keeps its file from expiry, its access
/// record written before the reply: seen by the operator's own sweep run
/// at once beside the server (the tenant's key exported), by one run after
/// the server was killed right after the reply, and by the server's own
/// `/v1/expire`. Only a file neither viewed nor written goes. (Writing the
/// records in batches, tried, lost a view to a kill.)
#[cfg(feature = "test-hooks")]
#[test]
fn views_through_the_server_keep_their_files_from_expiry_across_a_kill_and_beside_the_operator() {
    let r = Root::new(&[("acme", "memory,admin")]);
    let token = r.tokens["acme"].clone();
    let t0 = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let at = |days: u128| (t0 + days * 86_400_000).to_string();
    let start = |now: &str| {
        Server::start_env(
            &r.root,
            &r.key,
            &["--idle-close", "2s"],
            &[("MEMVAULT_TEST_NOW_MS", now)],
        )
    };
    let s = start(&at(0));
    for f in ["a", "b", "c"] {
        let v = s.memory(
            &token,
            json!({"command": "create", "path": format!("/memories/{f}.md"), "file_text": "x\n"}),
        );
        assert_eq!(v["is_error"], false, "{v}");
    }
    s.stop();
    // Two days on: c is viewed, and the server is killed, not stopped,
    // right after the reply.
    let s = start(&at(2));
    let v = s.memory(&token, json!({"command": "view", "path": "/memories/c.md"}));
    assert_eq!(v["is_error"], false, "{v}");
    drop(s);
    // A new server the same day: a is viewed, and the operator's own sweep
    // of the tenant's vault, run at once beside the server (its key
    // exported), spares a and c.
    let s = start(&at(2));
    let v = s.memory(&token, json!({"command": "view", "path": "/memories/a.md"}));
    assert_eq!(v["is_error"], false, "{v}");
    let tenant_key = r.tmp.path().join("acme.key");
    let out = tenant_cmd(&r.key)
        .args(["tenant", "export-key", "acme", "--root"])
        .arg(&r.root)
        .arg("--out")
        .arg(&tenant_key)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let vault = std::fs::read_dir(r.root.join("tenants"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let out = tenant_cmd(&tenant_key)
        .env("MEMVAULT_TEST_NOW_MS", at(2))
        .arg("--vault")
        .arg(&vault)
        .args(["expire", "--older-than", "1d", "--dry-run"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{listed}");
    assert!(
        listed.contains("/memories/b.md")
            && !listed.contains("/memories/a.md")
            && !listed.contains("/memories/c.md"),
        "{listed}"
    );
    // And so does the server's own expiry.
    let (status, v) = s.req("POST", "/v1/expire", Some(&token), r#"{"older_than":"1d"}"#);
    assert_eq!(status, 200, "{v}");
    let gone = v["files"].to_string();
    assert!(
        gone.contains("b.md") && !gone.contains("a.md") && !gone.contains("c.md"),
        "{v}"
    );
    for (f, kept) in [("a", true), ("b", false), ("c", true)] {
        let v = s.memory(
            &token,
            json!({"command": "view", "path": format!("/memories/{f}.md")}),
        );
        assert_eq!(v["is_error"], !kept, "{f}: {v}");
    }
    // And a view's record outlives a graceful stop: four days on, a (seen
    // on day two) is younger than three days.
    s.stop();
    let s = start(&at(4));
    let (status, v) = s.req("POST", "/v1/expire", Some(&token), r#"{"older_than":"3d"}"#);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["files"].as_array().map(Vec::len), Some(0), "{v}");
}

/// A tenant's storage quota (`tenant quota`): once its vault stores that
/// many bytes, a memory command that adds content is a 429 (no
/// `Retry-After`: waiting does not change it) and changes nothing, and on
/// `/mcp` the tool's error; views and deletes still run; another tenant
/// is not touched; the operator's change holds at the next request of a
/// running server. Sizes that are not sizes are refused.
#[test]
fn a_tenant_at_its_storage_quota_is_refused_writes_and_keeps_reading() {
    let r = Root::new(&[("acme", "memory"), ("zed", "memory")]);
    let (acme, zed) = (r.tokens["acme"].clone(), r.tokens["zed"].clone());
    let quota = |size: &str| {
        tenant_cmd(&r.key)
            .args(["tenant", "quota", "acme", size, "--root"])
            .arg(&r.root)
            .output()
            .unwrap()
    };
    for bad in [
        "0",
        "12XB",
        "-5",
        "",
        "1.5GB",
        "99999999999999999999",
        "18446744073709551615",
        "16EiB",
    ] {
        assert_eq!(quota(bad).status.code(), Some(2), "{bad:?}");
    }
    assert!(quota("300KB").status.success());
    let listed = r.list_json();
    assert!(listed.contains("\"quota_bytes\":300000"), "{listed}");
    let s = r.start(&[]);
    let note = "q".repeat(20_000);
    let create = |token: &str, name: &str| {
        s.req(
            "POST",
            "/v1/memory",
            Some(token),
            &json!({"command": "create", "path": format!("/memories/{name}.md"), "file_text": note})
                .to_string(),
        )
    };
    let mut made = 0;
    let refusal = loop {
        let (status, v) = create(&acme, &format!("n{made}"));
        if status != 200 {
            break (status, v);
        }
        assert_eq!(v["is_error"], false, "{v}");
        made += 1;
        assert!(made < 40, "never refused");
    };
    assert_eq!(refusal.0, 429, "{}", refusal.1);
    let why = refusal.1["error"].as_str().unwrap();
    assert!(
        why.contains("storage quota") && why.contains("of 300000 bytes"),
        "{why}"
    );
    assert!(
        made >= 5,
        "refused after {made} notes of 20 KB under 300 KB"
    );
    // The writes that passed took the vault past the quota by no more
    // than a write's commit and key record (its blobs and trees are
    // checked before it is made).
    let stored: u64 = why
        .split(" of 300000 bytes")
        .next()
        .and_then(|w| w.rsplit('(').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{why}"));
    assert!(stored <= 300_000 + 1024, "{why}");
    // Commands that change nothing, or that the tool refuses for their
    // own reasons, answer as without a quota.
    for (command, says) in [
        (
            json!({"command": "create", "path": "/memories/../x.md", "file_text": "x"}),
            "..",
        ),
        (
            json!({"command": "create", "path": "/memories/nofield.md"}),
            "file_text",
        ),
        (
            json!({"command": "str_replace", "path": "/memories/none.md", "old_str": "a", "new_str": "b"}),
            "does not exist",
        ),
        (
            json!({"command": "str_replace", "path": "/memories/n0.md", "old_str": "absent", "new_str": "b"}),
            "did not appear",
        ),
    ] {
        let (status, v) = s.req("POST", "/v1/memory", Some(&acme), &command.to_string());
        assert_eq!(status, 200, "{command}: {v}");
        assert_eq!(v["is_error"], true, "{command}: {v}");
        let text = v["content"].as_str().unwrap_or_default();
        assert!(
            text.contains(says) && !text.contains("quota"),
            "{command}: {v}"
        );
    }
    // An edit that leaves the file as it was writes nothing: answered as
    // an edit, not refused.
    let (status, v) = s.req(
        "POST",
        "/v1/memory",
        Some(&acme),
        &json!({"command": "str_replace", "path": "/memories/n0.md", "old_str": note, "new_str": note}).to_string(),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["is_error"], false, "{v}");
    // `tenant list` shows the usage the refusal counted.
    let listed: Value = r
        .list_json()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|t| t["name"] == "acme")
        .unwrap();
    let used = listed["stored_bytes"].as_u64().unwrap();
    assert!(used > 250_000 && used <= 300_000 + 4096, "{listed}");
    // Nothing was written; the other writes that add content are refused
    // too (a tool_use block as well), views and deletes are not.
    let v = s.memory(&acme, json!({"command": "view", "path": "/memories"}));
    assert!(
        !v["content"]
            .as_str()
            .unwrap()
            .contains(&format!("n{made}.md")),
        "{v}"
    );
    // Each write below brings three notes' worth, more than the room the
    // refused create left even after a checkpoint (which the server may
    // run at any time, when it closes an idle vault) packed the log's
    // records into less room than they took.
    let big = "r".repeat(60_000);
    for command in [
        json!({"command": "str_replace", "path": "/memories/n0.md", "old_str": note, "new_str": big}),
        // An `input` beside a bare command is not where the command is.
        json!({"command": "create", "path": "/memories/y.md", "file_text": big, "input": {}}),
        json!({"command": "create", "path": "/memories/y.md", "file_text": big, "input": {"command": "view"}}),
        json!({"type": "tool_use", "id": "toolu_q", "name": "memory", "input": {"command": "insert", "path": "/memories/n0.md", "insert_line": 0, "insert_text": big}}),
    ] {
        let (status, v) = s.req("POST", "/v1/memory", Some(&acme), &command.to_string());
        // Not the command itself in the message: 60 KB of it.
        assert_eq!(status, 429, "{}: {v}", command["command"]);
    }
    let raw = raw_post(
        s.port,
        "/v1/memory",
        &acme,
        &json!({"command": "create", "path": "/memories/x.md", "file_text": big}).to_string(),
    );
    assert!(raw.starts_with("HTTP/1.1 429"), "{raw}");
    assert!(!raw.to_ascii_lowercase().contains("retry-after"), "{raw}");
    let v = s.memory(&acme, json!({"command": "view", "path": "/memories/n0.md"}));
    assert_eq!(v["is_error"], false, "{v}");
    let v = s.memory(
        &acme,
        json!({"command": "delete", "path": "/memories/n1.md"}),
    );
    assert_eq!(v["is_error"], false, "{v}");
    // On /mcp: the tool's error.
    let a = format!("Bearer {acme}");
    let (status, v) = s.req_with(
        "POST",
        "/mcp",
        &[
            ("Authorization", a.as_str()),
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
        ],
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "memory", "arguments": {"command": "create", "path": "/memories/m.md", "file_text": big, "input": {}}}})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(status, 200, "{v}");
    let text = v.to_string();
    assert!(
        text.contains("storage quota") && text.contains("isError"),
        "{text}"
    );
    // Without --sync, /healthz says nothing of syncs.
    let (status, v) = s.req("GET", "/healthz", None, "");
    assert_eq!((status, v.get("sync")), (200, None), "{v}");
    // Another tenant writes as before.
    let (status, v) = create(&zed, "z");
    assert_eq!((status, v["is_error"].clone()), (200, json!(false)), "{v}");
    // The quota raised, then removed, under the running server.
    assert!(quota("10MiB").status.success());
    assert_eq!(create(&acme, "after-raise").0, 200);
    assert!(quota("none").status.success());
    assert_eq!(create(&acme, "after-none").0, 200);
    let listed = r.list_json();
    assert!(listed.contains("\"quota_bytes\":null"), "{listed}");
    // A tenant added with its quota.
    let out = r
        .tenant()
        .args(["add", "small", "--quota", "1MiB", "--root"])
        .arg(&r.root)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(r.list_json().contains("\"quota_bytes\":1048576"));
}

/// One POST on its own connection: the raw response (status line and
/// headers included).
fn raw_post(port: u16, path: &str, token: &str, body: &str) -> String {
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        c,
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    out
}

/// Requests to tenants whose vaults another process holds locked (an
/// operator's long command) wait off the runtime's threads: with more
/// such tenants than the server has cores, another tenant is still
/// answered at once.
#[test]
fn tenants_locked_by_the_operator_do_not_hold_up_the_others() {
    let cores = std::thread::available_parallelism().map_or(2, usize::from);
    let names: Vec<String> = (0..=cores).map(|i| format!("t{i}")).collect();
    let mut tenants: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "memory")).collect();
    tenants.push(("free", "memory"));
    let r = Root::new(&tenants);
    let s = r.start(&[]);
    // Every vault open (the first request of each opens it), a note in
    // each (a view of a file records it, under the lock).
    for (name, _) in &tenants {
        let v = s.memory(
            &r.tokens[*name],
            json!({"command": "create", "path": "/memories/n.md", "file_text": "n\n"}),
        );
        assert_eq!(v["is_error"], false, "{v}");
    }
    let ids = r.ids();
    let held: Vec<std::fs::File> = names
        .iter()
        .map(|n| {
            let f = std::fs::File::open(r.root.join("tenants").join(&ids[n]).join("memvault/lock"))
                .unwrap();
            f.lock().unwrap();
            let other =
                std::fs::File::open(r.root.join("tenants").join(&ids[n]).join("memvault/lock"))
                    .unwrap();
            assert!(other.try_lock_shared().is_err(), "not locked");
            f
        })
        .collect();
    let port = s.port;
    let waiting: Vec<_> = names
        .iter()
        .map(|n| {
            let token = r.tokens[n].clone();
            std::thread::spawn(move || {
                let body = json!({"command": "view", "path": "/memories/n.md"}).to_string();
                let auth = format!("Bearer {token}");
                http(
                    port,
                    "POST",
                    "/v1/memory",
                    &[("Authorization", auth.as_str())],
                    body.as_bytes(),
                )
                .0
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let at = Instant::now();
    let v = s.memory(
        &r.tokens["free"],
        json!({"command": "view", "path": "/memories/n.md"}),
    );
    let took = at.elapsed();
    assert_eq!(v["is_error"], false, "{v}");
    assert!(
        took < Duration::from_secs(3),
        "the free tenant waited {took:?}"
    );
    // The locked tenants' requests were waiting, and are answered once
    // the locks go.
    assert!(waiting.iter().all(|w| !w.is_finished()));
    drop(held);
    for w in waiting {
        assert_eq!(w.join().unwrap(), 200);
    }
}

#[test]
fn mcp_describes_the_tool_with_the_tenants_own_settings() {
    let r = Root::new(&[("acme", "memory"), ("beta", "memory")]);
    // acme's vault: create overwrites, secrets refused, a 2,000-character
    // view cap (set with its exported key, as an operator would).
    let (vault, tenant_key) = tenant_vault(&r, "acme");
    for (name, value) in [
        ("overwrite_on_create", "true"),
        ("redaction.mode", "reject"),
        ("max_view_chars", "2000"),
    ] {
        let out = tenant_cmd(&tenant_key)
            .arg("--vault")
            .arg(&vault)
            .args(["config", "set", name, value])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    let s = Server::start(&r.root, &r.key, &[]);
    let describe = |tenant: &str| -> String {
        let auth = format!("Bearer {}", r.tokens[tenant]);
        let h = [
            ("Authorization", auth.as_str()),
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
        ];
        let (st, v) = s.req_with(
            "POST",
            "/mcp",
            &h,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
        );
        assert_eq!(st, 200, "{v}");
        v["result"]["tools"][0]["description"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let acme = describe("acme");
    assert!(acme.contains("replacing an existing one"), "{acme}");
    assert!(
        acme.contains("a write that contains one is refused"),
        "{acme}"
    );
    assert!(acme.contains("Text over 2000 characters"), "{acme}");
    // beta's vault keeps the defaults, and is described so.
    let beta = describe("beta");
    assert!(beta.contains("It is an error if the file exists"), "{beta}");
    assert!(beta.contains("Text over 16000 characters"), "{beta}");
    assert!(beta.contains("they are redacted before saving"), "{beta}");
}

/// A tenant's vault directory and its exported key (as an operator gets
/// them: `tenant list`, `tenant export-key`).
fn tenant_vault(r: &Root, name: &str) -> (PathBuf, PathBuf) {
    let tenant_key = r.tmp.path().join(format!("{name}.key"));
    let out = tenant_cmd(&r.key)
        .args(["tenant", "export-key", name, "--root"])
        .arg(&r.root)
        .arg("--out")
        .arg(&tenant_key)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let list = tenant_cmd(&r.key)
        .args(["tenant", "list", "--json", "--root"])
        .arg(&r.root)
        .output()
        .unwrap();
    let id = String::from_utf8_lossy(&list.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|t| t["name"] == name)
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    (r.root.join("tenants").join(id), tenant_key)
}

#[test]
fn show_gives_an_images_bytes_in_base64_and_says_what_it_is() {
    let r = Root::new(&[("acme", "memory,audit")]);
    let token = r.tokens["acme"].clone();
    let (vault, tenant_key) = tenant_vault(&r, "acme");
    let png: Vec<u8> = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\xff\xfe\x00\xc3\x28".to_vec();
    let from = r.tmp.path().join("import");
    std::fs::create_dir_all(&from).unwrap();
    std::fs::write(from.join("pic.png"), &png).unwrap();
    let out = tenant_cmd(&tenant_key)
        .arg("--vault")
        .arg(&vault)
        .arg("import")
        .arg(&from)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let s = Server::start(&r.root, &r.key, &[]);
    let (st, v) = s.req(
        "POST",
        "/v1/show",
        Some(&token),
        r#"{"rev":"HEAD","path":"/memories/pic.png","raw":true}"#,
    );
    assert_eq!(st, 200, "{v}");
    assert!(v.get("content").is_none(), "{v}");
    let bytes = data_encoding::BASE64
        .decode(v["content_base64"].as_str().unwrap().as_bytes())
        .unwrap();
    assert_eq!(bytes, png);
    let (st, v) = s.req(
        "POST",
        "/v1/show",
        Some(&token),
        r#"{"rev":"HEAD","path":"/memories/pic.png"}"#,
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["is_error"], false, "{v}");
    assert_eq!(
        v["text"],
        format!(
            "/memories/pic.png is an image (image/png, {} bytes): `--raw` gives its bytes",
            png.len()
        )
    );
    // Text stays text.
    let v = s.memory(
        &token,
        json!({"command": "create", "path": "/memories/a.md", "file_text": "é\n"}),
    );
    assert_eq!(v["is_error"], false, "{v}");
    let (st, v) = s.req(
        "POST",
        "/v1/show",
        Some(&token),
        r#"{"rev":"HEAD","path":"/memories/a.md","raw":true}"#,
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["content"], "é\n");
    // A path not there at that revision is a 422 with or without `raw`
    // (round 38c: without it, a 200 whose body said `"is_error": true`).
    for raw in [false, true] {
        let body = json!({"rev": "HEAD", "path": "/memories/nothing.md", "raw": raw});
        let (st, v) = s.req("POST", "/v1/show", Some(&token), &body.to_string());
        assert_eq!(st, 422, "{v}");
        assert!(
            v["error"]
                .as_str()
                .unwrap()
                .contains("/memories/nothing.md"),
            "{v}"
        );
    }
}

/// A request target that names a host (`POST http://evil.example/mcp`)
/// is for that host, whatever its `Host` header says: refused (round 33c).
#[test]
fn an_mcp_request_whose_target_names_a_host_is_refused() {
    let r = Root::new(&[("acme", "memory")]);
    let s = Server::start(&r.root, &r.key, &[]);
    let list = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    for (target, ok) in [
        ("http://evil.example/mcp".to_string(), false),
        (format!("http://127.0.0.1:{}/mcp", s.port), false),
        ("/mcp".to_string(), true),
    ] {
        let mut c = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
        write!(
            c,
            "POST {target} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{list}",
            s.port,
            r.tokens["acme"],
            list.len()
        )
        .unwrap();
        let (status, _, body) = read_response(&mut BufReader::new(c));
        assert_eq!(
            status == 200,
            ok,
            "{target}: {status} {}",
            String::from_utf8_lossy(&body)
        );
    }
}

#[test]
fn an_allowed_origin_given_without_a_port_accepts_only_its_default_port() {
    let r = Root::new(&[("acme", "memory")]);
    let s = Server::start(&r.root, &r.key, &["--allowed-origin", "http://web.example"]);
    let auth = format!("Bearer {}", r.tokens["acme"]);
    let list = br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    for (origin, allowed) in [
        ("http://web.example", true),
        ("http://web.example:80", true),
        ("http://web.example:8080", false),
        ("https://web.example", false),
        ("http://evil.example", false),
    ] {
        let h = [
            ("Authorization", auth.as_str()),
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("Origin", origin),
        ];
        let (st, v) = s.req_with("POST", "/mcp", &h, list);
        assert_eq!(st == 200, allowed, "{origin}: {st} {v}");
    }
}

/// One response read from a kept-alive connection: status, headers
/// (lowercased names) and body, by its `Content-Length`.
fn read_response(r: &mut BufReader<TcpStream>) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut status_line = String::new();
    r.read_line(&mut status_line).unwrap();
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {status_line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (k, v) = line.split_once(':').unwrap();
        headers.push((k.to_ascii_lowercase(), v.trim().to_string()));
    }
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .map(|(_, v)| v.parse().unwrap())
        .unwrap_or(0);
    let mut body = vec![0; len];
    r.read_exact(&mut body).unwrap();
    (status, headers, body)
}

/// A request refused before its body is read (no token, a token without
/// the route's scope, a second `Host` on `/mcp`) still leaves the
/// connection usable: the body is read and dropped, so the next request
/// on it is answered; one whose body is over the limit is answered with
/// `Connection: close`, never by a silent close.
#[test]
fn a_request_refused_before_its_body_keeps_the_connection_for_the_next() {
    let r = Root::new(&[("acme", "memory")]);
    let s = r.start(&["--max-body", "65536"]);
    let good = format!("Bearer {}", r.tokens["acme"]);
    let bad = format!("Bearer mvt_0123456789abcdef_{}", "e".repeat(64));
    let conn = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut w = conn.try_clone().unwrap();
    let mut rd = BufReader::new(conn);
    let filler = format!(
        r#"{{"command":"create","path":"/memories/x.md","file_text":"{}"}}"#,
        "x".repeat(20_000)
    );
    let view = r#"{"command":"view","path":"/memories"}"#;
    let mut send = |path: &str, auth: &str, extra: &str, body: &str| {
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {auth}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n{extra}Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        w.write_all(req.as_bytes()).unwrap();
    };
    let list = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    // Each refusal is followed, on the same connection, by a request that
    // must be answered.
    let refusals: [(&str, &str, &str, &str, u16); 6] = [
        ("/v1/memory", bad.as_str(), "", filler.as_str(), 401),
        ("/v1/purge", good.as_str(), "", filler.as_str(), 403),
        ("/v1/memory?x=1", good.as_str(), "", filler.as_str(), 400),
        ("/mcp", good.as_str(), "Host: evil.example\r\n", list, 400),
        ("/v1/nope", good.as_str(), "", filler.as_str(), 404),
        ("/healthz", good.as_str(), "", filler.as_str(), 405),
    ];
    for (path, auth, extra, body, want) in refusals {
        send(path, auth, extra, body);
        let (st, headers, answer) = read_response(&mut rd);
        assert_eq!(st, want, "{path}: {}", String::from_utf8_lossy(&answer));
        assert!(
            !headers
                .iter()
                .any(|(k, v)| k == "connection" && v == "close"),
            "{path}: {headers:?}"
        );
        send("/v1/memory", &good, "", view);
        let (st, _, answer) = read_response(&mut rd);
        assert_eq!(
            st,
            200,
            "after {path}: {}",
            String::from_utf8_lossy(&answer)
        );
        assert!(String::from_utf8_lossy(&answer).contains("Here're the files"));
    }
    // A body past the limit is not read: the answer says the connection
    // closes.
    // (Only its head is sent: the answer comes without the body.) And a
    // client waiting for `100 Continue` is not asked for a body it would
    // only have dropped: the 401 comes at once, and the connection closes.
    drop((w, rd));
    for extra in [
        "Content-Length: 70000",
        "Expect: 100-continue\r\nContent-Length: 10",
    ] {
        let conn = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut w = conn.try_clone().unwrap();
        let mut rd = BufReader::new(conn);
        let head = format!(
            "POST /v1/memory HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {bad}\r\n{extra}\r\n\r\n"
        );
        w.write_all(head.as_bytes()).unwrap();
        let (st, headers, _) = read_response(&mut rd);
        assert_eq!(st, 401, "{extra}");
        assert!(
            headers
                .iter()
                .any(|(k, v)| k == "connection" && v == "close"),
            "{extra}: {headers:?}"
        );
    }
}

/// A token rotated (or revoked: the same check) while a request's body is
/// on its way does not act: the request whose headers came before the
/// change, its body after, is refused (401) and changes nothing, on the
/// memory route, an admin route and `/mcp`.
#[test]
fn a_token_revoked_while_a_body_is_on_its_way_does_not_act() {
    let r = Root::new(&[("acme", "memory,admin")]);
    let s = r.start(&[]);
    let token = r.tokens["acme"].clone();
    let v = s.memory(
        &token,
        json!({"command": "create", "path": "/memories/keep.md", "file_text": "kept\n"}),
    );
    assert_eq!(v["is_error"], false, "{v}");
    let bodies = [
        (
            "/v1/memory",
            r#"{"command":"create","path":"/memories/late.md","file_text":"late\n"}"#.to_string(),
        ),
        ("/v1/purge", r#"{"path":"/memories/keep.md"}"#.to_string()),
        (
            "/mcp",
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"memory","arguments":{"command":"create","path":"/memories/late2.md","file_text":"late\n"}}}"#.to_string(),
        ),
    ];
    let mut token = token;
    for (path, body) in &bodies {
        let conn = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut w = conn.try_clone().unwrap();
        let mut rd = BufReader::new(conn);
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        w.write_all(head.as_bytes()).unwrap();
        w.write_all(&body.as_bytes()[..5]).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let (ok, fresh, err) = r.token("acme", &["--rotate"]);
        assert!(ok, "{err}");
        w.write_all(&body.as_bytes()[5..]).unwrap();
        let (status, _, answer) = read_response(&mut rd);
        assert_eq!(status, 401, "{path}: {}", String::from_utf8_lossy(&answer));
        token = fresh;
    }
    let v = s.memory(&token, json!({"command": "view", "path": "/memories"}));
    let listing = content(&v);
    assert!(listing.contains("keep.md"), "{listing}");
    assert!(!listing.contains("late"), "{listing}");
}

/// What an interrupted `tenant remove` or `tenant add` leaves under
/// `tenants/` (a vault the registry no longer names, its key gone with
/// it; a half-erased `.removed` copy) is erased by the next `tenant add`,
/// `tenant remove` (even of a name that does not exist) or server start,
/// and said; the vaults the registry names are untouched. A name no
/// tenant can have is a usage error for every subcommand.
#[test]
fn leftovers_of_an_interrupted_remove_or_add_are_erased_by_the_next_one() {
    let r = Root::new(&[("ana", "memory"), ("bo", "memory")]);
    let s = r.start(&[]);
    let ana = r.tokens["ana"].clone();
    let v = s.memory(
        &ana,
        json!({"command": "create", "path": "/memories/a.md", "file_text": "kept note"}),
    );
    assert_eq!(v["is_error"], false, "{v}");
    drop(s);
    let ids = r.ids();
    let tenants = r.root.join("tenants");
    // Copies of a real vault as leftovers: one under an id the registry
    // does not know, one as a removal's half-erased copy, and a stray
    // file.
    let copy = |to: &str| {
        let st = Command::new("cp")
            .arg("-a")
            .arg(tenants.join(&ids["bo"]))
            .arg(tenants.join(to))
            .status()
            .unwrap();
        assert!(st.success());
    };
    let names = |t: &Path| {
        let mut v: Vec<String> = std::fs::read_dir(t)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    let mut registered: Vec<String> = ids.values().cloned().collect();
    registered.sort();
    for (round, trigger) in [
        &["add", "cy", "--scopes", "memory"][..],
        &["remove", "nobody"],
        &[],
    ]
    .into_iter()
    .enumerate()
    {
        copy("0123456789abcdef");
        copy(&format!("{}.removed", ids["ana"]));
        std::fs::write(tenants.join("stray"), b"x").unwrap();
        let out = if trigger.is_empty() {
            // A server start sweeps too.
            let s = r.start(&[]);
            let v = s.memory(&ana, json!({"command": "view", "path": "/memories/a.md"}));
            assert!(v["content"].as_str().unwrap().contains("kept note"), "{v}");
            drop(s);
            None
        } else {
            Some(
                r.tenant()
                    .args(trigger)
                    .arg("--root")
                    .arg(&r.root)
                    .output()
                    .unwrap(),
            )
        };
        if let Some(out) = &out {
            let said = String::from_utf8_lossy(&out.stderr);
            assert!(
                said.contains("erased 3 leftover vault directories"),
                "{trigger:?}: {said}"
            );
            // `remove nobody` still fails as before: no such tenant.
            assert_eq!(
                out.status.code(),
                Some(if round == 0 { 0 } else { 1 }),
                "{said}"
            );
        }
        let mut want = registered.clone();
        if round == 0 {
            let cy = r.ids()["cy"].clone();
            registered.push(cy);
            registered.sort();
            want = registered.clone();
        }
        assert_eq!(names(&tenants), want, "{trigger:?}");
    }
    // Every registered vault still verifies and reads.
    let s = r.start(&[]);
    let v = s.memory(&ana, json!({"command": "view", "path": "/memories/a.md"}));
    assert!(v["content"].as_str().unwrap().contains("kept note"), "{v}");
    drop(s);
    // Names no tenant can have: exit 2 everywhere, nothing changed.
    for cmd in [
        &["remove", "Ana"][..],
        &["quota", "a/b", "1MB"],
        &["export-key", "Ana", "--out", "/nonexistent/k"],
        &["sync", ".."],
        &["remote", "Ana", "/tmp/x.git"],
    ] {
        let out = r
            .tenant()
            .args(cmd)
            .arg("--root")
            .arg(&r.root)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(names(&tenants), registered);
}
