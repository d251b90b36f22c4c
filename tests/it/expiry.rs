//! Expiry and erasure: the access log, `expire`, `purge`, the prune that
//! makes destroyed keys physically gone, crashes in the middle, and a
//! sweep running beside a live `serve`. Time comes from
//! MEMVAULT_TEST_NOW_MS and crashes from MEMVAULT_TEST_CRASH, which only a
//! `test-hooks` build reads: these tests run with
//! `cargo test --features test-hooks` (as `.ci/test` does).
#![cfg(feature = "test-hooks")]

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

use crate::util::*;

const DAY: u64 = 86_400_000;
/// 2026-01-01T00:00:00Z.
const T0: u64 = 1_767_225_600_000;

fn at(c: &mut Command, t: u64) -> &mut Command {
    c.env("MEMVAULT_TEST_NOW_MS", t.to_string())
}

fn serve_at(v: &TestVault, t: u64, cmds: &[Value]) -> Vec<Value> {
    let input: String = cmds.iter().map(|c| format!("{c}\n")).collect();
    let out = run_with_stdin(
        at(v.cmd().args(["serve", "--session", "t"]), t),
        input.as_bytes(),
    );
    assert!(out.status.success());
    parse_lines(&out.stdout)
}

fn create(path: &str, text: &str) -> Value {
    json!({"command": "create", "path": path, "file_text": text})
}

fn view(path: &str) -> Value {
    json!({"command": "view", "path": path})
}

fn run_at(v: &TestVault, t: u64, args: &[&str]) -> Output {
    at(v.cmd().args(args), t).output().unwrap()
}

/// The files at the tip.
fn files(v: &TestVault) -> BTreeSet<String> {
    let listing = v.one(view("/memories"));
    text(&listing)
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once('\t').map(|(_, p)| p.to_string()))
        .filter(|p| !p.ends_with('/') && p != "/memories")
        .collect()
}

fn set(paths: &[&str]) -> BTreeSet<String> {
    paths.iter().map(|p| p.to_string()).collect()
}

/// a, b, c/d written at T0; a viewed at T0+20d; c/ listed (a directory
/// view) at T0+25d; e written at T0+15d.
fn aged_vault() -> TestVault {
    let v = TestVault::new();
    serve_at(
        &v,
        T0,
        &[
            create("/memories/a.md", "alpha\n"),
            create("/memories/b.md", "bravo\n"),
            create("/memories/c/d.md", "delta\n"),
        ],
    );
    serve_at(&v, T0 + 15 * DAY, &[create("/memories/e.md", "echo\n")]);
    let r = serve_at(&v, T0 + 20 * DAY, &[view("/memories/a.md")]);
    assert!(!is_error(&r[0]));
    serve_at(&v, T0 + 25 * DAY, &[view("/memories/c"), view("/memories")]);
    v
}

#[test]
fn expire_keeps_what_was_viewed_or_written_recently_and_dry_run_changes_nothing() {
    let v = aged_vault();
    let now = T0 + 40 * DAY;
    // Dry run: lists b and c/d (never viewed; the directory view does not
    // count), with their last use; changes nothing at all.
    let commits = v.commits();
    let access = std::fs::read(v.vault.join("memvault/access")).unwrap();
    let out = ok(&run_at(
        &v,
        now,
        &["expire", "--older-than", "30d", "--dry-run", "--json"],
    ));
    let lines: Vec<Value> = parse_lines(out.as_bytes());
    let listed: BTreeSet<String> = lines
        .iter()
        .filter_map(|l| l["path"].as_str().map(str::to_string))
        .collect();
    assert_eq!(listed, set(&["/memories/b.md", "/memories/c/d.md"]));
    let b = lines
        .iter()
        .find(|l| l["path"] == "/memories/b.md")
        .unwrap();
    assert_eq!(b["last_written"], "2026-01-01T00:00:00Z");
    assert_eq!(b["last_viewed"], Value::Null);
    assert_eq!(lines.last().unwrap()["dry_run"], true);
    assert_eq!(v.commits(), commits);
    assert_eq!(
        std::fs::read(v.vault.join("memvault/access")).unwrap(),
        access
    );
    assert_eq!(files(&v).len(), 4);

    // The real sweep: one commit marked as an expiry.
    let out = ok(&run_at(&v, now, &["expire", "--older-than", "30d"]));
    assert!(out.contains("2 files expired"), "{out}");
    assert_eq!(v.commits(), commits + 1);
    assert_eq!(files(&v), set(&["/memories/a.md", "/memories/e.md"]));
    let top =
        &parse_lines(ok(&run_at(&v, now, &["history", "--json", "--limit", "1"])).as_bytes())[0];
    assert_eq!(top["op"], "expire");
    // e (written at +15d) goes once 30 days have passed since its write;
    // a since its view at +20d.
    ok(&run_at(
        &v,
        T0 + 46 * DAY,
        &["expire", "--older-than", "30d"],
    ));
    assert_eq!(files(&v), set(&["/memories/a.md"]));
    ok(&run_at(
        &v,
        T0 + 51 * DAY,
        &["expire", "--older-than", "30d"],
    ));
    assert!(files(&v).is_empty());
    assert!(ok(&v.cmd().arg("verify").output().unwrap()).starts_with("ok:"));
    // Bad periods are usage errors.
    assert_eq!(
        run_at(&v, now, &["expire", "--older-than", "soon"])
            .status
            .code(),
        Some(2)
    );
    let zero = run_at(&v, now, &["expire", "--older-than", "0d"]);
    assert_eq!(zero.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&zero.stderr).contains("a period of zero"),
        "{}",
        String::from_utf8_lossy(&zero.stderr)
    );
    // Round 38d: a well-formed period past what is counted says so.
    let long = run_at(&v, now, &["expire", "--older-than", "999999999999d"]);
    assert_eq!(long.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&long.stderr).contains("a longer period than memvault counts"),
        "{}",
        String::from_utf8_lossy(&long.stderr)
    );
}

#[test]
fn erased_versions_no_longer_open_while_other_history_stays_intact() {
    let v = aged_vault();
    let revs: Vec<String> =
        parse_lines(ok(&v.cmd().args(["history", "--json"]).output().unwrap()).as_bytes())
            .iter()
            .map(|l| l["rev"].as_str().unwrap().to_string())
            .collect();
    let first = revs[revs.len() - 2].clone(); // the create of a.md
    let third = revs[revs.len() - 4].clone(); // after c/d.md was created
    assert_eq!(
        ok(&v
            .cmd()
            .args(["show", &third, "/memories/b.md", "--raw"])
            .output()
            .unwrap()),
        "bravo\n"
    );
    ok(&run_at(
        &v,
        T0 + 40 * DAY,
        &["expire", "--older-than", "30d"],
    ));
    // Every old version of the expired files is gone for good...
    for p in ["/memories/b.md", "/memories/c/d.md"] {
        let o = v.cmd().args(["show", &third, p, "--raw"]).output().unwrap();
        assert_eq!(o.status.code(), Some(1), "{p} still opens");
        assert!(String::from_utf8_lossy(&o.stderr).contains("erased"));
    }
    // ...while the others' history is intact.
    assert_eq!(
        ok(&v
            .cmd()
            .args(["show", &first, "/memories/a.md", "--raw"])
            .output()
            .unwrap()),
        "alpha\n"
    );
    // Purge with --keep-current: a's past is erased, its present stays.
    ok(&v
        .cmd()
        .args(["purge", "/memories/a.md", "--keep-current"])
        .output()
        .unwrap());
    assert!(text(&v.one(view("/memories/a.md"))).contains("alpha"));
    let o = v
        .cmd()
        .args(["show", &first, "/memories/a.md", "--raw"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    // diff and verify report erased versions as erased, not damage.
    let d = ok(&v.cmd().args(["diff", &first]).output().unwrap());
    assert!(d.contains("erased"), "{d}");
    let report: Value =
        serde_json::from_str(&ok(&v.cmd().args(["verify", "--json"]).output().unwrap())).unwrap();
    assert_eq!(report["ok"], true, "{report}");
    assert!(report["erased_versions"].as_u64().unwrap() >= 3, "{report}");
    // Reverting the creation of an expired file skips it and says so.
    let create_b = &revs[revs.len() - 3];
    let o = v
        .cmd()
        .args(["revert", create_b, "--force"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(
        said.contains("nothing to undo") || said.contains("erased"),
        "{said}"
    );
}

/// Every file key any key-table object of `v`'s repository holds.
fn keys_in_any_object(v: &TestVault) -> BTreeSet<String> {
    crate::util::keys_in_any_object(&v.vault, &v.key)
}

#[test]
fn after_purge_and_prune_no_object_holds_the_erased_key() {
    let v = TestVault::new();
    serve_at(
        &v,
        T0,
        &[
            create("/memories/secret.md", "salary: 1\n"),
            create("/memories/keep.md", "keep\n"),
            json!({"command": "str_replace", "path": "/memories/secret.md", "old_str": "1", "new_str": "2"}),
            create("/memories/other.md", "other\n"),
        ],
    );
    // Pack what exists, so the prune must handle packed key states too.
    git(&v.vault, &["repack", "-a", "-d", "-q"]);
    serve_at(&v, T0, &[create("/memories/late.md", "late\n")]);
    let secret_key = {
        let mut vault = v.open_library("probe");
        let tip = vault.tip().unwrap();
        let snap = vault.snapshot_at(tip).unwrap();
        snap.file_key_id(&memvault::memory::MemoryPath::parse("/memories/secret.md").unwrap())
            .unwrap()
            .unwrap()
            .to_hex()
    };
    // The probe can find it before the purge (so the check below can fail).
    assert!(keys_in_any_object(&v).contains(&secret_key));
    let out = ok(&v
        .cmd()
        .args(["purge", "/memories/secret.md"])
        .output()
        .unwrap());
    assert!(out.contains("erased 1 key"), "{out}");
    let left = keys_in_any_object(&v);
    assert!(
        !left.contains(&secret_key),
        "the erased key survives in some object"
    );
    assert_eq!(
        left.len(),
        3,
        "the other files' keys are still there: {left:?}"
    );
    assert!(ok(&v.cmd().arg("verify").output().unwrap()).starts_with("ok:"));
    assert_eq!(
        files(&v),
        set(&[
            "/memories/keep.md",
            "/memories/other.md",
            "/memories/late.md"
        ])
    );
    // The tombstone says what was erased and when, without content.
    let top = &parse_lines(
        ok(&v
            .cmd()
            .args(["history", "--json", "--limit", "1"])
            .output()
            .unwrap())
        .as_bytes(),
    )[0];
    assert_eq!(top["op"], "purge");
    assert_eq!(top["path"], "/memories/secret.md");
    let found = plaintext_anywhere(&v.vault, "salary");
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn a_crash_at_any_step_of_expire_or_purge_applies_all_or_nothing() {
    for point in ["after-marker", "after-commit", "after-erase", "mid-prune"] {
        for purge in [false, true] {
            let v = aged_vault();
            let now = T0 + 40 * DAY;
            // The key state that holds the keys the sweep destroys.
            let old_keys =
                String::from_utf8(git(&v.vault, &["rev-parse", "refs/memvault/keys"]).stdout)
                    .unwrap();
            let args: Vec<&str> = if purge {
                vec!["purge", "/memories/b.md"]
            } else {
                vec!["expire", "--older-than", "30d"]
            };
            let o = at(v.cmd().args(&args), now)
                .env("MEMVAULT_TEST_CRASH", point)
                .output()
                .unwrap();
            assert!(!o.status.success(), "{point}: the crash hook did not fire");
            // The vault passes verify right after the crash, which says
            // the erasure's prune is owed...
            let report = ok(&v.cmd().arg("verify").output().unwrap());
            assert!(report.starts_with("ok:"), "{point}: {report}");
            assert!(report.contains("note: an erasure"), "{point}: {report}");
            // ...and holds either none or all of the change.
            let gone: BTreeSet<String> = if purge {
                set(&["/memories/b.md"])
            } else {
                set(&["/memories/b.md", "/memories/c/d.md"])
            };
            let now_files = files(&v);
            let all = set(&[
                "/memories/a.md",
                "/memories/b.md",
                "/memories/c/d.md",
                "/memories/e.md",
            ]);
            if point == "after-marker" {
                assert_eq!(now_files, all, "{point} {args:?}: applied in part");
            } else {
                assert_eq!(
                    now_files,
                    all.difference(&gone).cloned().collect(),
                    "{point} {args:?}"
                );
            }
            // The next writer finishes any interrupted erasure: old versions
            // of removed files no longer open, the rest do.
            serve_at(&v, now, &[create("/memories/z.md", "z\n")]);
            let first =
                parse_lines(ok(&v.cmd().args(["history", "--json"]).output().unwrap()).as_bytes())
                    .iter()
                    .rev()
                    .nth(3)
                    .unwrap()["rev"]
                    .as_str()
                    .unwrap()
                    .to_string();
            for p in &gone {
                let o = v.cmd().args(["show", &first, p, "--raw"]).output().unwrap();
                assert_eq!(
                    o.status.success(),
                    point == "after-marker",
                    "{point} {args:?}: {p}"
                );
            }
            let report = ok(&v.cmd().arg("verify").output().unwrap());
            assert!(
                report.starts_with("ok:") && !report.contains("note:"),
                "{report}"
            );
            assert!(!v.vault.join("memvault/erase-pending").exists());
            // And once the sweep applied, the replaced key state that held
            // the destroyed keys is physically gone, whatever step the
            // crash hit (after the marker alone, nothing was destroyed: that
            // state stays the current one until the next write).
            if point == "after-marker" {
                continue;
            }
            let still = Command::new("git")
                .arg("--git-dir")
                .arg(&v.vault)
                .args(["cat-file", "-e", old_keys.trim()])
                .status()
                .unwrap();
            assert!(
                !still.success(),
                "{point} {args:?}: the old key state is still there"
            );
        }
    }
}

/// A `serve` at `now` kept running (pausing `pause_ms` after each reply,
/// a test hook, when given), asked one command at a time.
struct LiveServe {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl LiveServe {
    fn start(v: &TestVault, now: u64, pause_ms: Option<u64>) -> LiveServe {
        let mut cmd = v.cmd();
        at(cmd.args(["serve", "--session", "live"]), now);
        if let Some(ms) = pause_ms {
            cmd.env("MEMVAULT_TEST_AFTER_REPLY_PAUSE_MS", ms.to_string());
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        LiveServe {
            stdin: child.stdin.take().unwrap(),
            lines: BufReader::new(child.stdout.take().unwrap()).lines(),
            child,
        }
    }

    fn ask(&mut self, cmd: Value) -> Value {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        serde_json::from_str(&self.lines.next().unwrap().unwrap()).unwrap()
    }

    /// End its input and wait for it to close.
    fn stop(self) {
        let LiveServe {
            mut child, stdin, ..
        } = self;
        drop(stdin);
        child.wait().unwrap();
    }
}

#[test]
fn a_sweep_beside_a_live_serve_loses_no_write_and_spares_what_was_just_viewed() {
    let v = TestVault::new();
    let now = T0 + 40 * DAY;
    serve_at(
        &v,
        T0,
        &[
            create("/memories/viewed.md", "v\n"),
            create("/memories/stale.md", "s\n"),
        ],
    );
    let mut live = LiveServe::start(&v, now, None);
    // The view is answered before the sweep starts.
    assert!(!is_error(&live.ask(view("/memories/viewed.md"))));
    let sweep = std::thread::spawn({
        let mut c = v.cmd();
        move || {
            at(c.args(["expire", "--older-than", "30d"]), now)
                .output()
                .unwrap()
        }
    });
    let mut acked = Vec::new();
    for i in 0..40 {
        let p = format!("/memories/new/n{i}.md");
        let r = live.ask(create(&p, "fresh\n"));
        assert!(!is_error(&r), "{r}");
        acked.push(p);
    }
    let sweep = sweep.join().unwrap();
    assert!(
        sweep.status.success(),
        "{}",
        String::from_utf8_lossy(&sweep.stderr)
    );
    live.stop();
    let after = files(&v);
    assert!(after.contains("/memories/viewed.md"));
    assert!(!after.contains("/memories/stale.md"));
    for p in &acked {
        assert!(after.contains(p), "acknowledged write {p} lost");
    }
    assert!(ok(&v.cmd().arg("verify").output().unwrap()).starts_with("ok:"));
}

/// Views that `serve` followers hand to their leader leave their access
/// records too, before a sweep that runs beside them can count the files
/// idle.
#[test]
fn views_handed_to_a_serve_leader_keep_their_files_from_expiry() {
    let v = TestVault::new();
    let now = T0 + 40 * DAY;
    let names = ["a", "b", "c", "d", "stale"];
    let cmds: Vec<Value> = names
        .iter()
        .map(|n| create(&format!("/memories/{n}.md"), "x\n"))
        .collect();
    serve_at(&v, T0, &cmds);
    let mut leader = LiveServe::start(&v, now, None);
    assert!(!is_error(&leader.ask(view("/memories/a.md"))));
    let sock = v.vault.join("memvault/serve.sock");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !sock.exists() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(sock.exists(), "the first serve leads");
    let mut followers: Vec<LiveServe> = (0..3).map(|_| LiveServe::start(&v, now, None)).collect();
    // Creates between the views, from every client: the leader's threads
    // take turns.
    for (i, f) in followers.iter_mut().enumerate() {
        assert!(!is_error(
            &f.ask(create(&format!("/memories/new/f{i}.md"), "n\n"))
        ));
    }
    for (f, n) in followers.iter_mut().zip(["b", "c", "d"]) {
        assert!(!is_error(&f.ask(view(&format!("/memories/{n}.md")))));
    }
    // A sweep waits for the writer lock: one held for good (a view's
    // record never written, as deferred records once could be) would
    // hold it for good.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn({
        let mut c = v.cmd();
        move || {
            let _ = tx.send(
                at(c.args(["expire", "--older-than", "30d"]), now)
                    .output()
                    .unwrap(),
            );
        }
    });
    let Ok(sweep) = rx.recv_timeout(std::time::Duration::from_secs(60)) else {
        let _ = leader.child.kill();
        panic!("the sweep waited a minute for views' records never written");
    };
    assert!(
        sweep.status.success(),
        "{}",
        String::from_utf8_lossy(&sweep.stderr)
    );
    for f in followers {
        f.stop();
    }
    leader.stop();
    let after = files(&v);
    for n in ["a", "b", "c", "d"] {
        assert!(
            after.contains(&format!("/memories/{n}.md")),
            "{n} was viewed: {after:?}"
        );
    }
    assert!(!after.contains("/memories/stale.md"), "{after:?}");
    assert!(ok(&v.cmd().arg("verify").output().unwrap()).starts_with("ok:"));
}

/// View `path` through a `serve` at `now` that pauses `pause_ms` after
/// each reply (a test hook), then run a sweep of files idle for 30 days
/// at once: how long the sweep took, with `serve` still running.
fn sweep_right_after_a_view(
    v: &TestVault,
    now: u64,
    path: &str,
    pause_ms: u64,
) -> std::time::Duration {
    let mut live = LiveServe::start(v, now, Some(pause_ms));
    let r = live.ask(view(path));
    assert!(!is_error(&r), "{r}");
    let started = std::time::Instant::now();
    let sweep = at(v.cmd().args(["expire", "--older-than", "30d"]), now)
        .output()
        .unwrap();
    let took = started.elapsed();
    assert!(
        sweep.status.success(),
        "{}",
        String::from_utf8_lossy(&sweep.stderr)
    );
    live.stop();
    took
}

/// `serve` writes a view's access record before its reply and holds no
/// lock after it: a sweep started right after the reply (while `serve`
/// pauses after it, a test hook) does not wait for `serve` and spares the
/// file, for a small reply as for one too large to fit a pipe; and a
/// `serve` killed right after the reply (before anything it does after
/// replies) lost no view: the file is spared too.
#[test]
fn a_views_record_is_written_before_its_reply_and_survives_a_kill_after_it() {
    let now = T0 + 40 * DAY;
    let big: String = (0..600)
        .map(|i| format!("line {i:03} of a large note, long enough\n"))
        .collect();
    assert!(big.len() > 16 << 10);
    for (text, kill) in [("o\n", false), (big.as_str(), false), ("k\n", true)] {
        let v = TestVault::new();
        let path = "/memories/viewed.md";
        serve_at(&v, T0, &[create(path, text)]);
        if kill {
            // Killed while it pauses after the reply.
            let mut live = LiveServe::start(&v, now, Some(3000));
            let r = live.ask(view(path));
            assert!(!is_error(&r), "{r}");
            live.child.kill().unwrap();
            live.child.wait().unwrap();
            let out = at(v.cmd().args(["expire", "--older-than", "30d"]), now)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        } else {
            let took = sweep_right_after_a_view(&v, now, path, 3000);
            assert!(
                took < std::time::Duration::from_millis(2500),
                "the sweep waited {took:?} for serve after the view of {} bytes",
                text.len()
            );
        }
        assert!(
            files(&v).contains(path),
            "a file viewed before the sweep began was expired (killed: {kill})"
        );
        // Without a view since, the next sweep (ten more days on) removes it.
        let out = at(
            v.cmd().args(["expire", "--older-than", "5d"]),
            now + 10 * DAY,
        )
        .output()
        .unwrap();
        assert!(out.status.success());
        assert!(!files(&v).contains(path));
    }
}

#[test]
fn serve_expire_every_sweeps_inside_the_server() {
    let v = TestVault::new();
    serve_at(&v, T0, &[create("/memories/old.md", "o\n")]);
    let mut child = at(
        v.cmd()
            .args(["serve", "--session", "s", "--expire-every", "1s"]),
        T0 + 40 * DAY,
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    // The sweep says on stderr what it removed.
    let mut err = BufReader::new(child.stderr.take().unwrap()).lines();
    loop {
        let line = err
            .next()
            .expect("serve ended before its sweep ran")
            .unwrap();
        assert!(!line.contains("sweep failed"), "{line}");
        if line.contains("expiry sweep removed 1 file(s)") {
            break;
        }
    }
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{}", view("/memories")).unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let r = parse_lines(&out.stdout);
    assert!(!text(&r[0]).contains("old.md"), "{}", text(&r[0]));
    let top = &parse_lines(
        ok(&v
            .cmd()
            .args(["history", "--json", "--limit", "1"])
            .output()
            .unwrap())
        .as_bytes(),
    )[0];
    assert_eq!(top["op"], "expire");
    assert_eq!(top["actor"], "expiry");
}

/// A file `restore` or `revert` brings back counts as written then: the
/// next sweep keeps it (before, its key's record still said when the old
/// version was written, and the sweep erased it for good).
#[test]
fn a_file_brought_back_by_restore_or_revert_is_not_expired_by_the_next_sweep() {
    let v = TestVault::new();
    serve_at(
        &v,
        T0,
        &[
            create("/memories/old.md", "kept\n"),
            create("/memories/two.md", "also\n"),
        ],
    );
    serve_at(
        &v,
        T0 + DAY,
        &[
            json!({"command": "delete", "path": "/memories/old.md"}),
            json!({"command": "delete", "path": "/memories/two.md"}),
        ],
    );
    let later = T0 + 40 * DAY;
    // HEAD~2: before either delete.
    ok(&run_at(
        &v,
        later,
        &["restore", "/memories/old.md", "--at", "HEAD~2"],
    ));
    // HEAD~1 now: the delete of two.md.
    ok(&run_at(&v, later, &["revert", "HEAD~1"]));
    assert_eq!(files(&v), set(&["/memories/old.md", "/memories/two.md"]));
    let both: Value =
        serde_json::from_str(ok(&run_at(&v, later, &["history", "--json", "--limit", "1"])).trim())
            .unwrap();
    let both = both["rev"].as_str().unwrap().to_string();
    let out = ok(&run_at(&v, later + DAY, &["expire", "--older-than", "30d"]));
    assert!(!out.contains("expired /memories"), "{out}");
    assert_eq!(files(&v), set(&["/memories/old.md", "/memories/two.md"]));
    // Still swept once unused for the period, as any file.
    let out = ok(&run_at(
        &v,
        later + 31 * DAY,
        &["expire", "--older-than", "30d"],
    ));
    assert!(
        out.contains("/memories/old.md") && out.contains("/memories/two.md"),
        "{out}"
    );
    assert!(files(&v).is_empty());
    // Erased: a restore of it is a failure that says so, not a success
    // that did nothing.
    let out = run_at(
        &v,
        later + 31 * DAY,
        &["restore", "/memories/old.md", "--at", &both],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("were erased") && err.contains("/memories/old.md"),
        "{err}"
    );
    assert!(files(&v).is_empty());
}

/// A second purge of a path purged already changes nothing (no empty
/// tombstone) and says so, exit 1, as a purge of a path that never held a
/// file does.
#[test]
fn a_second_purge_of_the_same_path_changes_nothing() {
    let v = TestVault::new();
    let r = v.one(json!({"command": "create", "path": "/memories/p.md", "file_text": "x\n"}));
    assert!(!is_error(&r), "{r}");
    let out = v.cmd().args(["purge", "/memories/p.md"]).output().unwrap();
    ok(&out);
    let commits = v.commits();
    let out = v.cmd().args(["purge", "/memories/p.md"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("erased already"));
    assert_eq!(v.commits(), commits);
}

/// A purge of a file's old name erases the versions it wrote under its new
/// name too (one file key across renames): the output says so, names the
/// file it kept, and the kept file reads as it is now.
#[test]
fn a_purge_of_an_old_name_says_the_renamed_files_past_is_erased_too() {
    let v = TestVault::new();
    for cmd in [
        json!({"command": "create", "path": "/memories/draft.md", "file_text": "d1\n"}),
        json!({"command": "rename", "old_path": "/memories/draft.md", "new_path": "/memories/final.md"}),
        json!({"command": "str_replace", "path": "/memories/final.md", "old_str": "d1", "new_str": "f2"}),
        json!({"command": "str_replace", "path": "/memories/final.md", "old_str": "f2", "new_str": "f3"}),
    ] {
        let r = v.one(cmd);
        assert!(!is_error(&r), "{r}");
    }
    let out = v
        .cmd()
        .args(["purge", "/memories/draft.md"])
        .output()
        .unwrap();
    ok(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("kept, re-encrypted under a new key  /memories/final.md")
            && text.contains(
                "note: /memories/final.md shared a file key with what was purged (a file keeps its key across renames): every earlier version of it is unreadable too"
            ),
        "{text}"
    );
    let r = v.one(json!({"command": "view", "path": "/memories/final.md"}));
    assert!(!is_error(&r) && r.to_string().contains("f3"), "{r}");
    // A purge that kept only files at the path says no such note.
    let r = v.one(json!({"command": "create", "path": "/memories/p.md", "file_text": "p\n"}));
    assert!(!is_error(&r), "{r}");
    let out = v
        .cmd()
        .args(["purge", "/memories/p.md", "--keep-current"])
        .output()
        .unwrap();
    ok(&out);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("note:"));
}

/// An append to the access log cut short (a full disk) leaves part of a
/// record; the views recorded after it still count: a file viewed since
/// is not expired as unused.
#[test]
fn views_recorded_after_a_torn_access_record_still_keep_their_file() {
    let v = TestVault::new();
    serve_at(
        &v,
        T0,
        &[
            create("/memories/used.md", "in daily use\n"),
            create("/memories/idle.md", "idle\n"),
        ],
    );
    let log = v.vault.join("memvault/access");
    let bytes = std::fs::read(&log).unwrap();
    assert!(bytes.len() > 4, "the writes were recorded");
    // The first record's first half, appended again: a torn append.
    let first = 2 + u16::from_le_bytes([bytes[0], bytes[1]]) as usize;
    let mut torn = bytes.clone();
    torn.extend_from_slice(&bytes[..first / 2]);
    std::fs::write(&log, &torn).unwrap();
    let r = serve_at(&v, T0 + 40 * DAY, &[view("/memories/used.md")]);
    assert!(!is_error(&r[0]), "{}", r[0]);
    let out = run_at(
        &v,
        T0 + 41 * DAY,
        &["expire", "--dry-run", "--older-than", "30d"],
    );
    ok(&out);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("/memories/idle.md") && !said.contains("/memories/used.md"),
        "{said}"
    );
}

/// Round 38d: the operator commands that take a path find a file by the
/// name the model wrote, as the memory tool does, though a secret in it
/// was stored as its marker. `purge` of that name said it "never held a
/// file" (naming the stored path, which did) and erased nothing;
/// `history` and `show` found nothing.
#[test]
fn operator_commands_find_a_file_by_the_secret_name_the_model_wrote() {
    let v = TestVault::new();
    let written = "/memories/n-AKIAZ3MXQW7P2LK4N5RT.md";
    let r = v.one(create(written, "customer data\n"));
    assert!(!is_error(&r), "{r}");
    let stdout = |args: &[&str]| ok(&v.cmd().args(args).output().unwrap());
    let listed = stdout(&["history", written]);
    assert!(listed.contains("create"), "{listed}");
    assert!(!listed.contains("AKIAZ3MXQW7P2LK4N5RT"), "{listed}");
    assert_eq!(
        stdout(&["show", "--raw", "HEAD", written]),
        "customer data\n"
    );
    let said = stdout(&["purge", written]);
    assert!(said.contains("erased 1 key"), "{said}");
    assert!(!said.contains("AKIAZ3MXQW7P2LK4N5RT"), "{said}");
    let r = v.one(view("/memories"));
    assert!(!text(&r).contains("n-"), "{r}");
    assert!(plaintext_anywhere(&v.vault, "customer data").is_empty());

    // A file stored under the name as written (the filter was off then)
    // is found under that name first, now and once deleted (the review's
    // case: the redacted name never held it).
    let set = |mode: &str| stdout(&["config", "set", "redaction.mode", mode]);
    set("off");
    let r = v.one(create(written, "raw name\n"));
    assert!(!is_error(&r), "{r}");
    set("redact");
    assert_eq!(stdout(&["show", "--raw", "HEAD", written]), "raw name\n");
    let r = v.one(json!({"command": "delete", "path": written}));
    assert!(!is_error(&r), "{r}");
    let said = stdout(&["purge", written]);
    assert!(said.contains("erased 1 key"), "{said}");
}
