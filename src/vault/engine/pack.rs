//! Writing a git pack (and its version-2 index) straight from the log's
//! objects, without delta search, for checkpoints.
//!
//! A checkpoint must be cheap: libgit2's pack builder searched for deltas
//! among every object of the log (a quarter of all CPU time in the write
//! benchmark), only for `gc` to repack everything anyway. Here objects go
//! in stored (level 0) zlib blocks: blobs are ciphertext, and deflating
//! trees and commits cost a third of a write's CPU. Instead, a tree whose
//! previous version is earlier in the same pack (the log holds every
//! version of a directory, one per mutation) is written as an offset delta
//! against it: a copy of the common prefix, the changed bytes, a copy of
//! the common suffix ([`tree_bases`], [`make_delta`]). That keeps a
//! directory of 100 files at about 100 bytes per version instead of 8 KB,
//! without any search. `gc` deflates everything and finds the other deltas.
//!
//! Merging packs copies entries as they stand; an offset delta is
//! re-pointed at its base's new offset ([`Entry::RawOfsDelta`]).
//!
//! The pack is written to a temporary name and synced, then the index, and
//! only then are both renamed into place (pack first: readers discover a
//! pack by its index). The caller syncs the directory.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::{self, Read as _, Write};
use std::path::Path;
use std::sync::Arc;

use git2::{ObjectType, Oid};
use sha1::{Digest, Sha1};

use super::fsync;
use super::raw::{Object, code_type, type_code};

/// The variable-length object header: type and inflated size.
fn entry_header(kind: ObjectType, size: usize, out: &mut Vec<u8>) {
    // Every object memvault writes is one of the four kinds (a blob
    // otherwise, as before: nothing else reaches a pack).
    type_header(type_code(kind).unwrap_or(3), size, out);
}

/// One entry of a pack being written.
pub(crate) enum Entry<'a> {
    /// An object, to be stored (checked against its id first), as a delta
    /// when it has a base earlier in the pack.
    Object(&'a Object),
    /// [`Entry::Object`] whose bytes the caller has just hashed against
    /// its id (a clone's objects, hashed as they were read): stored
    /// without hashing them again.
    Hashed(&'a Object),
    /// An entry copied as it stands from another pack (header and zlib
    /// data of a whole, non-delta object), with its CRC-32.
    Raw { id: Oid, crc: u32, bytes: &'a [u8] },
    /// An offset delta copied from another pack: its zlib data as it
    /// stands, the delta's size, and its base, which must be earlier in
    /// the pack being written.
    RawOfsDelta {
        id: Oid,
        base: Oid,
        size: usize,
        zdata: &'a [u8],
    },
}

impl Entry<'_> {
    fn id(&self) -> Oid {
        match self {
            Entry::Object(o) | Entry::Hashed(o) => o.id,
            Entry::Raw { id, .. } | Entry::RawOfsDelta { id, .. } => *id,
        }
    }
}

/// The type code of an offset delta entry.
const OFS_DELTA: u8 = 6;

/// The longest delta chain a checkpoint writes: every tenth version of a
/// tree is whole, so reading one applies at most this many small deltas.
const MAX_DELTA_DEPTH: u8 = 10;

/// The header of an entry of type `code` and inflated size `size`.
fn type_header(code: u8, size: usize, out: &mut Vec<u8>) {
    let mut size = size as u64;
    let mut byte = (code << 4) | (size & 0x0f) as u8;
    size >>= 4;
    while size != 0 {
        out.push(byte | 0x80);
        byte = (size & 0x7f) as u8;
        size >>= 7;
    }
    out.push(byte);
}

/// Append `data` as a zlib stream of stored (uncompressed) deflate
/// blocks: the two-byte header, blocks of at most 65,535 bytes, and the
/// Adler-32 of `data`. What zlib at level 0 makes, without its stream
/// state (about 256 KiB allocated and cleared per object: a tenth of a
/// checkpoint's CPU).
pub(crate) fn zlib_stored(out: &mut Vec<u8>, data: &[u8]) {
    out.reserve(data.len() + data.len() / 65_535 * 5 + 11);
    // 32 KiB window, no dictionary, fastest: (0x78 << 8 | 0x01) % 31 == 0.
    out.extend_from_slice(&[0x78, 0x01]);
    let mut chunks = data.chunks(65_535).peekable();
    if chunks.peek().is_none() {
        out.extend_from_slice(&[0x01, 0x00, 0x00, 0xff, 0xff]);
    }
    while let Some(chunk) = chunks.next() {
        out.push(u8::from(chunks.peek().is_none()));
        let len = chunk.len() as u16;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(chunk);
    }
    out.extend_from_slice(&adler32(data).to_be_bytes());
}

fn adler32(data: &[u8]) -> u32 {
    const MOD: u32 = 65_521;
    let (mut a, mut b) = (1u32, 0u32);
    // 5,552 bytes is the most that cannot overflow `b` before the modulo.
    for chunk in data.chunks(5_552) {
        for &x in chunk {
            a += u32::from(x);
            b += a;
        }
        a %= MOD;
        b %= MOD;
    }
    (b << 16) | a
}

/// The distance back to an offset delta's base, as git encodes it.
fn ofs_encode(mut distance: u64, out: &mut Vec<u8>) {
    let mut bytes = vec![(distance & 0x7f) as u8];
    distance >>= 7;
    while distance != 0 {
        distance -= 1;
        bytes.push(0x80 | (distance & 0x7f) as u8);
        distance >>= 7;
    }
    bytes.reverse();
    out.extend_from_slice(&bytes);
}

/// A git delta turning `base` into `target`: copy the common prefix,
/// insert what differs, copy the common suffix. Linear time, no search:
/// right for a tree where one entry changed.
pub(crate) fn make_delta(base: &[u8], target: &[u8]) -> Vec<u8> {
    fn varint(mut n: usize, out: &mut Vec<u8>) {
        while n >= 0x80 {
            out.push(0x80 | (n & 0x7f) as u8);
            n >>= 7;
        }
        out.push(n as u8);
    }
    fn copy(mut offset: usize, mut len: usize, out: &mut Vec<u8>) {
        while len > 0 {
            let n = len.min(0x00ff_ffff);
            let mut cmd = 0x80u8;
            let mut args = Vec::with_capacity(7);
            for i in 0..4 {
                let b = (offset >> (8 * i)) as u8;
                if b != 0 {
                    cmd |= 1 << i;
                    args.push(b);
                }
            }
            for i in 0..3 {
                let b = (n >> (8 * i)) as u8;
                if b != 0 {
                    cmd |= 0x10 << i;
                    args.push(b);
                }
            }
            out.push(cmd);
            out.extend_from_slice(&args);
            offset += n;
            len -= n;
        }
    }
    let common = base.len().min(target.len());
    let prefix = base.iter().zip(target).take_while(|(a, b)| a == b).count();
    let suffix = base
        .iter()
        .rev()
        .zip(target.iter().rev())
        .take(common - prefix)
        .take_while(|(a, b)| a == b)
        .count();
    let mut out = Vec::with_capacity(32 + target.len() - prefix - suffix);
    varint(base.len(), &mut out);
    varint(target.len(), &mut out);
    copy(0, prefix, &mut out);
    for chunk in target[prefix..target.len() - suffix].chunks(0x7f) {
        out.push(chunk.len() as u8);
        out.extend_from_slice(chunk);
    }
    copy(base.len() - suffix, suffix, &mut out);
    out
}

/// `"<field><hex id>\n"` among a commit's header lines.
fn commit_field(data: &[u8], field: &[u8]) -> Option<Oid> {
    for line in data.split(|&b| b == b'\n') {
        if line.is_empty() {
            return None;
        }
        if let Some(hex) = line.strip_prefix(field) {
            return std::str::from_utf8(hex)
                .ok()
                .and_then(|h| Oid::from_str(h).ok());
        }
    }
    None
}

/// The subtrees of a tree object, sorted by name (for a binary search).
fn subtrees(data: &[u8]) -> Vec<(&[u8], Oid)> {
    let mut out = Vec::new();
    let mut rest = data;
    while let Some(sp) = rest.iter().position(|&b| b == b' ') {
        let mode = &rest[..sp];
        let Some(nul) = memchr::memchr(0, &rest[sp..]) else {
            break;
        };
        let name = &rest[sp + 1..sp + nul];
        let Some(id) = rest.get(sp + nul + 1..sp + nul + 21) else {
            break;
        };
        if mode == b"40000"
            && let Ok(id) = Oid::from_bytes(id)
        {
            out.push((name, id));
        }
        rest = &rest[sp + nul + 21..];
    }
    out.sort_unstable_by(|a, b| a.0.cmp(b.0));
    out
}

/// For the trees among `objects` (a log's objects, in order), the earlier
/// version of the same tree among them, found by walking each commit's
/// tree against its parent's (main) or the previous key commit's (the key
/// state, whose commits have no parent). Only a hint: a base is used only
/// when it is written earlier in the pack, and a poor one is refused by
/// size.
pub(crate) fn tree_bases(objects: &[&Object]) -> HashMap<Oid, Oid> {
    let by_id: HashMap<Oid, &Object> = objects.iter().map(|o| (o.id, *o)).collect();
    let mut bases = HashMap::new();
    fn pair(by_id: &HashMap<Oid, &Object>, new: Oid, old: Oid, bases: &mut HashMap<Oid, Oid>) {
        if new == old || bases.contains_key(&new) {
            return;
        }
        let (Some(n), Some(o)) = (by_id.get(&new), by_id.get(&old)) else {
            return;
        };
        if n.kind != ObjectType::Tree || o.kind != ObjectType::Tree {
            return;
        }
        bases.insert(new, old);
        // Most trees are folders of files: the old one is read only when
        // the new one has subtrees to pair.
        let after = subtrees(&n.data);
        if after.is_empty() {
            return;
        }
        let before = subtrees(&o.data);
        for (name, id) in after {
            if let Ok(i) = before.binary_search_by(|(b, _)| b.cmp(&name)) {
                pair(by_id, id, before[i].1, bases);
            }
        }
    }
    let mut previous_key_tree = None;
    for o in objects.iter().filter(|o| o.kind == ObjectType::Commit) {
        let Some(tree) = commit_field(&o.data, b"tree ") else {
            continue;
        };
        let base = match commit_field(&o.data, b"parent ") {
            Some(parent) => by_id
                .get(&parent)
                .and_then(|c| commit_field(&c.data, b"tree ")),
            None => previous_key_tree.replace(tree),
        };
        if let Some(base) = base {
            pair(&by_id, tree, base, &mut bases);
        }
    }
    bases
}

/// Where an entry went in the pack being written: its offset, and for an
/// object written from its bytes, those bytes and its delta depth (so it
/// can serve as a base).
type Written<'a> = (u64, Option<(&'a [u8], u8)>);

/// The pack and index bytes for `entries` (duplicates written once), and
/// the pack's name (the hex SHA-1 of its content, as git names packs).
pub(crate) fn build_entries(
    all: &[Entry<'_>],
    bases: &HashMap<Oid, Oid>,
) -> io::Result<(Vec<u8>, Vec<u8>, String)> {
    let mut seen = HashSet::with_capacity(all.len());
    let unique: Vec<&Entry<'_>> = all.iter().filter(|e| seen.insert(e.id())).collect();
    let count = u32::try_from(unique.len())
        .map_err(|_| io::Error::other("too many objects for one pack"))?;
    let mut pack = Vec::with_capacity(
        all.iter()
            .map(|e| match e {
                Entry::Object(o) | Entry::Hashed(o) => o.data.len() + 32,
                Entry::Raw { bytes, .. } => bytes.len(),
                Entry::RawOfsDelta { zdata, .. } => zdata.len() + 16,
            })
            .sum::<usize>()
            + 32,
    );
    pack.extend_from_slice(b"PACK");
    pack.extend_from_slice(&2u32.to_be_bytes());
    pack.extend_from_slice(&count.to_be_bytes());
    // (id, crc32, offset)
    let mut entries: Vec<([u8; 20], u32, u64)> = Vec::with_capacity(unique.len());
    // Where each object went, with its bytes and delta depth when it can
    // serve as a base.
    let mut written: HashMap<Oid, Written<'_>> = HashMap::with_capacity(unique.len());
    // Stored, not deflated: blobs are ciphertext (and so is the key
    // table), which deflate cannot shrink; trees go as deltas where they
    // can; zlib level 1 on the rest cost a third of a write's CPU. `gc`
    // deflates and deltas everything when it repacks.
    let stored = |pack: &mut Vec<u8>, data: &[u8]| -> io::Result<()> {
        zlib_stored(pack, data);
        Ok(())
    };
    for e in unique {
        let offset = pack.len() as u64;
        match e {
            Entry::Raw { bytes, .. } => {
                pack.extend_from_slice(bytes);
                written.insert(e.id(), (offset, None));
            }
            Entry::RawOfsDelta {
                id,
                base,
                size,
                zdata,
            } => {
                let Some(&(at, _)) = written.get(base) else {
                    return Err(io::Error::other(
                        "a delta's base is not before it in the pack",
                    ));
                };
                type_header(OFS_DELTA, *size, &mut pack);
                ofs_encode(offset - at, &mut pack);
                pack.extend_from_slice(zdata);
                written.insert(*id, (offset, None));
            }
            Entry::Object(o) | Entry::Hashed(o) => {
                if matches!(e, Entry::Object(_)) && object_hash(o.kind, &o.data) != o.id.as_bytes()
                {
                    return Err(io::Error::other("a logged object does not match its id"));
                }
                let delta = bases
                    .get(&o.id)
                    .and_then(|b| written.get(b))
                    .and_then(|&(at, base)| {
                        let (data, depth) = base?;
                        (depth < MAX_DELTA_DEPTH)
                            .then(|| (at, depth + 1, make_delta(data, &o.data)))
                    })
                    .filter(|(_, _, d)| d.len() < o.data.len() / 2);
                let depth = match delta {
                    Some((at, depth, d)) => {
                        type_header(OFS_DELTA, d.len(), &mut pack);
                        ofs_encode(offset - at, &mut pack);
                        stored(&mut pack, &d)?;
                        depth
                    }
                    None => {
                        entry_header(o.kind, o.data.len(), &mut pack);
                        stored(&mut pack, &o.data)?;
                        0
                    }
                };
                written.insert(o.id, (offset, Some((&o.data, depth))));
            }
        }
        // A raw entry is copied whole, with the CRC its index gave.
        let crc = match e {
            Entry::Raw { crc, .. } => *crc,
            _ => {
                let mut crc = flate2::Crc::new();
                crc.update(&pack[offset as usize..]);
                crc.sum()
            }
        };
        let mut id = [0u8; 20];
        id.copy_from_slice(e.id().as_bytes());
        entries.push((id, crc, offset));
    }
    let pack_sum: [u8; 20] = Sha1::digest(&pack).into();
    pack.extend_from_slice(&pack_sum);

    entries.sort_unstable_by_key(|a| a.0);
    let mut idx = Vec::with_capacity(8 + 1024 + entries.len() * 28 + 40);
    idx.extend_from_slice(&[0xff, b't', b'O', b'c']);
    idx.extend_from_slice(&2u32.to_be_bytes());
    let mut fanout = [0u32; 256];
    for (id, _, _) in &entries {
        fanout[id[0] as usize] += 1;
    }
    let mut running = 0u32;
    for f in fanout {
        running += f;
        idx.extend_from_slice(&running.to_be_bytes());
    }
    for (id, _, _) in &entries {
        idx.extend_from_slice(id);
    }
    for (_, crc, _) in &entries {
        idx.extend_from_slice(&crc.to_be_bytes());
    }
    let mut large: Vec<u64> = Vec::new();
    for (_, _, offset) in &entries {
        if *offset < 0x8000_0000 {
            idx.extend_from_slice(&(*offset as u32).to_be_bytes());
        } else {
            idx.extend_from_slice(&(0x8000_0000 | large.len() as u32).to_be_bytes());
            large.push(*offset);
        }
    }
    for offset in large {
        idx.extend_from_slice(&offset.to_be_bytes());
    }
    idx.extend_from_slice(&pack_sum);
    let idx_sum: [u8; 20] = Sha1::digest(&idx).into();
    idx.extend_from_slice(&idx_sum);
    Ok((pack, idx, data_encoding::HEXLOWER.encode(&pack_sum)))
}

fn write_synced(dir: &Path, bytes: &[u8]) -> io::Result<std::path::PathBuf> {
    let tmp = dir.join(format!(
        "tmp_mv_pack_{}",
        data_encoding::HEXLOWER.encode(&crate::crypto::random_bytes::<6>())
    ));
    let result = (|| {
        let mut f = super::fsx::create_new(&tmp, super::fsx::FILE_MODE)?;
        f.write_all(bytes)?;
        fsync::sync_data(&f)
    })();
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(tmp)
}

/// Write `objects` as one pack with its index into `pack_dir`, both synced
/// before they get their names. Returns the pack's name.
pub(crate) fn write(pack_dir: &Path, objects: &[&Object]) -> io::Result<String> {
    let entries: Vec<Entry<'_>> = objects.iter().map(|o| Entry::Object(o)).collect();
    write_entries(pack_dir, &entries, &tree_bases(objects))
}

/// [`write`] of objects the caller has just hashed against their ids.
pub(crate) fn write_hashed(pack_dir: &Path, objects: &[&Object]) -> io::Result<String> {
    let entries: Vec<Entry<'_>> = objects.iter().map(|o| Entry::Hashed(o)).collect();
    write_entries(pack_dir, &entries, &tree_bases(objects))
}

/// [`write`] for entries that may be copied from other packs, with delta
/// bases for objects (see [`tree_bases`]).
pub(crate) fn write_entries(
    pack_dir: &Path,
    entries: &[Entry<'_>],
    bases: &HashMap<Oid, Oid>,
) -> io::Result<String> {
    let (pack, idx, name) = build_entries(entries, bases)?;
    let pack_tmp = write_synced(pack_dir, &pack)?;
    let idx_tmp = match write_synced(pack_dir, &idx) {
        Ok(p) => p,
        Err(e) => {
            let _ = fs::remove_file(&pack_tmp);
            return Err(e);
        }
    };
    let renamed = fs::rename(&pack_tmp, pack_dir.join(format!("pack-{name}.pack")))
        .and_then(|()| fs::rename(&idx_tmp, pack_dir.join(format!("pack-{name}.idx"))));
    if let Err(e) = renamed {
        let _ = fs::remove_file(&pack_tmp);
        let _ = fs::remove_file(&idx_tmp);
        return Err(e);
    }
    Ok(name)
}

/// A pack on disk, read whole, with its index parsed: for merging packs.
pub(crate) struct PackFile {
    pack: Vec<u8>,
    /// (id, crc32, offset), by offset.
    entries: Vec<(Oid, u32, u64)>,
}

/// What a pack entry is, once read.
pub(crate) enum Read<'a> {
    /// A whole object's header and zlib data, to copy as they stand.
    Whole { id: Oid, crc: u32, bytes: &'a [u8] },
    /// An offset delta against an entry of the same pack: its size, zlib
    /// data and base, to copy re-pointed.
    OfsDelta {
        id: Oid,
        base: Oid,
        size: usize,
        zdata: &'a [u8],
    },
    /// Another delta: to be resolved through the object database and
    /// written whole.
    Delta(Oid),
}

impl PackFile {
    /// Read `<stem>.pack` and `<stem>.idx` (index version 2).
    pub(crate) fn open(dir: &Path, stem: &str) -> io::Result<PackFile> {
        let bad = || io::Error::other("a pack or its index does not read");
        let idx = super::fsx::read(&dir.join(format!("{stem}.idx")))?;
        let pack = super::fsx::read(&dir.join(format!("{stem}.pack")))?;
        if idx.get(..8) != Some(&[0xff, b't', b'O', b'c', 0, 0, 0, 2][..])
            || pack.get(..4) != Some(&b"PACK"[..])
            || pack.len() < 32
        {
            return Err(bad());
        }
        let be32 = |at: usize| -> io::Result<u32> {
            idx.get(at..at + 4)
                .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
                .ok_or_else(bad)
        };
        let n = be32(8 + 255 * 4)? as usize;
        let ids_at = 8 + 1024;
        let crcs_at = ids_at + n * 20;
        let offs_at = crcs_at + n * 4;
        let large_at = offs_at + n * 4;
        // The count comes from the file: check the index holds that many
        // entries before reserving room for them.
        if idx.len() < large_at {
            return Err(bad());
        }
        let mut entries = Vec::with_capacity(n);
        for i in 0..n {
            let id = idx
                .get(ids_at + i * 20..ids_at + i * 20 + 20)
                .and_then(|b| Oid::from_bytes(b).ok())
                .ok_or_else(bad)?;
            let crc = be32(crcs_at + i * 4)?;
            let small = be32(offs_at + i * 4)?;
            let offset = if small & 0x8000_0000 == 0 {
                u64::from(small)
            } else {
                let at = large_at + (small & 0x7fff_ffff) as usize * 8;
                idx.get(at..at + 8)
                    .map(|b| u64::from_be_bytes(b.try_into().unwrap_or_default()))
                    .ok_or_else(bad)?
            };
            if offset < 12 || offset >= (pack.len() - 20) as u64 {
                return Err(bad());
            }
            entries.push((id, crc, offset));
        }
        entries.sort_unstable_by_key(|e| e.2);
        // Two ids at one offset would make an entry of no bytes: such an
        // index was not written by git or memvault.
        if entries.windows(2).any(|w| w[0].2 == w[1].2) {
            return Err(bad());
        }
        Ok(PackFile { pack, entries })
    }

    /// Every entry, in pack order.
    /// The ids the index lists.
    pub(crate) fn ids(&self) -> impl Iterator<Item = Oid> + '_ {
        self.entries.iter().map(|e| e.0)
    }

    pub(crate) fn entries(&self) -> impl Iterator<Item = Read<'_>> {
        let end = self.pack.len() - 20;
        (0..self.entries.len()).map(move |i| {
            let (id, crc, start) = self.entries[i];
            let stop = self.entries.get(i + 1).map_or(end, |e| e.2 as usize);
            let bytes = &self.pack[start as usize..stop];
            match (bytes.first().copied().unwrap_or(0) >> 4) & 7 {
                1..=4 => Read::Whole { id, crc, bytes },
                OFS_DELTA => self.ofs_delta(id, start, bytes).unwrap_or(Read::Delta(id)),
                _ => Read::Delta(id),
            }
        })
    }

    /// An offset delta entry at `start`, if its header parses and its
    /// base is an entry of this pack.
    fn ofs_delta<'a>(&'a self, id: Oid, start: u64, bytes: &'a [u8]) -> Option<Read<'a>> {
        let mut i = 0;
        let mut size = usize::from(bytes[0] & 0x0f);
        let mut shift = 4;
        while bytes.get(i)? & 0x80 != 0 {
            i += 1;
            size |= usize::from(bytes.get(i)? & 0x7f).checked_shl(shift)?;
            shift += 7;
            if shift > 56 {
                return None;
            }
        }
        i += 1;
        let mut c = *bytes.get(i)?;
        let mut distance = u64::from(c & 0x7f);
        while c & 0x80 != 0 {
            i += 1;
            c = *bytes.get(i)?;
            distance = distance.checked_add(1)?.checked_mul(128)? | u64::from(c & 0x7f);
        }
        i += 1;
        let at = start.checked_sub(distance)?;
        let k = self.entries.binary_search_by_key(&at, |e| e.2).ok()?;
        Some(Read::OfsDelta {
            id,
            base: self.entries[k].0,
            size,
            zdata: bytes.get(i..)?,
        })
    }
}

/// The largest object [`whole_entry_holds`] inflates to check it (a
/// vault's largest tree, 100,000 files in one directory, is about 9 MiB).
const CHECK_LIMIT: u64 = 64 << 20;

/// Whether a whole (non-delta) pack entry, its type-and-size header and
/// zlib data as [`Read::Whole`] gives them, holds the object `id`: its
/// inflated bytes hash to it. False for anything that does not parse,
/// inflate to the size it declares, or stay under [`CHECK_LIMIT`].
pub(crate) fn whole_entry_holds(id: Oid, bytes: &[u8]) -> bool {
    let Some(&first) = bytes.first() else {
        return false;
    };
    let Some(kind) = code_type((first >> 4) & 7) else {
        return false;
    };
    let mut size = u64::from(first & 0x0f);
    let (mut i, mut shift) = (0, 4);
    while bytes[i] & 0x80 != 0 {
        i += 1;
        let Some(&b) = bytes.get(i) else {
            return false;
        };
        if shift > 56 {
            return false;
        }
        size |= u64::from(b & 0x7f) << shift;
        shift += 7;
    }
    if size > CHECK_LIMIT {
        return false;
    }
    let mut data = Vec::with_capacity(size as usize);
    let mut z = flate2::read::ZlibDecoder::new(&bytes[i + 1..]).take(size + 1);
    if z.read_to_end(&mut data).is_err() || data.len() as u64 != size {
        return false;
    }
    object_hash(kind, &data) == id.as_bytes()
}

/// Git's object id of `bytes` as an object of `kind`, computed without
/// libgit2 (whose collision-detecting SHA-1 is several times slower).
pub(crate) fn object_hash(kind: ObjectType, bytes: &[u8]) -> [u8; 20] {
    let mut h = Sha1::new();
    h.update(kind.str().as_bytes());
    h.update(b" ");
    h.update(digits(bytes.len() as u64, 10, &mut [0; 22]));
    h.update(b"\0");
    h.update(bytes);
    h.finalize().into()
}

/// `n` in `radix` (2 to 10) without leading zeros, as `{}` and `{:o}`
/// write it, in the end of `buf`: for object headers and tree modes, where
/// the formatter showed in profiles.
pub(crate) fn digits(mut n: u64, radix: u64, buf: &mut [u8; 22]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % radix) as u8;
        n /= radix;
        if n == 0 {
            return &buf[at..];
        }
    }
}

/// Git's blob id of `bytes` (the log's checksum).
pub(crate) fn blob_hash(bytes: &[u8]) -> [u8; 20] {
    object_hash(ObjectType::Blob, bytes)
}

/// The largest object memvault lets libgit2 read, inflated (the log's
/// own record limit: nothing larger can have been written by memvault).
pub(crate) const MAX_OBJECT: u64 = 1 << 30;

/// Why a pack was refused before libgit2 read it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PackError {
    #[error("a pack or its index does not read: {0}")]
    Unreadable(#[from] io::Error),
    #[error("a pack or its index is malformed ({0})")]
    Malformed(&'static str),
}

/// Inflate the zlib stream at the start of `input`, handing the output to
/// `sink` in pieces (it returns false to stop), at most `limit` bytes of
/// it. The number of input bytes the stream took, or None if it is
/// corrupt, cut short, longer than `limit`, or stopped. Memory stays
/// bounded whatever the stream claims.
pub(crate) fn inflate_stream(
    input: &[u8],
    limit: u64,
    mut sink: impl FnMut(&[u8]) -> bool,
) -> Option<usize> {
    thread_local! {
        // One inflater and buffer per thread, reset per stream: setting
        // one up costs more than inflating a small commit.
        static Z: std::cell::RefCell<(flate2::Decompress, Vec<u8>)> =
            std::cell::RefCell::new((flate2::Decompress::new(true), vec![0u8; 64 << 10]));
    }
    Z.with(|z| {
        let (z, buf) = &mut *z.borrow_mut();
        z.reset(true);
        loop {
            let (in_before, out_before) = (z.total_in(), z.total_out());
            let status = z
                .decompress(
                    input.get(in_before as usize..)?,
                    buf,
                    flate2::FlushDecompress::None,
                )
                .ok()?;
            let produced = (z.total_out() - out_before) as usize;
            if z.total_out() > limit {
                return None;
            }
            if !sink(&buf[..produced]) {
                return None;
            }
            match status {
                flate2::Status::StreamEnd => return Some(z.total_in() as usize),
                // No progress: the input ended before the stream did.
                _ if produced == 0 && z.total_in() == in_before => return None,
                _ => {}
            }
        }
    })
}

/// The type code, inflated size and header length of the pack entry
/// header at the start of `bytes`.
fn parse_entry_header(bytes: &[u8]) -> Option<(u8, u64, usize)> {
    let first = *bytes.first()?;
    let code = (first >> 4) & 7;
    let mut size = u64::from(first & 0x0f);
    let (mut i, mut shift) = (0usize, 4u32);
    while bytes.get(i)? & 0x80 != 0 {
        i += 1;
        if shift > 56 {
            return None;
        }
        size |= u64::from(bytes.get(i)? & 0x7f) << shift;
        shift += 7;
    }
    Some((code, size, i + 1))
}

/// A size at the start of a delta (7 bits a byte, low bits first).
fn delta_varint(r: &mut &[u8]) -> Option<u64> {
    let (mut v, mut shift) = (0u64, 0u32);
    loop {
        let (&b, rest) = r.split_first()?;
        *r = rest;
        if shift > 63 {
            return None;
        }
        v |= u64::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
}

/// The object a git delta makes of `base`: None if the delta does not
/// parse, names another base size, copies from outside the base, or does
/// not make exactly the size it declares (at most [`MAX_OBJECT`]).
pub(crate) fn apply_delta(base: &[u8], delta: &[u8]) -> Option<Vec<u8>> {
    let mut r = delta;
    let base_size = delta_varint(&mut r)?;
    let size = delta_varint(&mut r)?;
    if base_size != base.len() as u64 || size > MAX_OBJECT {
        return None;
    }
    let size = size as usize;
    // Room for what the delta can make at most before it copies (inserts
    // are its own bytes; each copy at most the base).
    let mut out = Vec::with_capacity(size.min(base.len().saturating_add(delta.len())));
    while let Some((&cmd, rest)) = r.split_first() {
        r = rest;
        let piece = if cmd & 0x80 != 0 {
            let mut arg = |bits: u8, shift: usize| -> Option<usize> {
                let mut v = 0usize;
                for i in 0..shift {
                    if bits & (1 << i) != 0 {
                        let (&b, rest) = r.split_first()?;
                        r = rest;
                        v |= usize::from(b) << (8 * i);
                    }
                }
                Some(v)
            };
            let offset = arg(cmd & 0x0f, 4)?;
            let len = match arg((cmd >> 4) & 0x07, 3)? {
                0 => 0x10000,
                n => n,
            };
            base.get(offset..offset.checked_add(len)?)?
        } else if cmd != 0 {
            let (piece, rest) = r.split_at_checked(usize::from(cmd))?;
            r = rest;
            piece
        } else {
            return None;
        };
        if out.len() + piece.len() > size {
            return None;
        }
        out.extend_from_slice(piece);
    }
    (out.len() == size).then_some(out)
}

/// An object [`PackIndex::read_object`] read: its type and content.
pub(crate) type Made = (ObjectType, Arc<Vec<u8>>);

/// How many bytes of deltas [`PackIndex::read_object`] holds at once
/// (down a chain, before it applies them).
/// (1 MiB in unit tests, to test it with small packs.)
const DELTAS_HELD: usize = if cfg!(test) { 1 << 20 } else { 64 << 20 };

/// How many bytes of objects [`PackIndex::read_object`] keeps per pack
/// as delta bases (all are dropped when they would go over).
const BASES_KEPT: usize = 1 << 20;

/// A pack's index and the pack, open: what [`open_index`] checks of a
/// pack before libgit2 may search it, and what
/// [`PackIndex::check_object`] needs to check, one object at a time, the
/// entries libgit2 would read for it. The index is read a fanout bucket
/// (the ids that share a first byte) at a time, when an id of that bucket
/// is first looked up.
pub(crate) struct PackIndex {
    idx: fs::File,
    idx_len: usize,
    n: usize,
    fanout: [u32; 256],
    crcs_at: usize,
    offs_at: usize,
    large_at: usize,
    /// The buckets read so far (256).
    buckets: Vec<Option<Bucket>>,
    pack: fs::File,
    /// The pack's length without its trailer.
    body_end: u64,
    /// The pack's header and trailer.
    header: [u8; 12],
    trailer: [u8; 20],
    /// Entries checked by [`PackIndex::check_object`]: offset -> size of
    /// the object it gives (a delta's result).
    checked: HashMap<u64, u64>,
    /// Those of them checked as the entry of their id (CRC-32 and, when
    /// whole, hash), not only as a delta base.
    by_id: HashSet<u64>,
    /// The buffer [`PackIndex::read_entry`] reads into, kept between reads.
    scratch: Vec<u8>,
    /// Objects [`PackIndex::read_object`] made, by entry offset, to apply
    /// the next delta on them (a tree's versions are a chain of deltas):
    /// at most [`BASES_KEPT`] bytes.
    bases: HashMap<u64, Made>,
    bases_bytes: usize,
}

/// One fanout bucket of an index: the positions `lo..` of the ids that
/// start with its byte, and their ids, CRC-32s and offsets (the index's
/// bytes), checked: each id starts with the bucket's byte and they are in
/// strictly increasing order.
struct Bucket {
    lo: usize,
    ids: Vec<u8>,
    crcs: Vec<u8>,
    offs: Vec<u8>,
}

impl std::fmt::Debug for PackIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackIndex")
            .field("objects", &self.n)
            .field("checked", &self.checked.len())
            .finish_non_exhaustive()
    }
}

/// Longest chain of deltas [`PackIndex::check_object`] follows (libgit2's
/// pack builder makes chains of at most 50; git's deepest is 4,095).
const MAX_CHAIN: usize = 1 << 14;

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Check a pack's index, and the pack's header and trailer against it,
/// without reading the pack's entries or the index's ids: the index is
/// version 2, its fanout never decreases and its length matches its
/// object count; the pack's header names as many objects and its trailer
/// is the one the index records. That is all libgit2 reads of a pack
/// before it looks up an id (it then searches the index between the
/// fanout's bounds, and reads the entries of the object it wants). Each
/// fanout bucket's ids are checked when the first id of that bucket is
/// looked up: they start with its byte and are sorted, each once, so a
/// binary search, libgit2's or [`PackIndex::check_object`]'s, finds an id
/// at one place only. An entry's offset is checked when its entry is
/// ([`PackIndex::check_object`]); the index's own checksum, by
/// [`validate`]: libgit2 reads neither before an entry, and reading the
/// whole index costs (tens of MB after 200,000 commits) more than a
/// one-shot command does otherwise.
pub(crate) fn open_index(idx_path: &Path, pack_path: &Path) -> Result<PackIndex, PackError> {
    use PackError::Malformed as bad;
    use std::os::unix::fs::FileExt;
    let idx = super::fsx::open_read(idx_path)?;
    let idx_len = idx.metadata()?.len();
    // 28 bytes per object and 8 per large offset: a 1 GiB index would list
    // tens of millions of objects.
    if idx_len > 1 << 30 {
        return Err(bad("the index is too large"));
    }
    let idx_len = idx_len as usize;
    if idx_len < 8 + 1024 + 40 {
        return Err(bad("not a version 2 index"));
    }
    let mut head = vec![0u8; 8 + 1024];
    idx.read_exact_at(&mut head, 0)?;
    if head[..8] != [0xff, b't', b'O', b'c', 0, 0, 0, 2] {
        return Err(bad("not a version 2 index"));
    }
    let mut fanout = [0u32; 256];
    for (b, f) in fanout.iter_mut().enumerate() {
        *f = be32(&head, 8 + 4 * b);
    }
    if fanout.windows(2).any(|w| w[1] < w[0]) {
        return Err(bad("the index's fanout decreases"));
    }
    let n = fanout[255] as usize;
    let ids_at = 8 + 1024;
    let crcs_at = n.checked_mul(20).and_then(|x| x.checked_add(ids_at));
    let large_at = crcs_at.and_then(|c| n.checked_mul(8).and_then(|x| x.checked_add(c)));
    let (Some(crcs_at), Some(large_at)) = (crcs_at, large_at) else {
        return Err(bad("the index's object count"));
    };
    let offs_at = crcs_at + n * 4;
    let trailer_at = idx_len - 40;
    if trailer_at < large_at || !(trailer_at - large_at).is_multiple_of(8) {
        return Err(bad("the index's length does not match its object count"));
    }
    let mut pack_sum = [0u8; 20];
    idx.read_exact_at(&mut pack_sum, trailer_at as u64)?;
    let pack = super::fsx::open_read(pack_path)?;
    let pack_len = pack.metadata()?.len();
    if pack_len < 32 {
        return Err(bad("the pack is too short"));
    }
    let body_end = pack_len - 20;
    let mut trailer = [0u8; 20];
    pack.read_exact_at(&mut trailer, body_end)?;
    if trailer != pack_sum {
        return Err(bad("the pack's trailer is not the one its index records"));
    }
    let mut header = [0u8; 12];
    pack.read_exact_at(&mut header, 0)?;
    if &header[..4] != b"PACK"
        || !matches!(be32(&header, 4), 2 | 3)
        || be32(&header, 8) as usize != n
    {
        return Err(bad("the pack's header"));
    }
    if n == 0 && body_end != 12 {
        return Err(bad("an empty pack holds bytes"));
    }
    Ok(PackIndex {
        idx,
        idx_len,
        n,
        fanout,
        crcs_at,
        offs_at,
        large_at,
        buckets: (0..256).map(|_| None).collect(),
        pack,
        body_end,
        header,
        trailer,
        checked: HashMap::new(),
        by_id: HashSet::new(),
        scratch: Vec::new(),
        bases: HashMap::new(),
        bases_bytes: 0,
    })
}

impl PackIndex {
    /// The positions of bucket `b`'s ids.
    fn bucket_range(&self, b: usize) -> std::ops::Range<usize> {
        let lo = if b == 0 {
            0
        } else {
            self.fanout[b - 1] as usize
        };
        lo..self.fanout[b] as usize
    }

    /// Read and check bucket `b` from the index file, or from `whole`
    /// (the index's bytes), unless it was read already.
    fn load_bucket(&mut self, b: usize, whole: Option<&[u8]>) -> Result<(), PackError> {
        use PackError::Malformed as bad;
        if self.buckets[b].is_some() {
            return Ok(());
        }
        let r = self.bucket_range(b);
        let read = |at: usize, len: usize| -> Result<Vec<u8>, PackError> {
            match whole {
                Some(w) => Ok(w[at..at + len].to_vec()),
                None => {
                    let mut v = vec![0u8; len];
                    std::os::unix::fs::FileExt::read_exact_at(&self.idx, &mut v, at as u64)?;
                    Ok(v)
                }
            }
        };
        let ids = read(8 + 1024 + r.start * 20, r.len() * 20)?;
        let crcs = read(self.crcs_at + r.start * 4, r.len() * 4)?;
        let offs = read(self.offs_at + r.start * 4, r.len() * 4)?;
        let mut prev: Option<&[u8]> = None;
        for id in ids.chunks_exact(20) {
            if usize::from(id[0]) != b {
                return Err(bad("the index's fanout does not match its ids"));
            }
            if prev.is_some_and(|p| p >= id) {
                return Err(bad("the index's ids are not sorted"));
            }
            prev = Some(id);
        }
        self.buckets[b] = Some(Bucket {
            lo: r.start,
            ids,
            crcs,
            offs,
        });
        Ok(())
    }

    /// The bucket holding position `pos`, if it was read.
    fn bucket_at(&self, pos: usize) -> Option<(&Bucket, usize)> {
        let b = self.fanout.partition_point(|&f| f as usize <= pos);
        let bucket = self.buckets.get(b)?.as_ref()?;
        Some((bucket, pos - bucket.lo))
    }

    /// The id at position `pos` (its bucket read).
    fn id_at(&self, pos: usize) -> Option<&[u8]> {
        let (b, i) = self.bucket_at(pos)?;
        b.ids.get(i * 20..i * 20 + 20)
    }

    /// The CRC-32 the index records for position `pos` (its bucket read).
    fn crc_at(&self, pos: usize) -> Option<u32> {
        let (b, i) = self.bucket_at(pos)?;
        Some(be32(b.crcs.get(i * 4..i * 4 + 4)?, 0))
    }

    /// The offset of the object at position `pos` (its bucket read);
    /// `u64::MAX` for none, or a large offset out of the index's range.
    fn offset(&self, pos: usize) -> u64 {
        let Some(small) = self
            .bucket_at(pos)
            .and_then(|(b, i)| b.offs.get(i * 4..i * 4 + 4))
            .map(|o| be32(o, 0))
        else {
            return u64::MAX;
        };
        if small & 0x8000_0000 == 0 {
            return u64::from(small);
        }
        let at = self.large_at + (small & 0x7fff_ffff) as usize * 8;
        // The large offsets end where the index's 40-byte trailer starts.
        let mut large = [0u8; 8];
        if at + 8 > self.idx_len - 40
            || std::os::unix::fs::FileExt::read_exact_at(&self.idx, &mut large, at as u64).is_err()
        {
            return u64::MAX;
        }
        u64::from_be_bytes(large)
    }

    /// The position of `id` in the index, if the pack holds it (its bucket
    /// read and checked first).
    fn position(&mut self, id: &[u8]) -> Result<Option<usize>, PackError> {
        let Some(&first) = id.first() else {
            return Ok(None);
        };
        let b = usize::from(first);
        self.load_bucket(b, None)?;
        let Some(bucket) = &self.buckets[b] else {
            return Ok(None);
        };
        let (mut lo, mut hi) = (0, bucket.ids.len() / 20);
        while lo < hi {
            let mid = (lo + hi) / 2;
            match bucket.ids[mid * 20..mid * 20 + 20].cmp(id) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Ok(Some(bucket.lo + mid)),
            }
        }
        // On a miss libgit2 also compares the id at the insertion point,
        // which past the bucket's end is the next bucket's first: read
        // and check that bucket too (its ids must start with its own
        // byte), so an id planted there is refused, not read unchecked.
        let end = bucket.lo + bucket.ids.len() / 20;
        if lo == bucket.ids.len() / 20 && end < self.n {
            let next = self.fanout.partition_point(|&f| f as usize <= end);
            if next < 256 {
                self.load_bucket(next, None)?;
            }
        }
        Ok(None)
    }

    /// Whether the pack holds `id`.
    pub(crate) fn holds(&mut self, id: Oid) -> Result<bool, PackError> {
        Ok(self.position(id.as_bytes())?.is_some())
    }

    /// Check what libgit2 would read of this pack to read `id`: nothing if
    /// the pack does not hold it; otherwise its entry and every delta base
    /// below it, each one as [`validate`] checks an entry (header, zlib
    /// stream inflating to the size it declares, inside the pack's body;
    /// the CRC-32 the index records; a whole object hashing to its id; a
    /// delta's base an earlier entry of the size the delta names, its
    /// result at most [`MAX_OBJECT`]). An entry checked once is not read
    /// again. Returns whether the pack holds `id`.
    pub(crate) fn check_object(&mut self, id: Oid) -> Result<bool, PackError> {
        use PackError::Malformed as bad;
        let Some(pos) = self.position(id.as_bytes())? else {
            return Ok(false);
        };
        // Down the chain to an entry already checked or a whole object,
        // then back up, checking each delta's sizes against its base.
        let mut pending: Vec<(u64, u64, u64)> = Vec::new();
        let (mut at, mut expect) = (self.offset(pos), Some(pos));
        if !(12..self.body_end).contains(&at) {
            return Err(bad("an entry's offset is out of place"));
        }
        let top = at;
        let mut size = loop {
            // An entry first reached as a delta base is checked again as
            // the entry of its id (its CRC-32 and hash were not).
            if let Some(&size) = self.checked.get(&at)
                && (expect.is_none() || self.by_id.contains(&at))
            {
                break size;
            }
            if pending.len() >= MAX_CHAIN {
                return Err(bad("a delta chain is too long"));
            }
            match self.read_entry(at, expect, None)? {
                Checked::Whole(size, _) => {
                    self.checked.insert(at, size);
                    break size;
                }
                Checked::Delta {
                    base,
                    base_size,
                    result,
                } => {
                    pending.push((at, base_size, result));
                    (at, expect) = (base, None);
                }
            }
        };
        while let Some((at, base_size, result)) = pending.pop() {
            if base_size != size || result > MAX_OBJECT {
                return Err(bad(
                    "a delta's sizes do not match its base or are too large",
                ));
            }
            self.checked.insert(at, result);
            size = result;
        }
        self.by_id.insert(top);
        Ok(true)
    }

    /// Check the entry at `start`: `expect` is its position in the index
    /// when it is reached by id (its CRC-32 and, when whole, its id are
    /// checked then). Its bytes are read a few KiB first, more while its
    /// stream runs on.
    fn read_entry(
        &mut self,
        start: u64,
        expect: Option<usize>,
        mut keep: Option<&mut Vec<u8>>,
    ) -> Result<Checked, PackError> {
        use PackError::Malformed as bad;
        let room = self.body_end.saturating_sub(start);
        let mut want = room.min(4 << 10);
        // The buffer of the last read, reused (zeroing a new one per
        // entry cost a view more than inflating its blob).
        let mut buf = std::mem::take(&mut self.scratch);
        let checked = loop {
            buf.resize(want as usize, 0);
            if let Err(e) = std::os::unix::fs::FileExt::read_exact_at(&self.pack, &mut buf, start) {
                break Err(e.into());
            }
            // The entry cannot be longer than its header (at most 32
            // bytes, with a delta's base) and a zlib stream of its
            // declared size: a stored stream adds 5 bytes per 64 KiB
            // block, a deflated one less.
            let most = parse_entry_header(&buf).map_or(want, |(_, size, _)| {
                room.min(size.saturating_add(size / 64 + 128))
            });
            if let Some(k) = keep.as_deref_mut() {
                k.clear();
            }
            match self.entry_in(start, &buf, expect, keep.as_deref_mut()) {
                Ok((checked, _)) => break Ok(checked),
                // Only a stream may go on past what was read.
                Err(what) if what == NO_INFLATE && want < most => {
                    want = most.min(want.saturating_mul(8));
                }
                Err(what) => break Err(bad(what)),
            }
        };
        // A large entry's buffer is not kept.
        if buf.capacity() <= 64 << 10 {
            self.scratch = buf;
        }
        checked
    }

    /// The object `id`, if this pack holds it: its type and content, read
    /// here without libgit2, a delta applied on its base (and that base's,
    /// down to a whole entry or one read before), each entry checked as
    /// [`check_object`](Self::check_object) checks it, and the object made
    /// hashed against `id`. None if the pack does not hold it.
    pub(crate) fn read_object(&mut self, id: Oid) -> Result<Option<Made>, PackError> {
        use PackError::Malformed as bad;
        let Some(pos) = self.position(id.as_bytes())? else {
            return Ok(None);
        };
        let top = self.offset(pos);
        // Down the chain to a whole entry or a base made before, keeping
        // each delta; then back up, applying them.
        let mut deltas: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut held = 0usize;
        let mut sizes: Vec<(u64, u64)> = Vec::new();
        let (mut at, mut expect) = (top, Some(pos));
        let (kind, mut made) = loop {
            if !(12..self.body_end).contains(&at) {
                return Err(bad("an entry's offset is out of place"));
            }
            // A base made before (from this pack's bytes alone, as it
            // would be made again); never the top entry, read and checked
            // here every time.
            if let Some((kind, made)) = self.bases.get(&at)
                && expect.is_none()
            {
                break (*kind, made.clone());
            }
            if deltas.len() >= MAX_CHAIN {
                return Err(bad("a delta chain is too long"));
            }
            let mut body = Vec::new();
            match self.read_entry(at, expect, Some(&mut body))? {
                Checked::Whole(size, kind) => {
                    sizes.push((at, size));
                    break (kind, Arc::new(body));
                }
                Checked::Delta { base, result, .. } => {
                    // The deltas wait here to be applied: their bytes are
                    // bounded (libgit2, which holds one at a time, reads
                    // what would go over).
                    held += body.len();
                    if held > DELTAS_HELD {
                        return Ok(None);
                    }
                    sizes.push((at, result));
                    deltas.push((at, body));
                    (at, expect) = (base, None);
                }
            }
        };
        let chained = !deltas.is_empty();
        while let Some((at, delta)) = deltas.pop() {
            let next =
                apply_delta(&made, &delta).ok_or(bad("a delta does not apply to its base"))?;
            made = Arc::new(next);
            if !deltas.is_empty() {
                self.keep_base(at, kind, &made);
            }
        }
        // A whole entry was hashed as it was read (reached by its id).
        if chained && object_hash(kind, &made) != *id.as_bytes() {
            return Err(bad("an entry does not hash to its id"));
        }
        // Every entry of the chain checked out: remembered as
        // `check_object` remembers them.
        self.checked.extend(sizes);
        self.by_id.insert(top);
        // The newest version of a chain is the likeliest base of the next.
        if chained {
            self.keep_base(top, kind, &made);
        }
        Ok(Some((kind, made)))
    }

    /// Keep an object [`read_object`](Self::read_object) made, as a base
    /// for later deltas.
    fn keep_base(&mut self, at: u64, kind: ObjectType, made: &Arc<Vec<u8>>) {
        if made.len() > BASES_KEPT / 4 {
            return;
        }
        if self.bases_bytes + made.len() > BASES_KEPT {
            self.bases.clear();
            self.bases_bytes = 0;
        }
        if let Some((_, old)) = self.bases.insert(at, (kind, made.clone())) {
            self.bases_bytes -= old.len();
        }
        self.bases_bytes += made.len();
    }

    /// [`PackIndex::read_entry`] on the entry's first bytes, `buf`; also
    /// returns the entry's length.
    fn entry_in(
        &mut self,
        start: u64,
        buf: &[u8],
        expect: Option<usize>,
        mut keep: Option<&mut Vec<u8>>,
    ) -> Result<(Checked, usize), &'static str> {
        let (code, size, mut at) =
            parse_entry_header(buf).ok_or("an entry's header does not parse")?;
        if size > MAX_OBJECT {
            return Err("an entry is too large");
        }
        let (kind, base) = match code {
            1 => (Some(ObjectType::Commit), None),
            2 => (Some(ObjectType::Tree), None),
            3 => (Some(ObjectType::Blob), None),
            4 => (Some(ObjectType::Tag), None),
            OFS_DELTA => {
                let (distance, len) = ofs_distance(&buf[at..])?;
                at += len;
                let base = start
                    .checked_sub(distance)
                    .filter(|&b| distance > 0 && b >= 12)
                    .ok_or("an offset delta's base is not an earlier entry")?;
                (None, Some(base))
            }
            7 => {
                let base = buf.get(at..at + 20).ok_or("a delta is cut short")?;
                at += 20;
                let base = self
                    .position(base)
                    .map_err(|_| "a delta's base is not an earlier entry of its pack")?
                    .map(|p| self.offset(p))
                    .filter(|&b| b < start)
                    .ok_or("a delta's base is not an earlier entry of its pack")?;
                (None, Some(base))
            }
            _ => return Err("an entry has an unknown type"),
        };
        let mut h = kind.filter(|_| expect.is_some()).map(|k| {
            let mut h = Sha1::new();
            h.update(format!("{} {size}\0", k.str()).as_bytes());
            h
        });
        let mut inflated = 0u64;
        let mut delta_head = Vec::new();
        if let Some(k) = keep.as_deref_mut() {
            // Room for what is declared, up to what the stream has shown.
            k.reserve_exact((size as usize).min(buf.len().saturating_mul(4)));
        }
        let used = inflate_stream(&buf[at..], size, |chunk| {
            inflated += chunk.len() as u64;
            if let Some(k) = keep.as_deref_mut() {
                k.extend_from_slice(chunk);
            }
            if let Some(h) = &mut h {
                h.update(chunk);
            } else if delta_head.len() < 20 {
                let take = chunk.len().min(20 - delta_head.len());
                delta_head.extend_from_slice(&chunk[..take]);
            }
            true
        })
        .ok_or(NO_INFLATE)?;
        if inflated != size {
            return Err("an entry does not inflate to the size it declares");
        }
        if let Some(pos) = expect {
            let mut crc = flate2::Crc::new();
            crc.update(&buf[..at + used]);
            if Some(crc.sum()) != self.crc_at(pos) {
                return Err("an entry's CRC-32 does not match the index");
            }
            if let Some(h) = h
                && Some(&h.finalize()[..]) != self.id_at(pos)
            {
                return Err("an entry does not hash to its id");
            }
        }
        let checked = match base {
            None => Checked::Whole(size, kind.unwrap_or(ObjectType::Any)),
            Some(base) => {
                let mut r = &delta_head[..];
                let (Some(base_size), Some(result)) = (delta_varint(&mut r), delta_varint(&mut r))
                else {
                    return Err("a delta's header does not parse");
                };
                Checked::Delta {
                    base,
                    base_size,
                    result,
                }
            }
        };
        Ok((checked, at + used))
    }
}

/// An entry's zlib stream did not inflate (whole): it may also run on past
/// the bytes read so far.
const NO_INFLATE: &str = "an entry's data does not inflate";

/// An entry [`PackIndex::read_entry`] checked: a whole object's size, or
/// a delta's base (its offset), the base's size it names, and its result's.
enum Checked {
    /// Its size and type.
    Whole(u64, ObjectType),
    Delta {
        base: u64,
        base_size: u64,
        result: u64,
    },
}

/// The distance of an offset delta's base, at the start of `b`, and the
/// bytes it takes.
fn ofs_distance(b: &[u8]) -> Result<(u64, usize), &'static str> {
    let mut at = 0;
    let mut c = *b.first().ok_or("an offset delta is cut short")?;
    let mut distance = u64::from(c & 0x7f);
    while c & 0x80 != 0 {
        at += 1;
        c = *b.get(at).ok_or("an offset delta is cut short")?;
        distance = distance
            .checked_add(1)
            .and_then(|d| d.checked_mul(128))
            .ok_or("an offset delta's distance")?
            | u64::from(c & 0x7f);
    }
    Ok((distance, at + 1))
}

/// Check a pack and its index before libgit2 reads anything of them, in
/// one sequential pass over the pack with bounded memory: what
/// [`open_index`] checks, then: the pack's trailer is the SHA-1 of the
/// rest; every entry starts where the index says, the entries tile the
/// pack, each one's CRC-32 is the index's, its header parses, its zlib
/// stream inflates to exactly the size it declares (at most
/// [`MAX_OBJECT`]) and ends where the next entry starts; a whole object
/// hashes to its id; a delta's base is an earlier entry of the same pack,
/// of the size the delta says, and its result at most [`MAX_OBJECT`].
/// Returns the checked index (every entry counts as checked).
pub(crate) fn validate(idx_path: &Path, pack_path: &Path) -> Result<PackIndex, PackError> {
    use PackError::Malformed as bad;
    let mut index = open_index(idx_path, pack_path)?;
    let n = index.n;
    let mut idx = vec![0u8; index.idx_len];
    std::os::unix::fs::FileExt::read_exact_at(&index.idx, &mut idx, 0)?;
    if Sha1::digest(&idx[..idx.len() - 20])[..] != idx[idx.len() - 20..] {
        return Err(bad("the index's checksum"));
    }
    for b in 0..256 {
        index.load_bucket(b, Some(&idx))?;
    }
    drop(idx);
    if (0..n).any(|i| !(12..index.body_end).contains(&index.offset(i))) {
        return Err(bad("an entry's offset is out of place"));
    }
    // (offset, index position), in pack order.
    let mut entries: Vec<(u64, usize)> = (0..n).map(|i| (index.offset(i), i)).collect();
    entries.sort_unstable();
    match entries.first() {
        Some((first, _)) if *first != 12 => return Err(bad("the first entry is not at 12")),
        _ => {}
    }
    if entries.windows(2).any(|w| w[0].0 == w[1].0) {
        return Err(bad("an entry's offset is out of place"));
    }
    let body_end = index.body_end;
    let mut reader = io::BufReader::with_capacity(1 << 16, index.pack.try_clone()?);
    let mut header = [0u8; 12];
    reader.read_exact(&mut header)?;
    if header != index.header {
        return Err(bad("the pack's header"));
    }
    let mut hasher = Sha1::new();
    hasher.update(header);
    let mut buf = Vec::new();
    // Each entry's object size (a delta's result), by offset.
    let mut sizes: HashMap<u64, u64> = HashMap::with_capacity(n);
    for k in 0..n {
        let (start, i) = entries[k];
        let end = entries.get(k + 1).map_or(body_end, |e| e.0);
        let len = end - start;
        // A stored zlib stream adds 5 bytes per 64 KiB block.
        if len > MAX_OBJECT + MAX_OBJECT / 64 + 64 {
            return Err(bad("an entry is too large"));
        }
        buf.resize(len as usize, 0);
        reader.read_exact(&mut buf)?;
        hasher.update(&buf);
        let (checked, used) = index.entry_in(start, &buf, Some(i), None).map_err(bad)?;
        // The stream ends exactly where the next entry starts.
        if used != buf.len() {
            return Err(bad(
                "an entry's data does not end where the next entry starts",
            ));
        }
        let object_size = match checked {
            Checked::Whole(size, _) => size,
            Checked::Delta {
                base,
                base_size,
                result,
            } => {
                if entries[..k].binary_search_by_key(&base, |e| e.0).is_err() {
                    return Err(bad("an offset delta's base is not an earlier entry"));
                }
                if sizes.get(&base) != Some(&base_size) || result > MAX_OBJECT {
                    return Err(bad(
                        "a delta's sizes do not match its base or are too large",
                    ));
                }
                result
            }
        };
        sizes.insert(start, object_size);
    }
    if hasher.finalize()[..] != index.trailer {
        return Err(bad("the pack's checksum"));
    }
    index.by_id = sizes.keys().copied().collect();
    index.checked = sizes;
    Ok(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_zlib_inflates_to_its_input() {
        use std::io::Read;
        for len in [0usize, 1, 5_552, 65_535, 65_536, 200_001] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 300) as u8).collect();
            let mut z = Vec::new();
            zlib_stored(&mut z, &data);
            let mut back = Vec::new();
            flate2::read::ZlibDecoder::new(&z[..])
                .read_to_end(&mut back)
                .unwrap();
            assert_eq!(back, data, "{len}");
            let mut reference =
                flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::none());
            reference.write_all(&data).unwrap();
            let reference = reference.finish().unwrap();
            assert_eq!(
                adler32(&data).to_be_bytes(),
                reference[reference.len() - 4..]
            );
        }
    }
    use git2::Repository;

    fn object(kind: ObjectType, data: &[u8]) -> Object {
        Object {
            kind,
            id: Oid::hash_object(kind, data).unwrap(),
            data: data.to_vec(),
        }
    }

    #[test]
    fn blob_hash_is_git_blob_id() {
        for data in [&b""[..], b"hello\n", &[7u8; 9], &[7u8; 10], &[7u8; 100_000]] {
            let git = Oid::hash_object(ObjectType::Blob, data).unwrap();
            assert_eq!(&blob_hash(data)[..], git.as_bytes());
            for kind in [ObjectType::Commit, ObjectType::Tree] {
                let git = Oid::hash_object(kind, data).unwrap();
                assert_eq!(&object_hash(kind, data)[..], git.as_bytes());
            }
        }
    }

    #[test]
    fn an_object_that_does_not_match_its_id_is_refused() {
        let mut o = object(ObjectType::Blob, b"right");
        o.data = b"wrong".to_vec();
        assert!(build_entries(&[Entry::Object(&o)], &HashMap::new()).is_err());
        let t = object(ObjectType::Tree, b"");
        assert_eq!(&object_hash(ObjectType::Tree, b"")[..], t.id.as_bytes());
    }

    /// A whole entry checks out against its own id only, and not once it
    /// is damaged, cut short, or declares another size.
    #[test]
    fn whole_entries_are_checked_against_their_id() {
        let (_tmp, pack_dir) = bare_repo();
        let objects: Vec<Object> = [ObjectType::Blob, ObjectType::Tree, ObjectType::Commit]
            .into_iter()
            .map(|k| object(k, &[b'x'; 300]))
            .collect();
        let name = write(&pack_dir, &objects.iter().collect::<Vec<_>>()).unwrap();
        let f = PackFile::open(&pack_dir, &format!("pack-{name}")).unwrap();
        let mut checked = 0;
        for e in f.entries() {
            let Read::Whole { id, bytes, .. } = e else {
                panic!("a checkpoint pack of three different objects has no deltas")
            };
            assert!(whole_entry_holds(id, bytes));
            let other = objects.iter().find(|o| o.id != id).unwrap().id;
            assert!(!whole_entry_holds(other, bytes));
            assert!(!whole_entry_holds(id, &bytes[..bytes.len() / 2]));
            let mut damaged = bytes.to_vec();
            let at = damaged.len() - 10;
            damaged[at] ^= 1;
            assert!(!whole_entry_holds(id, &damaged));
            let mut resized = bytes.to_vec();
            resized[0] ^= 1;
            assert!(!whole_entry_holds(id, &resized));
            checked += 1;
        }
        assert_eq!(checked, 3);
        assert!(!whole_entry_holds(objects[0].id, &[]));
        assert!(!whole_entry_holds(objects[0].id, &[0xbf; 12]));
    }

    #[test]
    fn packs_merge_by_copying_whole_entries_and_resolving_deltas() {
        let (tmp, pack_dir) = bare_repo();
        let repo = Repository::open_bare(tmp.path()).unwrap();
        let blobs: Vec<Object> = (0..6u8)
            .map(|i| object(ObjectType::Blob, &[i; 3000]))
            .collect();
        let a = write(&pack_dir, &[&blobs[0], &blobs[1], &blobs[2]]).unwrap();
        let b = write(&pack_dir, &[&blobs[2], &blobs[3], &blobs[4], &blobs[5]]).unwrap();
        // A pack with deltas, as gc writes: two similar large blobs.
        let base: Vec<u8> = (0..50_000u32).map(|i| (i * 7 % 253) as u8).collect();
        let mut near = base.clone();
        near[25_000] ^= 1;
        let (x, y) = (repo.blob(&base).unwrap(), repo.blob(&near).unwrap());
        let mut pb = repo.packbuilder().unwrap();
        pb.insert_object(x, Some("f")).unwrap();
        pb.insert_object(y, Some("f")).unwrap();
        pb.write(&pack_dir, 0o444).unwrap();
        let c = format!("pack-{}", pb.name().unwrap().unwrap());
        // Loose copies of x and y are gone; only the packs hold them.
        for id in [x, y] {
            let hex = id.to_string();
            fs::remove_file(tmp.path().join("objects").join(&hex[..2]).join(&hex[2..])).unwrap();
        }
        let repo = Repository::open_bare(tmp.path()).unwrap();
        let odb = repo.odb().unwrap();
        let files: Vec<PackFile> = [format!("pack-{a}"), format!("pack-{b}"), c.clone()]
            .iter()
            .map(|stem| PackFile::open(&pack_dir, stem).unwrap())
            .collect();
        let mut resolved = Vec::new();
        let mut entries = Vec::new();
        let mut deltas = 0;
        for f in &files {
            for e in f.entries() {
                match e {
                    Read::Whole { id, crc, bytes } => entries.push(Entry::Raw { id, crc, bytes }),
                    Read::OfsDelta { id, .. } | Read::Delta(id) => {
                        deltas += 1;
                        let o = odb.read(id).unwrap();
                        resolved.push(Object {
                            kind: o.kind(),
                            id,
                            data: o.data().to_vec(),
                        });
                    }
                }
            }
        }
        assert_eq!(deltas, 1, "libgit2 stored one of the two as a delta");
        entries.extend(resolved.iter().map(Entry::Object));
        let merged = write_entries(&pack_dir, &entries, &HashMap::new()).unwrap();
        drop(files);
        for stem in [format!("pack-{a}"), format!("pack-{b}"), c] {
            fs::remove_file(pack_dir.join(format!("{stem}.idx"))).unwrap();
            fs::remove_file(pack_dir.join(format!("{stem}.pack"))).unwrap();
        }
        let repo = Repository::open_bare(tmp.path()).unwrap();
        let odb = repo.odb().unwrap();
        for o in &blobs {
            assert_eq!(odb.read(o.id).unwrap().data(), &o.data[..]);
        }
        assert_eq!(odb.read(x).unwrap().data(), &base[..]);
        assert_eq!(odb.read(y).unwrap().data(), &near[..]);
        let f = PackFile::open(&pack_dir, &format!("pack-{merged}")).unwrap();
        assert_eq!(f.entries().count(), 8, "each object once");
    }

    /// `versions` consecutive states of a directory of 100 files, as the
    /// log holds them: per mutation a new blob, the directory tree, the
    /// root tree and a commit on the previous one.
    fn history(first: usize, versions: usize, parent: &mut Option<Oid>) -> Vec<Object> {
        let mut files: Vec<Oid> = (0..100u32)
            .map(|i| Oid::hash_object(ObjectType::Blob, &i.to_le_bytes()).unwrap())
            .collect();
        let mut out = Vec::new();
        for k in 0..first + versions {
            let blob = object(ObjectType::Blob, format!("version {k}").as_bytes());
            files[k * 37 % 100] = blob.id;
            if k < first {
                continue;
            }
            let mut dir = Vec::new();
            for (i, id) in files.iter().enumerate() {
                dir.extend_from_slice(format!("100644 encrypted-name-{i:03}\0").as_bytes());
                dir.extend_from_slice(id.as_bytes());
            }
            let dir = object(ObjectType::Tree, &dir);
            let mut root = b"40000 d\0".to_vec();
            root.extend_from_slice(dir.id.as_bytes());
            let root = object(ObjectType::Tree, &root);
            let parent_line = parent.map(|p| format!("parent {p}\n")).unwrap_or_default();
            let commit = object(
                ObjectType::Commit,
                format!(
                    "tree {}\n{parent_line}author a <a> 0 +0000\ncommitter a <a> 0 +0000\n\n{k}\n",
                    root.id
                )
                .as_bytes(),
            );
            *parent = Some(commit.id);
            out.extend([blob, dir, root, commit]);
        }
        out
    }

    /// A new bare repository and its (created) pack directory.
    fn bare_repo() -> (tempfile::TempDir, std::path::PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        Repository::init_bare(tmp.path()).unwrap();
        let pack_dir = tmp.path().join("objects/pack");
        fs::create_dir_all(&pack_dir).unwrap();
        (tmp, pack_dir)
    }

    fn ofs_deltas(pack_dir: &Path, name: &str) -> usize {
        PackFile::open(pack_dir, &format!("pack-{name}"))
            .unwrap()
            .entries()
            .filter(|e| matches!(e, Read::OfsDelta { .. }))
            .count()
    }

    fn git_accepts(dir: &Path) {
        if let Ok(out) = std::process::Command::new("git")
            .arg("--git-dir")
            .arg(dir)
            .args(["fsck", "--no-dangling", "--strict"])
            .output()
        {
            assert!(
                out.status.success(),
                "git fsck: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    #[test]
    fn checkpoint_trees_are_written_as_deltas_on_their_previous_version() {
        let (tmp, pack_dir) = bare_repo();
        let objects = history(0, 25, &mut None);
        let refs: Vec<&Object> = objects.iter().collect();
        let name = write(&pack_dir, &refs).unwrap();
        let raw: usize = objects.iter().map(|o| o.data.len()).sum();
        let size = fs::metadata(pack_dir.join(format!("pack-{name}.pack")))
            .unwrap()
            .len();
        // 25 directory trees of about 4 KB: whole, the pack would be over
        // 100 KB; as deltas (every tenth whole), a third of that at most.
        assert!(
            (size as usize) < raw / 3,
            "pack {size} bytes for {raw} bytes of objects"
        );
        // 25 directory trees: the first whole, then chains of at most 10
        // (whole again at versions 11 and 22). The one-entry root trees
        // are too small for a delta to pay.
        let deltas = ofs_deltas(&pack_dir, &name);
        assert_eq!(deltas, 22);
        let repo = Repository::open_bare(tmp.path()).unwrap();
        let odb = repo.odb().unwrap();
        for o in &objects {
            let read = odb.read(o.id).unwrap();
            assert_eq!((read.kind(), read.data()), (o.kind, &o.data[..]));
        }
        git_accepts(tmp.path());
    }

    #[test]
    fn merging_checkpoint_packs_keeps_their_deltas() {
        let (tmp, pack_dir) = bare_repo();
        let mut parent = None;
        let mut all = Vec::new();
        let mut before = 0;
        // Past the merge threshold (8 packs), the small ones merge.
        for p in 0..10 {
            let objects = history(p * 6, 6, &mut parent);
            let refs: Vec<&Object> = objects.iter().collect();
            let name = write(&pack_dir, &refs).unwrap();
            before += ofs_deltas(&pack_dir, &name);
            all.extend(objects);
        }
        let repo = Repository::open_bare(tmp.path()).unwrap();
        let merged = crate::vault::gc::merge_small_packs(&repo).unwrap();
        assert!(merged >= 2, "{merged} packs merged");
        let names: Vec<String> = fs::read_dir(&pack_dir)
            .unwrap()
            .filter_map(|e| {
                let n = e.unwrap().file_name().into_string().unwrap();
                n.strip_prefix("pack-")?
                    .strip_suffix(".pack")
                    .map(str::to_string)
            })
            .collect();
        assert!(names.len() <= 8, "{} packs left", names.len());
        let after: usize = names.iter().map(|n| ofs_deltas(&pack_dir, n)).sum();
        assert_eq!(after, before, "every delta copied as a delta");
        let repo = Repository::open_bare(tmp.path()).unwrap();
        let odb = repo.odb().unwrap();
        for o in &all {
            let read = odb.read(o.id).unwrap();
            assert_eq!((read.kind(), read.data()), (o.kind, &o.data[..]));
        }
        git_accepts(tmp.path());
    }

    #[test]
    fn a_delta_applies_for_any_pair_of_inputs() {
        // Checked by libgit2 reading back a pack of base + delta.
        let cases: [(&[u8], &[u8]); 6] = [
            (b"", b"new"),
            (b"same", b"same"),
            (b"abcdef", b"abXYZef"),
            (b"prefix only", b"prefix"),
            (b"aaaa", b"aaaaaaaa"),
            (&[7u8; 200_000], &[7u8; 199_999]),
        ];
        for (base, target) in cases {
            let (tmp, pack_dir) = bare_repo();
            let (b, t) = (
                object(ObjectType::Blob, base),
                object(ObjectType::Blob, target),
            );
            let bases: HashMap<Oid, Oid> = [(t.id, b.id)].into();
            let name =
                write_entries(&pack_dir, &[Entry::Object(&b), Entry::Object(&t)], &bases).unwrap();
            let repo = Repository::open_bare(tmp.path()).unwrap();
            let odb = repo.odb().unwrap();
            assert_eq!(odb.read(t.id).unwrap().data(), target, "{name}");
            assert_eq!(odb.read(b.id).unwrap().data(), base);
        }
    }

    #[test]
    fn a_chain_of_deltas_too_large_to_hold_is_left_to_libgit2() {
        // An insert-only delta larger than what read_object holds: None
        // (libgit2 reads it, one delta at a time); a small one is read.
        let (tmp, pack_dir) = bare_repo();
        // The target: the base, then more than DELTAS_HELD new bytes (a
        // delta is written when under half its object's size).
        let big = 3 * DELTAS_HELD;
        let base = object(ObjectType::Blob, &vec![1u8; big]);
        let mut changed = vec![1u8; big];
        changed.extend(std::iter::repeat_n(2u8, DELTAS_HELD + DELTAS_HELD / 5));
        let target = object(ObjectType::Blob, &changed);
        let small_base = object(ObjectType::Blob, b"a small base, long enough to delta");
        let small = object(ObjectType::Blob, b"a small base, long enough to delta on");
        let bases: HashMap<Oid, Oid> = [(target.id, base.id), (small.id, small_base.id)].into();
        let entries = [&base, &target, &small_base, &small].map(Entry::Object);
        let name = write_entries(&pack_dir, &entries, &bases).unwrap();
        let stem = pack_dir.join(format!("pack-{name}"));
        let mut index =
            open_index(&stem.with_extension("idx"), &stem.with_extension("pack")).unwrap();
        assert!(index.read_object(target.id).unwrap().is_none());
        let (kind, data) = index.read_object(small.id).unwrap().unwrap();
        assert_eq!((kind, &data[..]), (ObjectType::Blob, &small.data[..]));
        // libgit2 reads the big one, as it did before.
        let repo = Repository::open_bare(tmp.path()).unwrap();
        assert_eq!(
            repo.odb().unwrap().read(target.id).unwrap().data(),
            &changed[..]
        );
    }

    #[test]
    fn header_sizes_round_trip_through_libgit2() {
        // Sizes that need 1, 2, 3 and 4 header bytes, a tree and a commit,
        // and a duplicate: libgit2 must read every object back intact.
        let tmp = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(tmp.path()).unwrap();
        let blobs: Vec<Vec<u8>> = [0usize, 15, 16, 2047, 2048, 300_000]
            .iter()
            .map(|n| (0..*n).map(|i| (i * 31 % 251) as u8).collect())
            .collect();
        let mut objects: Vec<Object> = blobs.iter().map(|b| object(ObjectType::Blob, b)).collect();
        let blob_id = objects[1].id;
        let mut tree = b"100644 a\0".to_vec();
        tree.extend_from_slice(blob_id.as_bytes());
        objects.push(object(ObjectType::Tree, &tree));
        let tree_id = objects.last().unwrap().id;
        let commit =
            format!("tree {tree_id}\nauthor a <a> 0 +0000\ncommitter a <a> 0 +0000\n\nm\n");
        objects.push(object(ObjectType::Commit, commit.as_bytes()));
        objects.push(object(ObjectType::Blob, &blobs[2]));
        let refs: Vec<&Object> = objects.iter().collect();
        let pack_dir = tmp.path().join("objects/pack");
        fs::create_dir_all(&pack_dir).unwrap();
        write(&pack_dir, &refs).unwrap();
        let repo = Repository::open_bare(repo.path()).unwrap();
        let odb = repo.odb().unwrap();
        for o in &objects {
            let read = odb.read(o.id).unwrap();
            assert_eq!(read.kind(), o.kind);
            assert_eq!(read.data(), &o.data[..]);
        }
        assert_eq!(repo.find_commit(objects[7].id).unwrap().tree_id(), tree_id);
        // git itself accepts the pack and its index.
        git_accepts(tmp.path());
    }

    /// A pack memvault writes (stored blocks, an offset delta between two
    /// versions of a tree) and one libgit2's pack builder writes (deflated,
    /// a ref delta), each with its index.
    fn genuine_packs() -> (
        tempfile::TempDir,
        Vec<(std::path::PathBuf, std::path::PathBuf)>,
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(tmp.path()).unwrap();
        let pack_dir = tmp.path().join("objects/pack");
        fs::create_dir_all(&pack_dir).unwrap();
        let mut parent = None;
        let objects = history(3, 3, &mut parent);
        let refs: Vec<&Object> = objects.iter().collect();
        let a = write(&pack_dir, &refs).unwrap();
        assert!(
            ofs_deltas(&pack_dir, &a) > 0,
            "the test needs an offset delta"
        );
        let base: Vec<u8> = (0..20_000u32).map(|i| (i * 7 % 253) as u8).collect();
        let mut near = base.clone();
        near[10_000] ^= 1;
        let (x, y) = (repo.blob(&base).unwrap(), repo.blob(&near).unwrap());
        let mut pb = repo.packbuilder().unwrap();
        pb.insert_object(x, Some("f")).unwrap();
        pb.insert_object(y, Some("f")).unwrap();
        pb.write(&pack_dir, 0o644).unwrap();
        let b = format!("pack-{}", pb.name().unwrap().unwrap());
        let ref_deltas = PackFile::open(&pack_dir, &b)
            .unwrap()
            .entries()
            .filter(|e| matches!(e, Read::Delta(_)))
            .count();
        assert_eq!(ref_deltas, 1, "the test needs a ref delta");
        let paths = [format!("pack-{a}"), b]
            .iter()
            .map(|stem| {
                (
                    pack_dir.join(format!("{stem}.idx")),
                    pack_dir.join(format!("{stem}.pack")),
                )
            })
            .collect();
        (tmp, paths)
    }

    #[test]
    fn validation_accepts_genuine_packs_and_refuses_any_flipped_or_cut_byte() {
        let (tmp, packs) = genuine_packs();
        let scratch = tmp.path().join("scratch");
        fs::create_dir_all(&scratch).unwrap();
        let (idx_copy, pack_copy) = (scratch.join("p.idx"), scratch.join("p.pack"));
        for (idx, pack) in &packs {
            let n = validate(idx, pack).unwrap().n;
            assert!(n > 1);
            let (i_bytes, p_bytes) = (fs::read(idx).unwrap(), fs::read(pack).unwrap());
            for (which, bytes) in [(0, &i_bytes), (1, &p_bytes)] {
                let write_pair = |changed: &[u8]| {
                    let (i, p) = if which == 0 {
                        (changed, &p_bytes[..])
                    } else {
                        (&i_bytes[..], changed)
                    };
                    fs::write(&idx_copy, i).unwrap();
                    fs::write(&pack_copy, p).unwrap();
                };
                for at in 0..bytes.len() {
                    let mut b = bytes.clone();
                    b[at] ^= 0x01;
                    write_pair(&b);
                    assert!(
                        validate(&idx_copy, &pack_copy).is_err(),
                        "a flipped bit at {at} of the {} passed",
                        ["index", "pack"][which]
                    );
                }
                for cut in [0, 1, 12, bytes.len() / 2, bytes.len() - 20, bytes.len() - 1] {
                    write_pair(&bytes[..cut]);
                    assert!(validate(&idx_copy, &pack_copy).is_err(), "cut at {cut}");
                }
            }
        }
    }

    /// The ids an index lists.
    fn ids_of(idx: &Path, pack: &Path) -> Vec<Oid> {
        let mut index = open_index(idx, pack).unwrap();
        for b in 0..256 {
            index.load_bucket(b, None).unwrap();
        }
        (0..index.n)
            .map(|i| Oid::from_bytes(index.id_at(i).unwrap()).unwrap())
            .collect()
    }

    #[test]
    fn object_checks_refuse_any_flipped_byte_libgit2_would_read() {
        // Checking every object one at a time covers every entry: a
        // flipped bit is refused by the index check or by the check of an
        // object whose entries hold it. Those that pass (the pack's version
        // made 3, the index's own checksum) leave libgit2 reading each
        // object as it was.
        let (tmp, packs) = genuine_packs();
        for (idx, pack) in &packs {
            let ids = ids_of(idx, pack);
            let mut index = open_index(idx, pack).unwrap();
            for &id in &ids {
                assert!(index.check_object(id).unwrap(), "{id}");
            }
            assert!(!index.check_object(Oid::ZERO_SHA1).unwrap());
            let originals: Vec<Vec<u8>> = {
                let repo = Repository::open_bare(tmp.path()).unwrap();
                let odb = repo.odb().unwrap();
                ids.iter()
                    .map(|&id| odb.read(id).unwrap().data().to_vec())
                    .collect()
            };
            let (i_bytes, p_bytes) = (fs::read(idx).unwrap(), fs::read(pack).unwrap());
            let work = tempfile::tempdir().unwrap();
            let (i2, p2) = (work.path().join("p.idx"), work.path().join("p.pack"));
            for (which, bytes) in [(0, &i_bytes), (1, &p_bytes)] {
                for at in 0..bytes.len() {
                    let mut b = bytes.clone();
                    b[at] ^= 0x01;
                    let (i, p) = if which == 0 {
                        (&b, &p_bytes)
                    } else {
                        (&i_bytes, &b)
                    };
                    fs::write(&i2, i).unwrap();
                    fs::write(&p2, p).unwrap();
                    let refused = match open_index(&i2, &p2) {
                        Err(_) => true,
                        Ok(mut index) => ids.iter().any(|&id| index.check_object(id).is_err()),
                    };
                    if refused {
                        continue;
                    }
                    // In the pack, only the version (2 becomes 3, which git
                    // reads alike) may pass. In the index, bytes whose change
                    // libgit2 reads as no object at all may (its own
                    // checksum, which `validate` checks; an id changed but
                    // still in order: that object is missing): below,
                    // libgit2 must then read every object as it was or not
                    // at all.
                    assert!(
                        which == 0 || at == 7,
                        "a flipped bit at {at} of the pack passed"
                    );
                    // A repository of its own: libgit2 shares packs by path.
                    let scratch = tempfile::tempdir().unwrap();
                    let repo = Repository::init_bare(scratch.path()).unwrap();
                    let dir = scratch.path().join("objects/pack");
                    fs::copy(&i2, dir.join("pack-x.idx")).unwrap();
                    fs::copy(&p2, dir.join("pack-x.pack")).unwrap();
                    let odb = repo.odb().unwrap();
                    for (id, original) in ids.iter().zip(&originals) {
                        if let Ok(o) = odb.read(*id) {
                            assert_eq!(
                                o.data(),
                                &original[..],
                                "a flipped bit at {at} of the {} gave {id} other content",
                                ["index", "pack"][which]
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn own_reads_give_what_libgit2_reads_and_nothing_else_from_a_flipped_byte() {
        let (tmp, packs) = genuine_packs();
        let repo = Repository::open_bare(tmp.path()).unwrap();
        let odb = repo.odb().unwrap();
        let (mut read, mut chains) = (0, 0);
        for (idx, pack) in &packs {
            let ids = ids_of(idx, pack);
            let mut index = open_index(idx, pack).unwrap();
            let originals: Vec<(ObjectType, Vec<u8>)> = ids
                .iter()
                .map(|&id| {
                    let o = odb.read(id).unwrap();
                    (o.kind(), o.data().to_vec())
                })
                .collect();
            for (&id, original) in ids.iter().zip(&originals) {
                let (kind, data) = index.read_object(id).unwrap().unwrap();
                assert_eq!(&(kind, data.to_vec()), original, "{id}");
                read += 1;
            }
            assert!(index.read_object(Oid::ZERO_SHA1).unwrap().is_none());
            // Deltas were applied (their results kept as bases).
            chains += index.bases.len();
            let (i_bytes, p_bytes) = (fs::read(idx).unwrap(), fs::read(pack).unwrap());
            let work = tempfile::tempdir().unwrap();
            let (i2, p2) = (work.path().join("p.idx"), work.path().join("p.pack"));
            fs::write(&i2, &i_bytes).unwrap();
            for at in 0..p_bytes.len() {
                let mut b = p_bytes.clone();
                b[at] ^= 0x01;
                fs::write(&p2, &b).unwrap();
                let Ok(mut index) = open_index(&i2, &p2) else {
                    continue;
                };
                for (&id, original) in ids.iter().zip(&originals) {
                    if let Ok(Some((kind, data))) = index.read_object(id) {
                        assert_eq!(
                            &(kind, data.to_vec()),
                            original,
                            "a flipped bit at {at} gave {id} other content"
                        );
                    }
                }
            }
        }
        assert!(
            read > 0 && chains > 0,
            "{read} objects, {chains} from deltas"
        );
    }

    /// A copy of the pack `idx`/`pack` in a directory of its own, with
    /// the index changed by `edit`.
    fn with_index_edit(
        idx: &Path,
        pack: &Path,
        edit: impl FnOnce(&mut Vec<u8>),
    ) -> (tempfile::TempDir, PackIndex) {
        let dir = tempfile::tempdir().unwrap();
        let (i2, p2) = (dir.path().join("p.idx"), dir.path().join("p.pack"));
        let mut bytes = fs::read(idx).unwrap();
        edit(&mut bytes);
        fs::write(&i2, bytes).unwrap();
        fs::copy(pack, &p2).unwrap();
        let index = open_index(&i2, &p2).unwrap();
        (dir, index)
    }

    #[test]
    fn an_id_planted_at_the_start_of_the_next_bucket_is_refused() {
        // libgit2, missing an id in its bucket, also compares the id at the
        // insertion point: the first of the next bucket. An id of bucket
        // `b` written there (the order still holds) would be read from
        // that position's entry unless its bucket is checked too.
        let (_tmp, packs) = genuine_packs();
        let (idx, pack) = &packs[0];
        let ids = ids_of(idx, pack);
        let (b, next) = (0..ids.len() - 1)
            .find(|&i| ids[i].as_bytes()[0] != ids[i + 1].as_bytes()[0])
            .map(|i| (ids[i].as_bytes()[0], i + 1))
            .expect("the test needs ids of two first bytes");
        let mut planted = [0xffu8; 20];
        planted[0] = b;
        let (_dir, mut index) = with_index_edit(idx, pack, |bytes| {
            let at = 8 + 1024 + next * 20;
            bytes[at..at + 20].copy_from_slice(&planted);
        });
        let planted = Oid::from_bytes(&planted).unwrap();
        assert!(
            index.check_object(planted).is_err(),
            "the planted id passed"
        );
        // The genuine ids of bucket `b` still look up (the pack is refused
        // by the caller once any check fails; here each call stands alone).
        let (_dir, mut index) = with_index_edit(idx, pack, |_| {});
        assert!(index.check_object(ids[next - 1]).unwrap());
    }

    #[test]
    fn a_delta_base_reached_again_by_an_id_it_is_not_is_refused() {
        // An index may give an id the offset of another object's delta
        // base: the entry checked as a base (no hash) must be checked
        // again, with the hash, as the entry of that id.
        let (_tmp, packs) = genuine_packs();
        let (idx, pack) = &packs[0];
        let ids = ids_of(idx, pack);
        let mut index = open_index(idx, pack).unwrap();
        let bytes = fs::read(pack).unwrap();
        // A delta's id and its base's offset.
        let (delta, base) = ids
            .iter()
            .find_map(|&id| {
                let pos = index.position(id.as_bytes()).unwrap()?;
                let at = index.offset(pos) as usize;
                let (code, _, hdr) = parse_entry_header(&bytes[at..])?;
                (code == OFS_DELTA).then(|| {
                    let (d, _) = ofs_distance(&bytes[at + hdr..]).unwrap();
                    (id, at as u64 - d)
                })
            })
            .expect("the test needs an offset delta");
        // Another id (not the base's own) given the base's offset.
        let victim = ids
            .iter()
            .copied()
            .find(|&id| {
                id != delta
                    && index
                        .position(id.as_bytes())
                        .unwrap()
                        .map(|p| index.offset(p))
                        != Some(base)
            })
            .unwrap();
        let pos = index.position(victim.as_bytes()).unwrap().unwrap();
        let (_dir, mut index) = with_index_edit(idx, pack, |b| {
            let at = 8 + 1024 + ids.len() * 24 + pos * 4;
            b[at..at + 4].copy_from_slice(&(base as u32).to_be_bytes());
        });
        assert!(index.check_object(delta).unwrap());
        assert!(
            index.check_object(victim).is_err(),
            "an id read from another object's entry passed"
        );
    }

    #[test]
    fn validation_refuses_a_pack_whose_entries_lie_even_with_good_checksums() {
        // An entry whose zlib data is cut short, in a pack and index whose
        // checksums and CRC-32s are recomputed to match: only the entry
        // checks catch it.
        let blob = object(ObjectType::Blob, &[5u8; 3000]);
        let other = object(ObjectType::Blob, &[6u8; 100]);
        let mut first = Vec::new();
        entry_header(ObjectType::Blob, 3000, &mut first);
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::none());
        z.write_all(&blob.data).unwrap();
        let zdata = z.finish().unwrap();
        first.extend_from_slice(&zdata[..zdata.len() - 9]);
        let entries = [
            Entry::Raw {
                id: blob.id,
                crc: {
                    let mut c = flate2::Crc::new();
                    c.update(&first);
                    c.sum()
                },
                bytes: &first,
            },
            Entry::Object(&other),
        ];
        let tmp = tempfile::tempdir().unwrap();
        let name = write_entries(tmp.path(), &entries, &Default::default()).unwrap();
        let stem = tmp.path().join(format!("pack-{name}"));
        let err = validate(&stem.with_extension("idx"), &stem.with_extension("pack")).unwrap_err();
        assert!(matches!(err, PackError::Malformed(_)), "{err}");
    }
}

#[cfg(test)]
mod hostile {
    use super::*;

    /// An index (version 2) naming `offsets`, with made-up ids.
    fn index(offsets: &[u32]) -> Vec<u8> {
        let mut idx = vec![0xff, b't', b'O', b'c', 0, 0, 0, 2];
        for _ in 0..256 {
            idx.extend_from_slice(&(offsets.len() as u32).to_be_bytes());
        }
        for i in 0..offsets.len() {
            idx.extend_from_slice(&[i as u8 + 1; 20]);
        }
        for _ in offsets {
            idx.extend_from_slice(&[0; 4]);
        }
        for o in offsets {
            idx.extend_from_slice(&o.to_be_bytes());
        }
        idx
    }

    fn parse(idx: &[u8], pack: &[u8]) -> io::Result<usize> {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("p.idx"), idx).unwrap();
        fs::write(dir.path().join("p.pack"), pack).unwrap();
        Ok(PackFile::open(dir.path(), "p")?.entries().count())
    }

    #[test]
    fn deltas_apply_as_libgit2_applies_them_and_hostile_ones_do_not() {
        let base = b"the quick brown fox jumps over the lazy dog".to_vec();
        let target = b"the quick red fox jumps over the lazy cat!".to_vec();
        let delta = make_delta(&base, &target);
        assert_eq!(apply_delta(&base, &delta).as_deref(), Some(&target[..]));
        // Another base size, a copy beyond the base, a result of another
        // size, a reserved command, a cut: refused.
        assert_eq!(apply_delta(&base[1..], &delta), None);
        let copy_out = [base.len() as u8, 4, 0x91, 40, 4];
        assert_eq!(apply_delta(&base, &copy_out), None);
        let short = [base.len() as u8, 5, 0x90, 4];
        assert_eq!(apply_delta(&base, &short), None);
        assert_eq!(apply_delta(&base, &[base.len() as u8, 1, 0]), None);
        assert_eq!(apply_delta(&base, &delta[..delta.len() - 1]), None);
        // Every truncation and every flipped byte: no panic, and any
        // result is exactly the declared size.
        for cut in 0..delta.len() {
            let _ = apply_delta(&base, &delta[..cut]);
        }
        for at in 0..delta.len() {
            for bit in 0..8 {
                let mut d = delta.clone();
                d[at] ^= 1 << bit;
                if let Some(out) = apply_delta(&base, &d) {
                    let mut r = &d[..];
                    delta_varint(&mut r).unwrap();
                    assert_eq!(out.len() as u64, delta_varint(&mut r).unwrap());
                }
            }
        }
    }

    #[test]
    fn hostile_packs_are_read_without_panicking() {
        let mut pack = b"PACK\0\0\0\x02\0\0\0\x02".to_vec();
        pack.extend_from_slice(&[0x60, 0x85, 0xff, 0xff, 0xff]);
        pack.extend_from_slice(&[0u8; 40]);
        // Two entries at one offset, an offset delta with a runaway
        // distance, an entry of a reserved type.
        assert!(parse(&index(&[12, 12]), &pack).is_err());
        // An index that claims more entries than it holds.
        let mut huge = index(&[12]);
        huge[8 + 255 * 4..8 + 256 * 4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse(&huge, &pack).is_err());
        for offsets in [&[12, 13][..], &[13, 12, 14], &[12], &[14, 20, 12]] {
            assert_eq!(parse(&index(offsets), &pack).unwrap(), offsets.len());
        }
    }
}
