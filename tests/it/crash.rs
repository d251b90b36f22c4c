//! Crash safety: `memvault serve` killed with SIGKILL in the middle of a
//! stream of writes, many times with seeded timings, loses no acknowledged
//! mutation, applies none by half, and the vault opens clean afterwards
//! (also for plain git: every commit and object is there).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::time::Duration;

use memvault::memory::{MemoryPath, NodeKind, Store, StoreError, ToolResult};
use serde_json::{Value, json};

use crate::util::*;

/// Files below this directory are the test's model.
const DIR: &str = "/memories/k";

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

type Model = BTreeMap<String, String>;

/// A stream of mutations on the model, each with the model after it.
fn plan(rng: &mut Rng, round: u64, start: &Model, n: usize) -> Vec<(Value, Model)> {
    let mut state = start.clone();
    let mut steps = Vec::new();
    for j in 0..n {
        let paths: Vec<String> = state.keys().cloned().collect();
        let cmd = if paths.is_empty() || rng.below(3) == 0 {
            let path = format!("{DIR}/c{round}_{j}.md");
            let text = format!("created in round {round} step {j}\n");
            state.insert(path.clone(), text.clone());
            json!({"command": "create", "path": path, "file_text": text})
        } else {
            let p = paths[rng.below(paths.len() as u64) as usize].clone();
            match rng.below(3) {
                0 => {
                    let old = state[&p].clone();
                    let new = format!("{old}edited in round {round} step {j}\n");
                    state.insert(p.clone(), new.clone());
                    json!({"command": "str_replace", "path": p, "old_str": old, "new_str": new})
                }
                1 => {
                    state.remove(&p);
                    json!({"command": "delete", "path": p})
                }
                _ => {
                    let to = format!("{DIR}/m{round}_{j}.md");
                    let text = state.remove(&p).unwrap();
                    state.insert(to.clone(), text);
                    json!({"command": "rename", "old_path": p, "new_path": to})
                }
            }
        };
        steps.push((cmd, state.clone()));
    }
    steps
}

/// What the vault holds below `DIR`, read through the library (which
/// recovers from the crash when it opens the vault).
fn actual(v: &TestVault) -> Model {
    let mut vault = v.open_library("crash-check");
    let mut found = Model::new();
    vault
        .read(&mut |snap| {
            let dir = MemoryPath::parse(DIR).unwrap();
            // No directory yet (or no more) is an empty model; any other
            // error (a damaged vault) fails the test.
            let entries = match snap.list(&dir) {
                Ok(entries) => entries,
                Err(StoreError::NotFound) => Vec::new(),
                Err(e) => return Err(e),
            };
            for e in entries {
                assert!(matches!(e.kind, NodeKind::File), "unexpected {}", e.name);
                let p = format!("{DIR}/{}", e.name);
                let bytes = snap.read(&MemoryPath::parse(&p).unwrap())?;
                found.insert(p, String::from_utf8(bytes.to_vec()).unwrap());
            }
            Ok(ToolResult::ok("read"))
        })
        .unwrap_or_else(|e| panic!("the vault does not read after the crash: {e}"));
    found
}

#[test]
fn sigkill_during_a_stream_of_writes_loses_no_acknowledged_mutation() {
    let seed: u64 = std::env::var("MEMVAULT_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x6d65_6d76_6175_6c74);
    // 12 rounds by default; CI runs 200 (MEMVAULT_CRASH_ROUNDS).
    let rounds: u64 = std::env::var("MEMVAULT_CRASH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12);
    // The rounds go to four vaults side by side (round n to worker n mod
    // 4), one process at a time on each. A round mostly waits (a
    // process's start, its replies, the pause before the kill): two
    // workers kept the two cores about 40% busy, and four took 5.7 s for
    // 50 rounds against 9.7 s for two.
    // Each worker starts a new vault every 25 of its rounds: `verify`
    // after each round reads the whole history, so one vault for all 200
    // made the run quadratic (50 rounds 17 s, 100 rounds 51 s, 200 about
    // 180 s), while 25 rounds are enough for everything a vault does
    // over time (a checkpoint at each process's close, packs merged at
    // eight).
    const WORKERS: u64 = 4;
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            std::thread::spawn(move || {
                let mine: Vec<u64> = (w..rounds).step_by(WORKERS as usize).collect();
                for chunk in mine.chunks(25) {
                    crash_rounds(seed, chunk.iter().copied());
                }
            })
        })
        .collect();
    for w in workers {
        if let Err(panic) = w.join() {
            std::panic::resume_unwind(panic);
        }
    }
}

/// The rounds `rounds` of the test above, on a vault of their own.
fn crash_rounds(seed: u64, rounds: impl Iterator<Item = u64>) {
    let v = TestVault::new();
    let mut model = Model::new();
    let mut commits = v.commits();
    for round in rounds {
        let mut rng = Rng(seed ^ (round + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let steps = plan(&mut rng, round, &model, 80);
        let mut child = v
            .cmd()
            .args(["serve", "--session", &format!("crash-{round}")])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let lines: Vec<String> = steps.iter().map(|(c, _)| c.to_string()).collect();
        let writer = std::thread::spawn(move || {
            for l in lines {
                if writeln!(stdin, "{l}").is_err() {
                    break;
                }
            }
        });
        let mut out = BufReader::new(child.stdout.take().unwrap());
        // Kill after a seeded number of acknowledgements plus a seeded
        // pause, so the kill lands anywhere in a mutation.
        let kill_after = 1 + rng.below(60) as usize;
        let mut acked = 0;
        let mut line = String::new();
        while acked < kill_after {
            line.clear();
            if out.read_line(&mut line).unwrap() == 0 {
                break;
            }
            let reply: Value = serde_json::from_str(&line).unwrap();
            assert!(!is_error(&reply), "round {round}: {reply}");
            acked += 1;
        }
        std::thread::sleep(Duration::from_micros(rng.below(8000)));
        child.kill().unwrap();
        // Lines already written before the kill are acknowledgements too.
        loop {
            line.clear();
            if out.read_line(&mut line).unwrap() == 0 || !line.ends_with('\n') {
                break;
            }
            let reply: Value = serde_json::from_str(&line).unwrap();
            assert!(!is_error(&reply), "round {round}: {reply}");
            acked += 1;
        }
        child.wait().unwrap();
        writer.join().unwrap();

        let got = actual(&v);
        let after = |n: usize| {
            if n == 0 {
                model.clone()
            } else {
                steps[n - 1].1.clone()
            }
        };
        // The mutation running at the kill may or may not have landed, but
        // wholly or not at all; every acknowledged one has.
        let applied = if got == after(acked) {
            acked
        } else if acked < steps.len() && got == after(acked + 1) {
            acked + 1
        } else {
            panic!(
                "round {round} (seed {seed}): {acked} acknowledged, vault holds {got:?}, expected {:?}",
                after(acked)
            );
        };
        commits += applied;
        // Plain git sees every commit and object after the reopen.
        assert_eq!(v.commits(), commits, "round {round} (seed {seed})");
        git(&v.vault, &["fsck", "--connectivity-only", "--no-dangling"]);
        let report = v.cmd().arg("verify").output().unwrap();
        assert!(
            report.status.success(),
            "round {round} (seed {seed}): verify failed: {}",
            String::from_utf8_lossy(&report.stdout)
        );
        model = got;
    }
    // And the vault still works: a view through `exec` is clean.
    let out = v.one(json!({"command": "view", "path": "/memories"}));
    assert!(!is_error(&out), "{out}");
}

/// `memvault init` killed at seeded moments leaves either no vault (and a
/// new `init` works) or a whole vault that `verify` passes; never a vault
/// that half exists.
#[test]
fn sigkill_during_init_leaves_no_vault_or_a_whole_one() {
    let mut rng = Rng(0x696e_6974_6b69_6c6c);
    let (mut none, mut whole) = (0, 0);
    // Kill moments spread over 1.2 times a whole init on this machine.
    let span = {
        let tmp = tempfile::tempdir().unwrap();
        let key = tmp.path().join("k");
        std::process::Command::new(bin())
            .arg("keygen")
            .arg(&key)
            .output()
            .unwrap();
        let t = std::time::Instant::now();
        let out = std::process::Command::new(bin())
            .arg("--vault")
            .arg(tmp.path().join("v"))
            .arg("--key-file")
            .arg(&key)
            .arg("init")
            .output()
            .unwrap();
        assert!(out.status.success());
        (t.elapsed().as_micros() as u64 * 6 / 5).max(1_000)
    };
    for round in 0..30 {
        let tmp = tempfile::tempdir().unwrap();
        let key = tmp.path().join("k");
        let vault = tmp.path().join("v");
        let ok = std::process::Command::new(bin())
            .arg("keygen")
            .arg(&key)
            .output()
            .unwrap();
        assert!(ok.status.success());
        let cmd = |args: &[&str]| {
            let mut c = std::process::Command::new(bin());
            c.arg("--vault")
                .arg(&vault)
                .arg("--key-file")
                .arg(&key)
                .args(args);
            c.env_remove("MEMVAULT_DIR")
                .env_remove("MEMVAULT_PASSPHRASE");
            c
        };
        let mut child = cmd(&["init"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_micros(rng.below(span)));
        let _ = child.kill();
        child.wait().unwrap();
        if vault.exists() {
            whole += 1;
            let v = cmd(&["verify"]).output().unwrap();
            assert!(
                v.status.success(),
                "round {round}: a vault exists but does not verify: {}{}",
                String::from_utf8_lossy(&v.stdout),
                String::from_utf8_lossy(&v.stderr)
            );
        } else {
            none += 1;
            let again = cmd(&["init"]).output().unwrap();
            assert!(
                again.status.success(),
                "round {round}: init after a killed init failed: {}",
                String::from_utf8_lossy(&again.stderr)
            );
        }
        let w = cmd(&[
            "exec",
            r#"{"command":"create","path":"/memories/a.md","file_text":"a"}"#,
        ])
        .output()
        .unwrap();
        assert!(
            w.status.success(),
            "round {round}: the vault does not take a write"
        );
    }
    eprintln!("init killed 30 times: {none} left no vault, {whole} a whole one");
}
