//! Vault tests that need the vault's internals: commits forged with a
//! valid MAC (as a buggy or hostile key holder could write) are still
//! caught by the per-blob path binding; the MAC survives the round trip
//! through libgit2's signature header.

use super::*;
use crate::memory::{ChangeFacts, MemoryPath, NodeKind, Op};

fn who() -> Attribution {
    Attribution {
        session: "unit".into(),
        actor: "unit".into(),
    }
}

fn new_vault() -> (tempfile::TempDir, Vault) {
    let tmp = tempfile::tempdir().unwrap();
    let vault = Vault::init(
        &tmp.path().join("v"),
        InitSecret::KeyFile(KeyFileKey::generate()),
        VaultConfig::default(),
        who(),
    )
    .unwrap();
    (tmp, vault)
}

/// A new vault at `<tmp>/v` under a fresh key file, with the key's bytes
/// (for [`reopen`]).
fn new_vault_with(config: VaultConfig) -> (tempfile::TempDir, PathBuf, [u8; 32], Vault) {
    let tmp = tempfile::tempdir().unwrap();
    let key = KeyFileKey::generate();
    let bytes = *key.expose_secret();
    let dir = tmp.path().join("v");
    let vault = Vault::init(&dir, InitSecret::KeyFile(key), config, who()).unwrap();
    (tmp, dir, bytes, vault)
}

/// Another handle on the vault at `dir`, as a new process would open it.
fn reopen(dir: &Path, bytes: &[u8; 32]) -> Vault {
    let key = KeyFileKey::from_bytes(bytes).unwrap();
    Vault::open(dir, &Unlock::KeyFile(&key), who()).unwrap()
}

fn put(vault: &mut Vault, path: &str, content: &[u8]) {
    try_put(vault, path, content).unwrap();
}

fn try_put(vault: &mut Vault, path: &str, content: &[u8]) -> Result<ToolResult, StoreError> {
    let path = MemoryPath::parse(path).unwrap();
    let content = content.to_vec();
    vault.write(&mut |_| {
        Ok(Outcome {
            result: ToolResult::ok("ok"),
            mutation: Some(Mutation {
                op: Op::Create,
                change: Change::Write {
                    path: path.clone(),
                    content: Zeroizing::new(content.clone()),
                },
                facts: ChangeFacts::default(),
            }),
        })
    })
}

fn read(vault: &mut Vault, path: &str) -> Result<Vec<u8>, StoreError> {
    let path = MemoryPath::parse(path).unwrap();
    let tip = vault.tip().unwrap();
    let snap = vault.snapshot_at(tip).unwrap();
    snap.read(&path).map(|z| z.to_vec())
}

/// A commit on `tip` with a valid MAC (as a buggy or hostile key holder
/// could write) whose tree also holds `blob` at the git path `at`, made
/// main's tip as a new process sees it (a running one follows its log).
fn forge_on_main(vault: &mut Vault, tip: Oid, at: &str, blob: Oid) -> Oid {
    let repo = &vault.repo;
    let parent = repo.find_commit(tip).unwrap();
    let mut update = git2::build::TreeUpdateBuilder::new();
    update.upsert(at, blob, git2::FileMode::Blob);
    let tree_id = update
        .create_updated(repo, &parent.tree().unwrap())
        .unwrap();
    let tree = repo.find_tree(tree_id).unwrap();
    let meta = CommitMeta {
        v: META_VERSION,
        op: "forged".into(),
        ..Default::default()
    };
    let forged = write_commit(
        repo,
        &vault.keys,
        &tree,
        std::slice::from_ref(&parent),
        &meta,
        0,
    )
    .unwrap();
    vault
        .repo
        .reference(MAIN_REF, forged, true, "forge")
        .unwrap();
    vault.wal.forget_refs_seen();
    forged
}

#[test]
fn blob_moved_under_a_valid_mac_still_fails_to_open() {
    let (_tmp, mut vault) = new_vault();
    put(&mut vault, "/memories/a.txt", b"alpha");
    put(&mut vault, "/memories/b.txt", b"beta");
    let tip = vault.checked_tip().unwrap().unwrap();
    let (a_oid, b_git) = {
        let snap = vault.snapshot_of(Some(tip)).unwrap();
        let a = MemoryPath::parse("/memories/a.txt").unwrap();
        let b = MemoryPath::parse("/memories/b.txt").unwrap();
        let (a_oid, kind) = snap.entry(&a).unwrap().unwrap();
        assert_eq!(kind, NodeKind::File);
        (a_oid, snap.locate(&b).unwrap().0)
    };
    // Write a commit with a valid MAC whose b.txt is a.txt's blob.
    let new_commit = forge_on_main(&mut vault, tip, b_git.as_str(), a_oid);
    assert!(verify_commit_mac(&vault.repo, &vault.keys, new_commit));
    assert_eq!(read(&mut vault, "/memories/a.txt").unwrap(), b"alpha");
    match read(&mut vault, "/memories/b.txt") {
        Err(StoreError::Damaged(_)) => {}
        other => panic!(
            "a moved blob must not open: {:?}",
            other.map(String::from_utf8)
        ),
    }
}

#[test]
fn mac_survives_the_signature_header_and_detects_changes() {
    let (_tmp, mut vault) = new_vault();
    put(&mut vault, "/memories/x.txt", b"x");
    let tip = vault.checked_tip().unwrap().unwrap();
    assert!(verify_commit_mac(&vault.repo, &vault.keys, tip));
    // Another vault's keys do not verify it.
    let (_tmp2, other) = new_vault();
    assert!(!verify_commit_mac(&vault.repo, &other.keys, tip));
}

#[test]
fn metadata_is_bound_to_its_commit() {
    let (_tmp, mut vault) = new_vault();
    put(&mut vault, "/memories/x.txt", b"x");
    let history = vault.history().unwrap();
    assert_eq!(history[0].1.op, "create");
    assert_eq!(history[0].1.key_id.as_ref().map(String::len), Some(32));
    // The same sealed message on another tree does not open.
    let commit = vault.repo.find_commit(history[0].0.oid()).unwrap();
    let sealed = data_encoding::BASE64
        .decode(commit.message_bytes().trim_ascii())
        .unwrap();
    let wrong = meta_aad(Oid::ZERO_SHA1, commit.parent_ids().next());
    assert!(vault.keys.open_meta(&wrong, &sealed).is_err());
}

#[test]
fn edits_and_renames_keep_the_file_key() {
    let (_tmp, mut vault) = new_vault();
    put(&mut vault, "/memories/d/x.txt", b"one");
    put(&mut vault, "/memories/d/x.txt", b"two");
    let from = MemoryPath::parse("/memories/d").unwrap();
    let to = MemoryPath::parse("/memories/e/f").unwrap();
    vault
        .write(&mut |_| {
            Ok(Outcome {
                result: ToolResult::ok("ok"),
                mutation: Some(Mutation {
                    op: Op::Rename,
                    change: Change::Rename {
                        from: from.clone(),
                        to: to.clone(),
                    },
                    facts: ChangeFacts::default(),
                }),
            })
        })
        .unwrap();
    assert_eq!(read(&mut vault, "/memories/e/f/x.txt").unwrap(), b"two");
    assert!(matches!(
        read(&mut vault, "/memories/d/x.txt"),
        Err(StoreError::NotFound)
    ));
    assert_eq!(vault.key_state.file_key_count(&vault.repo, &vault.keys), 1);
    let history = vault.history().unwrap();
    assert_eq!(history[0].1.op, "rename");
    assert_eq!(history[0].1.files, vec!["/memories/d/x.txt".to_string()]);
    assert_eq!(history[1].1.key_id, history[2].1.key_id);
}

#[test]
fn a_second_handle_sees_new_file_keys_written_by_the_first() {
    let (_tmp, dir, bytes, mut a) = new_vault_with(VaultConfig::default());
    let mut b = reopen(&dir, &bytes);
    put(&mut a, "/memories/new.txt", b"fresh");
    // b's key table is stale until it refreshes, which read() does.
    let got = b
        .read(&mut |snap| {
            let p = MemoryPath::parse("/memories/new.txt").unwrap();
            Ok(ToolResult::ok(
                String::from_utf8(snap.read(&p)?.to_vec()).unwrap(),
            ))
        })
        .unwrap();
    assert_eq!(got.text(), Some("fresh"));
}

fn walk_ids(vault: &mut Vault) -> Vec<(Rev, u64)> {
    vault
        .walk()
        .unwrap()
        .map(|r| r.map(|(id, m)| (id, m.time_ms)))
        .collect::<Result<_, _>>()
        .unwrap()
}

#[test]
fn history_index_is_a_cache_that_never_changes_the_answer() {
    let (_tmp, mut vault) = new_vault();
    for i in 0..300 {
        put(
            &mut vault,
            &format!("/memories/f{}.txt", i % 7),
            format!("{i}").as_bytes(),
        );
    }
    let from_git = walk_ids(&mut vault);
    assert_eq!(from_git.len(), 301);
    let index_file = vault.dir().join("memvault/history-index");
    assert!(index_file.exists(), "a full walk writes the index");
    // Read through the index: the same commits in the same order.
    assert_eq!(walk_ids(&mut vault), from_git);
    // New commits after the index: walked from git, then the index.
    for i in 0..5 {
        put(&mut vault, "/memories/new.txt", format!("{i}").as_bytes());
    }
    let longer = walk_ids(&mut vault);
    assert_eq!(longer.len(), 306);
    assert_eq!(&longer[5..], &from_git[..]);
    assert_eq!(walk_ids(&mut vault), longer);
    // A damaged index only makes it shorter (or unused).
    let mut bytes = std::fs::read(&index_file).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 1;
    std::fs::write(&index_file, &bytes).unwrap();
    assert_eq!(walk_ids(&mut vault), longer);
    // Main moved back (rollback): the index's newer commits are not shown.
    let back = longer[100].0;
    vault
        .repo
        .reference(MAIN_REF, back.oid(), true, "test")
        .unwrap();
    vault.verified_tip = None;
    vault.wal.forget_refs_seen();
    assert_eq!(walk_ids(&mut vault), longer[100..].to_vec());
    // An index sealed with another vault's key is ignored.
    let (_tmp2, mut other) = new_vault();
    for i in 0..300 {
        put(&mut other, "/memories/x.txt", format!("{i}").as_bytes());
    }
    walk_ids(&mut other);
    std::fs::copy(other.dir().join("memvault/history-index"), &index_file).unwrap();
    assert_eq!(walk_ids(&mut vault), longer[100..].to_vec());
}

/// A name held at two depths of one directory (as a memvault that knew
/// only the full depth would write it: the old copy under a bucket, the
/// new one at the full depth, or the other way round) reads as the
/// shallower, and the other is out of every command's reach: `verify`
/// reports it, whichever copy a commit added, under a valid MAC.
#[test]
fn verify_reports_a_name_held_at_two_depths_of_a_directory() {
    for deeper in [false, true] {
        let (_tmp, mut vault) = new_vault();
        for i in 0..20 {
            put(&mut vault, &format!("/memories/d/n{i}.md"), b"old");
        }
        let tip = vault.checked_tip().unwrap().unwrap();
        let n0 = MemoryPath::parse("/memories/d/n0.md").unwrap();
        let (at, blob) = {
            let snap = vault.snapshot_of(Some(tip)).unwrap();
            let (at, found) = snap.locate(&n0).unwrap();
            (at, found.unwrap().0)
        };
        let segs: Vec<&str> = at.split('/').collect();
        assert!(segs.len() >= 3 && segs[segs.len() - 2].len() == 1, "{at}");
        let name = segs[segs.len() - 1];
        let dir: Vec<&str> = segs[..segs.len() - 2].to_vec();
        // The copy: in the directory's own tree, or one bucket further
        // down than the genuine one.
        let copy = if deeper {
            let digits = crate::vault::tree::buckets(name);
            let k = segs.len() - 2 - dir.len() + 1;
            let mut p = segs[..segs.len() - 1].join("/");
            p.push('/');
            p.push(char::from(digits[k]));
            format!("{p}/{name}")
        } else {
            format!("{}/{name}", dir.join("/"))
        };
        let planted = if deeper {
            vault.repo.blob(b"planted").unwrap()
        } else {
            blob
        };
        forge_on_main(&mut vault, tip, &copy, planted);
        let report = vault.verify().unwrap();
        assert!(
            report
                .problems
                .iter()
                .any(|p| p.what.contains("held twice")),
            "deeper {deeper}: {:?}",
            report.problems.iter().map(|p| &p.what).collect::<Vec<_>>()
        );
    }
}

/// Bytes under `objects/` (packs and loose objects).
fn objects_bytes(vault: &Vault) -> u64 {
    fn walk(p: &std::path::Path) -> u64 {
        std::fs::read_dir(p)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let m = e.metadata().unwrap();
                if m.is_dir() { walk(&e.path()) } else { m.len() }
            })
            .sum()
    }
    walk(&vault.dir.join("objects"))
}

/// Format 3: a mutation rewrites a bounded number of small trees whatever
/// the size of its directory, so its log record stays small and the
/// repository grows by a few KiB per 1 KiB create, in a directory of 5,000
/// files as in one of 10 (in format 2, a create in the big directory
/// carried its whole tree, about 450 KB).
#[test]
fn a_mutation_in_a_big_directory_costs_what_one_in_a_small_does() {
    let (_tmp, mut vault) = new_vault();
    let files = (0..5000)
        .map(|i| bulk::ImportFile {
            path: MemoryPath::parse(&format!("/memories/big/note{i:05}.md")).unwrap(),
            content: Zeroizing::new(vec![b'x'; 100]),
            redactions: Vec::new(),
        })
        .collect();
    vault.import_files(files).unwrap();
    for i in 0..10 {
        put(&mut vault, &format!("/memories/small/a{i}.md"), b"a");
    }
    vault.checkpoint().unwrap();
    let mut records = Vec::new();
    let mut growth = Vec::new();
    for dir in ["big", "small", "big", "small"] {
        let objects_before = objects_bytes(&vault);
        for i in 0..50 {
            let before = vault.wal.len().unwrap();
            put(
                &mut vault,
                &format!("/memories/{dir}/n{}-{i}.md", growth.len()),
                &[b'y'; 1024],
            );
            let after = vault.wal.len().unwrap();
            assert!(after > before, "no checkpoint in between");
            records.push(after - before);
        }
        vault.checkpoint().unwrap();
        growth.push((objects_bytes(&vault) - objects_before) / 50);
    }
    // The repository, per 1 KiB create: its blob, the trees on its path
    // (deltas on their previous versions in the checkpoint's pack), the
    // commit, and the key state's change for its new file key.
    assert!(growth.iter().all(|&n| n <= 4096), "{growth:?}");
    // The log record: the same objects whole.
    assert!(records.iter().all(|&n| n < 8192), "{records:?}");
    // The big directory costs about what the small one does: the median
    // record of each run of 50 (a create that fills a bucket tree past
    // 16 entries splits it, and its record carries the new buckets: one
    // in about 16 in a directory of thousands).
    let median = |r: &[u64]| {
        let mut r = r.to_vec();
        r.sort_unstable();
        r[r.len() / 2]
    };
    let (big, small) = (median(&records[..50]), median(&records[50..100]));
    assert!(big < small + 1536, "{big} vs {small}: {records:?}");
    let tip = vault.tip().unwrap();
    let snap = vault.snapshot_at(tip).unwrap();
    let big = MemoryPath::parse("/memories/big").unwrap();
    assert_eq!(snap.list(&big).unwrap().len(), 5100);
    assert_eq!(snap.count_files().unwrap(), 5210);
}

/// The bucket digits are one hex digit per level, spread over all 16.
#[test]
fn bucket_digits_cover_every_value() {
    use crate::vault::tree::{FANOUT_LEVELS, buckets, fanned_git_path, flat_git_path, is_bucket};
    let keys = crate::crypto::VaultKeys::derive(&crate::crypto::Keyring::new_random());
    let mut seen = [[false; 16]; FANOUT_LEVELS];
    for i in 0..2000 {
        let enc = keys.encrypt_name("/memories", &format!("n{i}")).unwrap();
        for (level, b) in buckets(&enc).iter().enumerate() {
            assert!(is_bucket(&[*b]));
            seen[level][usize::from_str_radix(&char::from(*b).to_string(), 16).unwrap()] = true;
        }
        let g = fanned_git_path(&format!("{enc}/{enc}"));
        assert_eq!(g.split('/').count(), 2 * (FANOUT_LEVELS + 1));
        assert_eq!(flat_git_path(&g), format!("{enc}/{enc}"));
        assert_eq!(fanned_git_path(&g), g);
    }
    assert!(seen.iter().all(|l| l.iter().all(|&s| s)));
}

fn two_handles() -> (tempfile::TempDir, Vault, Vault) {
    let (tmp, dir, bytes, a) = new_vault_with(VaultConfig::default());
    let b = reopen(&dir, &bytes);
    (tmp, a, b)
}

#[test]
fn views_recorded_after_another_handle_compacted_the_access_log_are_kept() {
    use crate::vault::retention::access::Kind;
    let (_tmp, a, b) = two_handles();
    let id = crate::crypto::FileKeyId([7; 16]);
    // a holds the log open from its first append on.
    a.record_access(&[(id, Kind::Viewed, 1_000)]);
    // b rewrites it (as `expire` does): a new file takes its name.
    let table = b.access_table().unwrap();
    assert_eq!(table[&id].viewed_ms, Some(1_000));
    b.compact_access(&table).unwrap();
    // a's next view lands in the log that has the name now.
    a.record_access(&[(id, Kind::Viewed, 2_000)]);
    assert_eq!(b.access_table().unwrap()[&id].viewed_ms, Some(2_000));
    // And again, when the log was removed outright.
    std::fs::remove_file(b.dir().join("memvault/access")).unwrap();
    a.record_access(&[(id, Kind::Viewed, 3_000)]);
    assert_eq!(b.access_table().unwrap()[&id].viewed_ms, Some(3_000));
}

#[test]
fn views_alone_keep_the_access_log_bounded_and_every_newest_time() {
    use crate::vault::retention::access::{COMPACT_AT_LEAST, Kind};
    let (_tmp, a, b) = two_handles();
    let ids: Vec<_> = (0..3u8)
        .map(|i| crate::crypto::FileKeyId([i; 16]))
        .collect();
    let log = a.dir().join("memvault/access");
    let mut largest = 0;
    for t in 0..4_000u64 {
        a.record_access(&[(ids[(t % 3) as usize], Kind::Viewed, 10_000 + t)]);
        largest = largest.max(std::fs::metadata(&log).unwrap().len());
    }
    // One record is 2 + 24 + 25 + 16 bytes: 4,000 of them would be 268 KB.
    assert!(largest <= COMPACT_AT_LEAST + 100, "{largest}");
    let table = b.access_table().unwrap();
    for (i, id) in ids.iter().enumerate() {
        let newest = (0..4_000u64).filter(|t| t % 3 == i as u64).max().unwrap();
        assert_eq!(table[id].viewed_ms, Some(10_000 + newest));
    }
    // While another process holds the writer lock (shared: it is
    // recording a view), a view does not wait for it to compact: the log
    // grows past its bound, and the next write, holding the lock
    // exclusively, compacts it.
    let other = std::sync::Arc::new(std::fs::File::open(b.dir().join("memvault/lock")).unwrap());
    let held = crate::vault::FileLock::shared_on(&other).unwrap();
    for t in 0..2_000u64 {
        a.record_access(&[(ids[0], Kind::Viewed, 20_000 + t)]);
    }
    let grown = std::fs::metadata(&log).unwrap().len();
    assert!(grown > COMPACT_AT_LEAST, "{grown}");
    drop(held);
    let mut a = a;
    put(&mut a, "/memories/x.txt", b"one");
    assert!(std::fs::metadata(&log).unwrap().len() < 1_000);
    assert_eq!(b.access_table().unwrap()[&ids[0]].viewed_ms, Some(21_999));
}

#[test]
fn a_running_handle_and_a_new_one_refuse_a_ref_moved_back_under_them() {
    let (_tmp, dir, bytes, mut a) = new_vault_with(VaultConfig::default());
    put(&mut a, "/memories/x.txt", b"one");
    a.checkpoint().unwrap();
    put(&mut a, "/memories/x.txt", b"two");
    a.checkpoint().unwrap();
    assert_eq!(read(&mut a, "/memories/x.txt").unwrap(), b"two");
    // verify remembers the newest tip it has seen.
    assert!(a.verify().unwrap().ok());
    // Main moved back outside memvault (a rollback).
    let tip = a.checked_tip().unwrap().unwrap();
    let parent = a.repo.find_commit(tip).unwrap().parent_id(0).unwrap();
    a.repo
        .reference(MAIN_REF, parent, true, "rollback")
        .unwrap();
    // The running handle refuses to read, as a new one refuses to open:
    // it answers neither from the state main was set back to nor as if
    // nothing had happened.
    assert!(matches!(a.tip(), Err(VaultError::RolledBack(_))));
    // verify judges the ref files as they are and finds the rollback; a
    // new handle refuses to open (the log is newer than main).
    let report = a.verify().unwrap();
    assert!(!report.ok());
    assert!(format!("{:?}", report.problems).contains("roll"));
    let key = KeyFileKey::from_bytes(&bytes).unwrap();
    let opened = Vault::open(&dir, &Unlock::KeyFile(&key), who());
    assert!(matches!(opened, Err(VaultError::RolledBack(_))));
}

/// A ref moved back under a running writer (main to an ancestor, the key
/// state to an older state) is refused as a rollback: the next write does
/// not build on the old state (which would drop the acknowledged writes
/// after it from history), nothing changes, a new handle refuses to open,
/// and once the ref files are put back everything is there.
#[test]
fn a_ref_moved_back_under_a_running_writer_loses_no_acknowledged_write() {
    for with_main in [true, false] {
        let (_tmp, dir, bytes, mut a) = new_vault_with(VaultConfig::default());
        put(&mut a, "/memories/x.txt", b"one");
        a.checkpoint().unwrap();
        let old_main = a.repo.refname_to_id(MAIN_REF).unwrap();
        let old_keys = a.repo.refname_to_id(keys::KEYS_REF).unwrap();
        put(&mut a, "/memories/x.txt", b"two");
        // A new file: a new key, so a newer key state.
        put(&mut a, "/memories/y.txt", b"why");
        a.checkpoint().unwrap();
        let now = [MAIN_REF, keys::KEYS_REF].map(|n| (n, a.repo.refname_to_id(n).unwrap()));
        let mut moved = vec![(keys::KEYS_REF, old_keys)];
        if with_main {
            moved.push((MAIN_REF, old_main));
        }
        for (name, id) in &moved {
            a.repo.reference(name, *id, true, "rollback").unwrap();
        }
        let refused = try_put(&mut a, "/memories/z.txt", b"zed").unwrap_err();
        assert!(format!("{refused}").contains("rollback"), "{refused}");
        // It names the log's target, and a command to put the ref back.
        let (name, logged) = now[if with_main { 0 } else { 1 }];
        let said = format!("{refused}");
        assert!(said.contains(&format!("{logged}")), "{said}");
        assert!(said.contains(&format!("`git update-ref {name} ")), "{said}");
        for (name, id) in &moved {
            assert_eq!(a.repo.refname_to_id(name).unwrap(), *id, "{name} changed");
        }
        // A read in the running handle refuses too, main moved back or
        // not: it does not answer from a state the log has moved past.
        match a.tip() {
            Err(e) => assert!(matches!(e, VaultError::RolledBack(_)), "{e}"),
            Ok(t) => panic!("read at {t:?}"),
        }
        let key = KeyFileKey::from_bytes(&bytes).unwrap();
        let opened = Vault::open(&dir, &Unlock::KeyFile(&key), who());
        assert!(matches!(opened, Err(VaultError::RolledBack(_))));
        // The ref files put back: everything acknowledged is there.
        for (name, id) in now {
            a.repo.reference(name, id, true, "restored").unwrap();
        }
        put(&mut a, "/memories/z.txt", b"zed");
        for v in [&mut a, &mut reopen(&dir, &bytes)] {
            assert_eq!(read(v, "/memories/x.txt").unwrap(), b"two");
            assert_eq!(read(v, "/memories/y.txt").unwrap(), b"why");
            assert_eq!(read(v, "/memories/z.txt").unwrap(), b"zed");
            let report = v.verify().unwrap();
            assert!(report.ok(), "{:?}", report.problems);
        }
    }
}

/// A ref set outside memvault to a commit that does not hold the log's
/// target (not an ancestor either: a commit of another line) while the
/// log holds records is refused too, naming the log's target: adopting it
/// would drop the acknowledged writes since the last checkpoint. Put
/// back, everything is there.
#[test]
fn a_ref_set_sideways_under_a_running_writer_loses_no_acknowledged_write() {
    for name in [MAIN_REF, keys::KEYS_REF] {
        let (_tmp, dir, bytes, mut a) = new_vault_with(VaultConfig::default());
        put(&mut a, "/memories/x.txt", b"one");
        a.checkpoint().unwrap();
        // Records since the checkpoint, not yet in git.
        put(&mut a, "/memories/x.txt", b"two");
        put(&mut a, "/memories/y.txt", b"why");
        let logged = a.wal.ref_target(&a.repo, name).unwrap().unwrap();
        // A commit on a line of its own (no parent; the empty tree),
        // written to disk, as another tool would.
        let sideways = {
            let other = git2::Repository::open(a.repo.path()).unwrap();
            let tree = other.treebuilder(None).unwrap().write().unwrap();
            let tree = other.find_tree(tree).unwrap();
            let sig = git2::Signature::new("x", "x@x", &git2::Time::new(1, 0)).unwrap();
            other
                .commit(None, &sig, &sig, "elsewhere", &tree, &[])
                .unwrap()
        };
        a.repo.reference(name, sideways, true, "sideways").unwrap();
        let refused = try_put(&mut a, "/memories/z.txt", b"zed").unwrap_err();
        let said = format!("{refused}");
        assert!(said.contains("set outside memvault"), "{name}: {said}");
        // The log's newest, which for the key state is the one that took
        // in the shards logged since (format 7), written before the ref
        // files are judged.
        let logged = match name {
            MAIN_REF => logged,
            _ => a.wal.tail_target(name).unwrap(),
        };
        assert!(said.contains(&format!("{logged}")), "{name}: {said}");
        assert_eq!(a.repo.refname_to_id(name).unwrap(), sideways);
        let key = KeyFileKey::from_bytes(&bytes).unwrap();
        let opened = Vault::open(&dir, &Unlock::KeyFile(&key), who());
        // (A key state that is not this vault's does not unlock: the open
        // stops there, before the log is looked at.)
        assert!(
            matches!(opened, Err(VaultError::RolledBack(_)))
                || (name == keys::KEYS_REF && matches!(opened, Err(VaultError::Damaged(_)))),
            "{name}: {:?}",
            opened.as_ref().err()
        );
        assert_eq!(a.repo.refname_to_id(name).unwrap(), sideways);
        // Put back as the refusal says, with git itself (which refuses a
        // ref to an object only the log holds): every acknowledged write
        // is there.
        let command = said.split('`').nth(1).expect("a command in backquotes");
        let words: Vec<&str> = command.split(' ').collect();
        assert_eq!(words[..3], ["git", "update-ref", name], "{said}");
        let out = std::process::Command::new("git")
            .env("GIT_DIR", a.repo.path())
            .args(&words[1..])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{command}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        drop(a);
        let mut v = reopen(&dir, &bytes);
        assert_eq!(read(&mut v, "/memories/x.txt").unwrap(), b"two");
        assert_eq!(read(&mut v, "/memories/y.txt").unwrap(), b"why");
        put(&mut v, "/memories/z.txt", b"zed");
        let report = v.verify().unwrap();
        assert!(report.ok(), "{name}: {:?}", report.problems);
    }
}

#[test]
fn a_file_count_carried_to_a_new_handle_is_used_for_its_tree_only() {
    let (_tmp, dir, bytes, mut a) = new_vault_with(VaultConfig {
        max_files: 3,
        ..VaultConfig::default()
    });
    put(&mut a, "/memories/one.txt", b"1");
    let first = a.known_file_count().expect("a create counts the files");
    assert_eq!(first.files, 1);
    put(&mut a, "/memories/two.txt", b"2");
    let count = a.known_file_count().unwrap();
    assert_eq!(count.files, 2);
    assert_ne!(first.tree, count.tree);
    let stale = FileCount {
        tree: first.tree,
        files: 3,
    };
    drop(a);
    let open = || reopen(&dir, &bytes);
    // A count said to be at the limit, for the tip's tree: the create is
    // refused without counting (the count is taken as it is given).
    let mut b = open();
    b.seed_file_count(FileCount {
        tree: count.tree,
        files: 3,
    });
    let refused = b.write(&mut |_| {
        Ok(Outcome {
            result: ToolResult::ok("ok"),
            mutation: Some(Mutation {
                op: Op::Create,
                change: Change::Write {
                    path: MemoryPath::parse("/memories/three.txt").unwrap(),
                    content: Zeroizing::new(b"3".to_vec()),
                },
                facts: ChangeFacts::default(),
            }),
        })
    });
    assert!(refused.is_err(), "the seeded count was not used");
    drop(b);
    // (b left the count it was given in `memvault/file-count`, for the
    // tip's tree: taken away, this tests the seed alone.)
    std::fs::remove_file(dir.join(FILE_COUNT_FILE)).unwrap();
    // A count for a tree that is no longer the tip's changes nothing.
    let mut c = open();
    c.seed_file_count(stale);
    put(&mut c, "/memories/three.txt", b"3");
    assert_eq!(c.known_file_count().unwrap().files, 3);
}

/// The id of the key `path`'s file is sealed under, at the tip.
fn key_id_of(vault: &mut Vault, path: &MemoryPath) -> crate::crypto::FileKeyId {
    let tip = vault.tip().unwrap();
    let snap = vault.snapshot_at(tip).unwrap();
    snap.file_key_id(path).unwrap().unwrap()
}

/// A commit that adds the file key `id` and nothing else (as a create
/// whose key lands in that shard does).
fn add_key_alone(vault: &mut Vault, id: crate::crypto::FileKeyId) {
    vault
        .with_writer_lock(|v, tip| {
            let tree = v.tree_of(tip)?.unwrap();
            let meta = v.new_meta("test");
            let key = crate::crypto::FileKey::generate();
            let change = keys::KeyChange::files(vec![(id, Some(key))]);
            v.publish(tip, tree, change, &meta, Vec::new())
        })
        .unwrap();
}

/// Format 7: a create logs its key-table shard alone; a shard replaced by
/// a later one before any key state took it in never reaches git, and a
/// purge leaves no copy of the destroyed key in any object.
#[test]
fn a_shard_replaced_before_a_key_state_took_it_in_never_reaches_git_nor_outlives_a_purge() {
    let (_tmp, dir, bytes, mut a) = new_vault_with(VaultConfig::default());
    put(&mut a, "/memories/secret.txt", b"salary");
    let path = MemoryPath::parse("/memories/secret.txt").unwrap();
    let secret = key_id_of(&mut a, &path);
    let shard = crate::crypto::ShardLayout::Wide.shard_of(&secret);
    // Logged alone: the key state did not move.
    assert_eq!(a.wal.pending_keys().0.len(), 1);
    assert!(a.key_state.pending.contains_key(&shard));
    // A second key in the same shard, added on its own (a create whose key
    // lands there), replaces the shard before any key state holds it.
    let mut other = secret;
    other.0[15] ^= 1;
    let replaced = a.key_state.pending[&shard];
    add_key_alone(&mut a, other);
    assert_ne!(a.key_state.pending[&shard], replaced);
    // A second handle reads the file through the log's shards.
    let mut b = reopen(&dir, &bytes);
    assert_eq!(read(&mut b, "/memories/secret.txt").unwrap(), b"salary");
    drop(b);
    // The reopen checkpointed (a key state took the shards in first):
    // the replaced shard is nowhere in git, its successor is.
    let on_disk = git2::Repository::open_bare(&dir).unwrap();
    assert!(on_disk.odb().unwrap().read(replaced).is_err());
    assert!(on_disk.odb().unwrap().exists(a.key_state.pending[&shard]));
    a.purge(&path, false).unwrap();
    let on_disk = git2::Repository::open_bare(&dir).unwrap();
    let mut holding = Vec::new();
    on_disk
        .odb()
        .unwrap()
        .foreach(|id| {
            holding.push(*id);
            true
        })
        .unwrap();
    assert!(holding.len() > 10);
    let odb = on_disk.odb().unwrap();
    for id in holding {
        let Ok(o) = odb.read(id) else { continue };
        if let Ok(table) =
            a.keys
                .open_table_shard(crate::crypto::ShardLayout::Wide, shard, o.data())
        {
            assert!(table.get(&secret).is_none(), "{id} still holds the key");
        }
    }
    let mut v = reopen(&dir, &bytes);
    assert!(v.verify().unwrap().ok());
}

/// Format 7: two handles (two processes) add keys to one shard while no
/// key state holds either; each reads through the log's shards, and the
/// key state a checkpoint writes holds both.
#[test]
fn two_handles_adding_keys_to_one_shard_keep_both_and_a_checkpoint_takes_them_in() {
    let (_tmp, dir, bytes, mut a) = new_vault_with(VaultConfig::default());
    let mut b = reopen(&dir, &bytes);
    let keys_before = a.key_state.commit;
    put(&mut a, "/memories/one.txt", b"one");
    let path = MemoryPath::parse("/memories/one.txt").unwrap();
    let one = key_id_of(&mut a, &path);
    let mut other = one;
    other.0[15] ^= 1;
    // b adds a key to the shard a's create replaced (it reads a's shard
    // from the log and seals one holding both).
    add_key_alone(&mut b, other);
    assert_eq!(b.key_state.commit, keys_before, "no key state was written");
    assert_eq!(read(&mut b, "/memories/one.txt").unwrap(), b"one");
    assert_eq!(read(&mut a, "/memories/one.txt").unwrap(), b"one");
    assert!(
        a.key_state
            .file_key(&a.repo, &a.keys, &other)
            .unwrap()
            .is_some()
    );
    // b closes: its checkpoint writes a key state holding both keys.
    drop(b);
    let mut c = reopen(&dir, &bytes);
    assert_ne!(c.key_state.commit, keys_before);
    assert!(c.key_state.pending.is_empty());
    for id in [&one, &other] {
        assert!(
            c.key_state
                .file_key(&c.repo, &c.keys, id)
                .unwrap()
                .is_some()
        );
    }
    assert_eq!(read(&mut c, "/memories/one.txt").unwrap(), b"one");
    assert_eq!(read(&mut a, "/memories/one.txt").unwrap(), b"one");
    put(&mut a, "/memories/two.txt", b"two");
    drop(a);
    assert_eq!(read(&mut c, "/memories/two.txt").unwrap(), b"two");
    assert!(c.verify().unwrap().ok());
}

/// Apply one change of the memory layer's kind (no checks of its own).
fn change(vault: &mut Vault, op: Op, change: Change) {
    let mut change = Some(change);
    vault
        .write(&mut |_| {
            Ok(Outcome {
                result: ToolResult::ok("ok"),
                mutation: Some(Mutation {
                    op,
                    change: change.take().expect("one mutation"),
                    facts: ChangeFacts::default(),
                }),
            })
        })
        .unwrap();
}

/// The file count a handle carries from one tree to the next (a create
/// adds one, an edit or a rename none, a delete the files below it) is the
/// count a walk of the new tree gives, after every step of a random run;
/// and the count a closing handle leaves in `memvault/file-count` is what
/// the next process starts from, refused when altered or for another tree.
#[test]
fn the_file_count_carried_between_trees_and_processes_is_the_walked_one() {
    let (_tmp, dir, bytes, mut a) = new_vault_with(VaultConfig::default());
    let mut rng = 0x5eed_u64;
    let mut carried = 0;
    for step in 0..300 {
        let tip = a.tip().unwrap();
        let files = a
            .snapshot_at(tip)
            .unwrap()
            .files_below(&MemoryPath::root())
            .unwrap();
        let dir_of = |i: usize| format!("/memories/d{}", i % 4);
        let p = |s: String| MemoryPath::parse(&s).unwrap();
        match crate::test_rand(&mut rng, 10) {
            0..=4 => {
                let n = crate::test_rand(&mut rng, 1000);
                let path = p(format!("{}/f{n}.md", dir_of(n)));
                change(
                    &mut a,
                    Op::Create,
                    Change::Write {
                        path,
                        content: Zeroizing::new(b"x".to_vec()),
                    },
                );
            }
            5 | 6 if !files.is_empty() => {
                let f = files[crate::test_rand(&mut rng, files.len())].clone();
                change(
                    &mut a,
                    Op::StrReplace,
                    Change::Write {
                        path: f,
                        content: Zeroizing::new(format!("{step}").into_bytes()),
                    },
                );
            }
            7 if !files.is_empty() => {
                let f = files[crate::test_rand(&mut rng, files.len())].clone();
                let to = p(format!("/memories/moved/r{step}.md"));
                change(&mut a, Op::Rename, Change::Rename { from: f, to });
            }
            8 if !files.is_empty() => {
                let f = files[crate::test_rand(&mut rng, files.len())].clone();
                change(&mut a, Op::Delete, Change::Delete { path: f });
            }
            9 => {
                // A whole directory: deleted, or renamed under another.
                let d = p(dir_of(crate::test_rand(&mut rng, 4)));
                if a.snapshot_at(tip)
                    .unwrap()
                    .files_below(&d)
                    .unwrap()
                    .is_empty()
                {
                    continue;
                }
                if crate::test_rand(&mut rng, 2) == 0 {
                    change(&mut a, Op::Delete, Change::Delete { path: d });
                } else {
                    let to = p(format!("/memories/dirs/m{step}"));
                    change(&mut a, Op::Rename, Change::Rename { from: d, to });
                }
            }
            _ => continue,
        }
        let tip = a.tip().unwrap();
        let walked = {
            let fresh = reopen(&dir, &bytes);
            let t = fresh.tree_of(tip.map(|r| r.oid())).unwrap();
            let caches = Caches::default();
            let snap = VaultSnapshot::new(&fresh.repo, &fresh.keys, &fresh.key_state, &caches, t);
            snap.count_files().unwrap()
        };
        if let Some(count) = a.known_file_count() {
            assert_eq!(count.files, walked, "step {step}");
            carried += 1;
        }
    }
    assert!(
        carried > 250,
        "the count was carried at {carried} steps only"
    );
    // Closed: the next process takes the count from the file, for the
    // tip's tree only, and not when the file was altered.
    let tip = a.tip().unwrap().map(|r| r.oid());
    let expected = a.known_file_count().unwrap();
    drop(a);
    let file = dir.join(FILE_COUNT_FILE);
    let text = std::fs::read_to_string(&file).unwrap();
    let b = reopen(&dir, &bytes);
    let tree = b.tree_of(tip).unwrap().unwrap();
    assert_eq!(b.cached_file_count(tree), Some(expected.files));
    let parts: Vec<&str> = text.split_whitespace().collect();
    let forged = format!("v1 {} {} {}\n", parts[1], expected.files + 1, parts[3]);
    std::fs::write(&file, forged).unwrap();
    assert_eq!(
        reopen(&dir, &bytes).cached_file_count(tree),
        None,
        "altered"
    );
    std::fs::write(&file, &text).unwrap();
    let other = Oid::hash_object(git2::ObjectType::Tree, b"").unwrap();
    assert_eq!(
        reopen(&dir, &bytes).cached_file_count(other),
        None,
        "another tree"
    );
}

/// A quota (`Vault::set_quota`) refuses a write whose blobs and trees
/// would take what the vault stores past it, with nothing changed and
/// the refusal kept for the caller; a write that fits passes it by less
/// than 1 KiB (its commit and key record); a delete is never refused;
/// without the quota the same write passes.
#[test]
fn a_quota_refuses_the_write_that_would_pass_it_and_keeps_deletes() {
    let (_tmp, mut v) = new_vault();
    put(&mut v, "/memories/a.md", &[b'a'; 3000]);
    let stored = v.stored_bytes();
    v.set_quota(Some(stored + 2000));
    assert!(v.take_quota_refusal().is_none());
    let before = v.stored_bytes();
    let err = try_put(&mut v, "/memories/b.md", &[b'b'; 3000]).unwrap_err();
    assert!(
        matches!(&err, StoreError::Limit(m) if m.contains("storage quota")),
        "{err}"
    );
    let why = v.take_quota_refusal().expect("the refusal is kept");
    assert_eq!((why.stored, why.quota), (before, stored + 2000));
    assert!(why.adds >= 3000, "{why:?}");
    assert!(v.take_quota_refusal().is_none(), "taken once");
    assert_eq!(v.stored_bytes(), before, "nothing written");
    // A small file fits, and passes the quota by less than 1 KiB at most.
    put(&mut v, "/memories/c.md", b"c");
    assert!(v.stored_bytes() <= stored + 2000 + 1024);
    // A delete runs whatever the quota.
    v.set_quota(Some(1));
    change(
        &mut v,
        Op::Delete,
        Change::Delete {
            path: MemoryPath::parse("/memories/a.md").unwrap(),
        },
    );
    assert!(v.take_quota_refusal().is_none());
    v.set_quota(None);
    put(&mut v, "/memories/b.md", &[b'b'; 3000]);
}

/// A vault moved away while open here (a server's tenant removed: its
/// directory renamed, then erased) is not made again at its old place by
/// a checkpoint or a close: libgit2 would make the ref files' missing
/// folders. An abandoned vault (closed without its checkpoint) loses
/// nothing: its log is replayed at the next open.
#[test]
fn a_vault_moved_away_is_not_made_again_and_an_abandoned_one_loses_nothing() {
    let (tmp, dir, bytes, mut vault) = new_vault_with(VaultConfig::default());
    put(&mut vault, "/memories/a.md", b"hello");
    let away = tmp.path().join("away");
    fs::rename(&dir, &away).unwrap();
    assert!(vault.checkpoint().is_err());
    drop(vault);
    assert!(!dir.exists(), "the vault's old place was made again");

    let mut vault = reopen(&away, &bytes);
    put(&mut vault, "/memories/b.md", b"logged");
    // What git holds, file by file: a checkpoint would add the record's
    // objects (loose or in a pack).
    fn files(d: &Path) -> usize {
        fs::read_dir(d).map_or(0, |r| {
            r.flatten()
                .map(|e| match e.file_type().map(|t| t.is_dir()) {
                    Ok(true) => files(&e.path()),
                    _ => 1,
                })
                .sum()
        })
    }
    let before = files(&away.join("objects"));
    vault.abandon();
    assert_eq!(
        files(&away.join("objects")),
        before,
        "an abandoned vault checkpointed"
    );
    let mut vault = reopen(&away, &bytes);
    assert_eq!(read(&mut vault, "/memories/a.md").unwrap(), b"hello");
    assert_eq!(read(&mut vault, "/memories/b.md").unwrap(), b"logged");
}

/// A settings change made from settings read before another process
/// changed another setting keeps that change: `update_config` works on
/// the settings as they are under the writer lock (round 36a: two
/// concurrent `config set` of different settings both reported success,
/// and one of them was undone every time).
#[test]
fn a_settings_change_from_a_stale_read_keeps_another_process_change() {
    let (_tmp, dir, bytes, mut a) = new_vault_with(VaultConfig::default());
    let mut b = reopen(&dir, &bytes);
    // b read the settings before a changes them.
    assert_eq!(b.config().max_files, 100_000);
    let changed = a
        .update_config(|c| {
            let mut c = c.clone();
            c.max_files = 1_001;
            Ok::<_, VaultError>(Some((c, vec!["max_files".into()])))
        })
        .unwrap();
    assert!(changed);
    let changed = b
        .update_config(|c| {
            assert_eq!(
                c.max_files, 1_001,
                "the change is made from the current settings"
            );
            let mut c = c.clone();
            c.max_view_chars += 1;
            Ok::<_, VaultError>(Some((c, vec!["max_view_chars".into()])))
        })
        .unwrap();
    assert!(changed);
    drop((a, b));
    let v = reopen(&dir, &bytes);
    assert_eq!(v.config().max_files, 1_001);
    assert_eq!(
        v.config().max_view_chars,
        VaultConfig::default().max_view_chars + 1
    );
    // The same value again changes nothing and writes no commit.
    let mut v = v;
    let before = v.tip().unwrap();
    let changed = v
        .update_config(|c| Ok::<_, VaultError>(Some((c.clone(), vec![]))))
        .unwrap();
    assert!(!changed);
    assert_eq!(v.tip().unwrap(), before);
}
