//! Writing a git pack (and its version-2 index) straight from the log's
//! objects, without delta search, for checkpoints.
//!
//! A checkpoint must be cheap: libgit2's pack builder searched for deltas
//! among every object of the log (a quarter of all CPU time in the write
//! benchmark), only for `gc` to repack everything anyway. Here each object
//! goes in whole, in stored (level 0) zlib blocks: blobs are ciphertext,
//! and deflating trees and commits cost a third of a write's CPU for a
//! third of their size. `gc` is where objects are deflated and deltas
//! found.
//!
//! The pack is written to a temporary name and synced, then the index, and
//! only then are both renamed into place (pack first: readers discover a
//! pack by its index). The caller syncs the directory.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

use git2::{ObjectType, Oid};
use sha1::{Digest, Sha1};

use super::fsync;
use super::wal::Object;

fn type_code(kind: ObjectType) -> u8 {
    match kind {
        ObjectType::Commit => 1,
        ObjectType::Tree => 2,
        ObjectType::Tag => 4,
        _ => 3,
    }
}

/// The variable-length object header: type and inflated size.
fn entry_header(kind: ObjectType, size: usize, out: &mut Vec<u8>) {
    let mut size = size as u64;
    let mut byte = (type_code(kind) << 4) | (size & 0x0f) as u8;
    size >>= 4;
    while size != 0 {
        out.push(byte | 0x80);
        byte = (size & 0x7f) as u8;
        size >>= 7;
    }
    out.push(byte);
}

/// One entry of a pack being written.
pub(crate) enum Entry<'a> {
    /// An object, to be compressed (checked against its id first).
    Object(&'a Object),
    /// An entry copied as it stands from another pack (header and zlib
    /// data of a whole, non-delta object), with its CRC-32.
    Raw { id: Oid, crc: u32, bytes: &'a [u8] },
}

impl Entry<'_> {
    fn id(&self) -> Oid {
        match self {
            Entry::Object(o) => o.id,
            Entry::Raw { id, .. } => *id,
        }
    }
}

/// The pack and index bytes for `entries` (duplicates written once), and
/// the pack's name (the hex SHA-1 of its content, as git names packs).
pub(crate) fn build_entries(all: &[Entry<'_>]) -> io::Result<(Vec<u8>, Vec<u8>, String)> {
    let mut seen = HashSet::with_capacity(all.len());
    let unique: Vec<&Entry<'_>> = all.iter().filter(|e| seen.insert(e.id())).collect();
    let count = u32::try_from(unique.len())
        .map_err(|_| io::Error::other("too many objects for one pack"))?;
    let mut pack = Vec::with_capacity(
        all.iter()
            .map(|e| match e {
                Entry::Object(o) => o.data.len() + 32,
                Entry::Raw { bytes, .. } => bytes.len(),
            })
            .sum::<usize>()
            + 32,
    );
    pack.extend_from_slice(b"PACK");
    pack.extend_from_slice(&2u32.to_be_bytes());
    pack.extend_from_slice(&count.to_be_bytes());
    // (id, crc32, offset)
    let mut entries: Vec<([u8; 20], u32, u64)> = Vec::with_capacity(unique.len());
    for e in unique {
        let offset = pack.len() as u64;
        let crc = match e {
            Entry::Raw { crc, bytes, .. } => {
                pack.extend_from_slice(bytes);
                *crc
            }
            Entry::Object(o) => {
                if object_hash(o.kind, &o.data) != o.id.as_bytes() {
                    return Err(io::Error::other("a logged object does not match its id"));
                }
                entry_header(o.kind, o.data.len(), &mut pack);
                // Stored, not deflated. Blobs are ciphertext (and so is
                // the key table): deflate cannot shrink them. Trees (of
                // encrypted names and binary ids) and commits (encrypted
                // messages) shrink by about a third at a cost that was
                // a third of all the CPU of a write (zlib level 1 runs at
                // under 20 MB/s on such bytes). `gc` deflates and deltas
                // everything when it repacks.
                let level = flate2::Compression::none();
                let mut z = flate2::write::ZlibEncoder::new(&mut pack, level);
                z.write_all(&o.data)?;
                z.finish()?;
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
        let mut f = File::create(&tmp)?;
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
    write_entries(pack_dir, &entries)
}

/// [`write`] for entries that may be copied from other packs.
pub(crate) fn write_entries(pack_dir: &Path, entries: &[Entry<'_>]) -> io::Result<String> {
    let (pack, idx, name) = build_entries(entries)?;
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
    /// A delta against another object: to be resolved through the object
    /// database and written whole.
    Delta(Oid),
}

impl PackFile {
    /// Read `<stem>.pack` and `<stem>.idx` (index version 2).
    pub(crate) fn open(dir: &Path, stem: &str) -> io::Result<PackFile> {
        let bad = || io::Error::other("a pack or its index does not read");
        let idx = fs::read(dir.join(format!("{stem}.idx")))?;
        let pack = fs::read(dir.join(format!("{stem}.pack")))?;
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
        Ok(PackFile { pack, entries })
    }

    /// Every entry, in pack order.
    pub(crate) fn entries(&self) -> impl Iterator<Item = Read<'_>> {
        let end = self.pack.len() - 20;
        (0..self.entries.len()).map(move |i| {
            let (id, crc, start) = self.entries[i];
            let stop = self.entries.get(i + 1).map_or(end, |e| e.2 as usize);
            let bytes = &self.pack[start as usize..stop];
            match (bytes[0] >> 4) & 7 {
                1..=4 => Read::Whole { id, crc, bytes },
                _ => Read::Delta(id),
            }
        })
    }
}

/// Git's object id of `bytes` as an object of `kind`, computed without
/// libgit2 (whose collision-detecting SHA-1 is several times slower).
pub(crate) fn object_hash(kind: ObjectType, bytes: &[u8]) -> [u8; 20] {
    let mut h = Sha1::new();
    h.update(format!("{} {}\0", kind.str(), bytes.len()).as_bytes());
    h.update(bytes);
    h.finalize().into()
}

/// Git's blob id of `bytes` (the log's checksum).
pub(crate) fn blob_hash(bytes: &[u8]) -> [u8; 20] {
    object_hash(ObjectType::Blob, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
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
        for data in [&b""[..], b"hello\n", &[7u8; 100_000]] {
            let git = Oid::hash_object(ObjectType::Blob, data).unwrap();
            assert_eq!(&blob_hash(data)[..], git.as_bytes());
        }
    }

    #[test]
    fn an_object_that_does_not_match_its_id_is_refused() {
        let mut o = object(ObjectType::Blob, b"right");
        o.data = b"wrong".to_vec();
        assert!(build_entries(&[Entry::Object(&o)]).is_err());
        let t = object(ObjectType::Tree, b"");
        assert_eq!(&object_hash(ObjectType::Tree, b"")[..], t.id.as_bytes());
    }

    #[test]
    fn packs_merge_by_copying_whole_entries_and_resolving_deltas() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(tmp.path()).unwrap();
        let pack_dir = tmp.path().join("objects/pack");
        fs::create_dir_all(&pack_dir).unwrap();
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
                    Read::Delta(id) => {
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
        let merged = write_entries(&pack_dir, &entries).unwrap();
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
        let status = std::process::Command::new("git")
            .arg("--git-dir")
            .arg(tmp.path())
            .args(["fsck", "--no-dangling", "--strict"])
            .output();
        if let Ok(out) = status {
            assert!(
                out.status.success(),
                "git fsck: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
