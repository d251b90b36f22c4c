//! Faults during sync: `push`, `pull` and `sync` (and the merges they
//! make) killed with SIGKILL at seeded random points, connections cut in
//! the middle of a transfer, two machines pushing at the same moment.
//! Neither side ever loses an acknowledged mutation, `verify` passes on
//! both, and a fresh clone of the remote reads completely.

use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use std::time::Duration;

use serde_json::json;

use crate::sync::{Machine, world, world_with};
use crate::util::*;

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Every file machine `m` was told was written is there with its text.
fn holds(m: &Machine, acked: &[(String, String)]) {
    let files = m.files();
    for (path, text) in acked {
        let rel = path.strip_prefix("/memories/").unwrap();
        assert!(
            files
                .iter()
                .any(|(p, t)| (p == rel || p.strip_prefix("memories/") == Some(rel)) && t == text),
            "{path} was acknowledged and is gone"
        );
    }
}

#[test]
fn push_pull_and_sync_killed_at_random_points_lose_nothing_on_either_side() {
    let rounds: u64 = std::env::var("MEMVAULT_SYNC_KILL_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    // Two pairs of machines with a remote each, side by side, half the
    // rounds each, seeded apart: each round mostly waits for its kill's
    // delay and its processes, so the two cores take both at once.
    let pairs: Vec<_> = [0x5EED_5EED_1234_5678u64, 0x5EED_5EED_8765_4321]
        .into_iter()
        .enumerate()
        .map(|(i, seed)| {
            let mine = rounds / 2 + (i as u64) * (rounds % 2);
            std::thread::spawn(move || kill_rounds(seed, mine))
        })
        .collect();
    for p in pairs {
        if let Err(panic) = p.join() {
            std::panic::resume_unwind(panic);
        }
    }
}

/// `rounds` rounds of the test above on two new machines and a remote.
fn kill_rounds(seed: u64, rounds: u64) {
    let w = world(1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    let mut rng = Rng(seed);
    let mut acked_a: Vec<(String, String)> = Vec::new();
    let mut acked_b: Vec<(String, String)> = Vec::new();
    for round in 0..rounds {
        // Both sides write; b publishes now and then, so a's pulls merge.
        let pa = format!("/memories/a/{round}.md");
        let ta = format!("a wrote {round}\n");
        a.write(&pa, &ta);
        acked_a.push((pa, ta));
        if rng.below(2) == 0 {
            let pb = format!("/memories/b/{round}.md");
            let tb = format!("b wrote {round}\n");
            b.write(&pb, &tb);
            acked_b.push((pb, tb));
            b.ok(&["sync"]);
        }
        // a's push, pull or sync, killed after a random delay.
        let op = ["push", "pull", "sync"][rng.below(3) as usize];
        let delay = Duration::from_millis(rng.below(120));
        let mut child = a
            .cmd()
            .arg(op)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        let _ = child.kill();
        let _ = child.wait();
        // Let any git the kill orphaned finish with the remote.
        std::thread::sleep(Duration::from_millis(30));
        a.ok(&["verify"]);
        holds(a, &acked_a);
        if round % 10 == 9 {
            // A sync runs to its end, and both sides hold everything.
            a.ok(&["sync"]);
            b.ok(&["sync"]);
            holds(a, &acked_b);
            holds(b, &acked_a);
            let c = Machine::new(w.hub.with_file_name(format!("check{round}")), a.key.clone());
            c.ok(&["clone", w.hub.to_str().unwrap()]);
            c.ok(&["verify"]);
            holds(&c, &acked_a);
            holds(&c, &acked_b);
            std::fs::remove_dir_all(&c.dir).unwrap();
        }
    }
    a.ok(&["sync"]);
    b.ok(&["sync"]);
    a.ok(&["sync"]);
    assert_eq!(a.files(), b.files());
    b.ok(&["verify"]);
}

#[test]
fn two_machines_pushing_at_the_same_moment_both_get_in() {
    for round in 0..5 {
        let w = world(2);
        let ms = &w.machines;
        for (i, m) in ms.iter().enumerate() {
            m.write(&format!("/memories/m{i}-{round}.md"), "x\n");
        }
        let children: Vec<_> = ms
            .iter()
            .map(|m| {
                m.cmd()
                    .arg("sync")
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for c in children {
            let out = c.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "a concurrent sync failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        for m in ms {
            m.ok(&["sync"]);
        }
        let files = ms[0].files();
        for (i, m) in ms.iter().enumerate() {
            assert_eq!(m.files(), files);
            assert!(
                files
                    .iter()
                    .any(|(p, _)| p.contains(&format!("m{i}-{round}.md")))
            );
        }
    }
}

/// A transport whose connection is cut after LIMIT bytes: a stand-in for
/// `ssh` (git runs `$GIT_SSH_COMMAND HOST COMMAND`) that runs the command
/// here, with its output (`out`: fetches) or its input (`in`: pushes) cut.
fn cutting_ssh(dir: &std::path::Path, side: &str, limit: usize) -> Vec<(String, String)> {
    let script = dir.join(format!("cut-{side}-{limit}.py"));
    // A relay, unbuffered, that passes `limit` bytes one way and then
    // kills the command and hangs up (`head` would wait for a full block
    // and stall git's ref advertisement).
    let body = format!(
        r#"#!/usr/bin/env python3
import os, subprocess, sys
side, limit = "{side}", {limit}
p = subprocess.Popen(sys.argv[2], shell=True,
                     stdin=subprocess.PIPE if side == "in" else None,
                     stdout=subprocess.PIPE if side == "out" else None)
src, dst = (p.stdout.fileno(), 1) if side == "out" else (0, p.stdin.fileno())
n = 0
while True:
    b = os.read(src, 65536)
    if not b:
        break
    if n + len(b) > limit:
        os.write(dst, b[: limit - n])
        p.kill()
        os._exit(1)
    os.write(dst, b)
    n += len(b)
if side == "in":
    p.stdin.close()
sys.exit(p.wait())
"#
    );
    std::fs::write(&script, body).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Run through the interpreter, not exec'd itself: a script just
    // written may be "text file busy" while a child forked meanwhile by
    // another test thread still holds its write descriptor.
    vec![
        (
            "GIT_SSH_COMMAND".into(),
            format!("python3 {}", script.display()),
        ),
        ("GIT_SSH_VARIANT".into(), "simple".into()),
    ]
}

#[test]
fn a_connection_cut_in_the_middle_of_a_transfer_changes_nothing_on_either_side() {
    let scripts = tempfile::tempdir().unwrap();
    let tmp = scripts.path().to_path_buf();
    let uncut = cutting_ssh(&tmp, "out", 1 << 30);
    let w = world_with(|hub| format!("cut:{}", hub.display()), &uncut, 1);
    let (a, b) = (&w.machines[0], &w.machines[1]);
    // Content that does not compress, so the pack is large.
    let mut rng = Rng(42);
    let big: String = (0..60_000)
        .map(|_| char::from(b'a' + rng.below(26) as u8))
        .collect();
    let remote_main =
        || String::from_utf8(git(&w.hub, &["rev-parse", "refs/heads/main"]).stdout).unwrap();
    // A push cut off: the remote keeps what it had.
    a.write("/memories/big.md", &big);
    let before = remote_main();
    let mut cut = Machine::new(a.dir.clone(), a.key.clone());
    cut.env = cutting_ssh(&tmp, "in", 20_000);
    let err = cut.fails(&["push"], 1);
    assert!(err.contains("remote origin"), "{err}");
    assert_eq!(remote_main(), before);
    a.ok(&["verify"]);
    // A fetch cut off: this side keeps what it had.
    b.write("/memories/big-b.md", &big);
    b.ok(&["push"]);
    let a_before = a.files();
    cut.env = cutting_ssh(&tmp, "out", 20_000);
    let err = cut.fails(&["pull"], 1);
    assert!(err.contains("remote origin"), "{err}");
    assert_eq!(a.files(), a_before);
    a.ok(&["verify"]);
    // The same, uncut: everything arrives.
    a.ok(&["sync"]);
    b.ok(&["sync"]);
    assert_eq!(a.files(), b.files());
    assert_eq!(a.read("/memories/big-b.md").unwrap(), big);
    let r = a.exec(json!({"command": "view", "path": "/memories/big.md"}));
    assert!(!is_error(&r));
}

/// A remote that takes the connection and then never answers: over HTTP
/// (a listener on loopback that reads and says nothing) and over SSH (a
/// transport that never speaks). Each of push, pull, sync and clone gives
/// up after `--remote-timeout` with an error naming the remote, and
/// changes nothing on either side.
#[test]
fn a_remote_that_never_answers_is_given_up_after_the_timeout_and_nothing_changes() {
    let w = world(0);
    let a = &w.machines[0];
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming().flatten() {
            // Read what comes, answer nothing, hang up never.
            let mut c = conn.try_clone().unwrap();
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c, &mut std::io::sink());
            });
            held.push(conn);
        }
    });
    let url = format!("http://127.0.0.1:{port}/vault.git");
    a.ok(&["remote", "add", "stall", &url]);
    a.write("/memories/local.md", "written before the syncs\n");
    let files = a.files();
    let hub_main = || git(&w.hub, &["rev-parse", "refs/heads/main"]).stdout;
    let hub_before = hub_main();
    for args in [
        &["--remote-timeout", "2", "sync", "stall"][..],
        &["--remote-timeout", "2", "pull", "stall"],
        &["--remote-timeout", "2", "push", "stall"],
    ] {
        let t = std::time::Instant::now();
        let err = a.fails(args, 1);
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{args:?} took {:?}",
            t.elapsed()
        );
        assert!(
            err.contains("remote stall") && err.contains("did not answer within 2 s"),
            "{args:?}: {err}"
        );
        assert_eq!(a.files(), files, "{args:?}");
    }
    // SSH: the transport never says a word (it waits for its input to
    // end, so it goes when git is killed).
    let mut silent = Machine::new(a.dir.clone(), a.key.clone());
    silent.env = vec![
        (
            "GIT_SSH_COMMAND".into(),
            "python3 -c 'import sys; sys.stdin.buffer.read()'".into(),
        ),
        ("GIT_SSH_VARIANT".into(), "simple".into()),
    ];
    silent.ok(&["remote", "add", "quiet", "ssh://nobody@127.0.0.1/vault.git"]);
    a.write("/memories/local2.md", "another\n");
    let files = a.files();
    let err = silent.fails(&["--remote-timeout", "1", "push", "quiet"], 1);
    assert!(err.contains("did not answer within 1 s"), "{err}");
    let clone_dir = w._v.tmp.path().join("never");
    let mut c = Machine::new(clone_dir.clone(), a.key.clone());
    c.env = silent.env.clone();
    let err = c.fails(
        &[
            "--remote-timeout",
            "1",
            "clone",
            "ssh://nobody@127.0.0.1/vault.git",
        ],
        1,
    );
    assert!(err.contains("did not answer within 1 s"), "{err}");
    assert!(
        !clone_dir.exists() || std::fs::read_dir(&clone_dir).unwrap().next().is_none(),
        "a clone that timed out left a vault behind"
    );
    // Nothing moved anywhere; the vault is whole and still syncs with a
    // remote that answers.
    assert_eq!(a.files(), files);
    assert_eq!(hub_main(), hub_before);
    a.ok(&["verify"]);
    a.ok(&["sync"]);
    assert_ne!(hub_main(), hub_before);
}

/// In a process that syncs in the background (`serve --sync`), a stalled
/// remote's transport is killed with git at the timeout, even one that
/// would outlive git (real ssh waits on its peer, not its input); the
/// server keeps answering meanwhile, and the next sync tries again.
#[test]
fn a_background_sync_kills_a_stalled_transport_with_git() {
    use std::io::{BufRead, BufReader, Write};
    let w = world(0);
    let a = &w.machines[0];
    let pids = w._v.tmp.path().join("transport-pids");
    // A transport that records its pid, then sleeps, whatever its input
    // (a shell, quick to start even on a loaded machine).
    let mut m = Machine::new(a.dir.clone(), a.key.clone());
    m.env = vec![
        (
            "GIT_SSH_COMMAND".into(),
            format!("sh -c 'echo $$ >>{}; exec sleep 600'", pids.display()),
        ),
        ("GIT_SSH_VARIANT".into(), "simple".into()),
    ];
    m.ok(&["remote", "add", "quiet", "ssh://nobody@127.0.0.1/vault.git"]);
    let mut child = m
        .cmd()
        .args([
            "--remote-timeout",
            "2",
            "serve",
            "--sync",
            "quiet",
            "--sync-every",
            "1h",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let cmd = json!({"command": "create", "path": "/memories/while.md", "file_text": "answered\n"});
    stdin.write_all(format!("{cmd}\n").as_bytes()).unwrap();
    let r: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert!(!is_error(&r), "{r}");
    // The sync at start began, stalled, and was given up after 2 s: its
    // transport is gone too.
    let start = std::time::Instant::now();
    let first = loop {
        if let Some(pid) = std::fs::read_to_string(&pids)
            .ok()
            .and_then(|t| t.lines().next().map(str::to_string))
        {
            break pid;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "no sync began");
        std::thread::sleep(Duration::from_millis(50));
    };
    let proc_dir = std::path::PathBuf::from(format!("/proc/{first}"));
    while proc_dir.exists() {
        // (A zombie, reaped by init, has no cmdline left.)
        if std::fs::read(proc_dir.join("cmdline")).is_ok_and(|c| c.is_empty()) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the stalled transport outlived the timeout"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let cmd = json!({"command": "view", "path": "/memories/while.md"});
    stdin.write_all(format!("{cmd}\n").as_bytes()).unwrap();
    let r: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert!(text(&r).contains("answered"), "{r}");
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("did not answer within 2 s"), "{err}");
    a.ok(&["verify"]);
}
