//! A hostile vault directory: truncated loose commits and trees, and a
//! damaged pack, give the "vault is damaged" error quickly, from every
//! command that reads them, instead of a hang or a crash inside libgit2.
//!
//! Every command runs with a hard timeout: a hang fails the test (the
//! child is killed) rather than hanging the suite.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::util::*;

/// Long enough for a debug build on a loaded machine, far below "forever".
const TIMEOUT: Duration = Duration::from_secs(10);

/// [`run_bounded`](crate::util::run_bounded) with this file's timeout.
fn run_bounded(cmd: &mut Command, input: &str) -> Option<Output> {
    crate::util::run_bounded(cmd, input, TIMEOUT)
}

/// A vault with a few commits whose objects are all loose (each `exec`
/// checkpoints on exit into a pack, unpacked here).
fn vault_with_loose_history() -> TestVault {
    let v = TestVault::new();
    for (path, text) in [
        ("/memories/a.md", "first\n"),
        ("/memories/d/b.md", "second\n"),
        ("/memories/c.md", "third\n"),
    ] {
        let out = v
            .cmd()
            .arg("exec")
            .arg(json!({"command": "create", "path": path, "file_text": text}).to_string())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    unpack_all(&v);
    v
}

fn rev_parse(v: &TestVault, rev: &str) -> String {
    let out = git(&v.vault, &["rev-parse", rev]).stdout;
    String::from_utf8(out).unwrap().trim().to_string()
}

/// The tip of main and its parent, for `show` and `diff` (taken before
/// any damage: git itself may not read the vault after it).
fn tip_and_parent(v: &TestVault) -> (String, String) {
    (
        rev_parse(v, "refs/heads/main"),
        rev_parse(v, "refs/heads/main~1"),
    )
}

fn loose_file(v: &TestVault, oid: &str) -> PathBuf {
    v.vault.join("objects").join(&oid[..2]).join(&oid[2..])
}

/// Cut a loose object's file in half.
fn truncate_loose(v: &TestVault, oid: &str) {
    let path = loose_file(v, oid);
    let bytes = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("object {oid} is not loose ({e}): the test needs it loose"));
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
}

/// The commands a person or an agent runs on a vault, by name.
/// `show` and `diff` name the tip and its parent by id, taken before the
/// damage (the commands before them may add commits).
fn commands(v: &TestVault, tip: &str, parent: &str) -> Vec<(&'static str, Command, String)> {
    let mut out = Vec::new();
    let mut add = |name: &'static str, args: &[&str], input: String| {
        let mut c = v.cmd();
        c.args(args);
        out.push((name, c, input));
    };
    add(
        "view",
        &[
            "exec",
            &json!({"command": "view", "path": "/memories/a.md"}).to_string(),
        ],
        String::new(),
    );
    add(
        "view dir",
        &[
            "exec",
            &json!({"command": "view", "path": "/memories"}).to_string(),
        ],
        String::new(),
    );
    add(
        "create",
        &[
            "exec",
            &json!({"command": "create", "path": "/memories/new.md", "file_text": "x\n"})
                .to_string(),
        ],
        String::new(),
    );
    add(
        "serve",
        &["serve", "--session", "t"],
        format!(
            "{}\n{}\n",
            json!({"command": "view", "path": "/memories/d/b.md"}),
            json!({"command": "create", "path": "/memories/new2.md", "file_text": "y\n"})
        ),
    );
    add("history", &["history"], String::new());
    add("show", &["show", parent, "/memories"], String::new());
    add("diff", &["diff", parent, tip], String::new());
    add("verify", &["verify"], String::new());
    out
}

/// Run every command on `v`; each must finish in time, and each one in
/// `must_fail` must fail saying the vault is damaged (the others may
/// succeed: they do not read the damaged object). A command that fails
/// says "damaged" too.
fn assert_each_command_reports_damage(
    damage: impl FnOnce(&TestVault),
    case: &str,
    must_fail: &[&str],
) {
    let v = &vault_with_loose_history();
    let (tip, parent) = tip_and_parent(v);
    damage(v);
    for (name, mut cmd, input) in commands(v, &tip, &parent) {
        let start = Instant::now();
        let out = run_bounded(&mut cmd, &input)
            .unwrap_or_else(|| panic!("{case}: `{name}` did not finish in {TIMEOUT:?} (a hang)"));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.code().is_some(),
            "{case}: `{name}` was killed by a signal: {:?}",
            out.status
        );
        // A tool error is a result line with is_error; a CLI error is a
        // non-zero exit.
        let tool_error = stdout.contains("\"is_error\":true");
        let failed = !out.status.success() || tool_error;
        let said_damaged = stdout.contains("damaged") || stderr.contains("damaged");
        if must_fail.contains(&name) {
            assert!(
                failed && said_damaged,
                "{case}: `{name}` should report damage; exit {:?}\nstdout: {stdout}\nstderr: {stderr}",
                out.status.code()
            );
        } else if failed {
            assert!(
                said_damaged,
                "{case}: `{name}` failed without saying damaged:\nstdout: {stdout}\nstderr: {stderr}"
            );
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{case}: `{name}` took {:?}",
            start.elapsed()
        );
    }
}

const ALL: &[&str] = &[
    "view", "view dir", "create", "serve", "history", "show", "diff", "verify",
];

#[test]
fn a_truncated_loose_tip_tree_is_damage_not_a_hang() {
    // `history` lists commits from their metadata and reads no tree;
    // `show` reads an older tree.
    assert_each_command_reports_damage(
        |v| truncate_loose(v, &rev_parse(v, "refs/heads/main^{tree}")),
        "tip tree",
        &["view", "view dir", "create", "serve", "diff", "verify"],
    );
}

#[test]
fn a_truncated_loose_older_tree_is_damage_not_a_hang() {
    assert_each_command_reports_damage(
        |v| truncate_loose(v, &rev_parse(v, "refs/heads/main~1^{tree}")),
        "older tree",
        &["show", "diff", "verify"],
    );
}

#[test]
fn a_truncated_loose_subtree_is_damage_not_a_hang() {
    // The tree of /memories/d (the only subtree), shared by the tip and
    // its parent.
    let subtree = |v: &TestVault| {
        let root = rev_parse(v, "refs/heads/main^{tree}");
        // Its own tree, not one of the bucket trees above it (one-digit
        // names).
        let ls = String::from_utf8(git(&v.vault, &["ls-tree", "-r", "-t", &root]).stdout).unwrap();
        let sub = ls
            .lines()
            .find(|l| {
                l.contains(" tree ") && l.rsplit(['/', '\t']).next().is_some_and(|n| n.len() > 1)
            })
            .and_then(|l| l.split_whitespace().nth(2))
            .unwrap()
            .to_string();
        truncate_loose(v, &sub);
    };
    assert_each_command_reports_damage(
        subtree,
        "subtree",
        &["view dir", "serve", "show", "verify"],
    );
}

#[test]
fn a_truncated_loose_tip_commit_is_damage_not_a_hang() {
    assert_each_command_reports_damage(
        |v| truncate_loose(v, &rev_parse(v, "refs/heads/main")),
        "tip commit",
        ALL,
    );
}

#[test]
fn a_truncated_loose_key_state_commit_is_damage_not_a_hang() {
    assert_each_command_reports_damage(
        |v| truncate_loose(v, &rev_parse(v, "refs/memvault/keys")),
        "key-state commit",
        ALL,
    );
}

#[test]
fn a_truncated_loose_key_state_tree_is_damage_not_a_hang() {
    assert_each_command_reports_damage(
        |v| truncate_loose(v, &rev_parse(v, "refs/memvault/keys^{tree}")),
        "key-state tree",
        ALL,
    );
}

#[test]
fn a_truncated_loose_key_table_tree_is_damage_not_a_hang() {
    // The table is read when a file key is first needed: a listing and
    // `show` of a directory need none.
    assert_each_command_reports_damage(
        |v| truncate_loose(v, &rev_parse(v, "refs/memvault/keys:table")),
        "key-table tree",
        &["view", "create", "serve", "diff", "verify"],
    );
}

#[test]
fn a_truncated_loose_keyslot_tree_is_damage_not_a_hang() {
    assert_each_command_reports_damage(
        |v| truncate_loose(v, &rev_parse(v, "refs/memvault/keys:slots")),
        "keyslot tree",
        ALL,
    );
}

#[test]
fn a_damaged_key_table_shard_is_damage_for_its_files_and_verify_only() {
    // A key-table shard is decrypted when one of its keys is first asked
    // for: a damaged one fails the files whose keys it holds, and verify,
    // which opens every shard; the other files still read.
    let v = &vault_with_loose_history();
    let files = ["/memories/a.md", "/memories/d/b.md", "/memories/c.md"];
    let ls = git(&v.vault, &["ls-tree", "-r", "refs/memvault/keys:table"]).stdout;
    let shards: Vec<String> = String::from_utf8(ls)
        .unwrap()
        .lines()
        .map(|l| l.split_whitespace().nth(2).unwrap().to_string())
        .collect();
    assert!(
        !shards.is_empty() && shards.len() <= files.len(),
        "{shards:?}"
    );
    truncate_loose(v, &shards[0]);
    let view = |path: &str| {
        let out = run_bounded(
            v.cmd()
                .arg("exec")
                .arg(json!({"command": "view", "path": path}).to_string()),
            "",
        )
        .expect("view hung");
        assert!(out.status.code().is_some(), "killed: {:?}", out.status);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let failed = !out.status.success() || stdout.contains("\"is_error\":true");
        assert!(
            !failed || stdout.contains("damaged"),
            "{path} failed without saying damaged: {stdout}"
        );
        failed
    };
    let failed: Vec<bool> = files.iter().map(|f| view(f)).collect();
    assert!(
        failed.iter().any(|f| *f),
        "no file's key was in the damaged shard"
    );
    // Three keys in one shard of 4,096: all fail only then.
    if shards.len() > 1 {
        assert!(
            failed.iter().any(|f| !*f),
            "a file in a sound shard did not read"
        );
    }
    let out = run_bounded(v.cmd().arg("verify"), "").expect("verify hung");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("damaged"), "{stdout}");
}

#[test]
fn a_multi_pack_index_is_damage_from_every_command_and_when_planted_later() {
    // libgit2 reads a multi-pack index's offsets before any pack's own
    // index: memvault never writes one, and refuses one found.
    let v = &vault_with_loose_history();
    let (tip, parent) = tip_and_parent(v);
    let midx = v.vault.join("objects/pack/multi-pack-index");
    // Planted while a process runs: its next read is refused.
    let mut vault = v.open_library("t");
    let at = vault.tip().unwrap();
    assert_eq!(vault.files_at(at).unwrap().len(), 3);
    std::fs::write(&midx, b"MIDX\x01\x01\x00\x01").unwrap();
    match vault.files_at(at) {
        Err(e) => assert!(e.to_string().contains("multi-pack"), "{e}"),
        Ok(_) => panic!("read on past a multi-pack index"),
    }
    drop(vault);
    assert_every_command_refuses(v, (&tip, &parent), "multi-pack", &midx);
}

/// Every command on `v` (see [`commands`]) fails saying `word`, and no
/// ref moves; with `file` removed, `verify` passes again.
fn assert_every_command_refuses(
    v: &TestVault,
    (tip, parent): (&str, &str),
    word: &str,
    file: &Path,
) {
    let refs = || String::from_utf8(git(&v.vault, &["for-each-ref"]).stdout).unwrap();
    let before = refs();
    for (name, mut cmd, input) in commands(v, tip, parent) {
        let out = run_bounded(&mut cmd, &input).unwrap_or_else(|| panic!("`{name}` hung"));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.code().is_some(),
            "`{name}` was killed: {:?}",
            out.status
        );
        assert!(
            (!out.status.success() || stdout.contains("\"is_error\":true"))
                && (stdout.contains(word) || stderr.contains(word)),
            "`{name}` should refuse ({word}):\nstdout: {stdout}\nstderr: {stderr}"
        );
        // Said as damage, not as a failure of git.
        assert!(
            !stderr.contains("git error") && !stdout.contains("git object store failed"),
            "`{name}` blamed git:\nstdout: {stdout}\nstderr: {stderr}"
        );
    }
    assert_eq!(refs(), before, "a refused command moved a ref");
    std::fs::remove_file(file).unwrap();
    let out = v.cmd().arg("verify").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn a_process_reads_key_table_shards_it_had_not_read_after_its_own_purge_pruned_the_old_states() {
    // Shards are found when first needed, in the newest table: the tables
    // of replaced key states are pruned after an erasure. (libgit2's object
    // cache may still hold a pruned table tree here, so this pins that the
    // lookups stay right after a purge, not that the old tree is unread.)
    let v = TestVault::new();
    let files: Vec<String> = (0..12).map(|i| format!("/memories/f{i}.md")).collect();
    for (i, f) in files.iter().enumerate() {
        let out = v
            .cmd()
            .arg("exec")
            .arg(
                json!({"command": "create", "path": f, "file_text": format!("text {i}\n")})
                    .to_string(),
            )
            .output()
            .unwrap();
        assert!(out.status.success());
    }
    let mut vault = v.open_library("t");
    let purged = memvault::memory::MemoryPath::parse(&files[0]).unwrap();
    vault.purge(&purged, false).unwrap();
    // Every other file reads, each from a shard this process had not read.
    let tip = vault.tip().unwrap();
    let read = vault.files_at(tip).unwrap();
    assert_eq!(read.len(), files.len() - 1);
}

#[test]
fn an_alternates_file_is_damage_from_every_command_and_changes_nothing() {
    // libgit2 would search the objects directory it names, whose packs and
    // loose files memvault never checks: here the known crashing pack.
    let v = &vault_with_loose_history();
    let (tip, parent) = tip_and_parent(v);
    let elsewhere = tempfile::tempdir().unwrap();
    let pack_dir = elsewhere.path().join("pack");
    std::fs::create_dir_all(&pack_dir).unwrap();
    let (idx, pack) = known_bad_pack(&vault_with_a_pack().vault.join("objects/pack"));
    let stem = "pack-00000000000000000000000000000000000000ff";
    std::fs::write(pack_dir.join(format!("{stem}.idx")), idx).unwrap();
    std::fs::write(pack_dir.join(format!("{stem}.pack")), pack).unwrap();
    let alternates = v.vault.join("objects/info/alternates");
    std::fs::write(&alternates, format!("{}\n", elsewhere.path().display())).unwrap();
    assert_every_command_refuses(v, (&tip, &parent), "alternates", &alternates);
}

/// The pack that crashed libgit2's pack reader (a fuzz artifact), rebuilt
/// from the fuzz input: the input mutates the smallest pack of a vault
/// with packs; here it mutates a pack of this vault the same way.
fn known_bad_pack(pack_dir: &Path) -> (Vec<u8>, Vec<u8>) {
    let input = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz/artifacts/pack_merge/crash-libgit2-segv-packfile-unpack-header"),
    )
    .unwrap();
    let stem = std::fs::read_dir(pack_dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.strip_suffix(".pack").map(str::to_string)
        })
        .min()
        .unwrap();
    let idx = std::fs::read(pack_dir.join(format!("{stem}.idx"))).unwrap();
    let pack = std::fs::read(pack_dir.join(format!("{stem}.pack"))).unwrap();
    assert_eq!(input[0] % 2, 1, "the known input mutates a genuine pack");
    crate::fuzz_replay::checks::pack_merge::mutate(idx, pack, &input[1..])
}

/// A vault whose history is in packs: 70 files in one `serve` (a
/// checkpoint of more than 64 objects writes a pack).
fn vault_with_a_pack() -> TestVault {
    let v = TestVault::new();
    let lines: Vec<String> = (0..70)
        .map(|i| {
            json!({"command": "create", "path": format!("/memories/n{i}.md"),
                "file_text": format!("note {i}\n")})
            .to_string()
        })
        .collect();
    let out = v.serve(&lines);
    assert!(out.iter().all(|o| !is_error(o)));
    v
}

fn pack_stems(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.strip_suffix(".pack").map(str::to_string)
        })
        .collect();
    v.sort();
    v
}

#[test]
fn the_known_libgit2_crashing_pack_is_damage_not_a_segfault() {
    let v = vault_with_a_pack();
    let pack_dir = v.vault.join("objects/pack");
    let stems = pack_stems(&pack_dir);
    assert!(!stems.is_empty(), "the test needs a pack");
    let (idx, pack) = known_bad_pack(&pack_dir);
    // Beside the genuine pack, as the fuzz target placed it, and in its
    // place.
    for replace in [false, true] {
        let v2 = TestVault::new();
        std::fs::remove_dir_all(&v2.vault).unwrap();
        copy_dir(&v.vault, &v2.vault);
        let dir = v2.vault.join("objects/pack");
        let stem = if replace {
            pack_stems(&dir).remove(0)
        } else {
            "pack-00000000000000000000000000000000000000ff".to_string()
        };
        std::fs::write(dir.join(format!("{stem}.idx")), &idx).unwrap();
        std::fs::write(dir.join(format!("{stem}.pack")), &pack).unwrap();
        std::fs::copy(&v.key, &v2.key).unwrap();
        for (name, args) in [
            (
                "view",
                vec![
                    "exec".to_string(),
                    json!({"command": "view", "path": "/memories/n3.md"}).to_string(),
                ],
            ),
            ("verify", vec!["verify".to_string()]),
        ] {
            let out = run_bounded(v2.cmd().args(&args), "")
                .unwrap_or_else(|| panic!("`{name}` hung on the damaged pack"));
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.code().is_some(),
                "`{name}` (replace {replace}) was killed by a signal: {:?}",
                out.status
            );
            assert!(
                !out.status.success() || stdout.contains("\"is_error\":true"),
                "`{name}` (replace {replace}) should fail: {stdout}"
            );
            assert!(
                stdout.contains("damaged") || stderr.contains("damaged"),
                "`{name}` (replace {replace}) should say damaged:\nstdout: {stdout}\nstderr: {stderr}"
            );
        }
    }
}

#[test]
fn a_flipped_byte_in_a_pack_is_reported_as_damage_not_rollback() {
    let v = vault_with_a_pack();
    let out = v.cmd().arg("verify").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let pack_dir = v.vault.join("objects/pack");
    let stem = pack_stems(&pack_dir).remove(0);
    let path = pack_dir.join(format!("{stem}.pack"));
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();
    let out = run_bounded(v.cmd().arg("verify"), "").expect("verify hung");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("damaged") || stderr.contains("damaged"),
        "should report damage:\nstdout: {stdout}\nstderr: {stderr}"
    );
    assert!(
        !stdout.contains("rollback") && !stderr.contains("rollback"),
        "a damaged pack is not a rollback:\nstdout: {stdout}\nstderr: {stderr}"
    );
    // It names the pack file with its index, says what to do, and does
    // not send the reader back to `verify` to locate it.
    let said = format!("{stdout}{stderr}");
    assert!(
        said.contains(&format!("{stem}.pack, with its index {stem}.idx"))
            && said.contains("move that pack file and its index out of objects/pack")
            && !said.contains("run `memvault verify`"),
        "{said}"
    );
    // `gc` refuses it and writes nothing, the log included (round 38d: it
    // checkpointed and scrubbed the log first, though the log's records
    // may be the only other copy of what the pack lost).
    let before = every_file(&v.vault);
    let out = run_bounded(v.cmd().arg("gc"), "").expect("gc hung");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing was changed"));
    assert!(before == every_file(&v.vault), "gc changed a file");
}

/// Every file under `dir` with its bytes, by path.
fn every_file(dir: &std::path::Path) -> std::collections::BTreeMap<std::path::PathBuf, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().map(Result::unwrap) {
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                out.insert(e.path(), std::fs::read(e.path()).unwrap());
            }
        }
    }
    out
}

#[test]
fn a_damaged_commit_below_the_verified_head_is_damage_not_rollback() {
    let v = vault_with_loose_history();
    let out = v.cmd().arg("verify").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // Two more commits above the verified head, then the one between is
    // lost: the walk from the tip cannot reach the verified head.
    for p in ["/memories/e.md", "/memories/f.md"] {
        let out = v
            .cmd()
            .arg("exec")
            .arg(json!({"command": "create", "path": p, "file_text": "x\n"}).to_string())
            .output()
            .unwrap();
        assert!(out.status.success());
    }
    unpack_all(&v);
    std::fs::remove_file(loose_file(&v, &rev_parse(&v, "refs/heads/main~1"))).unwrap();
    let out = run_bounded(v.cmd().arg("verify"), "").expect("verify hung");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("damaged"), "{stdout}");
    assert!(
        !stdout.contains("rollback"),
        "a lost commit is not a rollback: {stdout}"
    );
}

#[test]
fn a_pack_planted_while_a_process_runs_is_refused_at_its_next_read() {
    let v = vault_with_a_pack();
    let mut vault = v.open_library("t");
    let tip = vault.tip().unwrap();
    assert_eq!(vault.files_at(tip).unwrap().len(), 70);
    let dir = v.vault.join("objects/pack");
    let (idx, pack) = known_bad_pack(&dir);
    let stem = "pack-00000000000000000000000000000000000000ff";
    std::fs::write(dir.join(format!("{stem}.pack")), &pack).unwrap();
    std::fs::write(dir.join(format!("{stem}.idx")), &idx).unwrap();
    match vault.files_at(tip) {
        Err(e @ memvault::vault::VaultError::Object(_)) => {
            assert!(e.to_string().contains("pack"), "{e}")
        }
        Err(e) => panic!("not reported as damage: {e}"),
        Ok(_) => panic!("read on through a damaged pack"),
    }
}
