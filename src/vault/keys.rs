//! The key state of a vault: keyslots and the file-key table, kept in the
//! commit that `refs/memvault/keys` points to.
//!
//! A new commit replaces it on every change. From format 4 on, the new
//! commit names the one it replaces as its parent (and a merge's names the
//! other side's too), so that git, which leaves out of a transfer only what
//! the receiver's commits reach through their parents, sends a sync the
//! changed shard and not the whole table. The chain is cut (the new commit
//! has no parent) whenever a key is destroyed, a keyslot changes or the
//! vault is rekeyed, and once every [`CHAIN_SEGMENT`] states: then the
//! replaced states are unreachable and pruned (`prune_key_garbage`,
//! `gc`), so a destroyed file key or a removed keyslot leaves no reachable
//! copy behind. Every state the chain reaches holds only keys that still
//! exist and the keyslots of today. Its tree:
//!
//! ```text
//! erased           ids of the file keys destroyed on purpose
//! settings         the vault settings, sealed (format 2)
//! slots/<16 hex>   one keyslot (crypto::seal_*_slot)
//! table/<o>/<o>/<o>/<o>  one shard of the file-key table (format 3: 4096
//!                  shards by the first 12 bits of the id, one octal digit
//!                  per level, so a new key rewrites a shard of a few keys
//!                  and four trees of at most 8 entries)
//! table/<2 hex>    (format 2: 256 shards by the first id byte; read only)
//! ```
//!
//! The commit carries a MAC over its buffer in the `mvmac` header, checked
//! after unlock, so a key state not written by a key holder is refused.
//! Its message says its format and, from format 2 on, a counter that grows
//! by one with every new key state (`memvault key state v5\ncounter N\n`,
//! under the MAC; `v4` for a state written before vault format 9, whose
//! main placed every entry at the full bucket depth; `v3` for a format-3
//! state, which has no parent, `v2` for format 2). A memvault that knows
//! `v4` at most refuses a `v5` state, so a vault of format 9 reached
//! through a remote is refused rather than misread. Every key state is written in the same log record as a
//! commit on main whose metadata names that counter
//! ([`super::CommitMeta::keys`]), so a key state older than main requires
//! (a rollback of `refs/memvault/keys`, e.g. to bring back an erased file
//! key or a removed keyslot) is detected: see `Vault::check_binding`.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::sync::OnceLock;

use git2::{FileMode, ObjectType, Oid, Repository};

use super::objects;
use super::tree::Caches;
use super::treeedit::TreeEdits;
use super::wal::Record;
use super::{VaultConfig, VaultError, damaged};
use crate::crypto::{FileKey, FileKeyId, KeyTable, ShardLayout, VaultKeys};

pub(crate) use super::engine::KEYS_REF;
/// The commit header field that carries memvault's MAC.
pub const MAC_FIELD: &str = "mvmac";

/// The key state as loaded from the repository.
pub struct KeyState {
    /// The keys commit this state was read from (or written as).
    pub commit: Oid,
    /// Keyslot blobs by name (hex slot id).
    pub slots: BTreeMap<String, Vec<u8>>,
    /// The key table's shards, each found and decrypted the first time
    /// one of its keys is asked for (see [`Shards`]).
    shards: Shards,
    /// Ids of file keys destroyed on purpose (expiry, purge), so a version
    /// whose key is gone reads as erased rather than damaged. Kept as the
    /// blob `erased` (ids only; covered by the key-state MAC).
    pub erased: std::collections::BTreeSet<FileKeyId>,
    /// The objects [`KeyState::stage_changes`] wrote for the commit it
    /// staged (the commit included), for [`KeyState::add_to_record`];
    /// None when it does not know them.
    staged: Option<(Oid, Vec<super::engine::raw::Object>)>,
    /// The commit [`KeyState::stage_changes`] staged last and whether it
    /// names the state it replaces as a parent (for
    /// [`KeyState::published`]).
    chained: Option<(Oid, bool)>,
    /// What this handle knows of the last state it staged without a
    /// rebuild (see [`Written`]); used only while it is `commit`.
    written: Option<Written>,
    /// The key-state format: 1 (no counter, no settings), 2 (256 shards),
    /// 3 (4096 shards), 4 (4096 shards, chained to the state it replaced)
    /// or 5 (as 4, written by vault format 9: main's entries at any bucket
    /// depth).
    pub format: u8,
    /// Grows by one with every new key state (0 for format 1).
    pub counter: u64,
    /// The authenticated settings (None in a format-1 key state, whose
    /// settings are still the plain `memvault/config.json`).
    pub settings: Option<VaultConfig>,
    /// Shards this state holds beyond `commit`: those the log's records
    /// replaced since (format 7, see [`KeyState::stage_deferred`]), by
    /// number, with their blobs. A new key state takes them all in.
    pub(crate) pending: BTreeMap<u16, Oid>,
}

/// What [`KeyState::stage_deferred`] gives: the sealed shard blobs and
/// the shards they replace (shard number, blob id).
pub(crate) type Deferred = (Vec<super::engine::raw::Object>, Vec<(u16, Oid)>);

/// What [`KeyState::stage_changes`] knows of a state it wrote, so that
/// the next change neither reads it back nor checks again what it made
/// (its root entries, date, counter, key epoch and MAC): valid only while
/// that state is the current one (`KeyState::commit`).
#[derive(Clone, Copy)]
struct Written {
    commit: Oid,
    counter: u64,
    date: u64,
    /// Which key MAC'd it: a MAC of [`WRITTEN_UNDER`] (epoch included).
    under: [u8; 8],
    erased: Option<Oid>,
    settings: Oid,
    slots: Oid,
    table: Option<Oid>,
}

/// What [`Written::under`] MACs.
const WRITTEN_UNDER: &[u8] = b"memvault: the key a written key state is MAC'd under";

/// A short fingerprint of the key `keys` MACs under (its epoch included).
fn written_under(keys: &VaultKeys) -> [u8; 8] {
    let mac = keys.mac(WRITTEN_UNDER);
    let mut out = [0u8; 8];
    out.copy_from_slice(&mac[mac.len() - 8..]);
    out
}

/// The root entries of a key state that a change keeps.
struct Root {
    slots: Oid,
    table: Option<Oid>,
    erased: Option<Oid>,
    settings: Option<Oid>,
}

/// One shard of the key table: its blob, and its keys once decrypted.
struct Shard {
    oid: Oid,
    table: OnceLock<KeyTable>,
}

/// The key table's shards, found and decrypted on demand: opening a vault
/// of 20,000 files walked the table's 585 trees and decrypted its 4,096
/// shards (and read most of every pack index doing it) for a `view` that
/// needs one. A shard is found under the `table` tree by its path (four
/// small trees) the first time one of its keys is asked for, then
/// decrypted; changes (which need `&mut`) find and decrypt the shards they
/// touch first.
struct Shards {
    /// How the table is split (every state written is `Wide`).
    layout: ShardLayout,
    /// The table tree the shards not yet found are looked up in (None: no
    /// table). Shards changed since are in `slots`.
    tree: Option<Oid>,
    /// By shard number (`layout.shards()` of them), once found: the shard,
    /// or None where there is none.
    slots: Box<[OnceLock<Option<Shard>>]>,
}

impl Shards {
    fn new(layout: ShardLayout, tree: Option<Oid>) -> Shards {
        Shards {
            layout,
            tree,
            slots: (0..layout.shards()).map(|_| OnceLock::new()).collect(),
        }
    }

    /// The shard `number`, found now if it was not yet, reading the
    /// table's trees through `caches` when given (a change: the trees are
    /// mostly the ones it wrote last; a long-running reader: the trees
    /// above the shards are shared).
    fn get_with(
        &self,
        repo: &Repository,
        caches: Option<&Caches>,
        number: u16,
    ) -> Result<Option<&Shard>, VaultError> {
        let slot = self
            .slots
            .get(usize::from(number))
            .ok_or_else(|| damaged("a key table shard number is out of range"))?;
        if let Some(found) = slot.get() {
            return Ok(found.as_ref());
        }
        let oid = match self.tree {
            None => None,
            Some(tree) => find_shard(repo, caches, tree, &shard_path_of(self.layout, number))?,
        };
        let shard = oid.map(Shard::found);
        Ok(slot.get_or_init(|| shard).as_ref())
    }

    /// The shard `number` for a change: found first if it was not yet.
    fn get_mut(
        &mut self,
        repo: &Repository,
        caches: &Caches,
        number: u16,
    ) -> Result<&mut Option<Shard>, VaultError> {
        self.get_with(repo, Some(caches), number)?;
        self.slots
            .get_mut(usize::from(number))
            .and_then(OnceLock::get_mut)
            .ok_or_else(|| damaged("a key table shard number is out of range"))
    }

    /// The keys of shard `number` (found and decrypted now if they were
    /// not yet), or None if there is no such shard.
    fn table(
        &self,
        repo: &Repository,
        keys: &VaultKeys,
        caches: Option<&Caches>,
        number: u16,
    ) -> Result<Option<&KeyTable>, VaultError> {
        match self.get_with(repo, caches, number)? {
            None => Ok(None),
            Some(shard) => Ok(Some(shard.table(repo, keys, self.layout, number)?)),
        }
    }

    /// Every shard, each found now if it was not yet: the whole table is
    /// walked once (and its names checked), rather than every path.
    fn all(&self, repo: &Repository) -> Result<Vec<(u16, &Shard)>, VaultError> {
        if let Some(tree) = self.tree
            && self.slots.iter().any(|s| s.get().is_none())
        {
            let mut found: HashMap<u16, Oid> =
                walk_table(repo, tree, self.layout)?.into_iter().collect();
            for (number, slot) in self.slots.iter().enumerate() {
                let oid = found.remove(&(number as u16));
                if slot.get().is_none() {
                    let _ = slot.set(oid.map(Shard::found));
                }
            }
        }
        let mut out = Vec::new();
        for (number, slot) in self.slots.iter().enumerate() {
            if let Some(shard) = slot.get().and_then(Option::as_ref) {
                out.push((number as u16, shard));
            }
        }
        Ok(out)
    }
}

/// The blob of a shard at `path` below the table tree `tree`, if any.
fn find_shard(
    repo: &Repository,
    caches: Option<&Caches>,
    tree: Oid,
    path: &str,
) -> Result<Option<Oid>, VaultError> {
    let bad = || damaged("a key table shard has a bad name");
    let mut at = tree;
    let mut parts = path.split('/').peekable();
    while let Some(name) = parts.next() {
        let last = parts.peek().is_none();
        let (mode, id) = match caches {
            // The entries remembered, or read checked (and remembered).
            Some(c) => {
                let entries = c.tree_entries(repo, at)?;
                let Some(i) = super::tree::find_entry(&entries, name.as_bytes()) else {
                    return Ok(None);
                };
                (entries[i].mode, entries[i].id)
            }
            None => {
                objects::check(repo, at)?;
                let t = repo.find_tree(at)?;
                let Some(e) = t.get_name(name) else {
                    return Ok(None);
                };
                (e.filemode(), e.id())
            }
        };
        match (last, mode) {
            (true, m) if m == i32::from(FileMode::Blob) => return Ok(Some(id)),
            (false, super::tree::MODE_TREE) => at = id,
            _ => return Err(bad()),
        }
    }
    Ok(None)
}

/// Every shard of the table tree `tree` (number and blob), its names and
/// shape checked.
fn walk_table(
    repo: &Repository,
    tree: Oid,
    layout: ShardLayout,
) -> Result<Vec<(u16, Oid)>, VaultError> {
    let bad = || damaged("a key table shard has a bad name");
    let mut found = Vec::new();
    let mut stack = vec![(tree, 0u16, 0usize)];
    while let Some((id, prefix, depth)) = stack.pop() {
        objects::check(repo, id)?;
        let sub = repo.find_tree(id)?;
        for e in sub.iter() {
            let name = e.name().map_err(|_| bad())?;
            // (digits, radix, bits per level, whether a shard)
            let (digits, radix, bits, leaf) = match layout {
                ShardLayout::Byte => (2, 16, 8, true),
                ShardLayout::Wide => (1, 8, 3, depth == SHARD_LEVELS - 1),
            };
            let n = Some(name)
                .filter(|n| {
                    n.len() == digits
                        && n.bytes()
                            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                })
                .and_then(|n| u16::from_str_radix(n, radix).ok())
                .ok_or_else(bad)?;
            let number = (prefix << bits) | n;
            match (leaf, e.kind()) {
                (true, Some(ObjectType::Blob)) => found.push((number, e.id())),
                (false, Some(ObjectType::Tree)) => stack.push((e.id(), number, depth + 1)),
                _ => return Err(bad()),
            }
        }
    }
    Ok(found)
}

/// The shard numbers below the table trees `a` and `b` (wide layout, at
/// `depth` with the number's leading digits `prefix`) whose blobs differ.
fn diff_table(
    repo: &Repository,
    a: Option<Oid>,
    b: Option<Oid>,
    prefix: u16,
    depth: usize,
    out: &mut Vec<u16>,
) -> Result<(), VaultError> {
    if a == b {
        return Ok(());
    }
    let bad = || damaged("a key table shard has a bad name");
    let leaf = depth == SHARD_LEVELS - 1;
    // Each tree's entries by digit: (blob or tree id).
    let entries = |t: Option<Oid>| -> Result<[Option<Oid>; 8], VaultError> {
        let mut out = [None; 8];
        let Some(t) = t else { return Ok(out) };
        objects::check(repo, t)?;
        for e in repo.find_tree(t)?.iter() {
            let n = match e.name_bytes() {
                [d @ b'0'..=b'7'] => usize::from(d - b'0'),
                _ => return Err(bad()),
            };
            let kind = if leaf {
                ObjectType::Blob
            } else {
                ObjectType::Tree
            };
            if e.kind() != Some(kind) {
                return Err(bad());
            }
            out[n] = Some(e.id());
        }
        Ok(out)
    };
    let (ea, eb) = (entries(a)?, entries(b)?);
    for (n, (x, y)) in ea.into_iter().zip(eb).enumerate() {
        let number = (prefix << 3) | n as u16;
        if x == y {
            continue;
        }
        if leaf {
            out.push(number);
        } else {
            diff_table(repo, x, y, number, depth + 1, out)?;
        }
    }
    Ok(())
}

impl Shard {
    /// A shard stored in the blob `oid`, not decrypted yet.
    fn found(oid: Oid) -> Shard {
        Shard {
            oid,
            table: OnceLock::new(),
        }
    }

    /// A shard not written yet, holding `table`.
    fn unsaved(table: KeyTable) -> Shard {
        Shard {
            oid: Oid::ZERO_SHA1,
            table: OnceLock::from(table),
        }
    }

    /// Its keys, decrypted now if they were not yet.
    fn table(
        &self,
        repo: &Repository,
        keys: &VaultKeys,
        layout: ShardLayout,
        number: u16,
    ) -> Result<&KeyTable, VaultError> {
        if let Some(t) = self.table.get() {
            return Ok(t);
        }
        let blob = objects::blob_content(repo, self.oid)?;
        let table = keys
            .open_table_shard(layout, number, &blob)
            .map_err(|_| damaged("a key table shard failed to decrypt"))?;
        Ok(self.table.get_or_init(|| table))
    }

    /// Its keys, for a change (decrypted first if they were not yet).
    fn table_mut(
        &mut self,
        repo: &Repository,
        keys: &VaultKeys,
        layout: ShardLayout,
        number: u16,
    ) -> Result<&mut KeyTable, VaultError> {
        self.table(repo, keys, layout, number)?;
        self.table
            .get_mut()
            .ok_or_else(|| damaged("a key table shard is unreadable"))
    }
}

/// One change of the key state: file keys to add (`Some`) or destroy
/// (`None`), and optionally new keyslots or settings.
#[derive(Default)]
pub(crate) struct KeyChange {
    pub files: Vec<(FileKeyId, Option<FileKey>)>,
    pub slots: Option<BTreeMap<String, Vec<u8>>>,
    pub settings: Option<VaultConfig>,
    /// A new keyring (rekey): the new state and its commit on main are
    /// sealed and MAC'd under it (taken by `Vault::publish`).
    pub keyring: Option<crate::crypto::Keyring>,
    /// Write a new key state even if nothing else changes (a merge: its
    /// counter must pass both sides').
    pub bump: bool,
    /// A merge: the other side's key state, which the new one names as a
    /// second parent where it may (see `chains_to`).
    pub merge_parent: Option<Oid>,
}

impl KeyChange {
    pub fn files(files: Vec<(FileKeyId, Option<FileKey>)>) -> KeyChange {
        KeyChange {
            files,
            ..Default::default()
        }
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
            && self.slots.is_none()
            && self.settings.is_none()
            && self.keyring.is_none()
            && !self.bump
    }
}

/// The format and counter a key-state commit's message states (after its
/// MAC was checked).
pub(crate) fn read_header(repo: &Repository, commit: Oid) -> Result<(u8, u64), VaultError> {
    let c = repo
        .find_commit(commit)
        .map_err(|_| damaged("the key state commit is unreadable"))?;
    let msg = c.message_bytes();
    if msg == KEY_COMMIT_V1.as_bytes() {
        return Ok((1, 0));
    }
    let (format, rest) = if let Some(rest) = msg.strip_prefix(KEY_COMMIT_V5.as_bytes()) {
        (5, Some(rest))
    } else if let Some(rest) = msg.strip_prefix(KEY_COMMIT_V4.as_bytes()) {
        (4, Some(rest))
    } else if let Some(rest) = msg.strip_prefix(KEY_COMMIT_V3.as_bytes()) {
        (3, Some(rest))
    } else {
        (2, msg.strip_prefix(KEY_COMMIT_V2.as_bytes()))
    };
    let counter = rest
        .and_then(|rest| std::str::from_utf8(rest).ok())
        .and_then(|rest| rest.strip_prefix("counter "))
        .and_then(|rest| rest.strip_suffix('\n'))
        .filter(|n| !n.starts_with('0') || *n == "0")
        .and_then(|n| n.parse::<u64>().ok())
        .ok_or_else(|| damaged("the key state names a format this memvault does not know"))?;
    Ok((format, counter))
}

/// Read the keyslot blobs of the key state at `at` without any key
/// (needed to unlock): where the keys ref points, see `Wal::ref_target`;
/// None: the ref is missing.
pub fn read_slots_at(
    repo: &Repository,
    at: Option<Oid>,
) -> Result<(Oid, BTreeMap<String, Vec<u8>>), VaultError> {
    let commit_id = at.ok_or_else(|| damaged("the key state (refs/memvault/keys) is missing"))?;
    objects::check(repo, commit_id)?;
    let commit = repo
        .find_commit(commit_id)
        .map_err(|_| damaged("the key state commit is unreadable"))?;
    objects::check(repo, commit.tree_id())?;
    let tree = commit
        .tree()
        .map_err(|_| damaged("the key state tree is unreadable"))?;
    let mut slots = BTreeMap::new();
    if let Some(entry) = tree.get_name("slots") {
        objects::check(repo, entry.id())?;
        let sub = repo
            .find_tree(entry.id())
            .map_err(|_| damaged("the keyslot tree is unreadable"))?;
        for e in sub.iter() {
            let name = e.name().unwrap_or_default().to_string();
            objects::check(repo, e.id())?;
            let blob = repo
                .find_blob(e.id())
                .map_err(|_| damaged("a keyslot is unreadable"))?;
            slots.insert(name, blob.content().to_vec());
        }
    }
    if slots.is_empty() {
        return Err(damaged("the vault has no keyslot"));
    }
    Ok((commit_id, slots))
}

/// Check that a commit carries a valid memvault MAC.
///
/// Parses the raw object itself rather than through libgit2's
/// `git_commit_extract_signature`, which reads past the end of objects
/// held by the in-memory object store (they are not NUL-terminated).
pub fn verify_commit_mac(repo: &Repository, keys: &VaultKeys, id: Oid) -> bool {
    if objects::check(repo, id).is_err() {
        return false;
    }
    let Ok(odb) = repo.odb() else {
        return false;
    };
    let Ok(obj) = odb.read(id) else {
        return false;
    };
    if obj.kind() != git2::ObjectType::Commit {
        return false;
    }
    let Some((tag, signed)) = split_mac(obj.data()) else {
        return false;
    };
    keys.verify_mac(&signed, &tag)
}

/// The key epoch a commit's MAC claims (unverified: only to explain a
/// failure).
pub(crate) fn mac_epoch(repo: &Repository, id: Oid) -> Option<u32> {
    objects::check(repo, id).ok()?;
    let odb = repo.odb().ok()?;
    let obj = odb.read(id).ok()?;
    let (tag, _) = split_mac(obj.data())?;
    Some(u32::from_be_bytes(tag.get(..4)?.try_into().ok()?))
}

/// Split a commit object into its MAC and the buffer the MAC covers (the
/// object without the `mvmac` header line). None if there is no such
/// header, or more than one.
pub(crate) fn split_mac(data: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    let header_end = data.windows(2).position(|w| w == b"\n\n")? + 1;
    let prefix = format!("{MAC_FIELD} ");
    let mut found: Option<(usize, usize)> = None;
    let mut start = 0;
    while start < header_end {
        let end = data[start..header_end]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(header_end, |p| start + p + 1);
        if data[start..end].starts_with(prefix.as_bytes()) {
            if found.is_some() {
                return None;
            }
            found = Some((start, end));
        }
        start = end;
    }
    let (s, e) = found?;
    // A continuation line would make the header multi-line: refuse.
    if data.get(e) == Some(&b' ') {
        return None;
    }
    let value = std::str::from_utf8(&data[s + prefix.len()..e]).ok()?;
    let tag = data_encoding::HEXLOWER
        .decode(value.trim().as_bytes())
        .ok()?;
    let mut signed = Vec::with_capacity(data.len());
    signed.extend_from_slice(&data[..s]);
    signed.extend_from_slice(&data[e..]);
    Some((tag, signed))
}

/// Write a commit object from a buffer with memvault's MAC attached.
pub fn write_signed_commit(
    repo: &Repository,
    keys: &VaultKeys,
    buffer: &[u8],
) -> Result<Oid, VaultError> {
    Ok(write_signed_object(repo, keys, buffer)?.id)
}

/// [`write_signed_commit`], returning the commit object (for a log
/// record, without reading it back).
pub(crate) fn write_signed_object(
    repo: &Repository,
    keys: &VaultKeys,
    buffer: &[u8],
) -> Result<super::engine::raw::Object, VaultError> {
    let tag = data_encoding::HEXLOWER.encode(&keys.mac(buffer));
    let data = signed_commit_bytes(buffer, &tag)?;
    let id = objects::write_object(repo, ObjectType::Commit, &data)?;
    Ok(super::engine::raw::Object {
        kind: ObjectType::Commit,
        id,
        data,
    })
}

/// The object `git_commit_create_with_signature` makes of a commit buffer
/// and a one-line signature in the `mvmac` field: the field's line put
/// after the header's last line (a test checks they are the same bytes),
/// so the commit goes into the in-memory store without libgit2's write
/// path.
pub(crate) fn signed_commit_bytes(buffer: &[u8], tag: &str) -> Result<Vec<u8>, VaultError> {
    let header_end = buffer
        .windows(2)
        .position(|w| w == b"\n\n")
        .ok_or_else(|| damaged("a commit buffer has no message"))?
        + 1;
    let mut out = Vec::with_capacity(buffer.len() + MAC_FIELD.len() + tag.len() + 2);
    out.extend_from_slice(&buffer[..header_end]);
    out.extend_from_slice(MAC_FIELD.as_bytes());
    out.push(b' ');
    out.extend_from_slice(tag.as_bytes());
    out.push(b'\n');
    out.extend_from_slice(&buffer[header_end..]);
    Ok(out)
}

impl KeyState {
    /// Load the key state at `at` (see [`read_slots_at`]): verify the keys
    /// commit's MAC and open every shard.
    pub fn load_at(
        repo: &Repository,
        keys: &VaultKeys,
        at: Option<Oid>,
    ) -> Result<KeyState, VaultError> {
        let (commit, slots) = read_slots_at(repo, at)?;
        if !verify_commit_mac(repo, keys, commit) {
            // (Damage here even when its MAC claims a newer epoch: `open`
            // starts over when the keys ref moved meanwhile, and `reopen`
            // says a rekey elsewhere; a key state an open just took its
            // keyring from cannot be of a newer epoch than that keyring.)
            return Err(damaged(
                "the key state was not written with this vault's key",
            ));
        }
        let (format, counter) = read_header(repo, commit)?;
        let mut state = KeyState {
            commit,
            slots,
            shards: Shards::new(ShardLayout::Wide, None),
            erased: Default::default(),
            staged: None,
            pending: BTreeMap::new(),
            chained: None,
            written: None,
            format,
            counter,
            settings: None,
        };
        state.load_shards(repo, keys)?;
        Ok(state)
    }

    fn load_shards(&mut self, repo: &Repository, keys: &VaultKeys) -> Result<(), VaultError> {
        objects::check(repo, self.commit)?;
        let commit = repo.find_commit(self.commit)?;
        objects::check(repo, commit.tree_id())?;
        let tree = commit.tree()?;
        self.settings = match tree.get_name("settings") {
            None if self.format >= 2 => {
                return Err(damaged("the key state has no settings"));
            }
            None => None,
            Some(entry) => {
                objects::check(repo, entry.id())?;
                let blob = repo
                    .find_blob(entry.id())
                    .map_err(|_| damaged("the vault settings are unreadable"))?;
                let plain = keys
                    .open_settings(blob.content())
                    .map_err(|_| damaged("the vault settings failed to decrypt"))?;
                let config: VaultConfig = serde_json::from_slice(&plain)
                    .map_err(|_| damaged("the vault settings do not parse"))?;
                config
                    .validate()
                    .map_err(|_| damaged("the vault settings are out of range"))?;
                Some(config)
            }
        };
        self.erased.clear();
        if let Some(entry) = tree.get_name("erased") {
            objects::check(repo, entry.id())?;
            let blob = repo
                .find_blob(entry.id())
                .map_err(|_| damaged("the erased-key list is unreadable"))?;
            for c in blob.content().chunks_exact(16) {
                let mut id = [0u8; 16];
                id.copy_from_slice(c);
                self.erased.insert(FileKeyId(id));
            }
        }
        // Format 3: table/<o>/<o>/<o>/<o>, 4096 shards; before: table/<2 hex>.
        let layout = match self.format {
            3.. => ShardLayout::Wide,
            _ => ShardLayout::Byte,
        };
        let table = match tree.get_name("table") {
            None => None,
            Some(e) if e.kind() == Some(ObjectType::Tree) => Some(e.id()),
            Some(_) => return Err(damaged("a key table shard has a bad name")),
        };
        // A new state: its shards are found and decrypted anew, and the
        // old tables (erased keys among them) dropped now.
        self.shards = Shards::new(layout, table);
        Ok(())
    }

    /// Find and decrypt every shard not yet (`verify`: the whole table
    /// must be sound, not only the shards of the keys asked for).
    pub(crate) fn open_all_shards(
        &self,
        repo: &Repository,
        keys: &VaultKeys,
    ) -> Result<(), VaultError> {
        for (number, shard) in self.shards.all(repo)? {
            shard.table(repo, keys, self.shards.layout, number)?;
        }
        Ok(())
    }

    /// Every file key of the table, each shard decrypted (a merge of two
    /// key states).
    pub(crate) fn all_keys(
        &self,
        repo: &Repository,
        keys: &VaultKeys,
    ) -> Result<Vec<(FileKeyId, FileKey)>, VaultError> {
        let layout = self.shards.layout;
        let mut out = Vec::new();
        for (number, shard) in self.shards.all(repo)? {
            let table = shard.table(repo, keys, layout, number)?;
            out.extend(table.iter().map(|(id, k)| (*id, k.duplicate())));
        }
        Ok(out)
    }

    /// The numbers of the shards whose blobs differ between this state's
    /// stored table and `other`'s (in one of them only, or different):
    /// the only shards whose keys can differ, found by walking the two
    /// table trees past every subtree they share. None when either is of
    /// an older layout (compare them whole).
    pub(crate) fn differing_shards(
        &self,
        repo: &Repository,
        other: &KeyState,
    ) -> Result<Option<Vec<u16>>, VaultError> {
        if self.shards.layout != ShardLayout::Wide || other.shards.layout != ShardLayout::Wide {
            return Ok(None);
        }
        let table = |commit: Oid| -> Result<Option<Oid>, VaultError> {
            objects::check(repo, commit)?;
            let tree = repo.find_commit(commit)?.tree_id();
            objects::check(repo, tree)?;
            let tree = repo.find_tree(tree)?;
            match tree.get_name("table") {
                None => Ok(None),
                Some(e) if e.kind() == Some(ObjectType::Tree) => Ok(Some(e.id())),
                Some(_) => Err(damaged("a key table shard has a bad name")),
            }
        };
        let mut out = Vec::new();
        diff_table(
            repo,
            table(self.commit)?,
            table(other.commit)?,
            0,
            0,
            &mut out,
        )?;
        Ok(Some(out))
    }

    /// The keys of shard `number` (none if there is no such shard).
    pub(crate) fn shard_keys(
        &self,
        repo: &Repository,
        keys: &VaultKeys,
        number: u16,
    ) -> Result<Vec<(FileKeyId, FileKey)>, VaultError> {
        Ok(match self.shards.table(repo, keys, None, number)? {
            None => Vec::new(),
            Some(t) => t.iter().map(|(id, k)| (*id, k.duplicate())).collect(),
        })
    }

    /// Re-read the state if another process replaced it (`at`: where the
    /// keys ref points now, see `Wal::ref_target`).
    pub fn refresh(
        &mut self,
        repo: &Repository,
        keys: &VaultKeys,
        at: Option<Oid>,
    ) -> Result<(), VaultError> {
        let current = at.ok_or_else(|| damaged("the key state (refs/memvault/keys) is missing"))?;
        if current == self.commit {
            return Ok(());
        }
        if !verify_commit_mac(repo, keys, current) {
            if mac_epoch(repo, current).is_some_and(|e| e > keys.current_epoch()) {
                return Err(super::slots::rekeyed_elsewhere());
            }
            return Err(damaged(
                "the key state was not written with this vault's key",
            ));
        }
        let (_, slots) = read_slots_at(repo, Some(current))?;
        let (format, counter) = read_header(repo, current)?;
        // The shards read from now on are the new state's: the log's
        // pending ones are applied again by the caller.
        self.pending.clear();
        self.commit = current;
        self.slots = slots;
        self.format = format;
        self.counter = counter;
        let loaded = self.load_shards(repo, keys);
        if loaded.is_err() {
            // Not this state: read again at the next look, never the
            // tables of the one before under its name.
            self.commit = Oid::ZERO_SHA1;
        }
        loaded
    }

    /// The file key with this id, if the table holds it (its shard is
    /// decrypted now if it was not yet; an error if that fails).
    pub fn file_key(
        &self,
        repo: &Repository,
        keys: &VaultKeys,
        id: &FileKeyId,
    ) -> Result<Option<&FileKey>, VaultError> {
        self.file_key_with(repo, keys, None, id)
    }

    /// [`file_key`](Self::file_key), the table's trees read through
    /// `caches` when given (a long-running process: the trees above the
    /// shards are shared by many files' lookups).
    pub(crate) fn file_key_with(
        &self,
        repo: &Repository,
        keys: &VaultKeys,
        caches: Option<&Caches>,
        id: &FileKeyId,
    ) -> Result<Option<&FileKey>, VaultError> {
        let number = self.shards.layout.shard_of(id);
        Ok(self
            .shards
            .table(repo, keys, caches, number)?
            .and_then(|t| t.get(id)))
    }

    /// Number of file keys in the table.
    #[cfg(test)]
    pub fn file_key_count(&self, repo: &Repository, keys: &VaultKeys) -> usize {
        let layout = self.shards.layout;
        self.shards
            .all(repo)
            .unwrap()
            .into_iter()
            .map(|(n, s)| s.table(repo, keys, layout, n).unwrap().len())
            .sum()
    }

    /// Re-read the state that is really on disk (after a staged change
    /// was abandoned: the in-memory tables were edited in place).
    pub(crate) fn reload(
        &mut self,
        repo: &Repository,
        keys: &VaultKeys,
        at: Option<Oid>,
    ) -> Result<(), VaultError> {
        self.commit = Oid::ZERO_SHA1;
        // Edited tables are not reused: a fresh state.
        self.shards = Shards::new(ShardLayout::Wide, None);
        *self = KeyState::load_at(repo, keys, at)?;
        Ok(())
    }

    /// Whether `change` can be logged as its shards alone
    /// ([`stage_deferred`](Self::stage_deferred)): file keys added, nothing
    /// else, to a state of the current format.
    pub(crate) fn can_defer(&self, change: &KeyChange) -> bool {
        !change.files.is_empty()
            && change.files.iter().all(|(_, k)| k.is_some())
            && change.slots.is_none()
            && change.settings.is_none()
            && change.keyring.is_none()
            && !change.bump
            && change.merge_parent.is_none()
            && self.format == 5
            && self.settings.is_some()
            && self.shards.layout == ShardLayout::Wide
    }

    /// Add the file keys of `files` (a change [`can_defer`](Self::can_defer)
    /// allows) to the in-memory table and seal the shards they change,
    /// without a new key state: a create's log record then carries one
    /// shard blob where a whole state took four table trees, a root and a
    /// MAC'd commit. Returns the blobs (for the record's objects) and the
    /// shards they replace (its `keys`). The key state takes them in
    /// before the next checkpoint (`Vault::fold_keys`); until then every
    /// process reads them from the log (see [`apply_pending`](Self::apply_pending)).
    /// The in-memory table holds the change; on failure the caller reloads.
    pub(crate) fn stage_deferred(
        &mut self,
        repo: &Repository,
        keys: &VaultKeys,
        caches: &Caches,
        files: Vec<(FileKeyId, Option<FileKey>)>,
    ) -> Result<Deferred, VaultError> {
        let layout = self.shards.layout;
        let mut touched = std::collections::BTreeSet::new();
        for (id, key) in files {
            let Some(key) = key else {
                return Err(damaged("a key to destroy cannot be deferred"));
            };
            let number = layout.shard_of(&id);
            touched.insert(number);
            self.shards
                .get_mut(repo, caches, number)?
                .get_or_insert_with(|| Shard::unsaved(KeyTable::default()))
                .table_mut(repo, keys, layout, number)?
                .insert(id, key);
        }
        let mut objects = Vec::with_capacity(touched.len());
        let mut replaced = Vec::with_capacity(touched.len());
        for number in touched {
            let slot = self.shards.get_mut(repo, caches, number)?;
            let Some(Shard { oid, table }) = slot else {
                return Err(damaged("a key table shard vanished while being changed"));
            };
            let table = table
                .get()
                .ok_or_else(|| damaged("a key table shard was not read"))?;
            let sealed = keys.seal_table_shard(ShardLayout::Wide, number, table);
            *oid = objects::write_object(repo, ObjectType::Blob, &sealed)?;
            objects.push(super::engine::raw::Object {
                kind: ObjectType::Blob,
                id: *oid,
                data: sealed,
            });
            replaced.push((number, *oid));
            self.pending.insert(number, *oid);
        }
        Ok((objects, replaced))
    }

    /// The counter a commit on main made now names (format 8): this
    /// state's, or while the log holds shards no key state took in yet,
    /// the next one's, which takes them in (a fold is always the next
    /// state: see `Vault::fold_keys`). So a key state rolled back to
    /// before such a fold (the log emptied by the checkpoint that wrote
    /// it) is older than the tip requires, and refused at open, not found
    /// later as keys missing from the table.
    pub(crate) fn bound_counter(&self) -> u64 {
        self.counter + u64::from(!self.pending.is_empty())
    }

    /// Take in the shards the log's records replaced since this state's
    /// commit (`pending`, from `Wal::pending_keys`): each is read from its
    /// blob when one of its keys is asked for.
    pub(crate) fn apply_pending(&mut self, pending: &BTreeMap<u16, Oid>) {
        for (&number, &oid) in pending {
            let Some(slot) = self.shards.slots.get_mut(usize::from(number)) else {
                continue;
            };
            if slot
                .get()
                .and_then(Option::as_ref)
                .is_some_and(|s| s.oid == oid)
            {
                continue;
            }
            *slot = OnceLock::from(Some(Shard::found(oid)));
        }
        self.pending.clone_from(pending);
    }

    /// Write the objects of a new keys commit with `changes` applied, and
    /// return it, without moving the ref or making anything durable: the
    /// caller logs it (see [`KeyState::add_to_record`]), moves the ref and
    /// then calls [`KeyState::published`], or [`KeyState::reload`] on
    /// failure. The in-memory table already holds the changes.
    pub(crate) fn stage_changes(
        &mut self,
        repo: &Repository,
        keys: &VaultKeys,
        caches: &Caches,
        change: KeyChange,
        date: u64,
    ) -> Result<Oid, VaultError> {
        let KeyChange {
            files,
            slots,
            settings,
            keyring: _,
            bump: _,
            merge_parent,
        } = change;
        let mut touched = std::collections::BTreeSet::new();
        let mut erased_changed = false;
        let mut removed_any = false;
        // Every new key state is format 5, with the next counter; a
        // format-1 state gets its settings now (the caller gives them).
        let previous_format = self.format;
        self.counter += 1;
        self.format = 5;
        // A table of 256 shards (format 2) is split into 4096, all
        // rewritten.
        if self.shards.layout != ShardLayout::Wide {
            let layout = self.shards.layout;
            let mut wide: BTreeMap<u16, KeyTable> = BTreeMap::new();
            let numbers: Vec<u16> = self.shards.all(repo)?.iter().map(|(n, _)| *n).collect();
            for number in numbers {
                let Some(shard) = self.shards.get_mut(repo, caches, number)? else {
                    continue;
                };
                let table = std::mem::take(shard.table_mut(repo, keys, layout, number)?);
                for (id, key) in table.into_entries() {
                    let shard = ShardLayout::Wide.shard_of(&id);
                    touched.insert(shard);
                    wide.entry(shard).or_default().insert(id, key);
                }
            }
            // Every shard of the new layout is known now: those holding
            // keys, and none elsewhere (the table is written whole).
            let mut shards = Shards::new(ShardLayout::Wide, None);
            for (number, table) in wide {
                shards.slots[usize::from(number)] = OnceLock::from(Some(Shard::unsaved(table)));
            }
            self.shards = shards;
        }
        let settings_changed = settings.is_some();
        if let Some(s) = settings {
            self.settings = Some(s);
        }
        let settings = self
            .settings
            .clone()
            .ok_or_else(|| damaged("a key state without settings cannot be upgraded"))?;
        for (id, key) in files {
            let layout = self.shards.layout;
            let number = layout.shard_of(&id);
            touched.insert(number);
            let table = self
                .shards
                .get_mut(repo, caches, number)?
                .get_or_insert_with(|| Shard::unsaved(KeyTable::default()))
                .table_mut(repo, keys, layout, number)?;
            match key {
                Some(k) => {
                    table.insert(id, k);
                }
                None => {
                    removed_any |= table.remove(&id).is_some();
                    erased_changed |= self.erased.insert(id);
                }
            }
        }
        let mut objects = Vec::new();
        let mut table_edits = TreeEdits::default();
        for shard in &touched {
            // Every touched shard was found and decrypted above.
            let slot = self.shards.get_mut(repo, caches, *shard)?;
            let empty = slot
                .as_ref()
                .is_none_or(|s| s.table.get().is_some_and(KeyTable::is_empty));
            if empty {
                if slot.take().is_some_and(|s| !s.oid.is_zero()) {
                    table_edits.remove(&shard_path(*shard));
                }
                continue;
            }
            if let Some(Shard { oid, table }) = slot
                && let Some(table) = table.get()
            {
                let sealed = keys.seal_table_shard(ShardLayout::Wide, *shard, table);
                *oid = objects::write_object(repo, ObjectType::Blob, &sealed)?;
                table_edits.upsert(&shard_path(*shard), *oid);
                objects.push(super::engine::raw::Object {
                    kind: ObjectType::Blob,
                    id: *oid,
                    data: sealed,
                });
            }
        }
        // The common case (a create adds one key): the slots are unchanged,
        // so edit the previous state's trees (the table's three levels on
        // the changed shard's path, and the root) and keep the objects for
        // the log record, rather than rebuild everything through libgit2
        // and read it back.
        self.staged = None;
        self.chained = None;
        // The state this handle wrote last needs no reading back.
        let known = self.written.take().filter(|w| w.commit == self.commit);
        let previous = match (&slots, known) {
            (Some(_), _) => None,
            (None, Some(w)) => Some(Root {
                slots: w.slots,
                table: w.table,
                erased: w.erased,
                settings: Some(w.settings),
            }),
            (None, None) if previous_format < 3 || self.format_of_previous(repo) < 3 => None,
            (None, None) => objects::check(repo, self.commit)
                .ok()
                .and_then(|()| repo.find_commit(self.commit).ok())
                .filter(|c| objects::check(repo, c.tree_id()).is_ok())
                .and_then(|c| c.tree().ok())
                .and_then(|t| {
                    let id = |name: &str| t.get_name(name).map(|e| e.id());
                    Some(Root {
                        slots: id("slots")?,
                        table: id("table"),
                        erased: id("erased"),
                        settings: id("settings"),
                    })
                }),
        };
        if let Some(s) = slots {
            self.slots = s;
        }
        let Some(previous) = previous else {
            let commit = write_key_commit(repo, keys, self, &settings, caches)?;
            // Every shard was found for the rebuild; none is looked up in a
            // tree again until the next state is read.
            self.shards.tree = None;
            return Ok(commit);
        };
        let slot_tree = previous.slots;
        let table_tree = previous.table;
        // Shards logged alone since the state this one replaces (see
        // `stage_deferred`): it takes them in.
        for (number, oid) in &self.pending {
            if !touched.contains(number) {
                table_edits.upsert(&shard_path(*number), *oid);
            }
        }
        let table = table_edits.write(repo, caches, table_tree, &mut objects)?;
        // Shards not found yet are looked up in the new table from now on:
        // the old one goes with the replaced state (pruned after an
        // erasure), and the new one holds them unchanged.
        self.shards.tree = Some(table);
        let mut add = |kind: ObjectType, data: Vec<u8>| -> Result<Oid, VaultError> {
            let id = objects::write_object(repo, kind, &data)?;
            objects.push(super::engine::raw::Object { kind, id, data });
            Ok(id)
        };
        let erased = match self.erased.is_empty() {
            true => None,
            false if erased_changed => Some(add(ObjectType::Blob, erased_bytes(&self.erased))?),
            false => previous.erased,
        };
        let settings = match settings_changed {
            true => add(ObjectType::Blob, seal_settings(keys, &settings)?)?,
            false => previous
                .settings
                .ok_or_else(|| damaged("the key state has no settings"))?,
        };
        let root = add(
            ObjectType::Tree,
            root_tree_bytes(erased, settings, slot_tree, table),
        )?;
        // The states this one chains to: the one it replaces unless a key
        // left the table, and a merge's other side; each only if it holds
        // the same erased list and keyslots, under the same key, in the
        // same segment (see the module docs).
        let mut parents = Vec::new();
        let ours = (!removed_any).then_some(self.commit);
        for candidate in ours.into_iter().chain(merge_parent) {
            let chains = match known.filter(|w| w.commit == candidate) {
                // This handle wrote it (format 4, MAC'd under `epoch`).
                Some(w) => {
                    w.counter < self.counter
                        && w.counter / CHAIN_SEGMENT == self.counter / CHAIN_SEGMENT
                        && w.erased == erased
                        && w.slots == slot_tree
                        && w.under == written_under(keys)
                }
                None => chains_to(repo, keys, candidate, erased, slot_tree, self.counter),
            };
            if !parents.contains(&candidate) && chains {
                parents.push(candidate);
            }
        }
        let buffer = key_commit_buffer(root, &parents, self.counter, date);
        let object = write_signed_object(repo, keys, &buffer)?;
        let commit = object.id;
        objects.push(object);
        self.written = Some(Written {
            commit,
            counter: self.counter,
            date,
            under: written_under(keys),
            erased,
            settings,
            slots: slot_tree,
            table: Some(table),
        });
        self.chained = Some((commit, parents.contains(&self.commit)));
        self.staged = Some((commit, objects));
        Ok(commit)
    }

    /// Add a staged keys commit and the objects it needs beyond `old` to a
    /// log record, with the ref target.
    pub(crate) fn add_to_record(
        &mut self,
        repo: &Repository,
        record: &mut Record,
        old: Oid,
        new: Oid,
    ) -> Result<(), VaultError> {
        if let Some((commit, objects)) = self.staged.take()
            && commit == new
        {
            // The commit among them.
            record.objects.extend(objects);
            record.refs.push((KEYS_REF.to_string(), new));
            return Ok(());
        }
        let odb = repo.odb()?;
        record.add_object(&odb, new)?;
        objects::check(repo, new)?;
        let new_tree = repo.find_commit(new)?.tree_id();
        let old_tree = match objects::check(repo, old) {
            Ok(()) => repo.find_commit(old).ok().map(|c| c.tree_id()),
            Err(_) => None,
        };
        let mut seen = std::collections::HashSet::new();
        record.add_tree_diff(&odb, repo, new_tree, old_tree, &mut seen)?;
        record.refs.push((KEYS_REF.to_string(), new));
        Ok(())
    }

    /// The ref now points at the staged commit: the state it replaced is
    /// garbage unless the new one chains to it.
    pub(crate) fn published(&mut self, repo: &Repository, commit: Oid) {
        // Known from the staging (a state written whole has no parent).
        let mut chained = || match self.chained.take() {
            Some((staged, chained)) if staged == commit => chained,
            _ => false,
        };
        if commit != self.commit && !chained() {
            note_garbage(repo, self.commit);
        }
        self.commit = commit;
        // The new state holds every shard this one had pending.
        self.pending.clear();
    }

    /// Initial key state for a new vault.
    pub fn create(
        repo: &Repository,
        keys: &VaultKeys,
        slots: BTreeMap<String, Vec<u8>>,
        settings: VaultConfig,
    ) -> Result<KeyState, VaultError> {
        let mut state = KeyState {
            commit: Oid::ZERO_SHA1,
            slots,
            shards: Shards::new(ShardLayout::Wide, None),
            erased: Default::default(),
            staged: None,
            pending: BTreeMap::new(),
            chained: None,
            written: None,
            format: 5,
            counter: 1,
            settings: Some(settings.clone()),
        };
        state.commit = write_key_commit(repo, keys, &state, &settings, &Caches::default())?;
        repo.reference(KEYS_REF, state.commit, false, "memvault init")?;
        Ok(state)
    }

    /// The format of the key state this one was staged from (the commit
    /// it replaces): the fast path reuses that commit's trees, which a
    /// format-1 state lacks the settings of.
    /// The date of the current state, if this handle wrote it (no read).
    pub(crate) fn known_date(&self) -> Option<u64> {
        self.written
            .filter(|w| w.commit == self.commit)
            .map(|w| w.date)
    }

    fn format_of_previous(&self, repo: &Repository) -> u8 {
        read_header(repo, self.commit).map_or(1, |(f, _)| f)
    }
}

/// The list of replaced key-state commits, for the prune that makes
/// erased keys physically gone (object ids only: nothing secret).
pub const GARBAGE_FILE: &str = "memvault/keys-garbage";

/// Remember a replaced key-state commit (best effort: `prune` also finds
/// key-state commits by scanning when asked for a full prune).
pub(crate) fn note_garbage(repo: &Repository, old: Oid) {
    use std::io::Write;
    let _ = super::fsx::open_append(&repo.path().join(GARBAGE_FILE))
        .and_then(|mut f| writeln!(f, "{old}"));
}

fn write_key_commit(
    repo: &Repository,
    keys: &VaultKeys,
    state: &KeyState,
    settings: &VaultConfig,
    caches: &Caches,
) -> Result<Oid, VaultError> {
    let mut slot_tree = repo.treebuilder(None)?;
    for (name, bytes) in &state.slots {
        let oid = repo.blob(bytes)?;
        slot_tree.insert(name, oid, FileMode::Blob.into())?;
    }
    let slot_tree = slot_tree.write()?;
    let mut table = TreeEdits::default();
    for (number, shard) in state.shards.all(repo)? {
        table.upsert(&shard_path(number), shard.oid);
    }
    let table_tree = table.write(repo, caches, None, &mut Vec::new())?;
    let mut root = repo.treebuilder(None)?;
    root.insert("slots", slot_tree, FileMode::Tree.into())?;
    root.insert("table", table_tree, FileMode::Tree.into())?;
    root.insert(
        "settings",
        repo.blob(&seal_settings(keys, settings)?)?,
        FileMode::Blob.into(),
    )?;
    if !state.erased.is_empty() {
        root.insert(
            "erased",
            repo.blob(&erased_bytes(&state.erased))?,
            FileMode::Blob.into(),
        )?;
    }
    let root = root.write()?;
    write_signed_commit(
        repo,
        keys,
        &key_commit_buffer(root, &[], state.counter, state.counter),
    )
}

/// Levels of the `table` tree of format 3 (4096 shards, eight per tree).
const SHARD_LEVELS: usize = 4;

/// Where shard `number` sits in the `table` tree of `layout`.
fn shard_path_of(layout: ShardLayout, number: u16) -> String {
    match layout {
        ShardLayout::Byte => format!("{number:02x}"),
        ShardLayout::Wide => shard_path(number),
    }
}

/// Where a shard of format 3 sits in the `table` tree: its four octal
/// digits, one per level. (Eight entries per tree: a new key rewrites four
/// trees of 8 entries, 900 bytes, where three of 16 would be 1,350.)
fn shard_path(shard: u16) -> String {
    format!(
        "{}/{}/{}/{}",
        (shard >> 9) & 7,
        (shard >> 6) & 7,
        (shard >> 3) & 7,
        shard & 7
    )
}

/// The sealed `settings` blob.
fn seal_settings(keys: &VaultKeys, settings: &VaultConfig) -> Result<Vec<u8>, VaultError> {
    let json = serde_json::to_vec(settings).map_err(|_| damaged("settings do not serialise"))?;
    Ok(keys.seal_settings(&json))
}

/// The key-state root tree: `erased` (when any key was erased),
/// `settings`, `slots`, `table`, in git's order.
fn root_tree_bytes(erased: Option<Oid>, settings: Oid, slots: Oid, table: Oid) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 * 32);
    if let Some(e) = erased {
        out.extend_from_slice(b"100644 erased\0");
        out.extend_from_slice(e.as_bytes());
    }
    out.extend_from_slice(b"100644 settings\0");
    out.extend_from_slice(settings.as_bytes());
    out.extend_from_slice(b"40000 slots\0");
    out.extend_from_slice(slots.as_bytes());
    out.extend_from_slice(b"40000 table\0");
    out.extend_from_slice(table.as_bytes());
    out
}

/// The unsigned buffer of a key-state commit (what
/// `commit_create_buffer` gives with the fixed signature).
fn key_commit_buffer(root: Oid, parents: &[Oid], counter: u64, date: u64) -> Vec<u8> {
    // Its date is the clock it shares with main, which grows along both
    // histories (git orders its walks by date; see `Vault::clock`).
    commit_buffer(root, parents, date, &key_commit_message(counter))
}

/// The bytes libgit2's `commit_create_buffer` makes of a commit by `m <m>`
/// at `date` (+0000) with `message` (tests compare the two).
pub(crate) fn commit_buffer(tree: Oid, parents: &[Oid], date: u64, message: &str) -> Vec<u8> {
    let parents: String = parents.iter().map(|p| format!("parent {p}\n")).collect();
    format!(
        "tree {tree}\n{parents}author m <m> {date} +0000\ncommitter m <m> {date} +0000\n\n{message}"
    )
    .into_bytes()
}

/// Check the key states `tip` chains to (`verify`): each one held,
/// carrying this vault's MAC (a state before a rekey: any epoch this
/// keyring holds), with a header it reads and a counter below its
/// child's. Returns how many there are.
pub(crate) fn check_chain(
    repo: &Repository,
    keys: &VaultKeys,
    tip: Oid,
) -> Result<usize, VaultError> {
    let mut seen = std::collections::HashSet::new();
    let (_, counter) = read_header(repo, tip)?;
    let mut stack: Vec<(Oid, u64)> = objects::find_commit(repo, tip)
        .map_err(|_| damaged("the key state commit is unreadable"))?
        .parent_ids()
        .map(|p| (p, counter))
        .collect();
    while let Some((id, child)) = stack.pop() {
        if !seen.insert(id) {
            continue;
        }
        let commit = objects::find_commit(repo, id)
            .map_err(|_| damaged("a key state the current one chains to is missing"))?;
        if !verify_commit_mac(repo, keys, id) {
            return Err(damaged(
                "a key state the current one chains to was not written with this vault's key",
            ));
        }
        let (_, counter) = read_header(repo, id)?;
        if counter >= child {
            return Err(damaged(
                "a key state the current one chains to is not older than it",
            ));
        }
        stack.extend(commit.parent_ids().map(|p| (p, counter)));
    }
    Ok(seen.len())
}

/// Key states a chain holds between two cuts at most: past a multiple of
/// this counter, a new state starts a new chain, so the replaced ones
/// become garbage and the chain a vault keeps stays short (a sync whose
/// remote is behind a cut sends the whole table once).
pub(crate) const CHAIN_SEGMENT: u64 = 256;

/// Whether a new key state with these `erased` and `slots` entries,
/// MAC'd under `keys`, with `counter`, may name `candidate` as its
/// parent: a readable state of format 3 or later, with the same erased
/// list and keyslots, under the same key epoch, in the same segment.
fn chains_to(
    repo: &Repository,
    keys: &VaultKeys,
    candidate: Oid,
    erased: Option<Oid>,
    slots: Oid,
    counter: u64,
) -> bool {
    let Ok(commit) = objects::find_commit(repo, candidate) else {
        return false;
    };
    let Ok((format, theirs)) = read_header(repo, candidate) else {
        return false;
    };
    let same_tree = objects::check(repo, commit.tree_id()).is_ok()
        && commit.tree().is_ok_and(|t| {
            t.get_name("erased").map(|e| e.id()) == erased
                && t.get_name("slots").map(|e| e.id()) == Some(slots)
        });
    format >= 3
        && theirs < counter
        && theirs / CHAIN_SEGMENT == counter / CHAIN_SEGMENT
        && same_tree
        && mac_epoch(repo, candidate) == Some(keys.current_epoch())
        && verify_commit_mac(repo, keys, candidate)
}

/// The message of a key-state commit of format 1 (read only).
const KEY_COMMIT_V1: &str = "memvault key state v1\n";
/// The first line of a key-state commit of format 2 (read only).
const KEY_COMMIT_V2: &str = "memvault key state v2\n";
/// The first line of a key-state commit of format 3 (read only).
const KEY_COMMIT_V3: &str = "memvault key state v3\n";
/// The first line of a key-state commit of format 4 (read only).
const KEY_COMMIT_V4: &str = "memvault key state v4\n";
/// The first line of a key-state commit of format 5.
const KEY_COMMIT_V5: &str = "memvault key state v5\n";

fn key_commit_message(counter: u64) -> String {
    format!("{KEY_COMMIT_V5}counter {counter}\n")
}

/// The `erased` blob: the destroyed key ids, in order.
fn erased_bytes(erased: &std::collections::BTreeSet<FileKeyId>) -> Vec<u8> {
    erased.iter().flat_map(|id| id.0).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::Keyring;

    fn tree_of(repo: &Repository, commit: Oid) -> Oid {
        repo.find_commit(commit).unwrap().tree_id()
    }

    /// Main commits are built by hand too: the same bytes as libgit2's
    /// for no, one and two parents and a sealed-metadata message.
    #[test]
    fn commit_buffers_are_the_bytes_libgit2_makes() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(tmp.path()).unwrap();
        let tree = repo.treebuilder(None).unwrap().write().unwrap();
        let tree = repo.find_tree(tree).unwrap();
        let sig = super::super::generation_signature(7).unwrap();
        let one = repo.commit(None, &sig, &sig, "a\n", &tree, &[]).unwrap();
        let two = repo.commit(None, &sig, &sig, "b\n", &tree, &[]).unwrap();
        let commits = [one, two].map(|c| repo.find_commit(c).unwrap());
        for n in 0..=2 {
            let parents: Vec<&git2::Commit> = commits.iter().take(n).collect();
            let ids: Vec<Oid> = parents.iter().map(|c| c.id()).collect();
            for (date, message) in [(7, "c2VhbGVk+/=\n"), (4_000_000_000, "x\n")] {
                let sig = super::super::generation_signature(date).unwrap();
                let libgit2 = repo
                    .commit_create_buffer(&sig, &sig, message, &tree, &parents)
                    .unwrap();
                let ours = commit_buffer(tree.id(), &ids, date as u64, message);
                assert_eq!(&libgit2[..], &ours[..], "{n} parents");
            }
        }
    }

    /// The in-place update of the key tree gives exactly the tree a full
    /// rebuild gives, through adds, removals (erasure) and emptied shards.
    #[test]
    fn signed_commits_are_the_bytes_libgit2_makes() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(tmp.path()).unwrap();
        let tree = repo.treebuilder(None).unwrap().write().unwrap();
        for message in ["one line\n", "base64==\n", "x\n\ny\n"] {
            let buffer = key_commit_buffer(tree, &[], 7, 7).to_vec();
            let buffer = [&buffer[..], message.as_bytes()].concat();
            let tag = "00ff".repeat(18);
            let theirs = repo
                .commit_signed(std::str::from_utf8(&buffer).unwrap(), &tag, Some(MAC_FIELD))
                .unwrap();
            let ours = signed_commit_bytes(&buffer, &tag).unwrap();
            let odb = repo.odb().unwrap();
            assert_eq!(odb.read(theirs).unwrap().data(), &ours[..]);
        }
    }

    #[test]
    fn incremental_key_tree_matches_a_full_rebuild() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(dir.path()).unwrap();
        let keys = VaultKeys::derive(&Keyring::new_random());
        let mut slots = BTreeMap::new();
        slots.insert("00112233aabbccdd".to_string(), vec![7u8; 90]);
        let mut state = KeyState::create(&repo, &keys, slots, VaultConfig::default()).unwrap();
        let mut ids = Vec::new();
        for round in 0..6 {
            let mut changes = Vec::new();
            for _ in 0..(1 + round * 7) {
                let id = FileKeyId::generate();
                ids.push(id);
                changes.push((id, Some(FileKey::generate())));
            }
            if round >= 2 {
                // Erase a few, emptying some shards.
                for _ in 0..3 {
                    let id = ids.remove(0);
                    changes.push((id, None));
                }
            }
            let date = 100 + round as u64;
            let staged = state
                .stage_changes(
                    &repo,
                    &keys,
                    &Caches::default(),
                    KeyChange::files(changes),
                    date,
                )
                .unwrap();
            let settings = state.settings.clone().unwrap();
            let full =
                write_key_commit(&repo, &keys, &state, &settings, &Caches::default()).unwrap();
            // The same tree but for the settings blob, sealed anew (with a
            // fresh nonce) by the full rebuild.
            let entries = |c: Oid| {
                let t = repo.find_tree(tree_of(&repo, c)).unwrap();
                t.iter()
                    .filter(|e| e.name().ok() != Some("settings"))
                    .map(|e| (e.name().unwrap().to_string(), e.id()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(entries(staged), entries(full), "round {round}");
            // The commit is the one libgit2 would build (same buffer).
            let tree = repo.find_tree(tree_of(&repo, staged)).unwrap();
            let sig = super::super::generation_signature(date as i64).unwrap();
            let message = key_commit_message(state.counter);
            let parents: Vec<git2::Commit> = repo.find_commit(staged).unwrap().parents().collect();
            // Chained to the state it replaced until a key is erased.
            assert_eq!(parents.len(), usize::from(round < 2), "round {round}");
            let parent_refs: Vec<&git2::Commit> = parents.iter().collect();
            let parent_ids: Vec<Oid> = parents.iter().map(|c| c.id()).collect();
            let libgit2 = repo
                .commit_create_buffer(&sig, &sig, &message, &tree, &parent_refs)
                .unwrap();
            assert_eq!(
                &libgit2[..],
                &key_commit_buffer(tree.id(), &parent_ids, state.counter, date)[..]
            );
            // The record holds every object the new state needs beyond
            // the old one, with its true bytes.
            let mut record = Record::default();
            let old = state.commit;
            state
                .add_to_record(&repo, &mut record, old, staged)
                .unwrap();
            let mut expected = Record::default();
            let odb = repo.odb().unwrap();
            expected.add_object(&odb, staged).unwrap();
            let mut seen = std::collections::HashSet::new();
            let old_tree = repo.find_commit(old).ok().map(|c| c.tree_id());
            expected
                .add_tree_diff(&odb, &repo, tree_of(&repo, staged), old_tree, &mut seen)
                .unwrap();
            let ids = |r: &Record| {
                let mut v: Vec<Oid> = r.objects.iter().map(|o| o.id).collect();
                v.sort();
                v.dedup();
                v
            };
            assert_eq!(ids(&record), ids(&expected), "round {round}");
            for o in &record.objects {
                assert_eq!(odb.read(o.id).unwrap().data(), &o.data[..]);
            }
            assert_eq!(record.refs, vec![(KEYS_REF.to_string(), staged)]);
            state.published(&repo, staged);
            // And it reads back as the same table.
            let again = KeyState::load_at(&repo, &keys, Some(staged)).unwrap();
            assert_eq!(
                again.file_key_count(&repo, &keys),
                state.file_key_count(&repo, &keys)
            );
            assert_eq!(again.erased, state.erased);
            // The counter grows by one per state, and is read back.
            assert_eq!(again.counter, 2 + round as u64);
            assert_eq!(again.settings, state.settings);
        }
        assert!(!state.erased.is_empty());
    }

    fn parents_of(repo: &Repository, commit: Oid) -> Vec<Oid> {
        repo.find_commit(commit).unwrap().parent_ids().collect()
    }

    /// A key state names the one it replaces as its parent while keys are
    /// only added; an erasure, a keyslot change, a new key epoch or a new
    /// segment cut the chain (so the replaced states become garbage); a
    /// merge names the other side too where it holds the same erased list
    /// and keyslots.
    #[test]
    fn key_states_chain_until_a_key_or_keyslot_goes() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(dir.path()).unwrap();
        std::fs::create_dir(repo.path().join("memvault")).unwrap();
        let keys = VaultKeys::derive(&Keyring::new_random());
        let caches = Caches::default();
        let mut slots = BTreeMap::new();
        slots.insert("00112233aabbccdd".to_string(), vec![7u8; 90]);
        let mut state =
            KeyState::create(&repo, &keys, slots.clone(), VaultConfig::default()).unwrap();
        let step = |state: &mut KeyState, change: KeyChange| {
            let before = state.commit;
            let staged = state
                .stage_changes(&repo, &keys, &caches, change, 1)
                .unwrap();
            state.published(&repo, staged);
            (before, staged)
        };
        let add = || KeyChange::files(vec![(FileKeyId::generate(), Some(FileKey::generate()))]);
        let (before, a) = step(&mut state, add());
        assert_eq!(parents_of(&repo, a), vec![before]);
        let (before, b) = step(&mut state, add());
        assert_eq!(parents_of(&repo, b), vec![before]);
        // A second state from `a` (the other machine's side of a merge).
        let mut other = KeyState::load_at(&repo, &keys, Some(a)).unwrap();
        let (_, theirs) = step(&mut other, add());
        assert_eq!(parents_of(&repo, theirs), vec![a]);
        let mut merge = KeyChange::files(
            other
                .all_keys(&repo, &keys)
                .unwrap()
                .into_iter()
                .map(|(id, k)| (id, Some(k)))
                .collect(),
        );
        merge.merge_parent = Some(theirs);
        let (before, m) = step(&mut state, merge);
        assert_eq!(parents_of(&repo, m), vec![before, theirs]);
        // Erasure: no parent, and the replaced state is garbage.
        let id = FileKeyId::generate();
        step(
            &mut state,
            KeyChange::files(vec![(id, Some(FileKey::generate()))]),
        );
        let (before, e) = step(&mut state, KeyChange::files(vec![(id, None)]));
        assert!(parents_of(&repo, e).is_empty());
        let garbage = std::fs::read_to_string(repo.path().join(GARBAGE_FILE)).unwrap();
        assert_eq!(
            garbage.lines().collect::<Vec<_>>(),
            vec![before.to_string()]
        );
        // Chained again after it (the erased list is the same).
        let (before, f) = step(&mut state, add());
        assert_eq!(parents_of(&repo, f), vec![before]);
        // A merge with a side that has not erased that key: not its parent.
        let mut merge = add();
        merge.merge_parent = Some(theirs);
        let (before, g) = step(&mut state, merge);
        assert_eq!(parents_of(&repo, g), vec![before]);
        // A keyslot change cuts it.
        slots.insert("ffeeddccbbaa9988".to_string(), vec![9u8; 90]);
        let (_, h) = step(
            &mut state,
            KeyChange {
                slots: Some(slots),
                ..add()
            },
        );
        assert!(parents_of(&repo, h).is_empty());
        // Crossing into the next segment cuts it.
        state.counter = CHAIN_SEGMENT - 1;
        let (_, i) = step(&mut state, add());
        assert!(parents_of(&repo, i).is_empty());
        let (before, j) = step(&mut state, add());
        assert_eq!(parents_of(&repo, j), vec![before]);
        // Another key epoch (a rekey) cuts it.
        let other_keys = VaultKeys::derive(&Keyring::new_random());
        let staged = state
            .stage_changes(&repo, &other_keys, &caches, add(), 1)
            .unwrap();
        assert!(parents_of(&repo, staged).is_empty());
    }
}
