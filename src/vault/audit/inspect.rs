//! Looking at what a vault stores, for tools rather than for the memory
//! tool: the demo's search of every decompressed object for plaintext, and
//! the benchmarks' count of the blob bytes history holds. Read-only; the
//! git work stays here so that callers see no git2 type.

use std::path::Path;

use git2::Repository;

use crate::vault::VaultError;

/// What a search of a vault's objects found.
pub(crate) struct ObjectScan {
    /// Objects read (decompressed).
    pub(crate) objects: usize,
    /// The hex ids of the objects holding one of the needles.
    pub(crate) found: Vec<String>,
}

/// Read every object of the repository at `dir`, decompressed, and name
/// those that contain any of `needles`. For a vault this process made (the
/// demo's): it trusts libgit2 to read the objects.
pub(crate) fn objects_containing(dir: &Path, needles: &[&[u8]]) -> Result<ObjectScan, VaultError> {
    let repo = Repository::open_bare(dir)?;
    let odb = repo.odb()?;
    let mut ids = Vec::new();
    odb.foreach(|id| {
        ids.push(*id);
        true
    })?;
    let mut scan = ObjectScan {
        objects: 0,
        found: Vec::new(),
    };
    for id in ids {
        let obj = odb.read(id)?;
        scan.objects += 1;
        let data = obj.data();
        let holds = |n: &[u8]| !n.is_empty() && data.windows(n.len()).any(|w| w == n);
        if needles.iter().any(|n| holds(n)) {
            scan.found.push(id.to_string());
        }
    }
    Ok(scan)
}

#[cfg(feature = "bench-hooks")]
impl crate::vault::Vault {
    /// The bytes of the distinct blobs (encrypted files) reachable from
    /// main, for the benchmarks' storage ratio.
    pub fn reachable_blob_bytes(&self) -> Result<u64, VaultError> {
        use std::collections::HashSet;
        let repo = &self.repo;
        let odb = repo.odb()?;
        let mut walk = repo.revwalk()?;
        walk.push_ref(crate::vault::MAIN_REF)?;
        let (mut blobs, mut trees) = (HashSet::new(), HashSet::new());
        let mut bytes = 0u64;
        for commit in walk {
            let tree = repo.find_commit(commit?)?.tree()?;
            if !trees.insert(tree.id()) {
                continue;
            }
            let mut failed = None;
            let walked = tree.walk(git2::TreeWalkMode::PreOrder, |_, e| {
                match e.kind() {
                    Some(git2::ObjectType::Tree) if !trees.insert(e.id()) => {
                        return git2::TreeWalkResult::Skip;
                    }
                    Some(git2::ObjectType::Blob) if blobs.insert(e.id()) => {
                        match odb.read_header(e.id()) {
                            Ok((len, _)) => bytes += len as u64,
                            Err(err) => {
                                failed = Some(err);
                                return git2::TreeWalkResult::Abort;
                            }
                        }
                    }
                    _ => {}
                }
                git2::TreeWalkResult::Ok
            });
            if let Some(err) = failed {
                return Err(err.into());
            }
            walked?;
        }
        Ok(bytes)
    }
}
