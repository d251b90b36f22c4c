//! Many files in one commit (`memvault import`), and every file of a
//! revision (`memvault export`).

use git2::Oid;
use zeroize::Zeroizing;

use super::access::Kind;
use super::treeedit::TreeEdits;
use super::{KeyChange, Rev, Vault, VaultError, stage_blob};
use crate::crypto::{self, FileKey, FileKeyId};
use crate::memory::{MemoryPath, NodeKind, Snapshot};

/// A file's path and decrypted content.
pub type DecryptedFile = (MemoryPath, Zeroizing<Vec<u8>>);

/// One file to import: its path, content, and the redaction kinds that
/// were applied to it (already applied by the caller).
pub struct ImportFile {
    pub path: MemoryPath,
    pub content: Zeroizing<Vec<u8>>,
    pub redactions: Vec<(String, u32)>,
}

impl Vault {
    /// Add `files` as one commit (op `import`). Refuses, changing nothing,
    /// when any path (or a parent of one) already exists, when a file is
    /// over the size limit, or when the vault would exceed its file limit.
    pub fn import_files(&mut self, files: Vec<ImportFile>) -> Result<Rev, VaultError> {
        self.with_writer_lock(|vault, tip| vault.import_locked(tip, files))
            .map(Rev::from_oid)
    }

    fn import_locked(
        &mut self,
        tip: Option<Oid>,
        files: Vec<ImportFile>,
    ) -> Result<Oid, VaultError> {
        if files.is_empty() {
            return Err(VaultError::Refused("there is no file to import".into()));
        }
        let mut update = TreeEdits::memory();
        let mut objects = Vec::with_capacity(files.len() + 8);
        let mut new_keys = Vec::with_capacity(files.len());
        let mut written = Vec::with_capacity(files.len());
        let mut meta = self.new_meta("import");
        {
            let snap = self.snapshot_of(tip)?;
            let existing = snap.count_files()?;
            if existing + files.len() > self.config.max_files {
                return Err(VaultError::Refused(format!(
                    "importing {} files would bring the vault to {}, over its limit of {}",
                    files.len(),
                    existing + files.len(),
                    self.config.max_files
                )));
            }
            let mut clashes = Vec::new();
            for f in &files {
                // The file itself, or an ancestor that is a file.
                let taken = f
                    .path
                    .ancestors()
                    .chain(std::iter::once(f.path.clone()))
                    .find(|p| {
                        !p.is_root()
                            && match snap.kind(p) {
                                Ok(Some(NodeKind::File)) => true,
                                Ok(Some(NodeKind::Dir)) => *p == f.path,
                                _ => false,
                            }
                    });
                match taken {
                    Some(p) if p == f.path => clashes.push(f.path.as_str().to_string()),
                    Some(p) => clashes.push(format!(
                        "{} (the file {} is where its folder would be)",
                        f.path.as_str(),
                        p.as_str()
                    )),
                    None => {}
                }
                if f.content.len() > self.config.max_file_bytes {
                    return Err(VaultError::Refused(format!(
                        "{} is {} bytes{}, over this vault's limit of {} bytes per file",
                        f.path.as_str(),
                        f.content.len(),
                        match f.redactions.is_empty() {
                            true => "",
                            false => " once its secrets are replaced by [REDACTED:…] markers",
                        },
                        self.config.max_file_bytes
                    )));
                }
                let lines = count_lines(&f.content);
                if lines as usize > crate::memory::render::MAX_VIEW_LINES {
                    return Err(VaultError::Refused(format!(
                        "{} is {lines} lines, over the limit of 999,999 lines that view can show; split it into several smaller files",
                        f.path.as_str(),
                    )));
                }
            }
            if !clashes.is_empty() {
                clashes.truncate(20);
                return Err(VaultError::Refused(format!(
                    "these paths already exist in the vault and import never overwrites: {}",
                    clashes.join(", ")
                )));
            }
            for f in &files {
                let id = FileKeyId::generate();
                let key = FileKey::generate();
                let sealed = crypto::seal_blob(&key, &id, f.path.as_str(), &f.content);
                let blob = stage_blob(&self.repo, sealed, &mut objects)?;
                update.upsert(&snap.locate(&f.path)?.0, blob);
                new_keys.push((id, Some(key)));
                written.push((id, Kind::Written, meta.time_ms));
                meta.files.push(f.path.as_str().to_string());
                meta.lines_added += count_lines(&f.content);
                for (kind, n) in &f.redactions {
                    match meta.redactions.iter_mut().find(|(k, _)| k == kind) {
                        Some((_, m)) => *m += n,
                        None => meta.redactions.push((kind.clone(), *n)),
                    }
                }
            }
        }
        meta.size = Some(files.iter().map(|f| f.content.len() as u64).sum());
        // The edit reads the trees on each path: check them first.
        if let Some(base) = self.tree_of(tip)? {
            for f in &files {
                let git_path = self.git_path_of(&f.path)?;
                super::objects::check_path(&self.repo, base, &git_path)?;
            }
        }
        let tree = self.edit_tree(tip, &update, &mut objects)?;
        let commit = self.publish(tip, tree, KeyChange::files(new_keys), &meta, objects)?;
        self.append_access(&written);
        Ok(commit)
    }

    /// Every file at `rev` (None: the empty tree), decrypted, in path order.
    pub fn files_at(&self, rev: Option<Rev>) -> Result<Vec<DecryptedFile>, VaultError> {
        let snap = self.snapshot_at(rev)?;
        let mut out = Vec::new();
        for path in snap.files_below(&MemoryPath::root())? {
            let content = snap.read(&path)?;
            out.push((path, content));
        }
        Ok(out)
    }

    /// The files at or below `path` at `rev` whose version there was
    /// erased since (expired or purged), in name order.
    pub fn erased_below(
        &self,
        rev: Option<Rev>,
        path: &MemoryPath,
    ) -> Result<Vec<MemoryPath>, VaultError> {
        let snap = self.snapshot_at(rev)?;
        let mut out = Vec::new();
        for p in snap.files_below(path)? {
            if let Some(id) = snap.file_key_id(&p)?
                && self.key_state.erased.contains(&id)
            {
                out.push(p);
            }
        }
        Ok(out)
    }

    /// [`files_at`](Self::files_at), with the files whose version there
    /// was erased (expired or purged since) left out and listed apart.
    pub fn files_at_but_erased(
        &self,
        rev: Option<Rev>,
    ) -> Result<(Vec<DecryptedFile>, Vec<MemoryPath>), VaultError> {
        let snap = self.snapshot_at(rev)?;
        let (mut out, mut erased) = (Vec::new(), Vec::new());
        for path in snap.files_below(&MemoryPath::root())? {
            match snap.read(&path) {
                Ok(content) => out.push((path, content)),
                Err(crate::memory::StoreError::Erased) => erased.push(path),
                Err(e) => return Err(e.into()),
            }
        }
        Ok((out, erased))
    }
}

fn count_lines(content: &[u8]) -> u32 {
    match std::str::from_utf8(content) {
        Ok(t) => t.lines().count() as u32,
        Err(_) => 0,
    }
}
