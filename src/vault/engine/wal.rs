//! The write-ahead log: what makes a mutation durable with one
//! `fdatasync`, and lets a mutation create no file at all.
//!
//! A mutation stages its new git objects in memory (a mempack backend in
//! front of the repository's object database, see [`install_odb`]), then
//! appends ONE record to `memvault/wal` holding the raw bytes of every
//! object the new refs need beyond the previous state, and the new targets
//! of `refs/heads/main` and `refs/memvault/keys`. Once that record is
//! synced the mutation is durable. The record IS the ref move: ref files
//! are written only at checkpoints, and between two checkpoints the log's
//! tail is where the refs point. Every process reads refs through
//! [`Wal::ref_target`] after catching up with the log ([`Wal::catch_up`],
//! which also loads the new records' objects into its own memory): a ref
//! file naming the checkpoint's target (or the tail) stands for the tail;
//! any other value, or a missing ref, was set outside memvault and is
//! taken as it is, so the MAC and rollback checks still judge it. Plain
//! `git` sees the state of the last checkpoint (every memvault process
//! checkpoints when it closes).
//!
//! A checkpoint ([`crate::vault::Vault`] runs it every few MiB of log, on close, in
//! `gc`, and under the writer lock whenever a ref file names neither the
//! checkpoint nor the tail, i.e. was changed outside memvault) writes every
//! object of the log into git (one pack, or a few loose objects when there
//! are few), syncs them, the ref files and their directories, and only then
//! resets the log to a head entry naming the checkpointed ref targets.
//! After a crash the refs are set back (or forward) to the log's tail, and
//! the objects come from the log's bytes. No git file is ever written
//! without being synced before the log forgets it.
//!
//! # Format
//!
//! A sequence of entries, each `"MVWL" kind:u8 len:u32le body checksum`,
//! where the checksum is the git blob hash (SHA-1) of everything before it:
//! it finds torn writes. The first entry is the head (an 8-byte
//! generation, changed at every checkpoint, then the ref targets at that
//! checkpoint); the rest are records (the generation, the ref targets the
//! record builds on, the new ref targets, then objects as
//! `type:u8 oid len:u32le bytes`). In format 2 (kinds 3 and 4) every body
//! ends with an HMAC-SHA256 tag under the vault's log key
//! ([`crate::crypto::LogKey`]) over the kind and the rest of the body, and
//! each record names the tail it builds on: so an entry written without
//! the key (a log copied from another vault, a forged record) and a
//! genuine record replayed out of place are refused as damage
//! ([`WalError::Forged`], [`WalError::Replayed`]), never applied. Format 1
//! (kinds 1 and 2: no tag, no chain) is read only after a format-1 head,
//! until the first checkpoint writes a format-2 head; the vault refuses a
//! format-1 head once its key state is of format 2.
//!
//! Reading stops at the first entry that is cut short, does not check
//! out, or belongs to another generation: that is a record whose writer
//! died before it was synced, and which was therefore never acknowledged.
//! No record is written that a reader would refuse: one larger than
//! [`MAX_ENTRY`] is refused before anything is written
//! ([`WalError::TooLarge`]). The file itself is preallocated (zeros
//! written ahead of the records, in steps; see [`PREALLOC_BYTES`]) and
//! never truncated: a new record overwrites whatever follows the last
//! entry that checks out, and a checkpoint rewrites the head, with a new
//! generation, at offset 0.
//!
//! Limitations: the whole log file replaced by an earlier genuine copy of
//! this vault's own log (with the ref files of the same moment) is an
//! earlier state of the vault, as a restored backup is; the records
//! written since are gone. Only `verify`'s high-water mark can tell.
//!
//! # What it holds
//!
//! Only what git holds: encrypted blobs, trees of encrypted names, commits
//! with encrypted messages, the encrypted key table. Ref names are the only
//! plain words. The checksum detects torn writes, not tampering: the MACs
//! on commits do that.

use std::collections::HashSet;
use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::path::Path;

use git2::{ObjectType, Odb, Oid, Repository};

use super::raw::{code_type, type_code};
use super::{fsx, fsync};
use crate::crypto::LogKey;

/// The log, relative to the repository directory.
pub(crate) const WAL_FILE: &str = "memvault/wal";
const MAGIC: &[u8; 4] = b"MVWL";
/// Format 1 entries (read only after a format-1 head).
const KIND_HEAD_V1: u8 = 1;
const KIND_RECORD_V1: u8 = 2;
/// Format 2 entries: tagged, records chained.
const KIND_HEAD: u8 = 3;
const KIND_RECORD: u8 = 4;
/// The tag domain of a record that names replaced shards (format 7; its
/// entry kind is still `KIND_RECORD`). A memvault of format 6 reads such a
/// record's shard list as bytes it does not know and would take the record
/// for the log's end, then write over it: under this domain its tag check
/// fails first, and it stops with an error instead.
const TAG_RECORD_KEYS: u8 = 5;
const TAG_LEN: usize = 32;
/// The key table's shards (format 3 on): a record names at most these.
const SHARDS: u16 = 4096;
/// Records kept in memory for the checkpoint (see `Known::held`) stop
/// being kept past this many bytes of objects: the log is read back then.
const HELD_BYTES: usize = 64 << 20;
const ENTRY_OVERHEAD: usize = 4 + 1 + 4 + 20;

/// The log file is kept at least this long from the first checkpoint on,
/// and zeros are written ahead of the records in steps of
/// [`PREALLOC_STEP`] (never truncated after), so a record overwrites
/// blocks the file already has and its `fdatasync` writes the data alone,
/// not the inode too (on this machine's ext4, about 100 µs instead of
/// 170), but for the one record in a step that extends the file. A vault
/// that is seldom written (one of a server's thousands of tenants) keeps
/// a small log; a busy one grows it once to what a checkpoint cycle
/// needs. The log's end is where entries stop checking out: the zeros, or
/// the remains of records of an earlier generation.
pub(crate) const PREALLOC_BYTES: u64 = 64 << 10;
/// The most the zeros are extended by at once (they double the log's
/// length up to this), when a record comes within a quarter of the file's
/// length (16 KiB to 256 KiB) of its end.
pub(crate) const PREALLOC_STEP: u64 = 1 << 20;

/// A checkpoint is due when the log grows past this.
pub(crate) const CHECKPOINT_BYTES: u64 = 4 << 20;
/// No single entry may be larger than this, for the writer as for the
/// reader (a corrupt length field must not make a reader allocate
/// gigabytes, and a record the reader would refuse is never written).
pub(crate) const MAX_ENTRY: usize = 1 << 30;

/// The entry limit in force: [`MAX_ENTRY`], or in a `test-hooks` build
/// `MEMVAULT_TEST_MAX_RECORD` bytes (so tests can reach it).
fn max_entry() -> usize {
    #[cfg(feature = "test-hooks")]
    {
        static LIMIT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        *LIMIT.get_or_init(|| {
            std::env::var("MEMVAULT_TEST_MAX_RECORD")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(MAX_ENTRY)
        })
    }
    #[cfg(not(feature = "test-hooks"))]
    MAX_ENTRY
}

/// Why the log could not be read or written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WalError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Git(#[from] git2::Error),
    #[error(
        "the write-ahead log (memvault/wal) holds an entry that was not written with this vault's key (a log copied from another vault, or a forged entry)"
    )]
    Forged,
    #[error(
        "the write-ahead log (memvault/wal) holds a record that does not build on the one before it (an earlier record replayed)"
    )]
    Replayed,
    #[error("a logged object does not match its id")]
    BadObject,
    #[error(
        "the write-ahead log (memvault/wal) is damaged at byte {at}: the entry there does not check out, yet {later} intact record(s) of the log follow it, so acknowledged changes would be lost if it were read only up to the damage; nothing was changed. Restore the vault from a remote or a backup; or, to keep the changes before the damage and drop those after it (if this machine lost power with writes in flight, those were never acknowledged), cut the log there: truncate -s {at} memvault/wal"
    )]
    Damaged { at: u64, later: usize },
    #[error(
        "this change needs a log record of {bytes} bytes, over the limit of {limit} bytes; nothing was changed (import fewer files at once, or rename a smaller directory)"
    )]
    TooLarge { bytes: usize, limit: usize },
    #[error(
        "the log must be read (and, for a format-1 head, checkpointed) before a record is written"
    )]
    NotReady,
}

/// Ref targets, by ref name.
pub(crate) type Refs = Vec<(String, Oid)>;

pub(crate) use super::raw::Object;

/// One mutation: the objects it adds and where the refs point after it.
#[derive(Default)]
pub(crate) struct Record {
    pub refs: Refs,
    pub objects: Vec<Object>,
    /// Key-table shards this record replaces without a new key state
    /// (format 7): shard number and its new sealed blob, which is among
    /// `objects`. The key state folds them in before the next checkpoint
    /// (see [`Wal::pending_keys`]).
    pub keys: Vec<(u16, Oid)>,
}

/// Keep `r` among the held records (see `Known::held`), unless they pass
/// [`HELD_BYTES`]: then none are kept (the checkpoint reads the log).
fn hold(held: &mut Option<Vec<Record>>, bytes: &mut usize, r: Record) {
    let Some(h) = held else {
        return;
    };
    *bytes += r.objects.iter().map(|o| o.data.len()).sum::<usize>();
    if *bytes > HELD_BYTES {
        *held = None;
    } else {
        h.push(r);
    }
}

/// The shard blobs of `records` that a later record replaced before any
/// key state took them in: no key state ever names them, so a checkpoint
/// leaves them out of git (each holds only keys its successor holds too;
/// a destroyed key must not stay behind in one, see `erase`).
pub(crate) fn superseded_keys(records: &[Record]) -> HashSet<Oid> {
    let mut pending = std::collections::BTreeMap::new();
    let mut out = HashSet::new();
    for r in records {
        if r.refs.iter().any(|(n, _)| n == super::KEYS_REF) {
            pending.clear();
        }
        for (shard, id) in &r.keys {
            if let Some(old) = pending.insert(*shard, *id)
                && old != *id
            {
                out.insert(old);
            }
        }
    }
    out
}

/// The key-table shards the log's records replaced since the last record
/// that moved the key state (a new key state holds every shard its writer
/// knew): `pending` after `r`.
fn note_keys(pending: &mut std::collections::BTreeMap<u16, Oid>, r: &Record) {
    if r.refs.iter().any(|(n, _)| n == super::KEYS_REF) {
        pending.clear();
    }
    pending.extend(r.keys.iter().copied());
}

impl Record {
    /// Add the objects a new tree needs that `old` (a durable tree, or
    /// None) does not have: the trees on changed paths and their new
    /// blobs. Objects already added are skipped.
    pub fn add_tree_diff(
        &mut self,
        odb: &Odb<'_>,
        repo: &Repository,
        new: Oid,
        old: Option<Oid>,
        seen: &mut HashSet<Oid>,
    ) -> Result<(), git2::Error> {
        if Some(new) == old || !seen.insert(new) {
            return Ok(());
        }
        super::objects::check(repo, new)?;
        self.add_object(odb, new)?;
        let new_tree = super::objects::find_tree(repo, new)?;
        let old_tree = match old {
            Some(o) => Some(super::objects::find_tree(repo, o)?),
            None => None,
        };
        for e in new_tree.iter() {
            // Trees are sorted by name: look the entry up, not scan for it.
            let before = match (old_tree.as_ref(), e.name()) {
                (Some(t), Ok(name)) => t.get_name(name).map(|o| o.to_owned()),
                (Some(t), Err(_)) => {
                    let name = e.name_bytes();
                    t.iter().find(|o| o.name_bytes() == name)
                }
                (None, _) => None,
            };
            let before_id = before.as_ref().map(|b| b.id());
            if before_id == Some(e.id()) {
                continue;
            }
            match e.kind() {
                Some(ObjectType::Tree) => {
                    let old_sub = before
                        .filter(|b| b.kind() == Some(ObjectType::Tree))
                        .map(|b| b.id());
                    self.add_tree_diff(odb, repo, e.id(), old_sub, seen)?;
                }
                _ => {
                    if seen.insert(e.id()) {
                        super::objects::check(repo, e.id())?;
                        self.add_object(odb, e.id())?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Add one object by id, read back from the object database (one this
    /// mutation wrote, or checked by the caller: see `objects::check`).
    pub fn add_object(&mut self, odb: &Odb<'_>, id: Oid) -> Result<(), git2::Error> {
        let obj = odb.read(id)?;
        self.objects.push(Object {
            kind: obj.kind(),
            id,
            data: obj.data().to_vec(),
        });
        Ok(())
    }

    /// The record's entry: format 2 (`key`: tagged, with the tail `base`
    /// it builds on) or, without a key, format 1. Refused when larger than
    /// a reader accepts.
    fn encode(
        &self,
        generation: &[u8; 8],
        base: &Refs,
        key: Option<&LogKey>,
    ) -> Result<Vec<u8>, WalError> {
        // A shard list only in a tagged log (see `TAG_RECORD_KEYS`).
        if !self.keys.is_empty() && key.is_none() {
            return Err(WalError::NotReady);
        }
        let limit = max_entry();
        let size: usize = self
            .objects
            .iter()
            .map(|o| o.data.len().saturating_add(25))
            .fold(256usize, usize::saturating_add);
        if size > limit {
            return Err(WalError::TooLarge { bytes: size, limit });
        }
        let mut body = Vec::with_capacity(size + TAG_LEN);
        body.extend_from_slice(generation);
        if key.is_some() {
            encode_refs(&mut body, base);
        }
        encode_refs(&mut body, &self.refs);
        let count = u32::try_from(self.objects.len())
            .map_err(|_| WalError::TooLarge { bytes: size, limit })?;
        body.extend_from_slice(&count.to_le_bytes());
        for o in &self.objects {
            body.push(type_code(o.kind).ok_or(WalError::BadObject)?);
            body.extend_from_slice(o.id.as_bytes());
            // Each object is under the limit, itself under u32::MAX.
            body.extend_from_slice(&(o.data.len() as u32).to_le_bytes());
            body.extend_from_slice(&o.data);
        }
        // Format 7: the shards replaced, after the objects (a record
        // without any is as format 6 wrote it).
        if !self.keys.is_empty() {
            let n = u16::try_from(self.keys.len())
                .map_err(|_| WalError::TooLarge { bytes: size, limit })?;
            body.extend_from_slice(&n.to_le_bytes());
            for (shard, id) in &self.keys {
                body.extend_from_slice(&shard.to_le_bytes());
                body.extend_from_slice(id.as_bytes());
            }
        }
        let domain = if self.keys.is_empty() {
            KIND_RECORD
        } else {
            TAG_RECORD_KEYS
        };
        let kind = match key {
            Some(k) => {
                let tag = k.tag(&[&[domain], &body]);
                body.extend_from_slice(&tag);
                KIND_RECORD
            }
            None => KIND_RECORD_V1,
        };
        if body.len() > limit {
            return Err(WalError::TooLarge {
                bytes: body.len(),
                limit,
            });
        }
        Ok(entry(kind, &body))
    }

    /// A record's payload (its tag already checked): None if it is not of
    /// `generation` or does not parse. Format 2 also gives the tail the
    /// record builds on.
    fn decode(
        payload: &[u8],
        generation: &[u8; 8],
        chained: bool,
    ) -> Option<(Option<Refs>, Record)> {
        let mut r = Reader(payload);
        if r.take(8)? != generation {
            return None;
        }
        let base = match chained {
            true => Some(decode_refs(&mut r)?),
            false => None,
        };
        let refs = decode_refs(&mut r)?;
        let n = r.u32()? as usize;
        let mut objects = Vec::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            let kind = code_type(r.u8()?)?;
            let id = Oid::from_bytes(r.take(20)?).ok()?;
            let len = r.u32()? as usize;
            let data = r.take(len)?.to_vec();
            objects.push(Object { kind, id, data });
        }
        let mut keys = Vec::new();
        if !r.0.is_empty() {
            // Only in a tagged log (format 2 on).
            if !chained {
                return None;
            }
            let n = u16::from_le_bytes(r.take(2)?.try_into().ok()?);
            // Each shard once, of the 4096 there are, each naming a blob of
            // the record (the shard's new version).
            if n == 0 || usize::from(n) > objects.len() || n > SHARDS {
                return None;
            }
            let blobs: HashSet<Oid> = objects
                .iter()
                .filter(|o| o.kind == ObjectType::Blob)
                .map(|o| o.id)
                .collect();
            let mut seen = HashSet::new();
            for _ in 0..n {
                let shard = u16::from_le_bytes(r.take(2)?.try_into().ok()?);
                let id = Oid::from_bytes(r.take(20)?).ok()?;
                if shard >= SHARDS || !seen.insert(shard) || !blobs.contains(&id) {
                    return None;
                }
                keys.push((shard, id));
            }
        }
        if !r.0.is_empty() {
            return None;
        }
        Some((
            base,
            Record {
                refs,
                objects,
                keys,
            },
        ))
    }
}

/// The payload of a format-2 entry, its tag checked when the key is
/// known (before unlock it is not: the vault reads again once it is).
fn open_tagged<'a>(kind: u8, body: &'a [u8], key: Option<&LogKey>) -> Result<&'a [u8], WalError> {
    let Some(split) = body.len().checked_sub(TAG_LEN) else {
        return Err(WalError::Forged);
    };
    let (payload, tag) = body.split_at(split);
    match key {
        Some(k) if !k.check(&[&[kind], payload], tag) => Err(WalError::Forged),
        _ => Ok(payload),
    }
}

/// A record's payload, its tag checked when the key is known, and the
/// domain the tag was made under then: `KIND_RECORD`, or `TAG_RECORD_KEYS`
/// for a record that names replaced shards.
fn open_record<'a>(
    body: &'a [u8],
    key: Option<&LogKey>,
) -> Result<(&'a [u8], Option<u8>), WalError> {
    let Some(k) = key else {
        return Ok((open_tagged(KIND_RECORD, body, None)?, None));
    };
    for domain in [KIND_RECORD, TAG_RECORD_KEYS] {
        if let Ok(p) = open_tagged(domain, body, Some(k)) {
            return Ok((p, Some(domain)));
        }
    }
    Err(WalError::Forged)
}

/// The same ref targets, in any order.
fn same_refs(a: &Refs, b: &Refs) -> bool {
    a.len() == b.len() && a.iter().all(|(n, id)| target(b, n) == Some(*id))
}

fn encode_refs(out: &mut Vec<u8>, refs: &Refs) {
    out.push(refs.len() as u8);
    for (name, id) in refs {
        out.push(name.len() as u8);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(id.as_bytes());
    }
}

fn decode_refs(r: &mut Reader<'_>) -> Option<Refs> {
    let n = r.u8()?;
    let mut refs = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let len = r.u8()? as usize;
        let name = std::str::from_utf8(r.take(len)?).ok()?.to_string();
        let id = Oid::from_bytes(r.take(20)?).ok()?;
        refs.push((name, id));
    }
    Some(refs)
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

fn checksum(bytes: &[u8]) -> [u8; 20] {
    super::pack::blob_hash(bytes)
}

fn entry(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + ENTRY_OVERHEAD);
    out.extend_from_slice(MAGIC);
    out.push(kind);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(body);
    let sum = checksum(&out);
    out.extend_from_slice(&sum);
    out
}

/// Parse one entry at the start of `bytes`: its kind, body and length.
fn parse_entry(bytes: &[u8]) -> Option<(u8, &[u8], usize)> {
    if bytes.len() < ENTRY_OVERHEAD || &bytes[..4] != MAGIC {
        return None;
    }
    let kind = bytes[4];
    let len = u32::from_le_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) as usize;
    if len > max_entry() || bytes.len() < ENTRY_OVERHEAD + len {
        return None;
    }
    let end = 9 + len;
    if checksum(&bytes[..end]) != bytes[end..end + 20] {
        return None;
    }
    Some((kind, &bytes[9..end], end + 20))
}

/// Read and check the entry at `pos` of a log file `file_len` bytes long:
/// its kind, body and length. None where entries stop checking out.
fn read_entry_at(file: &File, pos: u64, file_len: u64) -> Option<(u8, Vec<u8>, u64)> {
    let room = file_len.checked_sub(pos)?;
    if room < ENTRY_OVERHEAD as u64 {
        return None;
    }
    let mut header = [0u8; 9];
    file.read_exact_at(&mut header, pos).ok()?;
    if &header[..4] != MAGIC {
        return None;
    }
    let len = u32::from_le_bytes([header[5], header[6], header[7], header[8]]) as usize;
    if len > max_entry() || room < (ENTRY_OVERHEAD + len) as u64 {
        return None;
    }
    let mut bytes = vec![0u8; ENTRY_OVERHEAD + len];
    file.read_exact_at(&mut bytes, pos).ok()?;
    let (kind, body, total) = parse_entry(&bytes)?;
    Some((kind, body.to_vec(), total as u64))
}

/// Whether entries that stop checking out at `pos` stop at the log's end
/// for sure: the file's end, or an entry of another generation that checks
/// out (an earlier generation's remains). Anything else, zeros included
/// (written ahead of the records, but also what a lost block reads as),
/// may be damage (see [`Wal::intact_records_after`]).
fn clean_end(file: &File, pos: u64, file_len: u64, generation: &[u8; 8]) -> bool {
    let mut first = [0u8; 9 + 8];
    let n = file_len.saturating_sub(pos).min(first.len() as u64) as usize;
    if n == 0 || file.read_exact_at(&mut first[..n], pos).is_err() {
        return true;
    }
    n == first.len()
        && &first[..4] == MAGIC
        && first[9..] != generation[..]
        // Whole: not this generation's entry with its generation hit.
        && read_entry_at(file, pos, file_len).is_some()
}

/// The entry at `pos` is of `kind` (a format-2 head or record) and its
/// body starts with `generation`, as both kinds' do. Reads 17 bytes.
fn entry_of_generation(file: &File, pos: u64, kind: u8, generation: &[u8; 8]) -> bool {
    let mut first = [0u8; 9 + 8];
    file.read_exact_at(&mut first, pos).is_ok()
        && &first[..4] == MAGIC
        && first[4] == kind
        && first[9..] == generation[..]
}

/// The head entry: the checkpoint the records build on.
pub(crate) struct Head {
    pub generation: [u8; 8],
    pub refs: Refs,
}

fn encode_head(head: &Head, key: Option<&LogKey>) -> Vec<u8> {
    let mut body = head.generation.to_vec();
    encode_refs(&mut body, &head.refs);
    match key {
        Some(k) => {
            let tag = k.tag(&[&[KIND_HEAD], &body]);
            body.extend_from_slice(&tag);
            entry(KIND_HEAD, &body)
        }
        None => entry(KIND_HEAD_V1, &body),
    }
}

fn decode_head(payload: &[u8]) -> Option<Head> {
    let mut r = Reader(payload);
    let generation: [u8; 8] = r.take(8)?.try_into().ok()?;
    let refs = decode_refs(&mut r)?;
    r.0.is_empty().then_some(Head { generation, refs })
}

/// The head at the start of the log, if one checks out: the head, whether
/// it is of format 2, and its entry's length. A format-2 head whose tag
/// fails is refused.
fn read_head(
    file: &File,
    file_len: u64,
    key: Option<&LogKey>,
) -> Result<Option<(Head, bool, u64)>, WalError> {
    let Some((kind, body, len)) = read_entry_at(file, 0, file_len) else {
        return Ok(None);
    };
    let (payload, v2) = match kind {
        KIND_HEAD => (open_tagged(kind, &body, key)?, true),
        KIND_HEAD_V1 => (&body[..], false),
        _ => return Ok(None),
    };
    Ok(decode_head(payload).map(|h| (h, v2, len)))
}

/// Everything the log holds that checks out.
pub(crate) struct Contents {
    pub head: Option<Head>,
    pub records: Vec<Record>,
    /// Length of the part that checks out.
    #[cfg_attr(not(test), allow(dead_code))]
    pub valid_len: u64,
    /// Every record's tag was checked under the vault's log key: each
    /// object in them is as a key holder wrote it, its id computed from
    /// its bytes then (so a checkpoint need not hash it again).
    pub tagged: bool,
}

impl Contents {
    /// An empty log: no head, no record.
    fn empty() -> Contents {
        Contents {
            head: None,
            records: Vec::new(),
            valid_len: 0,
            tagged: false,
        }
    }

    /// The key-table shards replaced since the last new key state (see
    /// [`Wal::pending_keys`]): none once the key state holds them all.
    pub fn pending_keys(&self) -> std::collections::BTreeMap<u16, Oid> {
        let mut pending = std::collections::BTreeMap::new();
        for r in &self.records {
            note_keys(&mut pending, r);
        }
        pending
    }

    /// Where the refs must point: the head's targets with every record's
    /// applied in order. Empty if the log holds nothing that checks out.
    pub fn tail(&self) -> Refs {
        let mut refs: Refs = self
            .head
            .as_ref()
            .map(|h| h.refs.clone())
            .unwrap_or_default();
        for r in &self.records {
            merge_refs(&mut refs, &r.refs);
        }
        refs
    }
}

pub(crate) fn merge_refs(into: &mut Refs, from: &Refs) {
    for (name, id) in from {
        match into.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = *id,
            None => into.push((name.clone(), *id)),
        }
    }
}

/// This process's handle on the log, with what it has already read.
pub(crate) struct Wal {
    file: File,
    /// How far this process has read (or written) the log.
    known: Option<Known>,
    /// The ref files found to point where the log's head says, with the
    /// generation and the files' stamps then: while neither changes, the
    /// answer of [`Wal::refs_consistent`] stands without reading them.
    refs_seen: std::cell::Cell<Option<([u8; 8], RefStamps)>>,
    /// Where the log was (see [`Wal::position`]) when
    /// [`Wal::refs_consistent`] last said true; None after a false.
    refs_ok_at: std::cell::Cell<Option<LogPosition>>,
    /// The key of the entries' tags (set once the vault is unlocked).
    key: Option<LogKey>,
    /// The file's length as last seen (zeros ahead of the records).
    allocated: u64,
    /// Grows whenever what this handle knows of the log may have changed
    /// [`Wal::pending_keys`] (so a reader applies them only then).
    keys_stamp: u64,
}

/// A generation of the log and a length read of it.
pub(crate) type LogPosition = ([u8; 8], u64);

/// A position in the log and the ref targets there.
struct Known {
    generation: [u8; 8],
    /// The head is of format 2 (tagged entries, chained records).
    v2: bool,
    /// Length read so far.
    len: u64,
    /// Length of the head entry (records start there).
    head_len: u64,
    /// The checkpoint's ref targets (the head's).
    head: Refs,
    /// The ref targets at `len`.
    tail: Refs,
    /// Every record from the head to `len`, as this process read (tag
    /// checked, objects hashed) or wrote them, when it holds them all: a
    /// checkpoint then packs them without reading the log back. None when
    /// some were not kept.
    held: Option<Vec<Record>>,
    /// The object bytes in `held`.
    held_bytes: usize,
    /// The key-table shards replaced since the last new key state, at
    /// `len` (see [`Wal::pending_keys`]).
    keys: std::collections::BTreeMap<u16, Oid>,
}

fn target(refs: &Refs, name: &str) -> Option<Oid> {
    refs.iter().find(|(n, _)| n == name).map(|(_, id)| *id)
}

/// A ref as its file says: None if there is none, the zero id if the file
/// does not read (cut short by a crash).
/// Size, modification time and inode of the files that can hold the refs
/// (their loose files and `packed-refs`; None if one cannot be read).
type RefStamps = [(u64, i64, i64, u64); 3];

fn ref_stamps(repo: &Repository, refs: &Refs) -> Option<RefStamps> {
    use std::os::unix::fs::MetadataExt;
    let one = |p: &Path| match fs::symlink_metadata(p) {
        Ok(m) => Some((m.size(), m.mtime(), m.mtime_nsec(), m.ino())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some((0, 0, 0, 0)),
        Err(_) => None,
    };
    let mut out = [(0, 0, 0, 0); 3];
    let names: Vec<&str> = refs.iter().map(|(n, _)| n.as_str()).collect();
    if names.len() > 2 {
        return None;
    }
    for (i, n) in names.iter().enumerate() {
        out[i] = one(&repo.path().join(n))?;
    }
    out[2] = one(&repo.path().join("packed-refs"))?;
    Some(out)
}

pub(crate) fn read_ref(repo: &Repository, name: &str) -> Option<Oid> {
    match repo.refname_to_id(name) {
        Ok(id) => Some(id),
        Err(e) if e.code() == git2::ErrorCode::NotFound => None,
        Err(_) => Some(Oid::ZERO_SHA1),
    }
}

/// What [`Wal::catch_up`] found.
pub(crate) struct CatchUp {
    /// The log has a head that checks out (false: new, or its head was
    /// torn; a checkpoint writes one).
    pub clean: bool,
    /// The log holds records that are not yet checkpointed into git.
    pub records: bool,
}

/// Whether the log of the vault at `dir` may hold records after its
/// head: changes its ref files do not show yet. Read without the key (this
/// only decides whether to read the vault as a remote), from a read-only
/// descriptor: the head, then the first 17 bytes after it (a record of the
/// head's generation starting there counts, whole or torn). A log that
/// cannot be read counts as holding records, a missing or empty one not.
pub(crate) fn holds_records(dir: &Path) -> bool {
    let file = match fsx::open_read(&dir.join(WAL_FILE)) {
        Ok(f) => f,
        Err(e) => return e.kind() != std::io::ErrorKind::NotFound,
    };
    let Ok(len) = file.metadata().map(|m| m.len()) else {
        return true;
    };
    match read_head(&file, len, None) {
        Ok(None) => false,
        Ok(Some((head, _, head_len))) => [KIND_RECORD, KIND_RECORD_V1]
            .iter()
            .any(|&kind| entry_of_generation(&file, head_len, kind, &head.generation)),
        Err(_) => true,
    }
}

/// Write zeros over `from..to` of `file`, from one static buffer: a fresh
/// zeroed allocation of up to a step per extension cost a page fault per
/// 4 KiB touched, on a mutation's path.
fn write_zeros(file: &File, from: u64, to: u64) -> std::io::Result<()> {
    static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
    let mut at = from;
    while at < to {
        let n = (to - at).min(ZEROS.len() as u64);
        file.write_all_at(&ZEROS[..n as usize], at)?;
        at += n;
    }
    Ok(())
}

impl Wal {
    /// Open (creating if missing, empty) the log of the repository at
    /// `dir`. An empty log means "the refs on disk are the checkpoint".
    /// Until [`Wal::set_key`], entries' tags are not checked (enough to
    /// find the keyslots before unlock) and nothing can be written.
    pub fn open(dir: &Path) -> std::io::Result<Wal> {
        let file = fsx::open_rw(&dir.join(WAL_FILE))?;
        Ok(Wal {
            file,
            known: None,
            refs_seen: std::cell::Cell::new(None),
            refs_ok_at: std::cell::Cell::new(None),
            key: None,
            allocated: 0,
            keys_stamp: 0,
        })
    }

    /// Check every entry's tag from now on, and write format 2. What was
    /// read before is read again, checked, at the next catch-up.
    pub fn set_key(&mut self, key: LogKey) {
        self.key = Some(key);
        self.known = None;
    }

    /// The head this process last read is of format 1 (untagged): the
    /// next checkpoint writes a format-2 one. None: no head was read.
    pub fn head_is_v1(&self) -> Option<bool> {
        self.known.as_ref().map(|k| !k.v2)
    }

    /// Read the records that follow a head, from `pos` with the tail
    /// `refs`, handing each to `each`; returns where they stop and the tail
    /// there. A record of the head's generation whose tag fails, or that
    /// does not build on the tail before it, is refused.
    fn scan(
        &self,
        head: &Head,
        v2: bool,
        mut pos: u64,
        mut refs: Refs,
        mut file_len: u64,
        mut each: impl FnMut(Record) -> Result<(), WalError>,
    ) -> Result<(u64, Refs), WalError> {
        let want = if v2 { KIND_RECORD } else { KIND_RECORD_V1 };
        // Times the entry at one place was found cut short with intact
        // records after it, and read again.
        let mut again = 0;
        'entries: loop {
            // An earlier generation's remains (what follows a fresh head until
            // records overwrite it) end the log: tell them by their first
            // bytes, without reading and checking the whole entry.
            while !v2 || entry_of_generation(&self.file, pos, KIND_RECORD, &head.generation) {
                let Some((kind, body, len)) = read_entry_at(&self.file, pos, file_len) else {
                    break;
                };
                if kind != want {
                    break;
                }
                let payload = match v2 {
                    true => match open_tagged(kind, &body, None) {
                        // Generation first: an earlier generation's remains
                        // end the log, whatever their tag.
                        Ok(p) if p.get(..8) != Some(&head.generation[..]) => break,
                        Ok(_) => open_record(&body, self.key.as_ref())?,
                        Err(_) => break,
                    },
                    false => (&body[..], None),
                };
                let (payload, domain) = payload;
                let Some((base, record)) = Record::decode(payload, &head.generation, v2) else {
                    break;
                };
                // The domain says whether the record names shards.
                if domain.is_some_and(|d| (d == TAG_RECORD_KEYS) == record.keys.is_empty()) {
                    return Err(WalError::Forged);
                }
                if let Some(base) = base
                    && !same_refs(&base, &refs)
                {
                    return Err(WalError::Replayed);
                }
                merge_refs(&mut refs, &record.refs);
                each(record)?;
                pos += len;
            }
            // A crash tears only the last record, and a record was synced (and
            // acknowledged) only with every one before it: intact records of
            // this generation after one that does not check out mean the log
            // was damaged in the middle, and reading up to there would drop
            // acknowledged changes without a word.
            if v2 && !clean_end(&self.file, pos, file_len, &head.generation) {
                let later = self.intact_records_after(pos, file_len, &head.generation);
                if later > 0 {
                    // A record a writer was appending when it was read (a
                    // catch-up needs no lock) is whole by now: the records
                    // after it were written after it, on this machine's page
                    // cache. Read on from it; damage stays cut short.
                    file_len = self.file.metadata()?.len();
                    if again < 3 && read_entry_at(&self.file, pos, file_len).is_some() {
                        again += 1;
                        continue 'entries;
                    }
                    return Err(WalError::Damaged { at: pos, later });
                }
            }
            return Ok((pos, refs));
        }
    }

    /// How many records of `generation` whose checksum and tag check out
    /// (under this vault's log key: none are counted without it) the file
    /// holds after `pos`, found by their entries' first bytes.
    fn intact_records_after(&self, pos: u64, file_len: u64, generation: &[u8; 8]) -> usize {
        self.intact_records(pos + 1, file_len, Some(generation), |payload| {
            payload.get(..8) == Some(&generation[..])
        })
    }

    /// How many records from `from` on check out (checksum, and tag under
    /// this vault's log key: none without it) and pass `keep` (given the
    /// payload); `generation`: only entries whose first bytes name it.
    fn intact_records(
        &self,
        from: u64,
        file_len: u64,
        generation: Option<&[u8; 8]>,
        mut keep: impl FnMut(&[u8]) -> bool,
    ) -> usize {
        const CHUNK: usize = 1 << 20;
        let Some(key) = self.key.as_ref() else {
            return 0;
        };
        let mut found = 0;
        let mut buf = vec![0u8; CHUNK + 17];
        let mut at = from;
        while at < file_len {
            let n = (file_len - at).min(buf.len() as u64) as usize;
            if self.file.read_exact_at(&mut buf[..n], at).is_err() {
                break;
            }
            // Entries starting in this chunk (the 17 bytes after it are
            // read for those near its end).
            let starts = n.min(CHUNK);
            for i in memchr::memmem::find_iter(&buf[..n], MAGIC).take_while(|&i| i < starts) {
                let first = &buf[i..n.min(i + 17)];
                if first.len() < 17
                    || first[4] != KIND_RECORD
                    || generation.is_some_and(|g| first[9..17] != g[..])
                {
                    continue;
                }
                let Some((_, body, _)) = read_entry_at(&self.file, at + i as u64, file_len) else {
                    continue;
                };
                if open_record(&body, Some(key)).is_ok_and(|(payload, _)| keep(payload)) {
                    found += 1;
                }
            }
            at += CHUNK as u64;
        }
        found
    }

    /// With no head that checks out at the start of the log: how many
    /// intact records follow that build on
    /// what the ref files say (records of the generation whose head was
    /// lost: the ref files are written at the checkpoint that writes a
    /// head, and its first record builds on them; an earlier generation's
    /// records build on older states).
    fn records_after_lost_head(&self, repo: &Repository, file_len: u64) -> usize {
        // (Zeros too: a lost block reads as zeros.)
        if file_len == 0 {
            return 0;
        }
        let on_disk: Refs = [super::MAIN_REF, super::KEYS_REF]
            .iter()
            .filter_map(|n| read_ref(repo, n).map(|id| (n.to_string(), id)))
            .collect();
        if on_disk.is_empty() {
            return 0;
        }
        let mut lost = None;
        self.intact_records(0, file_len, None, |payload| {
            let Some(generation) = payload.get(..8).and_then(|g| <[u8; 8]>::try_from(g).ok())
            else {
                return false;
            };
            let first = Record::decode(payload, &generation, true)
                .is_some_and(|(base, _)| base.is_some_and(|b| same_refs(&b, &on_disk)));
            if first {
                lost = Some(generation);
            }
            first
        });
        // Every intact record of that generation.
        match lost {
            Some(generation) => self.intact_records(0, file_len, Some(&generation), |payload| {
                payload.get(..8) == Some(&generation[..])
            }),
            None => 0,
        }
    }

    /// Read the whole log, leaving what this handle knows of it as it was
    /// (the objects of the records it has read are loaded; those it reads
    /// here are not, so [`Wal::catch_up`] must still find them new).
    pub fn peek_all(&self) -> Result<Contents, WalError> {
        let file_len = self.file.metadata()?.len();
        let Some((head, v2, head_len)) = read_head(&self.file, file_len, self.key.as_ref())? else {
            return Ok(Contents::empty());
        };
        let mut records = Vec::new();
        let (pos, _) = self.scan(&head, v2, head_len, head.refs.clone(), file_len, |r| {
            records.push(r);
            Ok(())
        })?;
        Ok(Contents {
            head: Some(head),
            records,
            valid_len: pos,
            tagged: v2 && self.key.is_some(),
        })
    }

    /// Read the whole log.
    pub fn read_all(&mut self) -> Result<Contents, WalError> {
        let file_len = self.file.metadata()?.len();
        let Some((head, v2, head_len)) = read_head(&self.file, file_len, self.key.as_ref())? else {
            self.known = None;
            return Ok(Contents::empty());
        };
        let mut records = Vec::new();
        let mut keys = std::collections::BTreeMap::new();
        let (pos, tail) = self.scan(&head, v2, head_len, head.refs.clone(), file_len, |r| {
            note_keys(&mut keys, &r);
            records.push(r);
            Ok(())
        })?;
        self.keys_stamp += 1;
        self.known = Some(Known {
            generation: head.generation,
            v2,
            len: pos,
            head_len,
            head: head.refs.clone(),
            tail,
            // Handed to the caller (a checkpoint, which starts the log
            // over).
            held: None,
            held_bytes: 0,
            keys,
        });
        Ok(Contents {
            head: Some(head),
            records,
            valid_len: pos,
            tagged: v2 && self.key.is_some(),
        })
    }

    /// What a checkpoint packs (the caller holds the writer lock): the
    /// records this process holds (see `Known::held`) when they are the
    /// whole log, which it then need not read back, check and hash again;
    /// otherwise the log read whole ([`Wal::read_all`]). Held records are
    /// handed over: the checkpoint starts the log over.
    pub fn contents_for_checkpoint(&mut self) -> Result<Contents, WalError> {
        if let Some(k) = &mut self.known
            && k.v2
            && self.key.is_some()
            && k.held.is_some()
            && entry_of_generation(&self.file, 0, KIND_HEAD, &k.generation)
            && !entry_of_generation(&self.file, k.len, KIND_RECORD, &k.generation)
            && let Some(records) = k.held.take()
        {
            return Ok(Contents {
                head: Some(Head {
                    generation: k.generation,
                    refs: k.head.clone(),
                }),
                records,
                valid_len: k.len,
                tagged: true,
            });
        }
        self.read_all()
    }

    /// Bring this process's view of the log up to date: load the objects
    /// of records it has not seen into `repo`'s in-memory object store
    /// (after another process's checkpoint, start a fresh one), and return
    /// the ref targets at the tail. Safe without the writer lock (a reader
    /// stops at a record still being appended).
    pub fn catch_up(&mut self, repo: &Repository) -> Result<CatchUp, WalError> {
        // Nothing new (the usual case, on every request): the head is of
        // the generation this process read, and no record of it follows
        // what was read. A generation has one head, which this process
        // read and checked whole; a head put back or altered under the same
        // generation changes nothing this process uses.
        if let Some(k) = &self.known
            && k.v2
            && self.key.is_some()
            && entry_of_generation(&self.file, 0, KIND_HEAD, &k.generation)
            && !entry_of_generation(&self.file, k.len, KIND_RECORD, &k.generation)
        {
            return Ok(CatchUp {
                clean: true,
                records: k.len > k.head_len,
            });
        }
        let mut file_len = self.file.metadata()?.len();
        let (head, v2, head_len) = match read_head(&self.file, file_len, self.key.as_ref())? {
            Some(head) => head,
            None => {
                // A head that does not check out, with the records after
                // it intact: damage, not a log to take as empty; unless it
                // was being written when read (a checkpoint), and is whole
                // now.
                let later = self.records_after_lost_head(repo, file_len);
                if later == 0 {
                    self.known = None;
                    return Ok(CatchUp {
                        clean: false,
                        records: false,
                    });
                }
                file_len = self.file.metadata()?.len();
                match read_head(&self.file, file_len, self.key.as_ref())? {
                    Some(head) => head,
                    None => return Err(WalError::Damaged { at: 0, later }),
                }
            }
        };
        let (start, refs, mut held, mut keys, mut held_bytes) = match &mut self.known {
            Some(k) if k.generation == head.generation && k.len <= file_len => (
                k.len,
                k.tail.clone(),
                k.held.take(),
                k.keys.clone(),
                k.held_bytes,
            ),
            _ => {
                // First look, or another process checkpointed: everything
                // before is in git now.
                install_odb(repo)?;
                let none = std::collections::BTreeMap::new();
                (head_len, head.refs.clone(), Some(Vec::new()), none, 0)
            }
        };
        // Kept only when checked as read (see `Known::held`).
        if !(v2 && self.key.is_some()) {
            held = None;
        }
        // The log ends where entries stop checking out (see
        // PREALLOC_BYTES): a record a writer is still appending, one that
        // was torn by a crash (never acknowledged; the next record
        // overwrites it), zeros, or an earlier generation's remains.
        // On an error, what this process knew stays as it was, without
        // held records (taken above).
        let (pos, refs) = self.scan(&head, v2, start, refs, file_len, |r| {
            for o in &r.objects {
                if super::objects::write_object(repo, o.kind, &o.data)? != o.id {
                    return Err(WalError::BadObject);
                }
            }
            note_keys(&mut keys, &r);
            hold(&mut held, &mut held_bytes, r);
            Ok(())
        })?;
        self.keys_stamp += 1;
        self.known = Some(Known {
            generation: head.generation,
            v2,
            len: pos,
            head_len,
            head: head.refs,
            tail: refs,
            held,
            held_bytes,
            keys,
        });
        Ok(CatchUp {
            // A log with a head is clean: whatever follows its last valid
            // entry is overwritten by the next record.
            clean: true,
            records: pos > head_len,
        })
    }

    /// Append a record (the caller holds the writer lock and has caught
    /// up). Not yet synced: call [`Wal::sync`]. With the key set, the head
    /// must be of format 2 (checkpoint first), and the record names the
    /// tail it builds on. Nothing is written when it is refused. Returns
    /// where the record starts.
    pub fn append(&mut self, record: Record) -> Result<u64, WalError> {
        let Some(known) = &self.known else {
            return Err(WalError::NotReady);
        };
        if known.v2 != self.key.is_some() {
            return Err(WalError::NotReady);
        }
        let bytes = record.encode(&known.generation, &known.tail, self.key.as_ref())?;
        self.keys_stamp += 1;
        // At the end of what checks out, over whatever follows it.
        let start = known.len;
        let end = start + bytes.len() as u64;
        // Zeros ahead of the record first (see PREALLOC_BYTES): if that
        // fails (a full disk), nothing of the record is written, so a
        // mutation that reports an error has not happened. Whatever
        // follows the log's end checks out as nothing: the caller holds
        // the writer lock and has caught up.
        let slack = (self.allocated / 4).clamp(16 << 10, PREALLOC_STEP / 4);
        if end + slack > self.allocated {
            let len = self.file.metadata()?.len();
            if end + slack > len {
                // Twice the log so far, at most a step more: a few
                // extensions per checkpoint cycle, a small file for a
                // vault written now and then.
                let to = (end * 2)
                    .min(end + PREALLOC_STEP)
                    .max(end + slack)
                    .next_multiple_of(64 << 10);
                write_zeros(&self.file, len.max(end), to)?;
                self.allocated = to;
            } else {
                self.allocated = len;
            }
        }
        self.file.write_all_at(&bytes, start)?;
        if let Some(k) = &mut self.known {
            k.len = start + bytes.len() as u64;
            merge_refs(&mut k.tail, &record.refs);
            note_keys(&mut k.keys, &record);
            hold(&mut k.held, &mut k.held_bytes, record);
        }
        Ok(start)
    }

    /// Make everything appended so far durable.
    pub fn sync(&self) -> std::io::Result<()> {
        fsync::sync_data(&self.file)
    }

    /// A second handle on the log file, to sync it without this `Wal`
    /// (the file is opened once and never replaced, so the handle stays
    /// on the log).
    pub fn sync_handle(&self) -> std::io::Result<File> {
        self.file.try_clone()
    }

    /// The key-table shards the log's records replaced since the last
    /// new key state, as far as this process has read (format 7: a create
    /// logs its shard alone; the key state takes them in before the next
    /// checkpoint, see `Vault::fold_keys`), with a stamp that changes
    /// whenever they may have.
    pub fn pending_keys(&self) -> (&std::collections::BTreeMap<u16, Oid>, u64) {
        static NONE: std::collections::BTreeMap<u16, Oid> = std::collections::BTreeMap::new();
        match &self.known {
            Some(k) => (&k.keys, self.keys_stamp),
            None => (&NONE, self.keys_stamp),
        }
    }

    /// The log's current length.
    pub fn len(&self) -> std::io::Result<u64> {
        Ok(self.known.as_ref().map_or(0, |k| k.len))
    }

    /// Where the ref `name` points, as far as this process has caught up.
    ///
    /// memvault writes ref files only at checkpoints: between two, the
    /// log's tail is the truth. So a ref file naming the checkpoint's
    /// target (or the tail, which a checkpoint writes before it resets the
    /// log) stands for the tail. A ref file naming anything else, or gone,
    /// was changed outside memvault (or by a checkpoint this process has
    /// not read yet: catch up once and look again) and is taken as it is,
    /// for the MAC checks to judge.
    pub fn ref_target(&mut self, repo: &Repository, name: &str) -> Result<Option<Oid>, WalError> {
        // The ref files were seen where the head says in this generation:
        // the tail is the answer. Only a checkpoint moves them, and it
        // starts a new generation; a ref file changed outside memvault
        // meanwhile is judged before a read gets here (`Vault::refresh`
        // looks at the files' stamps, `judge_refs` when they moved), and
        // by the next writer's check or checkpoint.
        if let Some(k) = &self.known
            && let Some(tail) = target(&k.tail, name)
            && self
                .refs_seen
                .get()
                .is_some_and(|(generation, _)| generation == k.generation)
        {
            return Ok(Some(tail));
        }
        let mut disk = read_ref(repo, name);
        for attempt in 0..2 {
            let Some(k) = &self.known else {
                return Ok(disk);
            };
            let Some(tail) = target(&k.tail, name) else {
                return Ok(disk);
            };
            match disk {
                None => return Ok(None),
                Some(d) if d.is_zero() || Some(d) == target(&k.head, name) || d == tail => {
                    if !d.is_zero() {
                        // Remember it when every ref file is at the head.
                        let _ = self.refs_consistent(repo);
                    }
                    return Ok(Some(tail));
                }
                Some(_) if attempt == 0 => {
                    self.catch_up(repo)?;
                    disk = read_ref(repo, name);
                }
                Some(_) => {}
            }
        }
        Ok(disk)
    }

    /// Read the ref files again at the next look, as a new process would
    /// (`verify` judges the files on disk, not this process's view).
    pub fn forget_refs_seen(&self) {
        self.refs_seen.set(None);
    }

    /// The ref target at the tail this process has read (or written).
    pub fn tail_target(&self, name: &str) -> Option<Oid> {
        self.known.as_ref().and_then(|k| target(&k.tail, name))
    }

    /// Every ref file names the checkpoint's target or the tail (the
    /// caller holds the writer lock and has caught up): false means a ref
    /// was changed outside memvault, and a checkpoint should settle it.
    pub fn refs_consistent(&self, repo: &Repository) -> bool {
        let Some(k) = &self.known else {
            self.refs_ok_at.set(None);
            return false;
        };
        let stamps = ref_stamps(repo, &k.tail);
        if stamps.is_some() && self.refs_seen.get() == stamps.map(|s| (k.generation, s)) {
            self.refs_ok_at.set(Some((k.generation, k.len)));
            return true;
        }
        let mut at_head = true;
        let consistent = k
            .tail
            .iter()
            .all(|(name, tail)| match read_ref(repo, name) {
                Some(d) => {
                    at_head &= Some(d) == target(&k.head, name);
                    d == *tail || Some(d) == target(&k.head, name)
                }
                None => false,
            });
        // Files that point at the head's targets stay consistent while the
        // generation lasts: records move only the log's tail.
        self.refs_seen.set(
            stamps
                .filter(|_| consistent && at_head)
                .map(|s| (k.generation, s)),
        );
        self.refs_ok_at
            .set(consistent.then_some((k.generation, k.len)));
        consistent
    }

    /// How far this handle has read: the generation and the length.
    pub fn position(&self) -> Option<LogPosition> {
        self.known.as_ref().map(|k| (k.generation, k.len))
    }

    /// Where the log was when [`refs_consistent`](Self::refs_consistent)
    /// last said true (None if its last answer was false).
    pub fn refs_ok_at(&self) -> Option<LogPosition> {
        self.refs_ok_at.get()
    }

    /// Overwrite everything after the head with zeros, durably: the
    /// remains of earlier generations' records (encrypted objects, among
    /// them replaced key tables and keyslots) are gone from the file.
    /// Called right after a checkpoint by `gc` and by erasure, whose
    /// promise is that replaced key material is gone. The caller holds
    /// the writer lock.
    pub fn scrub(&mut self) -> std::io::Result<()> {
        let Some(known) = &self.known else {
            return Ok(());
        };
        let from = known.len;
        let file_len = self.file.metadata()?.len();
        if file_len > from {
            let zeros = vec![0u8; (file_len - from) as usize];
            self.file.write_all_at(&zeros, from)?;
            fsync::sync_data(&self.file)?;
        }
        Ok(())
    }

    /// Replace the log by a head naming `refs` as the checkpoint (the
    /// caller holds the writer lock and has made git durable up to it).
    pub fn reset(&mut self, refs: Refs) -> std::io::Result<()> {
        let head = Head {
            generation: crate::crypto::random_bytes::<8>(),
            refs,
        };
        let bytes = encode_head(&head, self.key.as_ref());
        self.file.write_all_at(&bytes, 0)?;
        // What follows the head belongs to an earlier generation: it no
        // longer checks out, and the next records overwrite it. The file
        // is filled with zeros ahead (see PREALLOC_BYTES), never truncated.
        let file_len = self.file.metadata()?.len();
        if file_len < PREALLOC_BYTES {
            let from = file_len.max(bytes.len() as u64);
            let zeros = vec![0u8; (PREALLOC_BYTES - from) as usize];
            self.file.write_all_at(&zeros, from)?;
        }
        self.allocated = file_len.max(PREALLOC_BYTES);
        fsync::sync_data(&self.file)?;
        self.known = Some(Known {
            generation: head.generation,
            v2: self.key.is_some(),
            len: bytes.len() as u64,
            head_len: bytes.len() as u64,
            tail: head.refs.clone(),
            head: head.refs,
            held: self.key.is_some().then(Vec::new),
            held_bytes: 0,
            keys: Default::default(),
        });
        self.keys_stamp += 1;
        Ok(())
    }
}

/// Refusals of [`install_odb`], carried through libgit2's error type by
/// its callers and mapped back to [`crate::vault::VaultError::Damaged`].
pub(crate) const ALTERNATES_FOUND: &str = "objects/info/alternates would make git read objects \
     from outside the vault (memvault never writes one): remove it";
pub(crate) const MIDX_FOUND: &str = "objects/pack/multi-pack-index would make git read \
     unchecked pack offsets (memvault never writes one): remove it";

/// Put a fresh in-memory object store in front of the repository's object
/// database: every object libgit2 writes for this repository goes to
/// memory (the log makes it durable, a checkpoint writes it to git), and
/// reads see memory first, then the objects on disk. Also drops what an
/// earlier one held.
pub(crate) fn install_odb(repo: &Repository) -> Result<(), git2::Error> {
    let objects = repo.path().join("objects");
    let objects = objects
        .to_str()
        .ok_or_else(|| git2::Error::from_str("the vault path is not valid UTF-8"))?;
    // libgit2 would also search every objects directory named in
    // objects/info/alternates, none of whose files memvault checks.
    if fs::symlink_metadata(repo.path().join("objects/info/alternates")).is_ok() {
        return Err(git2::Error::from_str(ALTERNATES_FOUND));
    }
    // Nor does it write a multi-pack index, whose offsets libgit2 reads
    // before any pack's own index (also refused when it appears later: see
    // `objects`).
    if fs::symlink_metadata(repo.path().join("objects/pack/multi-pack-index")).is_ok() {
        return Err(git2::Error::from_str(MIDX_FOUND));
    }
    // As an alternate, the disk is only read: writes go to memory.
    super::fsync::install_mempack_odb(repo, objects)?;
    // libgit2 lists the packs at its first read: validate them before.
    super::objects::odb_installed(repo);
    Ok(())
}

pub(crate) fn io_git(e: std::io::Error) -> git2::Error {
    git2::Error::from_str(&format!("I/O error: {e}"))
}

/// Up to this many objects, a checkpoint writes loose objects (each
/// synced, and its directory: two syncs apiece); beyond, one pack (three
/// syncs in all). At 64, the checkpoint after a sync's merge (12 objects)
/// made 24 syncs, 6 to 9 ms of a 150 ms sync, and one after a create
/// about 30. Small packs are merged as they pile up (see `gc`).
const LOOSE_LIMIT: usize = 1;

/// Write `objects` into the repository's object directory and make them
/// durable: one pack (pack, index and directory synced), or, for a few
/// objects, loose files each synced before it gets its name.
pub(crate) fn write_durable_objects(
    repo: &Repository,
    objects: &[&Object],
    hashed: bool,
) -> Result<(), git2::Error> {
    if objects.is_empty() {
        return Ok(());
    }
    let dir = repo.path().join("objects");
    if objects.len() <= LOOSE_LIMIT {
        let mut dirs = std::collections::BTreeSet::new();
        for o in objects {
            let hex = o.id.to_string();
            let sub = dir.join(&hex[..2]);
            let path = sub.join(&hex[2..]);
            if fs::symlink_metadata(&path).is_ok() {
                continue;
            }
            if fs::symlink_metadata(&sub).is_err() {
                dirs.insert(dir.clone());
            }
            // Created 0700, or refused if it is a link.
            fsx::mkdir_private(&sub).map_err(io_git)?;
            write_loose(&sub, &path, o).map_err(io_git)?;
            dirs.insert(sub);
        }
        for d in dirs {
            fsync::sync_path(&d).map_err(io_git)?;
        }
        return Ok(());
    }
    // One pack, no delta search (gc finds deltas), synced before named.
    let pack_dir = dir.join("pack");
    fsx::mkdir_private(&pack_dir).map_err(io_git)?;
    let name = match hashed {
        true => super::pack::write_hashed(&pack_dir, objects),
        false => super::pack::write(&pack_dir, objects),
    }
    .map_err(io_git)?;
    fsync::sync_path(&pack_dir).map_err(io_git)?;
    // Written from objects checked against their ids: not validated again.
    super::objects::trust_written_pack(repo, &name);
    fsync::sync_path(&dir).map_err(io_git)?;
    Ok(())
}

/// One loose object: zlib of `<type> <len>\0<bytes>`, written to a
/// temporary name, synced, then renamed into place.
fn write_loose(sub: &Path, path: &Path, o: &Object) -> std::io::Result<()> {
    use std::io::Write;
    // Stored, not deflated (as in a checkpoint's pack: blobs are
    // ciphertext, trees mostly ids and encrypted names).
    let mut raw = format!("{} {}\0", o.kind.str(), o.data.len()).into_bytes();
    raw.extend_from_slice(&o.data);
    let mut bytes = Vec::new();
    super::pack::zlib_stored(&mut bytes, &raw);
    let tmp = sub.join(format!(
        "tmp_mv_{}",
        data_encoding::HEXLOWER.encode(&crate::crypto::random_bytes::<6>())
    ));
    let result = (|| {
        let mut f = fsx::create_new(&tmp, fsx::FILE_MODE)?;
        f.write_all(&bytes)?;
        fsync::sync_data(&f)?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    //! The log through its API (`open`, `reset`, `append`, `read_all`,
    //! `catch_up`), with the file's bytes cut, changed or left over from an
    //! earlier generation as a crash or a checkpoint leaves them.

    use super::*;
    use std::fs::OpenOptions;

    const MAIN: &str = "refs/heads/main";
    const KEYS: &str = "refs/memvault/keys";

    /// A bare repository with a `memvault/` folder for the log.
    fn repo() -> (tempfile::TempDir, Repository) {
        let tmp = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(tmp.path()).unwrap();
        fs::create_dir(tmp.path().join("memvault")).unwrap();
        (tmp, repo)
    }

    fn oid(i: u8) -> Oid {
        Oid::from_bytes(&[i; 20]).unwrap()
    }

    fn refs(i: u8) -> Refs {
        vec![(MAIN.to_string(), oid(i)), (KEYS.to_string(), oid(i + 100))]
    }

    /// Record `i`: main moves to `oid(i)`, one blob of 40 bytes (so every
    /// record has the same length).
    fn record(i: u8) -> Record {
        let data = vec![i; 40];
        Record {
            refs: vec![(MAIN.to_string(), oid(i))],
            objects: vec![Object {
                kind: ObjectType::Blob,
                id: Oid::hash_object(ObjectType::Blob, &data).unwrap(),
                data,
            }],
            keys: Vec::new(),
        }
    }

    type Summary = (Refs, Vec<(ObjectType, Oid, Vec<u8>)>);

    fn summary(r: &Record) -> Summary {
        let objects = r
            .objects
            .iter()
            .map(|o| (o.kind, o.id, o.data.clone()))
            .collect();
        (r.refs.clone(), objects)
    }

    fn summaries(rs: &[Record]) -> Vec<Summary> {
        rs.iter().map(summary).collect()
    }

    fn wal_path(dir: &Path) -> std::path::PathBuf {
        dir.join(WAL_FILE)
    }

    /// A log with a head naming `refs(0)` and records 1..=n; the offsets
    /// where each record starts, and the log's length.
    fn log_with(dir: &Path, n: u8) -> (Vec<u64>, u64) {
        let mut wal = Wal::open(dir).unwrap();
        wal.read_all().unwrap();
        wal.reset(refs(0)).unwrap();
        let starts = (1..=n).map(|i| wal.append(record(i)).unwrap()).collect();
        wal.sync().unwrap();
        (starts, wal.len().unwrap())
    }

    /// What a fresh handle reads, and the tail of main a fresh handle
    /// catching up finds.
    fn read_fresh(dir: &Path, repo: &Repository) -> (Contents, Option<Oid>) {
        let contents = Wal::open(dir).unwrap().read_all().unwrap();
        let mut wal = Wal::open(dir).unwrap();
        let up = wal.catch_up(repo).unwrap();
        assert_eq!(up.clean, contents.head.is_some());
        assert_eq!(up.records, !contents.records.is_empty());
        (contents, wal.tail_target(MAIN))
    }

    #[test]
    fn zeros_stay_ahead_of_the_records_and_a_quiet_log_stays_small() {
        let (tmp, _repo) = repo();
        let size = || fs::metadata(wal_path(tmp.path())).unwrap().len();
        let mut wal = Wal::open(tmp.path()).unwrap();
        wal.read_all().unwrap();
        wal.reset(refs(0)).unwrap();
        assert_eq!(size(), PREALLOC_BYTES);
        wal.append(record(1)).unwrap();
        assert_eq!(size(), PREALLOC_BYTES, "one small record grew the file");
        let mut extensions = 0;
        let mut last = size();
        for i in 0..40_000u32 {
            let data = i.to_be_bytes().repeat(64);
            let r = Record {
                refs: vec![(MAIN.to_string(), oid(1))],
                objects: vec![Object {
                    kind: ObjectType::Blob,
                    id: Oid::hash_object(ObjectType::Blob, &data).unwrap(),
                    data,
                }],
                keys: Vec::new(),
            };
            wal.append(r).unwrap();
            let len = wal.len().unwrap();
            // Never at the end: at least 16 KiB of zeros ahead.
            assert!(size() >= len + (16 << 10), "{} {len}", size());
            if size() != last {
                extensions += 1;
                assert!(size() - last <= PREALLOC_STEP + (64 << 10));
                last = size();
            }
            if len > CHECKPOINT_BYTES {
                break;
            }
        }
        assert!(
            extensions <= 12,
            "{extensions} extensions over a 4 MiB cycle"
        );
    }

    #[test]
    fn a_new_log_holds_nothing_and_refuses_an_append_before_a_read() {
        let (tmp, repo) = repo();
        let mut wal = Wal::open(tmp.path()).unwrap();
        assert!(wal.append(record(1)).is_err());
        let c = wal.read_all().unwrap();
        assert!(c.head.is_none() && c.records.is_empty() && c.valid_len == 0);
        assert!(c.tail().is_empty());
        let up = Wal::open(tmp.path()).unwrap().catch_up(&repo).unwrap();
        assert!(!up.clean && !up.records);
    }

    #[test]
    fn the_head_and_records_read_back_as_written() {
        let (tmp, repo) = repo();
        let (starts, len) = log_with(tmp.path(), 3);
        // The file is preallocated beyond what checks out.
        assert!(fs::metadata(wal_path(tmp.path())).unwrap().len() >= PREALLOC_BYTES);
        let (c, main) = read_fresh(tmp.path(), &repo);
        assert_eq!(c.head.as_ref().unwrap().refs, refs(0));
        assert_eq!(
            summaries(&c.records),
            summaries(&[record(1), record(2), record(3)])
        );
        assert_eq!(c.valid_len, len);
        assert_eq!(
            starts[0],
            encode_head(c.head.as_ref().unwrap(), None).len() as u64
        );
        // The tail: main from the last record, keys from the head.
        assert_eq!(
            c.tail(),
            vec![(MAIN.into(), oid(3)), (KEYS.into(), oid(100))]
        );
        assert_eq!(main, Some(oid(3)));
        // catch_up loaded the logged objects into the repository.
        let odb = repo.odb().unwrap();
        for i in 1..=3 {
            let o = &record(i).objects[0];
            assert_eq!(odb.read(o.id).unwrap().data(), &o.data[..]);
        }
    }

    #[test]
    fn a_record_cut_at_any_byte_is_not_read_and_the_earlier_ones_are() {
        let (tmp, repo) = repo();
        let (starts, len) = log_with(tmp.path(), 2);
        let full = fs::read(wal_path(tmp.path())).unwrap();
        let (at, end) = (starts[1], len);
        for cut in at..end {
            // The file ends at the cut, or zeros follow it (preallocated).
            for zeros in [false, true] {
                // Zeros after a cut whose missing bytes are all zeros (the
                // record's checksum, random with the log's generation,
                // ends in a zero byte one run in 256) make the record
                // whole again: it was written in full, and is read.
                if zeros && full[cut as usize..end as usize].iter().all(|&b| b == 0) {
                    continue;
                }
                let mut bytes = full[..cut as usize].to_vec();
                if zeros {
                    bytes.resize(end as usize + 4096, 0);
                }
                fs::write(wal_path(tmp.path()), &bytes).unwrap();
                let (c, main) = read_fresh(tmp.path(), &repo);
                assert_eq!(
                    summaries(&c.records),
                    summaries(&[record(1)]),
                    "cut at {cut} of {at}..{end}, zeros {zeros}"
                );
                assert_eq!(c.valid_len, at, "cut at {cut}");
                assert_eq!(main, Some(oid(1)), "cut at {cut}");
            }
        }
        // The next record goes where the torn one began, and is read.
        let mut wal = Wal::open(tmp.path()).unwrap();
        wal.read_all().unwrap();
        assert_eq!(wal.append(record(7)).unwrap(), at);
        let (c, main) = read_fresh(tmp.path(), &repo);
        assert_eq!(summaries(&c.records), summaries(&[record(1), record(7)]));
        assert_eq!(main, Some(oid(7)));
    }

    #[test]
    fn a_record_with_any_byte_changed_is_not_read() {
        let (tmp, repo) = repo();
        let (starts, len) = log_with(tmp.path(), 2);
        let full = fs::read(wal_path(tmp.path())).unwrap();
        for i in starts[1]..len {
            let mut bytes = full[..len as usize + 4096].to_vec();
            bytes[i as usize] ^= 0x01;
            fs::write(wal_path(tmp.path()), &bytes).unwrap();
            let (c, main) = read_fresh(tmp.path(), &repo);
            assert_eq!(summaries(&c.records), summaries(&[record(1)]), "byte {i}");
            assert_eq!(main, Some(oid(1)), "byte {i}");
        }
    }

    #[test]
    fn records_of_an_earlier_generation_are_not_read_after_a_reset() {
        let (tmp, repo) = repo();
        let (starts, _) = log_with(tmp.path(), 3);
        // A process that has read the old generation.
        let mut old_reader = Wal::open(tmp.path()).unwrap();
        old_reader.catch_up(&repo).unwrap();
        assert_eq!(old_reader.tail_target(MAIN), Some(oid(3)));

        // A checkpoint: a new head, as long as the old one, at offset 0;
        // the old records stay in the file behind it.
        let mut wal = Wal::open(tmp.path()).unwrap();
        wal.read_all().unwrap();
        wal.reset(refs(50)).unwrap();
        assert_eq!(wal.len().unwrap(), starts[0]);
        let (c, main) = read_fresh(tmp.path(), &repo);
        assert!(c.records.is_empty());
        assert_eq!(c.head.unwrap().refs, refs(50));
        assert_eq!(c.valid_len, starts[0]);
        assert_eq!(main, Some(oid(50)));

        // A new record overwrites the first old one exactly; the second old
        // one follows it, whole, and is still not read.
        assert_eq!(wal.append(record(9)).unwrap(), starts[0]);
        let bytes = fs::read(wal_path(tmp.path())).unwrap();
        assert_eq!(&bytes[starts[1] as usize..][..4], MAGIC);
        let (c, main) = read_fresh(tmp.path(), &repo);
        assert_eq!(summaries(&c.records), summaries(&[record(9)]));
        assert_eq!(c.valid_len, starts[1]);
        assert_eq!(main, Some(oid(9)));

        // The process that knew the old generation starts over from the
        // new head.
        let up = old_reader.catch_up(&repo).unwrap();
        assert!(up.clean && up.records);
        assert_eq!(old_reader.tail_target(MAIN), Some(oid(9)));
    }

    #[test]
    fn an_entry_header_claiming_more_than_the_limit_is_not_read() {
        let (tmp, repo) = repo();
        let (_, len) = log_with(tmp.path(), 1);
        // After record 1, a record header claiming MAX_ENTRY + 1 bytes, in
        // a file (sparse) long enough to hold them: a reader must not
        // allocate or read a gigabyte for it, and stops there.
        let file = OpenOptions::new()
            .write(true)
            .open(wal_path(tmp.path()))
            .unwrap();
        let mut header = MAGIC.to_vec();
        header.push(KIND_RECORD);
        header.extend_from_slice(&(MAX_ENTRY as u32 + 1).to_le_bytes());
        file.write_all_at(&header, len).unwrap();
        file.set_len(len + (ENTRY_OVERHEAD + MAX_ENTRY + 1) as u64)
            .unwrap();
        drop(file);
        // A reader without the limit still stops (the checksum fails) but
        // only after reading and hashing the gigabyte: seconds here, and a
        // gigabyte of memory. With it, a few reads of a few bytes.
        let t = std::time::Instant::now();
        let (c, main) = read_fresh(tmp.path(), &repo);
        assert!(
            t.elapsed() < std::time::Duration::from_secs(3),
            "the reader took {:?}: it read the oversized entry",
            t.elapsed()
        );
        assert_eq!(summaries(&c.records), summaries(&[record(1)]));
        assert_eq!(c.valid_len, len);
        assert_eq!(main, Some(oid(1)));
        // The next record overwrites the header.
        let mut wal = Wal::open(tmp.path()).unwrap();
        wal.read_all().unwrap();
        assert_eq!(wal.append(record(2)).unwrap(), len);
        let (c, _) = read_fresh(tmp.path(), &repo);
        assert_eq!(summaries(&c.records), summaries(&[record(1), record(2)]));
    }

    /// A checkpoint packs the records this process wrote and read without
    /// reading the log back, the same ones a read of the log gives; a
    /// record another handle appended since is read from the log.
    #[test]
    fn a_checkpoint_takes_the_records_held_and_reads_the_log_when_they_are_not_all() {
        let (tmp, repo) = repo();
        let keys = crate::crypto::VaultKeys::derive(&crate::crypto::Keyring::new_random());
        let open = || {
            let mut w = Wal::open(tmp.path()).unwrap();
            w.set_key(keys.log_key());
            w
        };
        let mut wal = open();
        wal.read_all().unwrap();
        wal.reset(refs(0)).unwrap();
        for i in 1..=3 {
            wal.append(record(i)).unwrap();
        }
        let held = wal.contents_for_checkpoint().unwrap();
        let read = open().read_all().unwrap();
        assert_eq!(summaries(&held.records), summaries(&read.records));
        assert_eq!(held.tail(), read.tail());
        assert_eq!(held.valid_len, read.valid_len);
        assert!(held.tagged);
        // Handed over: a second ask reads the log.
        let again = wal.contents_for_checkpoint().unwrap();
        assert_eq!(summaries(&again.records), summaries(&read.records));

        // Another handle (another process) appends after this one's reads:
        // not held here, so the log is read, its record included.
        let mut wal = open();
        wal.read_all().unwrap();
        wal.reset(refs(0)).unwrap();
        wal.append(record(1)).unwrap();
        let mut other = open();
        other.catch_up(&repo).unwrap();
        other.append(record(2)).unwrap();
        let c = wal.contents_for_checkpoint().unwrap();
        assert_eq!(c.records.len(), 2);
        assert_eq!(target(&c.tail(), MAIN), Some(oid(2)));
        // The other handle caught up and appended: it holds both.
        let c = other.contents_for_checkpoint().unwrap();
        assert_eq!(summaries(&c.records), summaries(&[record(1), record(2)]));

        // Without the key nothing is held: the log is read.
        let mut plain = Wal::open(tmp.path()).unwrap();
        plain.read_all().unwrap();
        plain.reset(refs(0)).unwrap();
        plain.append(record(5)).unwrap();
        assert!(plain.known.as_ref().unwrap().held.is_none());
    }

    /// Any byte of a record changed while intact records of the log
    /// follow it is damage, not a torn tail: reading stops with
    /// `WalError::Damaged` (naming where), for a fresh read as for a
    /// catch-up, rather than dropping the records after it. The same byte
    /// changed in the last record is a torn tail, as before; and an
    /// earlier generation's remains after the tail are no damage.
    #[test]
    fn a_damaged_record_followed_by_intact_ones_is_refused_not_dropped() {
        let (tmp, repo) = repo();
        let keys = crate::crypto::VaultKeys::derive(&crate::crypto::Keyring::new_random());
        let open = || {
            let mut w = Wal::open(tmp.path()).unwrap();
            w.set_key(keys.log_key());
            w
        };
        let mut wal = open();
        wal.read_all().unwrap();
        wal.reset(refs(0)).unwrap();
        let starts: Vec<u64> = (1..=3).map(|i| wal.append(record(i)).unwrap()).collect();
        let len = wal.len().unwrap();
        let full = fs::read(wal_path(tmp.path())).unwrap();
        let (second, third) = (starts[1], starts[2]);
        for i in (second..third).step_by(7) {
            let mut bytes = full.clone();
            bytes[i as usize] ^= 0x40;
            fs::write(wal_path(tmp.path()), &bytes).unwrap();
            match open().read_all() {
                Err(WalError::Damaged { at, later }) => {
                    assert_eq!((at, later), (second, 1), "byte {i}")
                }
                Err(e) => panic!("byte {i}: {e}"),
                Ok(c) => panic!("byte {i}: read {} records", c.records.len()),
            }
            assert!(
                matches!(open().catch_up(&repo), Err(WalError::Damaged { .. })),
                "byte {i}"
            );
        }
        // Zeros where a record starts (a lost block reads as zeros), in
        // a record that intact ones follow: damage too.
        for n in [17, 64, (third - second) as usize] {
            let mut bytes = full.clone();
            bytes[second as usize..second as usize + n].fill(0);
            fs::write(wal_path(tmp.path()), &bytes).unwrap();
            assert!(
                matches!(open().read_all(), Err(WalError::Damaged { at, later: 1 }) if at == second),
                "{n} zeros"
            );
        }
        // The last record changed: a torn tail, the two before it read.
        for i in (third..len).step_by(7) {
            let mut bytes = full.clone();
            bytes[i as usize] ^= 0x40;
            fs::write(wal_path(tmp.path()), &bytes).unwrap();
            let c = open().read_all().unwrap();
            assert_eq!(
                summaries(&c.records),
                summaries(&[record(1), record(2)]),
                "byte {i}"
            );
        }
        // The head changed: no head checks out, yet records that build on
        // what the ref files say (the head's) follow: damage at byte 0.
        // Without such ref files the records are an earlier generation's
        // remains (a head torn by a crash in a checkpoint) and the log
        // reads as empty.
        let mut bytes = full.clone();
        bytes[20] ^= 0x40;
        fs::write(wal_path(tmp.path()), &bytes).unwrap();
        assert!(!open().catch_up(&repo).unwrap().records);
        for (name, id) in refs(0) {
            let path = tmp.path().join(&name);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, format!("{id}\n")).unwrap();
        }
        assert!(matches!(
            open().catch_up(&repo),
            Err(WalError::Damaged { at: 0, later: 3 })
        ));
        // The head zeroed (a lost block): the same.
        let mut bytes = full.clone();
        bytes[..starts[0] as usize].fill(0);
        fs::write(wal_path(tmp.path()), &bytes).unwrap();
        assert!(matches!(
            open().catch_up(&repo),
            Err(WalError::Damaged { at: 0, later: 3 })
        ));
        // Cut where the message says: the records before it are kept.
        let mut bytes = full.clone();
        bytes[second as usize + 30] ^= 0x40;
        bytes.truncate(second as usize);
        fs::write(wal_path(tmp.path()), &bytes).unwrap();
        let c = open().read_all().unwrap();
        assert_eq!(summaries(&c.records), summaries(&[record(1)]));
        // A new generation over the old records: their remains after the
        // new tail, intact or not, are no damage.
        fs::write(wal_path(tmp.path()), &full).unwrap();
        let mut wal = open();
        wal.read_all().unwrap();
        wal.reset(refs(50)).unwrap();
        wal.append(record(9)).unwrap();
        let mut bytes = fs::read(wal_path(tmp.path())).unwrap();
        bytes[third as usize - 5] ^= 0x40;
        fs::write(wal_path(tmp.path()), &bytes).unwrap();
        let c = open().read_all().unwrap();
        assert_eq!(summaries(&c.records), summaries(&[record(9)]));
    }

    /// A record's shard list (format 7) reads back as written, and one
    /// that names a shard out of range or twice, or an id that is not a
    /// blob of the record, does not read at all.
    #[test]
    fn a_records_shard_list_reads_back_and_a_malformed_one_does_not() {
        let generation = [7u8; 8];
        let base = refs(0);
        let with = |keys: Vec<(u16, Oid)>| {
            let mut r = record(1);
            let blob = r.objects[0].id;
            r.objects.push(Object {
                kind: ObjectType::Tree,
                id: oid(9),
                data: Vec::new(),
            });
            r.keys = keys
                .into_iter()
                .map(|(n, id)| (n, if id == oid(0) { blob } else { id }))
                .collect();
            r
        };
        let keys = crate::crypto::VaultKeys::derive(&crate::crypto::Keyring::new_random());
        let k = keys.log_key();
        let decode = |r: &Record| {
            let entry = r.encode(&generation, &base, Some(&k)).unwrap();
            let (kind, body, _) = parse_entry(&entry).unwrap();
            assert_eq!(kind, KIND_RECORD);
            // A memvault of format 6 checks the tag under `KIND_RECORD`
            // alone: a record naming shards fails it (and stops that
            // memvault) rather than read as the log's end.
            assert_eq!(
                open_tagged(KIND_RECORD, body, Some(&k)).is_ok(),
                r.keys.is_empty()
            );
            let (payload, domain) = open_record(body, Some(&k)).unwrap();
            assert_eq!(domain == Some(TAG_RECORD_KEYS), !r.keys.is_empty());
            Record::decode(payload, &generation, true).map(|(_, r)| r.keys)
        };
        let blob = record(1).objects[0].id;
        assert_eq!(
            decode(&with(vec![(4095, oid(0))])),
            Some(vec![(4095, blob)])
        );
        assert_eq!(decode(&with(vec![])), Some(vec![]));
        // Out of range, twice, a tree, an id the record does not hold.
        assert_eq!(decode(&with(vec![(4096, oid(0))])), None);
        assert_eq!(decode(&with(vec![(3, oid(0)), (3, oid(0))])), None);
        assert_eq!(decode(&with(vec![(3, oid(9))])), None);
        assert_eq!(decode(&with(vec![(3, oid(8))])), None);
        // A count of zero after the objects is not a record either.
        let entry = record(1).encode(&generation, &base, Some(&k)).unwrap();
        let (_, body, _) = parse_entry(&entry).unwrap();
        let mut payload = open_tagged(KIND_RECORD, body, Some(&k)).unwrap().to_vec();
        payload.extend_from_slice(&0u16.to_le_bytes());
        assert!(Record::decode(&payload, &generation, true).is_none());
        // No shard list in an untagged (format-1) log, written or read.
        assert!(matches!(
            with(vec![(3, oid(0))]).encode(&generation, &base, None),
            Err(WalError::NotReady)
        ));
        let entry = record(1).encode(&generation, &base, None).unwrap();
        let (_, body, _) = parse_entry(&entry).unwrap();
        let mut body = body.to_vec();
        body.extend_from_slice(&1u16.to_le_bytes());
        body.extend_from_slice(&3u16.to_le_bytes());
        body.extend_from_slice(blob.as_bytes());
        assert!(Record::decode(&body, &generation, false).is_none());
    }
}
