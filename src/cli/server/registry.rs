//! A server root: the tenant registry and where each tenant's vault lives.
//!
//! ```text
//! ROOT/memvault-server/format     "memvault server format 1"
//! ROOT/memvault-server/keyslot    the root keyring, wrapped under the
//!                                 operator's key file or passphrase
//! ROOT/memvault-server/registry   sealed: tenants (name, vault key) and
//!                                 their tokens (name, scopes, keyed hash)
//! ROOT/memvault-server/lock       flock: one registry change at a time
//! ROOT/tenants/<id>/              each tenant's vault (a random id: no
//!                                 name reaches the file system)
//! ```
//!
//! Each tenant vault is an ordinary memvault vault unlocked by its own
//! random key file, which only the sealed registry holds. Removing a
//! tenant drops that key from the registry, then deletes the vault.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use super::super::{CliError, Secret};
use crate::crypto::{
    KdfParams, KeyFileKey, Keyring, ServerKeys, Unlock, open_slot, random_bytes, seal_keyfile_slot,
    seal_passphrase_slot,
};
use crate::vault::{FileLock, fsx, sync_dir, write_durable};

const STATE: &str = "memvault-server";
const FORMAT: &str = "memvault-server/format";
const FORMAT_LINE: &str = "memvault server format 1\n";
const KEYSLOT: &str = "memvault-server/keyslot";
const REGISTRY: &str = "memvault-server/registry";
const LOCK: &str = "memvault-server/lock";
/// The newest registry generation this root has served, MAC'd: a registry
/// copied back from before it is refused, across restarts too.
const SEEN: &str = "memvault-server/seen";
const TENANTS: &str = "tenants";
/// A registry file larger than this is refused unread.
const MAX_REGISTRY: u64 = 256 << 20;
/// The prefix of every token.
pub const TOKEN_PREFIX: &str = "mvt_";

/// What a token may do.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Memory tool calls (`/v1/memory`, `/mcp`).
    Memory,
    /// Read-only audit: history, show, diff, sessions, resume, verify.
    Audit,
    /// Undo and erasure: revert, restore, expire, purge (and what audit reads).
    Admin,
}

impl Scope {
    pub fn name(self) -> &'static str {
        match self {
            Scope::Memory => "memory",
            Scope::Audit => "audit",
            Scope::Admin => "admin",
        }
    }
}

/// A tenant's vault key, hex; wiped when dropped.
#[derive(Clone)]
pub struct HexKey(Zeroizing<String>);

impl Serialize for HexKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for HexKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(HexKey(Zeroizing::new(String::deserialize(d)?)))
    }
}

impl HexKey {
    fn generate() -> HexKey {
        let key = KeyFileKey::generate();
        HexKey(Zeroizing::new(
            data_encoding::HEXLOWER.encode(key.expose_secret()),
        ))
    }

    /// The hex form of a key file's key (a tenant's vault cloned from
    /// another server, `tenant add --clone`).
    pub fn of(key: &KeyFileKey) -> HexKey {
        HexKey(Zeroizing::new(
            data_encoding::HEXLOWER.encode(key.expose_secret()),
        ))
    }

    /// The key file key this unlocks the tenant's vault with.
    pub fn key(&self) -> Option<KeyFileKey> {
        let bytes = Zeroizing::new(data_encoding::HEXLOWER.decode(self.0.as_bytes()).ok()?);
        KeyFileKey::from_bytes(&bytes).ok()
    }
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Token {
    pub name: String,
    pub scopes: Vec<Scope>,
    /// Hex HMAC-SHA256 of the token under the root's token key.
    pub hash: String,
    pub created_ms: u64,
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tenant {
    pub name: String,
    pub key: HexKey,
    pub created_ms: u64,
    /// By token id (the 16 hex digits after `mvt_`).
    pub tokens: BTreeMap<String, Token>,
    /// The most bytes its vault may store (`tenant quota`), if set. A
    /// registry holding one is refused by a memvault older than quotas
    /// (unknown field), which could not keep it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<u64>,
}

/// The decrypted registry.
#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Registry {
    pub v: u32,
    /// Grows with every change: a server refuses a registry older than one
    /// it has read (a file put back).
    pub generation: u64,
    /// By tenant id (the name of its directory under `tenants/`).
    pub tenants: BTreeMap<String, Tenant>,
}

impl Registry {
    pub fn by_name(&self, name: &str) -> Option<(&String, &Tenant)> {
        self.tenants.iter().find(|(_, t)| t.name == name)
    }
}

/// Where a file stood when last read: a change shows as another stamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp(u64, i64, i64, u64, i64);

pub fn stamp_of(path: &Path) -> Option<Stamp> {
    let m = fs::metadata(path).ok()?;
    Some(Stamp(
        m.len(),
        m.mtime(),
        m.mtime_nsec(),
        m.ino(),
        m.ctime_nsec(),
    ))
}

/// A name of a tenant or a token: 1 to 64 of `a-z`, `0-9`, `-`, `_`,
/// starting with a letter or digit. Anything else is refused rather than
/// folded (no case or Unicode variant of a name can name another tenant).
pub fn check_name(what: &str, name: &str) -> Result<(), CliError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        && name.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(CliError {
            message: format!(
                "a {what} name is 1 to 64 characters: lowercase letters a-z, digits, '-' and '_', starting with a letter or digit"
            ),
            code: 2,
        })
    }
}

/// A new token: `mvt_` + 16 hex digits (its id) + `_` + 64 hex digits.
pub fn new_token() -> (String, Zeroizing<String>) {
    let id = data_encoding::HEXLOWER.encode(&random_bytes::<8>());
    let secret = Zeroizing::new(data_encoding::HEXLOWER.encode(&random_bytes::<32>()));
    let token = Zeroizing::new(format!("{TOKEN_PREFIX}{id}_{}", secret.as_str()));
    (id, token)
}

/// The id of a token of the right shape, or None.
pub fn token_id(token: &str) -> Option<&str> {
    let rest = token.strip_prefix(TOKEN_PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    let hex = |s: &str, n: usize| {
        s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    (hex(id, 16) && hex(secret, 64)).then_some(id)
}

/// An unlocked server root.
pub struct Root {
    dir: PathBuf,
    keys: ServerKeys,
}

fn io_err(what: &str, path: &Path, e: &io::Error) -> CliError {
    CliError::failure(format!(
        "cannot {what} {}: {}",
        path.display(),
        super::super::describe_io(e)
    ))
}

fn not_a_root(dir: &Path) -> CliError {
    CliError::failure(format!(
        "{} is not a memvault server root (create one with `memvault tenant add NAME --root {}`)",
        dir.display(),
        dir.display()
    ))
}

fn damaged(what: &str) -> CliError {
    CliError::failure(format!(
        "the server root is damaged: {what}; nothing was changed"
    ))
}

impl Root {
    /// Unlock the root at `dir`; with `create`, make it first when `dir`
    /// is absent or an empty directory.
    pub fn open(dir: &Path, secret: &Secret, create: bool) -> Result<Root, CliError> {
        let format_path = dir.join(FORMAT);
        if create && !format_path.exists() {
            return Self::create(dir, secret);
        }
        match fsx::read_to_string(&format_path, fsx::SMALL) {
            Ok(text) if text == FORMAT_LINE => {}
            Ok(text) if text.starts_with("memvault server format ") => {
                return Err(CliError::failure(format!(
                    "the server root {} has a format newer than this memvault understands ({}): upgrade memvault",
                    dir.display(),
                    text.trim()
                )));
            }
            Ok(_) => return Err(damaged("its format file is not one memvault wrote")),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(not_a_root(dir)),
            Err(e) => return Err(io_err("read", &format_path, &e)),
        }
        let slot_path = dir.join(KEYSLOT);
        let slot = read_bounded(&slot_path, 4096)?;
        let unlock = match secret {
            Secret::KeyFile(k) => Unlock::KeyFile(k),
            Secret::Passphrase(p) => Unlock::Passphrase(p),
        };
        let keyring = open_slot(&slot, &unlock).map_err(|e| match e {
            crate::crypto::CryptoError::DecryptionFailed | crate::crypto::CryptoError::WrongKind => {
                CliError::failure(
                    "the secret does not unlock this server root (check --key-file or the passphrase; nothing was changed)",
                )
            }
            _ => damaged("its keyslot does not parse"),
        })?;
        let keys = ServerKeys::derive(&keyring).map_err(|_| damaged("its keyring is empty"))?;
        let root = Root {
            dir: dir.to_path_buf(),
            keys,
        };
        root.load()?;
        Ok(root)
    }

    fn create(dir: &Path, secret: &Secret) -> Result<Root, CliError> {
        if dir.exists() {
            let empty = dir.is_dir()
                && fs::read_dir(dir)
                    .map_err(|e| io_err("read", dir, &e))?
                    .next()
                    .is_none();
            if !empty && dir.join(STATE).is_dir() {
                // Another process is creating this root, or has finished
                // since the caller looked for its format file.
                return Self::wait_then_open(dir, secret);
            }
            if !empty {
                return Err(CliError::failure(format!(
                    "{} exists and is not a memvault server root; give an empty or new directory",
                    dir.display()
                )));
            }
        }
        let keyring = Keyring::new_random();
        let slot = match secret {
            Secret::KeyFile(k) => seal_keyfile_slot(&keyring, k),
            Secret::Passphrase(p) => seal_passphrase_slot(&keyring, p, KdfParams::DEFAULT)
                .map_err(|e| CliError::failure(format!("cannot derive the root key: {e}")))?,
        };
        let keys = ServerKeys::derive(&keyring).map_err(|_| damaged("its keyring is empty"))?;
        // (An existing directory is fine: mkdir_private checks it is one.)
        fsx::mkdir_private(dir).map_err(|e| io_err("create", dir, &e))?;
        // Making the state directory claims the creation: a second
        // `tenant add` racing this one waits for the root to be whole and
        // then opens it, rather than writing a keyslot of its own over it.
        match fsx::mkdir_new_private(&dir.join(STATE)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Self::wait_then_open(dir, secret);
            }
            Err(e) => return Err(io_err("create", &dir.join(STATE), &e)),
        }
        fsx::mkdir_private(&dir.join(TENANTS))
            .map_err(|e| io_err("create", &dir.join(TENANTS), &e))?;
        let root = Root {
            dir: dir.to_path_buf(),
            keys,
        };
        let lock_path = dir.join(LOCK);
        fsx::create_new(&lock_path, 0o600).map_err(|e| io_err("create", &lock_path, &e))?;
        write_durable(&dir.join(KEYSLOT), &slot)
            .map_err(|e| io_err("write", &dir.join(KEYSLOT), &e))?;
        root.save(&Registry {
            v: 1,
            ..Registry::default()
        })?;
        // The format file last: a root is whole once it is there.
        write_durable(&dir.join(FORMAT), FORMAT_LINE.as_bytes())
            .map_err(|e| io_err("write", &dir.join(FORMAT), &e))?;
        sync_dir(dir);
        Ok(root)
    }

    /// Another process is creating the root at `dir`: open it once its
    /// format file is there (a creation takes well under a second).
    fn wait_then_open(dir: &Path, secret: &Secret) -> Result<Root, CliError> {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !dir.join(FORMAT).exists() {
            if std::time::Instant::now() > until {
                return Err(CliError::failure(format!(
                    "{} holds a server root whose creation did not finish (memvault-server/ without its format file); if no other memvault is creating it, remove the directory and run the command again",
                    dir.display()
                )));
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Self::open(dir, secret, false)
    }

    pub fn keys(&self) -> &ServerKeys {
        &self.keys
    }

    pub fn registry_path(&self) -> PathBuf {
        self.dir.join(REGISTRY)
    }

    /// The directory of tenant `id`'s vault.
    pub fn tenant_dir(&self, id: &str) -> PathBuf {
        self.dir.join(TENANTS).join(id)
    }

    /// Read and decrypt the registry.
    pub fn load(&self) -> Result<Registry, CliError> {
        // The high-water mark first: a change writes the registry, then
        // raises the mark, so a mark read now names a registry already
        // written. Read after the registry, a reader without the lock (the
        // server, a `tenant` command opening the root) could pair an older
        // registry with the mark of a change made in between, and refuse
        // a root that was fine (six `tenant add` at once on a new root).
        let seen = self.seen();
        let path = self.registry_path();
        let sealed = read_bounded(&path, MAX_REGISTRY)?;
        let plain = self
            .keys
            .open_registry(&sealed)
            .map_err(|_| damaged("its tenant registry fails authentication"))?;
        let reg: Registry = serde_json::from_slice(&plain)
            .map_err(|_| damaged("its tenant registry does not parse"))?;
        if !(1..=2).contains(&reg.v) {
            return Err(damaged("its tenant registry has an unknown version"));
        }
        if reg.generation < seen {
            return Err(damaged(
                "its tenant registry is older than one this root has already used (a copy put back?)",
            ));
        }
        for (id, t) in &reg.tenants {
            let ok_id = id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit());
            if !ok_id || check_name("tenant", &t.name).is_err() || t.key.key().is_none() {
                return Err(damaged(
                    "its tenant registry holds an entry memvault did not write",
                ));
            }
        }
        Ok(reg)
    }

    /// The generation the high-water mark names (0: none, or one that
    /// does not check out, which only a writer of the root can cause, and
    /// who could as well remove it).
    fn seen(&self) -> u64 {
        fsx::read_max(&self.dir.join(SEEN), fsx::SMALL)
            .ok()
            .and_then(|b| self.keys.open_seen(&b))
            .unwrap_or(0)
    }

    /// Raise the high-water mark to `generation` (the caller holds the
    /// root's lock). Every registry change raises it, so a server and
    /// every `tenant` command refuse a registry older than the newest one
    /// written.
    fn see(&self, generation: u64) -> Result<(), CliError> {
        if generation <= self.seen() {
            return Ok(());
        }
        let path = self.dir.join(SEEN);
        write_durable(&path, &self.keys.seal_seen(generation))
            .map_err(|e| io_err("write", &path, &e))
    }

    fn save(&self, reg: &Registry) -> Result<(), CliError> {
        // Version 2: a registry that holds a storage quota (older
        // memvaults refuse it, as they must: they would not keep it).
        let mut reg = reg.clone();
        reg.v = if reg.tenants.values().any(|t| t.quota.is_some()) {
            2
        } else {
            1
        };
        let plain = Zeroizing::new(
            serde_json::to_vec(&reg)
                .map_err(|_| CliError::failure("the registry does not serialise"))?,
        );
        let sealed = self.keys.seal_registry(&plain);
        let path = self.registry_path();
        let _ = fs::remove_file(path.with_extension("tmp"));
        write_durable(&path, &sealed).map_err(|e| io_err("write", &path, &e))
    }

    /// Erase what `tenants/` holds that no tenant of the registry owns:
    /// the vault of a `tenant remove` killed after the registry forgot the
    /// tenant (its key is gone with it: ciphertext no one can open), a
    /// `tenant add` killed before the registry named the new vault, ref
    /// files a server that still held a removed vault open wrote again.
    /// Under the root's lock, so no add is half way. Returns how many
    /// were erased; what cannot be erased is left for the next time.
    pub fn sweep_leftovers(&self) -> Result<usize, CliError> {
        let _guard = self.lock()?;
        let reg = self.load()?;
        let tenants = self.dir.join(TENANTS);
        let entries = match fs::read_dir(&tenants) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(io_err("read", &tenants, &e)),
        };
        let mut erased = 0;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let owned = name.to_str().is_some_and(|n| reg.tenants.contains_key(n));
            if !owned && erase_tree(&entry.path()).is_ok() {
                erased += 1;
            }
        }
        if erased > 0 {
            crate::vault::sync_dir(&tenants);
        }
        Ok(erased)
    }

    /// The root's lock (`memvault-server/lock`), exclusively.
    fn lock(&self) -> Result<FileLock, CliError> {
        let lock_path = self.dir.join(LOCK);
        let file = File::open(&lock_path).map_err(|e| io_err("open", &lock_path, &e))?;
        FileLock::exclusive(&file).map_err(|e| io_err("lock", &lock_path, &e))
    }

    /// Change the registry under the root's lock: read it, apply `f`,
    /// write it back with the next generation (durably) if `f` succeeds.
    pub fn change<T>(
        &self,
        f: impl FnOnce(&mut Registry) -> Result<T, CliError>,
    ) -> Result<T, CliError> {
        let _guard = self.lock()?;
        let mut reg = self.load()?;
        let out = f(&mut reg)?;
        reg.generation += 1;
        self.save(&reg)?;
        self.see(reg.generation)?;
        Ok(out)
    }
}

fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, CliError> {
    use std::io::Read;
    let f = fsx::open_read(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => damaged("a file of memvault-server/ is missing"),
        _ => io_err("read", path, &e),
    })?;
    let mut bytes = Vec::new();
    f.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| io_err("read", path, &e))?;
    if bytes.len() as u64 > max {
        return Err(damaged(
            "a file of memvault-server/ is larger than memvault writes",
        ));
    }
    Ok(bytes)
}

/// Add tenant `name` (its vault made by the caller) to `reg`, with a first
/// token named `name`; returns (tenant id, token).
pub fn add_tenant(
    reg: &mut Registry,
    keys: &ServerKeys,
    name: &str,
    scopes: &[Scope],
    key: Option<HexKey>,
) -> Result<(String, HexKey, Zeroizing<String>), CliError> {
    check_name("tenant", name)?;
    if reg.by_name(name).is_some() {
        return Err(CliError::failure(format!(
            "a tenant named {name} exists; nothing was changed"
        )));
    }
    let id = data_encoding::HEXLOWER.encode(&random_bytes::<8>());
    let key = key.unwrap_or_else(HexKey::generate);
    let mut tenant = Tenant {
        name: name.to_owned(),
        key: key.clone(),
        created_ms: crate::vault::now_ms(),
        tokens: BTreeMap::new(),
        quota: None,
    };
    let token = put_token(&mut tenant, keys, name, scopes);
    reg.tenants.insert(id.clone(), tenant);
    Ok((id, key, token))
}

/// Give `tenant` a new token named `name` (replacing one of that name).
pub fn put_token(
    tenant: &mut Tenant,
    keys: &ServerKeys,
    name: &str,
    scopes: &[Scope],
) -> Zeroizing<String> {
    tenant.tokens.retain(|_, t| t.name != name);
    let (id, token) = new_token();
    let mut scopes = scopes.to_vec();
    scopes.sort();
    scopes.dedup();
    tenant.tokens.insert(
        id,
        Token {
            name: name.to_owned(),
            scopes,
            hash: data_encoding::HEXLOWER.encode(&keys.token_hash(token.as_bytes())),
            created_ms: crate::vault::now_ms(),
        },
    );
    token
}

/// Remove a directory tree, making each file's content unreadable first
/// where it can (overwritten with zeros and synced). Symbolic links are
/// removed, never followed.
///
/// Another process may still be finishing work inside the tree (a
/// running server's background sync removes its scratch repository
/// through open directory handles, which follow the tree when it is
/// moved away): what vanishes meanwhile is already gone, and a folder
/// that filled again before it could be removed is erased again, a few
/// times, before the failure is said.
pub fn erase_tree(dir: &Path) -> io::Result<()> {
    const TRIES: u32 = 20;
    let mut tries = 0;
    loop {
        match erase_once(dir) {
            Err(e) if e.kind() == io::ErrorKind::DirectoryNotEmpty && tries < TRIES => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(25));
            }
            other => return other,
        }
    }
}

/// One pass of [`erase_tree`]: NotFound anywhere is something removed
/// meanwhile, not a failure.
fn erase_once(dir: &Path) -> io::Result<()> {
    let gone = |r: io::Result<()>| match r {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    };
    let meta = match fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.is_dir() {
        return gone(fs::remove_file(dir));
    }
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let path = entry.path();
        let kind = match entry.file_type() {
            Ok(kind) => kind,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if kind.is_dir() {
            erase_once(&path)?;
        } else {
            if kind.is_file() {
                zero_file(&path);
            }
            gone(fs::remove_file(&path))?;
        }
    }
    gone(fs::remove_dir(dir))
}

/// Overwrite the regular file at `path` with zeros and sync it, where it
/// can be opened. Never through a link: a file swapped for one meanwhile
/// is not opened (O_NOFOLLOW), only unlinked by the caller.
fn zero_file(path: &Path) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(mut f) = fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    else {
        return;
    };
    let Ok(meta) = f.metadata() else { return };
    if !meta.is_file() {
        return;
    }
    let zeros = vec![0u8; 64 << 10];
    let mut left = meta.len();
    while left > 0 {
        let n = left.min(zeros.len() as u64) as usize;
        if f.write_all(&zeros[..n]).is_err() {
            break;
        }
        left -= n as u64;
    }
    let _ = f.sync_data();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree that another thread empties at the same time (as a
    /// server's sync removes its scratch repository through open
    /// directory handles) is erased without a failure: what vanished is
    /// gone already.
    #[test]
    fn erase_tree_finishes_what_another_removal_is_doing_at_once() {
        for round in 0..3 {
            let tmp = tempfile::tempdir().unwrap();
            let top = tmp.path().join("t");
            for sub in ["a", "b", "c"] {
                let d = top.join(sub);
                fs::create_dir_all(&d).unwrap();
                for i in 0..300 {
                    fs::write(d.join(format!("{i}")), b"x").unwrap();
                }
            }
            let other = {
                let d = top.join(["a", "b", "c"][round % 3]);
                std::thread::spawn(move || {
                    let _ = fs::remove_dir_all(d);
                })
            };
            let result = erase_tree(&top);
            other.join().unwrap();
            result.unwrap();
            assert!(!top.exists());
        }
    }

    #[test]
    fn names_are_refused_rather_than_folded() {
        for ok in ["alice", "a", "team-7_x", "0day"] {
            assert!(check_name("tenant", ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "Alice",
            "ALICE",
            "al ice",
            "-a",
            "_a",
            "a/b",
            "..",
            "a.b",
            "alicé",
            "ａlice",
            "alice\u{200b}",
            &"a".repeat(65),
        ] {
            assert!(check_name("tenant", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn tokens_have_one_shape() {
        let (id, token) = new_token();
        assert_eq!(token_id(&token), Some(id.as_str()));
        assert_eq!(token.len(), 4 + 16 + 1 + 64);
        for bad in [
            "",
            "mvt_",
            "Bearer x",
            &token[..token.len() - 1],
            &token.to_uppercase(),
            &format!("{}x", token.as_str()),
        ] {
            assert_eq!(token_id(bad), None, "{bad:?}");
        }
    }

    /// A reader without the root's lock (the server, a `tenant` command
    /// opening the root) never takes a registry changing under it for one
    /// put back: it reads the high-water mark before the registry.
    #[test]
    fn a_registry_read_while_it_changes_is_never_taken_for_an_older_one() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("root");
        let key = Secret::KeyFile(KeyFileKey::generate());
        let root = Root::open(&dir, &key, true).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let root = Root::open(&dir, &key, false).unwrap();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut reads = 0;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    root.load().unwrap();
                    reads += 1;
                }
                reads
            })
        };
        for i in 0..300 {
            root.change(|reg| {
                add_tenant(reg, root.keys(), &format!("t{i}"), &[Scope::Memory], None)
            })
            .unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(reader.join().unwrap() > 0);
    }

    #[test]
    fn a_registry_survives_a_round_trip_and_refuses_another_key() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("root");
        let key = Secret::KeyFile(KeyFileKey::generate());
        let root = Root::open(&dir, &key, true).unwrap();
        let (id, _, token) = root
            .change(|reg| add_tenant(reg, root.keys(), "alice", &[Scope::Memory], None))
            .unwrap();
        let reg = root.load().unwrap();
        assert_eq!(reg.generation, 1);
        let t = &reg.tenants[&id];
        let (tid, stored) = t.tokens.iter().next().unwrap();
        assert_eq!(token_id(&token), Some(tid.as_str()));
        let hash = data_encoding::HEXLOWER
            .decode(stored.hash.as_bytes())
            .unwrap();
        assert!(root.keys().token_matches(token.as_bytes(), &hash));
        // No secret in the clear on disk.
        let sealed = fs::read(root.registry_path()).unwrap();
        let hay = String::from_utf8_lossy(&sealed);
        assert!(!hay.contains("alice") && !hay.contains(t.key.0.as_str()));
        let other = Secret::KeyFile(KeyFileKey::generate());
        assert!(Root::open(&dir, &other, false).is_err());
        assert!(Root::open(&dir, &key, false).is_ok());
    }

    /// A registry is version 2 while a tenant has a storage quota (older
    /// memvaults refuse it), version 1 again without one.
    #[test]
    fn a_registry_with_a_quota_is_version_2() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::open(
            &d.path().join("root"),
            &Secret::KeyFile(KeyFileKey::generate()),
            true,
        )
        .unwrap();
        let (id, ..) = root
            .change(|reg| add_tenant(reg, root.keys(), "alice", &[Scope::Memory], None))
            .unwrap();
        assert_eq!(root.load().unwrap().v, 1);
        let set = |q: Option<u64>| {
            root.change(|reg| {
                reg.tenants.get_mut(&id).unwrap().quota = q;
                Ok(())
            })
            .unwrap();
            root.load().unwrap()
        };
        let reg = set(Some(1 << 20));
        assert_eq!((reg.v, reg.tenants[&id].quota), (2, Some(1 << 20)));
        assert_eq!(set(None).v, 1);
    }

    /// `tenant add` looks for the root's format file, then creates the
    /// root when it is missing; a racing `tenant add` can finish the root
    /// in between. Creating a root that is whole by then opens it, with
    /// its own key, rather than refusing the directory as foreign.
    #[test]
    fn creating_a_root_another_process_has_just_finished_opens_it() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("root");
        let key = Secret::KeyFile(KeyFileKey::generate());
        let first = Root::open(&dir, &key, true).unwrap();
        let slot = fs::read(dir.join(KEYSLOT)).unwrap();
        let second = Root::create(&dir, &key).unwrap();
        assert_eq!(fs::read(dir.join(KEYSLOT)).unwrap(), slot);
        let (_, _, token) = second
            .change(|reg| add_tenant(reg, second.keys(), "bob", &[Scope::Memory], None))
            .unwrap();
        let reg = first.load().unwrap();
        let stored = &reg.tenants.values().next().unwrap().tokens[token_id(&token).unwrap()];
        let hash = data_encoding::HEXLOWER
            .decode(stored.hash.as_bytes())
            .unwrap();
        assert!(first.keys().token_matches(token.as_bytes(), &hash));
        // A directory holding something else is still refused.
        let other = d.path().join("other");
        fs::create_dir(&other).unwrap();
        fs::write(other.join("notes.txt"), b"x").unwrap();
        assert!(Root::create(&other, &key).is_err());
    }
}
