//! Several processes writing one vault at once lose nothing.

use std::process::Stdio;

use serde_json::json;

use crate::util::*;

#[test]
fn four_writers_making_100_mutations_each_lose_none() {
    let v = TestVault::new();
    let writers = 4;
    let per = 100;
    let mut children = Vec::new();
    for w in 0..writers {
        let mut input = String::new();
        for i in 0..per {
            // Alternate creates and edits of a file shared by all writers,
            // so the writers really contend for the same tree.
            let cmd = if i % 4 == 3 {
                json!({"command": "insert", "path": "/memories/shared.log", "insert_line": 0,
                       "insert_text": format!("w{w} line {i}")})
            } else {
                json!({"command": "create", "path": format!("/memories/w{w}/n{i:03}.md"),
                       "file_text": format!("writer {w} note {i}\n")})
            };
            input.push_str(&cmd.to_string());
            input.push('\n');
        }
        let mut cmd = v.cmd();
        cmd.args(["serve", "--session", &format!("writer-{w}")])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        children.push((cmd, input));
    }
    // The shared file must exist before writers insert into it.
    let first =
        v.one(json!({"command": "create", "path": "/memories/shared.log", "file_text": ""}));
    assert!(!is_error(&first));
    let handles: Vec<_> = children
        .into_iter()
        .map(|(mut cmd, input)| {
            std::thread::spawn(move || run_with_stdin(&mut cmd, input.as_bytes()))
        })
        .collect();
    for h in handles {
        let out = h.join().unwrap();
        ok(&out);
        let results = parse_lines(&out.stdout);
        assert_eq!(results.len(), per);
        for r in &results {
            assert!(!is_error(r), "{r}");
        }
    }
    assert_eq!(v.commits(), 1 + 1 + writers * per);
    // Every note is there, and the shared file has every writer's lines.
    let listing = v.one(json!({"command": "view", "path": "/memories/shared.log"}));
    let shared = text(&listing);
    for w in 0..writers {
        for i in (0..per).filter(|i| i % 4 == 3) {
            assert!(
                shared.contains(&format!("\tw{w} line {i}\n"))
                    || shared.ends_with(&format!("\tw{w} line {i}")),
                "lost w{w} line {i}"
            );
        }
        let mut reqs = Vec::new();
        for i in (0..per).filter(|i| i % 4 != 3) {
            reqs.push(
                json!({"command": "view", "path": format!("/memories/w{w}/n{i:03}.md")})
                    .to_string(),
            );
        }
        for (r, i) in v.serve(&reqs).iter().zip((0..per).filter(|i| i % 4 != 3)) {
            assert_eq!(
                text(r),
                format!(
                    "Here's the content of /memories/w{w}/n{i:03}.md with line numbers:\n     1\twriter {w} note {i}"
                )
            );
        }
    }
}

/// A `serve` process kept open: send a request, read its reply.
struct Client {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    out: std::io::BufReader<std::process::ChildStdout>,
}

impl Client {
    fn start(v: &TestVault, session: &str) -> Client {
        Client::start_cmd(v.cmd(), session)
    }

    fn start_cmd(cmd: std::process::Command, session: &str) -> Client {
        Client::spawn(cmd, session, Stdio::null())
    }

    /// Start `serve` with its stderr going to `stderr` (piped: take it
    /// from `child.stderr`).
    fn spawn(mut cmd: std::process::Command, session: &str, stderr: Stdio) -> Client {
        let mut child = cmd
            .args(["serve", "--session", session, "--actor", session])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        Client { child, stdin, out }
    }

    fn call(&mut self, cmd: serde_json::Value) -> serde_json::Value {
        use std::io::{BufRead, Write};
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{cmd}").unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        assert!(
            self.out.read_line(&mut line).unwrap() > 0,
            "no reply to {cmd}"
        );
        serde_json::from_str(&line).unwrap()
    }

    fn create(&mut self, path: &str, text: &str) {
        let r = self.call(json!({"command": "create", "path": path, "file_text": text}));
        assert!(!is_error(&r), "{r}");
    }

    /// Close its input and wait for it to exit, at most `secs` seconds
    /// (a thread waits for the exit; past the deadline it is killed).
    fn finish(mut self, secs: u64) -> std::process::ExitStatus {
        drop(self.stdin.take());
        let pid = self.child.id();
        let mut child = self.child;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        match rx.recv_timeout(std::time::Duration::from_secs(secs)) {
            Ok(status) => status.unwrap(),
            Err(_) => {
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
                panic!("serve did not exit within {secs} s of its input ending");
            }
        }
    }
}

fn content(v: &TestVault, path: &str) -> String {
    let r = v.one(json!({"command": "view", "path": path}));
    assert!(!is_error(&r), "{path}: {r}");
    text(&r).to_string()
}

#[test]
fn serve_processes_hand_writes_to_one_leader_and_keep_each_session() {
    let v = TestVault::new();
    let mut a = Client::start(&v, "alpha");
    a.create("/memories/a0.md", "a0\n");
    let sock = v.vault.join("memvault/serve.sock");
    assert!(sock.exists(), "the first serve process leads");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let mut b = Client::start(&v, "beta");
    let mut c = Client::start(&v, "gamma");
    for i in 0..5 {
        b.create(&format!("/memories/b{i}.md"), &format!("b{i}\n"));
        c.create(&format!("/memories/c{i}.md"), &format!("c{i}\n"));
        a.create(
            &format!("/memories/a{}.md", i + 1),
            &format!("a{}\n", i + 1),
        );
    }
    for client in [a, b, c] {
        assert!(client.finish(20).success());
    }
    // Every commit carries the session of the client that asked for it.
    let mut vault = v.open_library("check");
    let history = vault.history().unwrap();
    let mut seen = std::collections::BTreeMap::new();
    for (_, meta) in &history {
        if let Some(path) = &meta.path {
            seen.insert(path.clone(), (meta.session.clone(), meta.actor.clone()));
        }
    }
    for (prefix, who) in [("a", "alpha"), ("b", "beta"), ("c", "gamma")] {
        for i in 0..5 {
            let path = format!("/memories/{prefix}{i}.md");
            assert_eq!(
                seen.get(&path),
                Some(&(who.to_string(), who.to_string())),
                "{path}"
            );
        }
    }
    drop(vault);
    assert_eq!(
        content(&v, "/memories/c4.md"),
        "Here's the content of /memories/c4.md with line numbers:\n     1\tc4"
    );
}

#[test]
fn a_leader_whose_client_is_done_exits_and_its_followers_carry_on() {
    let v = TestVault::new();
    let mut leader = Client::start(&v, "leader");
    leader.create("/memories/l.md", "l\n");
    let mut f1 = Client::start(&v, "f1");
    let mut f2 = Client::start(&v, "f2");
    f1.create("/memories/f1_0.md", "x\n");
    f2.create("/memories/f2_0.md", "x\n");
    // The leader's client closes its input: it exits promptly although
    // two followers are still connected and idle.
    assert!(leader.finish(15).success());
    for i in 1..4 {
        f1.create(&format!("/memories/f1_{i}.md"), "x\n");
        f2.create(&format!("/memories/f2_{i}.md"), "x\n");
    }
    assert!(f1.finish(15).success());
    assert!(f2.finish(15).success());
    assert_eq!(v.commits(), 1 + 1 + 2 * 4);
    for i in 0..4 {
        content(&v, &format!("/memories/f1_{i}.md"));
        content(&v, &format!("/memories/f2_{i}.md"));
    }
}

#[test]
fn followers_of_a_killed_leader_lose_nothing_and_keep_working() {
    let v = TestVault::new();
    let mut leader = Client::start(&v, "leader");
    leader.create("/memories/l.md", "l\n");
    let mut f = Client::start(&v, "follower");
    f.create("/memories/f0.md", "x\n");
    leader.child.kill().unwrap();
    leader.child.wait().unwrap();
    // The follower was idle: its next requests reach a new leader (itself).
    for i in 1..4 {
        f.create(&format!("/memories/f{i}.md"), "x\n");
    }
    assert!(f.finish(15).success());
    assert_eq!(v.commits(), 1 + 1 + 4);
    content(&v, "/memories/l.md");
    let out = v.cmd().arg("verify").output().unwrap();
    ok(&out);
}

#[test]
fn a_peer_without_the_vault_keys_gets_nothing_run() {
    use std::io::{BufRead, BufReader, Write};
    let v = TestVault::new();
    let mut leader = Client::start(&v, "leader");
    leader.create("/memories/l.md", "l\n");
    let sock = v.vault.join("memvault/serve.sock");
    // A wrong proof, then a request: the leader hangs up and runs nothing.
    let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    writeln!(s, "hello {}", "00".repeat(32)).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert!(line.starts_with("leader "), "{line}");
    writeln!(s, "follower {}", "11".repeat(32)).unwrap();
    let request = json!({"command": "create", "path": "/memories/evil.md", "file_text": "x"});
    let _ = writeln!(
        s,
        "{}\n{request}",
        json!({"session": "evil", "actor": "evil"})
    );
    line.clear();
    assert_eq!(r.read_line(&mut line).unwrap_or(0), 0, "got {line:?}");
    // No handshake at all: also nothing.
    let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    let _ = writeln!(
        s,
        "{}\n{request}",
        json!({"session": "evil", "actor": "evil"})
    );
    drop(s);
    leader.create("/memories/l2.md", "l\n");
    assert!(leader.finish(15).success());
    // init, l.md, l2.md: nothing for the peers.
    assert_eq!(v.commits(), 3);
    let r = v.one(json!({"command": "view", "path": "/memories/evil.md"}));
    assert!(is_error(&r));
}

#[cfg(feature = "test-hooks")]
#[test]
fn a_follower_whose_leader_dies_mid_request_says_the_outcome_is_unknown() {
    use std::io::BufRead;
    let v = TestVault::new();
    let mut cmd = v.cmd();
    // The leader is killed during its pause; it never ends by itself.
    cmd.env("MEMVAULT_TEST_LEADER_PAUSE_MS", "600000");
    let mut leader = Client::spawn(cmd, "leader", Stdio::piped());
    let mut leader_err = std::io::BufReader::new(leader.child.stderr.take().unwrap()).lines();
    leader.create("/memories/l.md", "l\n");
    let mut f = Client::start(&v, "follower");
    let pending = std::thread::spawn(move || {
        let r = f.call(
            json!({"type": "tool_use", "id": "toolu_9", "name": "memory",
            "input": {"command": "create", "path": "/memories/inflight.md", "file_text": "x\n"}}),
        );
        (f, r)
    });
    // The leader has run the request and waits before replying (it says
    // so on stderr): kill it.
    loop {
        let line = leader_err
            .next()
            .expect("the leader ended before pausing")
            .unwrap();
        if line.contains("test hook: leader pausing") {
            break;
        }
    }
    leader.child.kill().unwrap();
    leader.child.wait().unwrap();
    let (mut f, r) = pending.join().unwrap();
    assert!(is_error(&r), "{r}");
    assert_eq!(r["tool_use_id"], "toolu_9");
    assert!(text(&r).contains("may or may not have been applied"), "{r}");
    // The follower carries on (it leads now), and nothing is half done.
    f.create("/memories/after.md", "y\n");
    assert!(f.finish(15).success());
    content(&v, "/memories/after.md");
    let out = v.cmd().arg("verify").output().unwrap();
    ok(&out);
}

/// A build without the `test-hooks` feature has no leader pause:
/// `MEMVAULT_TEST_LEADER_PAUSE_MS` is not read, and a follower's request is
/// answered at once.
#[test]
fn a_leader_ignores_memvault_test_leader_pause_ms_without_test_hooks() {
    if !default_build_under_test(
        "a_leader_ignores_memvault_test_leader_pause_ms_without_test_hooks",
    ) {
        return;
    }
    let v = TestVault::new();
    let mut cmd = v.cmd();
    cmd.env("MEMVAULT_TEST_LEADER_PAUSE_MS", "60000");
    let mut leader = Client::start_cmd(cmd, "leader");
    leader.create("/memories/l.md", "l\n");
    let mut f = Client::start(&v, "follower");
    let t = std::time::Instant::now();
    f.create("/memories/f.md", "f\n");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(30),
        "the leader paused for {:?}",
        t.elapsed()
    );
    assert!(f.finish(15).success());
    assert!(leader.finish(15).success());
    content(&v, "/memories/f.md");
}

/// A build without the `test-hooks` feature has no pause after a reply:
/// `MEMVAULT_TEST_AFTER_REPLY_PAUSE_MS` is not read, and a request after a
/// view is answered at once.
#[test]
fn serve_ignores_memvault_test_after_reply_pause_ms_without_test_hooks() {
    if !default_build_under_test(
        "serve_ignores_memvault_test_after_reply_pause_ms_without_test_hooks",
    ) {
        return;
    }
    let v = TestVault::new();
    let mut cmd = v.cmd();
    cmd.env("MEMVAULT_TEST_AFTER_REPLY_PAUSE_MS", "60000");
    let mut c = Client::start_cmd(cmd, "paused");
    c.create("/memories/a.md", "a\n");
    let t = std::time::Instant::now();
    c.create("/memories/b.md", "b\n");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(30),
        "serve paused for {:?} after a reply",
        t.elapsed()
    );
    assert!(c.finish(15).success());
    content(&v, "/memories/b.md");
}

/// Settings changed while a `serve` leads hold for every request it runs
/// from then on: a `serve` started after the change, whose requests the
/// leader runs, is served under the new settings (it was served under the
/// leader's, read at its start), and so is the leader's own client.
#[test]
fn a_settings_change_holds_for_requests_a_running_leader_serves() {
    let v = TestVault::new();
    let mut leader = Writer::start(&v, "lead");
    leader.send(&json!({"command": "view", "path": "/memories"}));
    for (key, value) in [("redaction.mode", "reject"), ("max_file_bytes", "1000")] {
        let out = v
            .cmd()
            .args(["config", "set", key, value])
            .output()
            .unwrap();
        ok(&out);
    }
    // A follower started now: the leader runs its requests.
    let secret = json!({"command": "create", "path": "/memories/e3.md", "file_text": "password = Hunter2!xyzQ\n"});
    let big =
        json!({"command": "create", "path": "/memories/e4.md", "file_text": "a".repeat(5000)});
    let out = v.serve(&[secret.to_string(), big.to_string()]);
    assert!(
        v.vault.join("memvault/serve.sock").exists(),
        "the first serve still leads"
    );
    assert!(is_error(&out[0]), "a secret in reject mode: {}", out[0]);
    assert!(is_error(&out[1]), "over max_file_bytes: {}", out[1]);
    // The leader's own client too.
    let reply = leader.ask(&big);
    assert!(reply.contains("\"is_error\":true"), "{reply}");
    assert!(leader.finish());
    for p in ["/memories/e3.md", "/memories/e4.md"] {
        assert!(
            is_error(&v.one(json!({"command": "view", "path": p}))),
            "{p} was written"
        );
    }
}

/// One-shot commands racing a `serve` that appends large records (and
/// checkpoints every few of them): a command that caught up while a record
/// was half written read on once it was whole, and `verify` looked again
/// with writers held off, so none of them reports damage that is not
/// there. Each failed before (a false "damaged ... truncate -s N", and
/// `verify` seeing keys or packs half moved by a checkpoint: found by an
/// attack). Bounded: 6 seconds of writes.
#[test]
fn one_shot_readers_and_verify_racing_a_writer_see_no_false_damage() {
    use std::io::{BufRead, BufReader, Write};
    let v = TestVault::new();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let mut cmd = v.cmd();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut child = cmd
                .args(["serve", "--session", "w"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let mut stdin = child.stdin.take().unwrap();
            let mut out = BufReader::new(child.stdout.take().unwrap());
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let size = [100, 300_000, 900_000][n % 3];
                let r = json!({"command": "create", "path": format!("/memories/w{n}.md"), "file_text": "a".repeat(size)});
                writeln!(stdin, "{r}").unwrap();
                let mut line = String::new();
                out.read_line(&mut line).unwrap();
                assert!(line.contains("\"is_error\":false"), "{line}");
                n += 1;
            }
            drop(stdin);
            child.wait().unwrap();
            n
        })
    };
    let until = std::time::Instant::now() + std::time::Duration::from_secs(6);
    let mut problems = Vec::new();
    let mut runs = 0;
    while std::time::Instant::now() < until {
        for args in [
            vec!["exec", r#"{"command":"view","path":"/memories"}"#],
            vec!["history", "--limit", "1"],
            vec!["verify"],
        ] {
            let out = v.cmd().args(&args).output().unwrap();
            runs += 1;
            let all = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            if !out.status.success() || all.contains("damaged") {
                problems.push(format!("{args:?}: {}", &all[..all.len().min(300)]));
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let written = writer.join().unwrap();
    assert!(
        problems.is_empty(),
        "{} of {runs}: {problems:#?}",
        problems.len()
    );
    assert!(written > 3, "the writer wrote {written}");
    assert!(ok(&v.cmd().arg("verify").output().unwrap()).starts_with("ok:"));
}

/// A command that waits for the vault's lock, held for long by another
/// process, says so on stderr (once) instead of hanging in silence, and
/// goes on when the lock is let go.
#[test]
fn a_command_waiting_long_for_the_lock_says_so_and_goes_on() {
    let v = TestVault::new();
    let r = v.one(json!({"command": "create", "path": "/memories/a.md", "file_text": "a\n"}));
    assert_eq!(r["is_error"], false, "{r}");
    let holder = std::process::Command::new("flock")
        .arg("-x")
        .arg(v.vault.join("memvault/lock"))
        .args(["sleep", "5"])
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let started = std::time::Instant::now();
    let out = v
        .cmd()
        .args([
            "exec",
            r#"{"command":"create","path":"/memories/b.md","file_text":"b\n"}"#,
        ])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(started.elapsed() >= std::time::Duration::from_secs(3));
    assert_eq!(
        err.matches("waiting for the vault's lock").count(),
        1,
        "{err}"
    );
    let mut holder = holder;
    holder.wait().unwrap();
    // Uncontended: nothing said.
    let out = v
        .cmd()
        .args(["exec", r#"{"command":"view","path":"/memories/b.md"}"#])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&out.stderr).contains("waiting"));
}
