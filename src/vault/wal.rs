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
//! A checkpoint ([`super::Vault`] runs it every few MiB of log, on close, in
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
//! where the checksum is the git blob hash (SHA-1) of everything before it.
//! The first entry is the head (kind 1: an 8-byte generation, changed at
//! every checkpoint, then the ref targets at that checkpoint); the rest are
//! records (kind 2: the generation, ref targets, then objects as
//! `type:u8 oid len:u32le bytes`). Reading stops at the first entry that is
//! cut short, does not check out, or belongs to another generation: that
//! is a record whose writer died before it was synced, and which was
//! therefore never acknowledged. The file itself is preallocated (zeros,
//! written once; see [`PREALLOC_BYTES`]) and never truncated: a new
//! record overwrites whatever follows the last entry that checks out, and
//! a checkpoint rewrites the head, with a new generation, at offset 0.
//!
//! # What it holds
//!
//! Only what git holds: encrypted blobs, trees of encrypted names, commits
//! with encrypted messages, the encrypted key table. Ref names are the only
//! plain words. The checksum detects torn writes, not tampering: the MACs
//! on commits do that.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;

use git2::{ObjectType, Odb, Oid, Repository};

use super::fsync;

/// The log, relative to the repository directory.
pub(crate) const WAL_FILE: &str = "memvault/wal";
const MAGIC: &[u8; 4] = b"MVWL";
const KIND_HEAD: u8 = 1;
const KIND_RECORD: u8 = 2;
const ENTRY_OVERHEAD: usize = 4 + 1 + 4 + 20;

/// The log file is kept at least this long: zeros are written once, at
/// the first checkpoint, and never truncated after, so a record overwrites
/// blocks the file already has and its `fdatasync` writes the data alone,
/// not the inode too (on this machine's ext4, about 100 µs instead of
/// 170). The log's end is where entries stop checking out: the zeros, or
/// the remains of records of an earlier generation.
pub(crate) const PREALLOC_BYTES: u64 = CHECKPOINT_BYTES + (1 << 20);
/// A checkpoint is due when the log grows past this.
pub(crate) const CHECKPOINT_BYTES: u64 = 4 << 20;
/// No single record may be larger than this (a corrupt length field must
/// not make a reader allocate gigabytes).
const MAX_ENTRY: usize = 1 << 30;

/// Ref targets, by ref name.
pub(crate) type Refs = Vec<(String, Oid)>;

/// One git object, as stored in a record.
pub(crate) struct Object {
    pub kind: ObjectType,
    pub id: Oid,
    pub data: Vec<u8>,
}

/// One mutation: the objects it adds and where the refs point after it.
#[derive(Default)]
pub(crate) struct Record {
    pub refs: Refs,
    pub objects: Vec<Object>,
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

    fn encode(&self, generation: &[u8; 8]) -> Vec<u8> {
        let size: usize = self.objects.iter().map(|o| o.data.len() + 25).sum();
        let mut body = Vec::with_capacity(size + 128);
        body.extend_from_slice(generation);
        encode_refs(&mut body, &self.refs);
        body.extend_from_slice(&(self.objects.len() as u32).to_le_bytes());
        for o in &self.objects {
            body.push(kind_byte(o.kind));
            body.extend_from_slice(o.id.as_bytes());
            body.extend_from_slice(&(o.data.len() as u32).to_le_bytes());
            body.extend_from_slice(&o.data);
        }
        entry(KIND_RECORD, &body)
    }

    fn decode(body: &[u8], generation: &[u8; 8]) -> Option<Record> {
        let mut r = Reader(body);
        if r.take(8)? != generation {
            return None;
        }
        let refs = decode_refs(&mut r)?;
        let n = r.u32()? as usize;
        let mut objects = Vec::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            let kind = byte_kind(r.u8()?)?;
            let id = Oid::from_bytes(r.take(20)?).ok()?;
            let len = r.u32()? as usize;
            let data = r.take(len)?.to_vec();
            objects.push(Object { kind, id, data });
        }
        if !r.0.is_empty() {
            return None;
        }
        Some(Record { refs, objects })
    }
}

fn kind_byte(k: ObjectType) -> u8 {
    match k {
        ObjectType::Commit => 1,
        ObjectType::Tree => 2,
        ObjectType::Blob => 3,
        ObjectType::Tag => 4,
        _ => 0,
    }
}

fn byte_kind(b: u8) -> Option<ObjectType> {
    Some(match b {
        1 => ObjectType::Commit,
        2 => ObjectType::Tree,
        3 => ObjectType::Blob,
        4 => ObjectType::Tag,
        _ => return None,
    })
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
    if len > MAX_ENTRY || bytes.len() < ENTRY_OVERHEAD + len {
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
    if len > MAX_ENTRY || room < (ENTRY_OVERHEAD + len) as u64 {
        return None;
    }
    let mut bytes = vec![0u8; ENTRY_OVERHEAD + len];
    file.read_exact_at(&mut bytes, pos).ok()?;
    let (kind, body, total) = parse_entry(&bytes)?;
    Some((kind, body.to_vec(), total as u64))
}

/// The head entry: the checkpoint the records build on.
pub(crate) struct Head {
    pub generation: [u8; 8],
    pub refs: Refs,
}

fn encode_head(head: &Head) -> Vec<u8> {
    let mut body = head.generation.to_vec();
    encode_refs(&mut body, &head.refs);
    entry(KIND_HEAD, &body)
}

fn decode_head(body: &[u8]) -> Option<Head> {
    let mut r = Reader(body);
    let generation: [u8; 8] = r.take(8)?.try_into().ok()?;
    let refs = decode_refs(&mut r)?;
    Some(Head { generation, refs })
}

/// Everything the log holds that checks out.
pub(crate) struct Contents {
    pub head: Option<Head>,
    pub records: Vec<Record>,
    /// Length of the part that checks out.
    pub valid_len: u64,
}

impl Contents {
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
}

/// A position in the log and the ref targets there.
struct Known {
    generation: [u8; 8],
    /// Length read so far.
    len: u64,
    /// The checkpoint's ref targets (the head's).
    head: Refs,
    /// The ref targets at `len`.
    tail: Refs,
}

fn target(refs: &Refs, name: &str) -> Option<Oid> {
    refs.iter().find(|(n, _)| n == name).map(|(_, id)| *id)
}

/// A ref as its file says: None if there is none, the zero id if the file
/// does not read (cut short by a crash).
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

impl Wal {
    /// Open (creating if missing, empty) the log of the repository at
    /// `dir`. An empty log means "the refs on disk are the checkpoint".
    pub fn open(dir: &Path) -> std::io::Result<Wal> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(WAL_FILE))?;
        Ok(Wal { file, known: None })
    }

    /// Read the whole log.
    pub fn read_all(&mut self) -> std::io::Result<Contents> {
        let file_len = self.file.metadata()?.len();
        let mut head: Option<Head> = None;
        let mut records = Vec::new();
        let mut pos = 0u64;
        while let Some((kind, body, len)) = read_entry_at(&self.file, pos, file_len) {
            match (kind, &head) {
                (KIND_HEAD, None) if pos == 0 => match decode_head(&body) {
                    Some(h) => head = Some(h),
                    None => break,
                },
                (KIND_RECORD, Some(h)) => match Record::decode(&body, &h.generation) {
                    Some(r) => records.push(r),
                    None => break,
                },
                _ => break,
            }
            pos += len;
        }
        let contents = Contents {
            head,
            records,
            valid_len: pos,
        };
        self.known = contents.head.as_ref().map(|h| Known {
            generation: h.generation,
            len: contents.valid_len,
            head: h.refs.clone(),
            tail: contents.tail(),
        });
        Ok(contents)
    }

    /// Bring this process's view of the log up to date: load the objects
    /// of records it has not seen into `repo`'s in-memory object store
    /// (after another process's checkpoint, start a fresh one), and return
    /// the ref targets at the tail. Safe without the writer lock (a reader
    /// stops at a record still being appended).
    pub fn catch_up(&mut self, repo: &Repository) -> Result<CatchUp, git2::Error> {
        let file_len = self.file.metadata().map_err(io_git)?.len();
        let mut head_buf = [0u8; 512];
        let n = self.file.read_at(&mut head_buf, 0).map_err(io_git)?;
        let head = parse_entry(&head_buf[..n])
            .filter(|(k, _, _)| *k == KIND_HEAD)
            .and_then(|(_, body, _)| decode_head(body));
        let Some(head) = head else {
            self.known = None;
            return Ok(CatchUp {
                clean: false,
                records: false,
            });
        };
        let head_len = parse_entry(&head_buf[..n]).map_or(0, |(_, _, l)| l as u64);
        let (start, mut refs) = match &self.known {
            Some(k) if k.generation == head.generation && k.len <= file_len => {
                (k.len, k.tail.clone())
            }
            _ => {
                // First look, or another process checkpointed: everything
                // before is in git now.
                install_odb(repo)?;
                (head_len, head.refs.clone())
            }
        };
        // The log ends where entries stop checking out (see
        // PREALLOC_BYTES): a record a writer is still appending, one that
        // was torn by a crash (never acknowledged; the next record
        // overwrites it), zeros, or an earlier generation's remains.
        let mut pos = start;
        let mut odb = None;
        while let Some((KIND_RECORD, body, len)) = read_entry_at(&self.file, pos, file_len) {
            let Some(r) = Record::decode(&body, &head.generation) else {
                break;
            };
            let odb = match &mut odb {
                Some(o) => o,
                None => odb.insert(repo.odb()?),
            };
            for o in &r.objects {
                if odb.write(o.kind, &o.data)? != o.id {
                    return Err(git2::Error::from_str(
                        "a logged object does not match its id",
                    ));
                }
            }
            merge_refs(&mut refs, &r.refs);
            pos += len;
        }
        self.known = Some(Known {
            generation: head.generation,
            len: pos,
            head: head.refs,
            tail: refs,
        });
        Ok(CatchUp {
            // A log with a head is clean: whatever follows its last valid
            // entry is overwritten by the next record.
            clean: true,
            records: pos > head_len,
        })
    }

    /// Append a record (the caller holds the writer lock and has caught
    /// up). Not yet synced: call [`Wal::sync`]. Returns the log's length
    /// before the record, for [`Wal::truncate_to`].
    pub fn append(&mut self, record: &Record) -> std::io::Result<u64> {
        let Some(known) = &self.known else {
            return Err(std::io::Error::other("the log was not read before writing"));
        };
        let bytes = record.encode(&known.generation);
        // At the end of what checks out, over whatever follows it.
        let start = known.len;
        self.file.write_all_at(&bytes, start)?;
        if let Some(k) = &mut self.known {
            k.len = start + bytes.len() as u64;
            merge_refs(&mut k.tail, &record.refs);
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
    pub fn ref_target(
        &mut self,
        repo: &Repository,
        name: &str,
    ) -> Result<Option<Oid>, git2::Error> {
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

    /// The ref target at the tail this process has read (or written).
    pub fn tail_target(&self, name: &str) -> Option<Oid> {
        self.known.as_ref().and_then(|k| target(&k.tail, name))
    }

    /// Every ref file names the checkpoint's target or the tail (the
    /// caller holds the writer lock and has caught up): false means a ref
    /// was changed outside memvault, and a checkpoint should settle it.
    pub fn refs_consistent(&self, repo: &Repository) -> bool {
        let Some(k) = &self.known else {
            return false;
        };
        k.tail
            .iter()
            .all(|(name, tail)| match read_ref(repo, name) {
                Some(d) => d == *tail || Some(d) == target(&k.head, name),
                None => false,
            })
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
        let bytes = encode_head(&head);
        self.file.write_all_at(&bytes, 0)?;
        // What follows the head belongs to an earlier generation: it no
        // longer checks out, and the next records overwrite it. The file
        // is filled with zeros once (see PREALLOC_BYTES) and not truncated.
        let file_len = self.file.metadata()?.len();
        if file_len < PREALLOC_BYTES {
            let from = file_len.max(bytes.len() as u64);
            let zeros = vec![0u8; (PREALLOC_BYTES - from) as usize];
            self.file.write_all_at(&zeros, from)?;
        }
        fsync::sync_data(&self.file)?;
        self.known = Some(Known {
            generation: head.generation,
            len: bytes.len() as u64,
            tail: head.refs.clone(),
            head: head.refs,
        });
        Ok(())
    }
}

/// Put a fresh in-memory object store in front of the repository's object
/// database: every object libgit2 writes for this repository goes to
/// memory (the log makes it durable, a checkpoint writes it to git), and
/// reads see memory first, then the objects on disk. Also drops what an
/// earlier one held.
pub(crate) fn install_odb(repo: &Repository) -> Result<(), git2::Error> {
    let odb = Odb::new()?;
    // The mempack backend lives as long as the object database; its handle
    // is not needed (a checkpoint replaces the whole database).
    let _mempack = odb.add_new_mempack_backend(1000)?;
    let objects = repo.path().join("objects");
    let objects = objects
        .to_str()
        .ok_or_else(|| git2::Error::from_str("the vault path is not valid UTF-8"))?;
    // As an alternate, the disk is only read: writes go to memory.
    odb.add_disk_alternate(objects)?;
    repo.set_odb(&odb)?;
    // libgit2 lists the packs at its first read: validate them before.
    super::objects::odb_installed(repo);
    Ok(())
}

pub(crate) fn io_git(e: std::io::Error) -> git2::Error {
    git2::Error::from_str(&format!("I/O error: {e}"))
}

/// Up to this many objects, a checkpoint writes loose objects (each
/// synced); beyond, one pack.
const LOOSE_LIMIT: usize = 64;

/// Write `objects` into the repository's object directory and make them
/// durable: one pack (pack, index and directory synced), or, for a few
/// objects, loose files each synced before it gets its name.
pub(crate) fn write_durable_objects(
    repo: &Repository,
    objects: &[&Object],
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
            if path.exists() {
                continue;
            }
            if !sub.exists() {
                fs::create_dir_all(&sub).map_err(io_git)?;
                dirs.insert(dir.clone());
            }
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
    fs::create_dir_all(&pack_dir).map_err(io_git)?;
    super::pack::write(&pack_dir, objects).map_err(io_git)?;
    fsync::sync_path(&pack_dir).map_err(io_git)?;
    fsync::sync_path(&dir).map_err(io_git)?;
    Ok(())
}

/// One loose object: zlib of `<type> <len>\0<bytes>`, written to a
/// temporary name, synced, then renamed into place.
fn write_loose(sub: &Path, path: &Path, o: &Object) -> std::io::Result<()> {
    use std::io::Write;
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
    write!(z, "{} {}\0", o.kind.str(), o.data.len())?;
    z.write_all(&o.data)?;
    let bytes = z.finish()?;
    let tmp = sub.join(format!(
        "tmp_mv_{}",
        data_encoding::HEXLOWER.encode(&crate::crypto::random_bytes::<6>())
    ));
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(&bytes)?;
        fsync::sync_data(&f)?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}
