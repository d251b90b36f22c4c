//! `memvault gc`: one pack of what the two refs reach, nothing else kept,
//! nothing reachable lost.

use serde_json::json;

use crate::util::*;

fn count_lines(out: std::process::Output) -> usize {
    String::from_utf8(out.stdout).unwrap().lines().count()
}

#[test]
fn gc_keeps_everything_reachable_in_one_pack_and_drops_the_rest() {
    let v = TestVault::new();
    // Four sessions of five creates: each closes with a key state that
    // takes in its new keys (format 7), chained to the one before.
    for s in 0..4 {
        let lines: Vec<String> = (s * 5..s * 5 + 5)
            .map(|i| json!({"command": "create", "path": format!("/memories/d/n{i}.md"), "file_text": format!("note {i}\n")}).to_string())
            .collect();
        for o in v.serve(&lines) {
            assert!(!is_error(&o), "{o}");
        }
    }
    let mut lines = Vec::new();
    for i in 0..10 {
        lines
            .push(json!({"command": "delete", "path": format!("/memories/d/n{i}.md")}).to_string());
    }
    for o in v.serve(&lines) {
        assert!(!is_error(&o), "{o}");
    }
    let commits = v.commits();
    // An object nothing reaches (as a crash between writing objects and
    // moving a ref leaves them).
    let mut stray = std::process::Command::new("git")
        .args(["hash-object", "-w", "--stdin"])
        .current_dir(&v.vault)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        stray
            .stdin
            .take()
            .unwrap()
            .write_all(b"stray object")
            .unwrap();
    }
    assert!(stray.wait_with_output().unwrap().status.success());
    let all_before = count_lines(git(
        &v.vault,
        &["cat-file", "--batch-all-objects", "--batch-check"],
    ));
    let reachable = count_lines(git(&v.vault, &["rev-list", "--objects", "--all"]));
    assert!(all_before > reachable, "{all_before} <= {reachable}");
    // The key state chains to the states it replaced (only keys were
    // added): they are reachable, and stay.
    let chain = count_lines(git(&v.vault, &["rev-list", "refs/memvault/keys"]));
    assert!(chain > 4, "{chain}");

    let out = v.cmd().arg("gc").output().unwrap();
    ok(&out);

    let packs: Vec<_> = std::fs::read_dir(v.vault.join("objects/pack"))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".pack"))
        .collect();
    assert_eq!(packs.len(), 1);
    let loose = std::fs::read_dir(v.vault.join("objects"))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().len() == 2)
        .count();
    assert_eq!(loose, 0, "loose object directories remain");
    let all_after = count_lines(git(
        &v.vault,
        &["cat-file", "--batch-all-objects", "--batch-check"],
    ));
    assert_eq!(all_after, reachable);
    assert_eq!(v.commits(), commits);
    assert_eq!(
        count_lines(git(&v.vault, &["rev-list", "refs/memvault/keys"])),
        chain
    );
    git(&v.vault, &["fsck", "--connectivity-only", "--no-dangling"]);
    let view = v.one(json!({"command": "view", "path": "/memories/d/n15.md"}));
    assert!(text(&view).contains("note 15"), "{view}");
}

fn pack_count(v: &TestVault) -> usize {
    std::fs::read_dir(v.vault.join("objects/pack"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().ends_with(".pack"))
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn checkpoints_merge_small_packs_without_losing_anything() {
    // Each `serve` checkpoints its log on close, as one pack when it holds
    // more than a few objects. Past 8 packs, the smaller ones are merged.
    let v = TestVault::new();
    let mut most = 0;
    for s in 0..12 {
        let lines: Vec<String> = (0..20)
            .map(|i| json!({"command": "create", "path": format!("/memories/s{s}/n{i}.md"), "file_text": format!("session {s} note {i}\n")}).to_string())
            .collect();
        for o in v.serve(&lines) {
            assert!(!is_error(&o), "{o}");
        }
        most = most.max(pack_count(&v));
    }
    assert!(
        most >= 8,
        "the test must reach the merge threshold ({most})"
    );
    assert!(pack_count(&v) <= 8, "{} packs left", pack_count(&v));
    for s in 0..12 {
        for i in 0..20 {
            let o = v.one(json!({"command": "view", "path": format!("/memories/s{s}/n{i}.md")}));
            assert!(text(&o).contains(&format!("session {s} note {i}")), "{o}");
        }
    }
    let out = v.cmd().arg("verify").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    git(&v.vault, &["fsck", "--connectivity-only", "--no-dangling"]);
}

/// `serve` runs a due checkpoint (after the reply, not inside the
/// request) while it keeps running: packs appear, the log file stays
/// bounded, and nothing is lost.
#[test]
fn serve_checkpoints_after_the_reply_while_it_keeps_running() {
    use std::io::{BufRead, BufReader, Write};
    let v = TestVault::new();
    let mut child = v
        .cmd()
        .args(["serve", "--session", "ckpt"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut ask = |cmd: serde_json::Value| {
        writeln!(stdin, "{cmd}").unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        serde_json::from_str::<serde_json::Value>(&line).unwrap()
    };
    let body = |n: usize| -> String {
        (0..2500)
            .map(|l| format!("note {n} line {l} about the weather\n"))
            .collect()
    };
    let wal = v.vault.join("memvault/wal");
    let mut largest = 0;
    let packs_before = pack_count(&v);
    for n in 0..60 {
        let o = ask(
            json!({"command": "create", "path": format!("/memories/big/n{n}.md"), "file_text": body(n)}),
        );
        assert!(!is_error(&o), "{o}");
        // The reply of the next request comes after the previous
        // request's deferred checkpoint.
        let o =
            ask(json!({"command": "view", "path": "/memories/big/n0.md", "view_range": [1, 1]}));
        assert!(!is_error(&o), "{o}");
        largest = largest.max(std::fs::metadata(&wal).unwrap().len());
    }
    assert!(
        pack_count(&v) > packs_before,
        "no checkpoint ran while serve was open"
    );
    // 60 notes of 100 KB went through a log that holds 4 MiB before a
    // checkpoint (the file is preallocated to 5 MiB).
    assert!(
        largest <= (5 << 20) + (1 << 20),
        "the log grew to {largest} bytes"
    );
    drop(stdin);
    assert!(child.wait().unwrap().success());
    for n in 0..60 {
        let o = v.one(json!({"command": "view", "path": format!("/memories/big/n{n}.md")}));
        assert!(
            text(&o).contains(&format!("note {n} line 2499 about")),
            "note {n}"
        );
    }
    let out = v.cmd().arg("verify").output().unwrap();
    assert!(out.status.success());
}

/// The log file is preallocated and not truncated at checkpoints, so
/// `gc` and an erasure zero what follows its head: earlier records
/// (replaced key tables among them) do not stay in the file.
#[test]
fn gc_and_purge_leave_nothing_after_the_log_head() {
    fn after_head(v: &TestVault) -> Vec<u8> {
        let log = std::fs::read(v.vault.join("memvault/wal")).unwrap();
        assert_eq!(&log[..4], b"MVWL");
        let len = u32::from_le_bytes([log[5], log[6], log[7], log[8]]) as usize;
        log[4 + 1 + 4 + len + 20..].to_vec()
    }
    let v = TestVault::new();
    let write = |from: usize| {
        let lines: Vec<String> = (from..from + 30)
            .map(|i| json!({"command": "create", "path": format!("/memories/n{i}.md"), "file_text": format!("note {i}\n")}).to_string())
            .collect();
        let mut vault = v.open_library("writer");
        let memory = memvault::memory_for_vault(&vault).unwrap();
        for l in &lines {
            let cmd: serde_json::Value = serde_json::from_str(l).unwrap();
            assert!(!memory.execute_json(&mut vault, &cmd).is_error);
        }
        let rest = after_head(&v);
        assert!(rest.iter().any(|&b| b != 0), "records are in the log");
        // Closing checkpoints: the records' bytes stay in the file.
        drop(vault);
        assert!(after_head(&v).iter().any(|&b| b != 0));
    };
    write(0);
    let out = v.cmd().arg("gc").output().unwrap();
    ok(&out);
    let rest = after_head(&v);
    // At least the 64 KiB a log starts with (records grew it further).
    assert!(rest.len() >= 60 << 10, "the log stays preallocated");
    assert!(rest.iter().all(|&b| b == 0), "gc left bytes after the head");

    write(30);
    let out = v.cmd().args(["purge", "/memories/n3.md"]).output().unwrap();
    ok(&out);
    assert!(
        after_head(&v).iter().all(|&b| b == 0),
        "the erasure left bytes after the head"
    );
    for i in (0..60).filter(|i| *i != 3) {
        let o = v.one(json!({"command": "view", "path": format!("/memories/n{i}.md")}));
        assert!(text(&o).contains(&format!("note {i}")), "{o}");
    }
}

/// Regression: `purge` pruned the replaced key states' objects, among them
/// the empty tree, which the init commit on main points to: `git fsck`
/// then reported a missing tree, and a clone of the vault failed.
#[test]
fn purge_keeps_the_empty_tree_of_the_init_commit() {
    let v = TestVault::new();
    // Two key-state changes before the purge: the first key state (whose
    // empty `table` tree is the init commit's tree) is then garbage.
    for name in ["a", "b"] {
        let r = v.one(json!({"command": "create", "path": format!("/memories/{name}.md"), "file_text": "gone\n"}));
        assert!(!is_error(&r), "{r}");
    }
    let out = v.cmd().args(["purge", "/memories/a.md"]).output().unwrap();
    ok(&out);
    let fsck = std::process::Command::new("git")
        .arg("--git-dir")
        .arg(&v.vault)
        .args(["fsck", "--full", "--no-dangling"])
        .output()
        .unwrap();
    assert!(
        fsck.status.success(),
        "git fsck: {}{}",
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
    let dest = v.tmp.path().join("clone");
    let clone = std::process::Command::new("git")
        .args(["clone", "--bare", "-q"])
        .arg(&v.vault)
        .arg(&dest)
        .output()
        .unwrap();
    assert!(
        clone.status.success(),
        "{}",
        String::from_utf8_lossy(&clone.stderr)
    );
}

/// What a killed checkpoint or `gc` leaves in `objects/` (temporary packs
/// and loose files, libgit2's lock files, a pack whose index never came;
/// also a file count's temporary file, though it holds no content)
/// holds whole objects, old key states among them: `gc` deletes it, and so
/// does an erasure, which promises the destroyed keys are gone from disk.
#[test]
fn what_a_killed_write_left_in_objects_is_deleted_by_gc_and_by_an_erasure() {
    let v = TestVault::new();
    for i in 0..3 {
        let r = v.one(json!({"command": "create", "path": format!("/memories/n{i}.md"), "file_text": format!("note {i}\n")}));
        assert!(!is_error(&r), "{r}");
    }
    let out = v.cmd().arg("gc").output().unwrap();
    ok(&out);
    let pack_dir = v.vault.join("objects/pack");
    let real_pack = std::fs::read_dir(&pack_dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "pack"))
        .unwrap();
    let plant = || {
        let bytes = std::fs::read(&real_pack).unwrap();
        let names = [
            "tmp_mv_pack_0a1b2c3d4e5f",
            "pack_git2_Xy12Ab",
            "pack_git2_Xy12Ab.idx.lock",
            "pack-0000000000000000000000000000000000000000.pack",
        ];
        for n in names {
            std::fs::write(pack_dir.join(n), &bytes).unwrap();
        }
        let loose = v.vault.join("objects/ab");
        std::fs::create_dir_all(&loose).unwrap();
        std::fs::write(loose.join("tmp_mv_0a1b2c3d4e5f"), &bytes).unwrap();
        // A file count's temporary file, as a process killed while it
        // wrote one leaves it.
        let count = v.vault.join("memvault/file-count.4242.tmp");
        std::fs::write(&count, "v1 ").unwrap();
        names
            .iter()
            .map(|n| pack_dir.join(n))
            .chain([loose.join("tmp_mv_0a1b2c3d4e5f"), count])
            .collect::<Vec<_>>()
    };
    let left = |planted: &[std::path::PathBuf]| -> Vec<String> {
        planted
            .iter()
            .filter(|p| p.exists())
            .map(|p| p.display().to_string())
            .collect()
    };

    let planted = plant();
    let out = v.cmd().arg("gc").output().unwrap();
    ok(&out);
    assert_eq!(left(&planted), Vec::<String>::new());
    let packs: Vec<_> = std::fs::read_dir(&pack_dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(packs.len(), 2, "one pack and its index: {packs:?}");

    let planted = plant();
    let out = v.cmd().args(["purge", "/memories/n1.md"]).output().unwrap();
    ok(&out);
    assert_eq!(left(&planted), Vec::<String>::new());
    // Nothing reachable was lost.
    let r = v.one(json!({"command": "view", "path": "/memories/n2.md"}));
    assert!(text(&r).contains("note 2"), "{r}");
    let out = v.cmd().arg("verify").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
