//! `memvault/remotes`: the vault's remotes (name, URL) and, for each, the
//! targets of its two refs as this vault last saw them (the lease of the
//! next push, and the mark a rollback or fork of the remote is judged
//! against). No secret: a URL with a password in it is refused.
//!
//! The file is JSON on one line, then a line `mac <hex>`: the vault's MAC
//! over it (the commit MAC key, domain-separated), so whoever can write
//! the vault directory but has no key cannot point a push elsewhere or
//! move a mark back unnoticed.

use std::path::Path;

use git2::Oid;
use serde::{Deserialize, Serialize};

use super::SyncError;
use crate::crypto::VaultKeys;
use crate::vault::{VaultError, fsx, write_durable};

pub(crate) const FILE: &str = "memvault/remotes";
const MAC_CONTEXT: &[u8] = b"memvault remotes v1\0";

/// One remote, as stored.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RemoteEntry {
    pub name: String,
    pub url: String,
    #[serde(default)]
    pub seen: Seen,
}

/// Where a remote's refs pointed when this vault last pulled from or
/// pushed to it, and its key state's counter then.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Seen {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub main: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<String>,
    #[serde(default)]
    pub counter: u64,
    /// The remote's access ref (see `git::ACCESS_REF`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<String>,
    /// The digest of the access table this vault last pushed there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_digest: Option<String>,
    /// A remote reached as a path whose key states a push replaced (an
    /// erasure, a keyslot change) and that was not pruned yet: every push
    /// and sync prunes it until one succeeds.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prune_pending: bool,
}

impl Seen {
    pub(crate) fn main(&self) -> Option<Oid> {
        self.main.as_deref().and_then(|s| Oid::from_str(s).ok())
    }

    pub(crate) fn keys(&self) -> Option<Oid> {
        self.keys.as_deref().and_then(|s| Oid::from_str(s).ok())
    }

    pub(crate) fn access(&self) -> Option<Oid> {
        self.access.as_deref().and_then(|s| Oid::from_str(s).ok())
    }
}

#[derive(Serialize, Deserialize)]
struct Stored {
    v: u32,
    remotes: Vec<RemoteEntry>,
}

/// Check a remote's name: 1 to 64 of `A-Za-z0-9._-`, not starting with
/// `.` or `-`.
pub(crate) fn check_name(name: &str) -> Result<(), SyncError> {
    let ok = (1..=64).contains(&name.len())
        && !name.starts_with(['.', '-'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok { Ok(()) } else { Err(SyncError::BadName) }
}

/// The stored remotes (none when the file does not exist).
pub(crate) fn load(dir: &Path, keys: &VaultKeys) -> Result<Vec<RemoteEntry>, VaultError> {
    let text = match fsx::read_to_string(&dir.join(FILE), fsx::LIST) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    let altered = || VaultError::from(SyncError::RemotesAltered);
    let (json, mac) = text.trim_end().split_once("\nmac ").ok_or_else(altered)?;
    let tag = data_encoding::HEXLOWER
        .decode(mac.as_bytes())
        .map_err(|_| altered())?;
    if !keys.verify_mac(&[MAC_CONTEXT, json.as_bytes()].concat(), &tag) {
        return Err(altered());
    }
    let stored: Stored = serde_json::from_str(json).map_err(|_| altered())?;
    if stored.v != 1 {
        return Err(altered());
    }
    Ok(stored.remotes)
}

/// Replace the stored remotes (written durably, then renamed into place).
pub(crate) fn store(
    dir: &Path,
    keys: &VaultKeys,
    remotes: &[RemoteEntry],
) -> Result<(), VaultError> {
    let json = serde_json::to_string(&Stored {
        v: 1,
        remotes: remotes.to_vec(),
    })
    .map_err(|e| VaultError::Io(std::io::Error::other(e)))?;
    let tag = keys.mac(&[MAC_CONTEXT, json.as_bytes()].concat());
    let text = format!("{json}\nmac {}\n", data_encoding::HEXLOWER.encode(&tag));
    // A temporary file a crash left would stop every later write.
    let _ = std::fs::remove_file(dir.join(FILE).with_extension("tmp"));
    write_durable(&dir.join(FILE), text.as_bytes())?;
    Ok(())
}

/// A URL must hold no password (`https://user:pw@host`), token or other
/// secret: the file is not secret (and `remote list` prints it); git
/// credential helpers hold those. Refused: a password in the user info,
/// anything the secret filter's built-in rules find in the URL (a token
/// given as the user name, `https://ghp_...@github.com/...`), an HTTP
/// user name too long to be a person's (a token of a kind the rules do
/// not know), and a query parameter named like a credential.
pub(crate) fn check_no_secret(url: &str) -> Result<(), SyncError> {
    // git and HTTP servers decode percent-escapes in the user name and
    // the query: checked as they read them, and as written.
    let decoded = percent_decoded(url);
    if decoded != url {
        check_no_secret(&decoded)?;
    }
    let refuse = |what: String| {
        Err(SyncError::BadUrl(format!(
            "a remote URL may not hold {what}: use a git credential helper or an SSH key"
        )))
    };
    let scheme_rest = url.split_once("://");
    if let Some((scheme, rest)) = scheme_rest {
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        if let Some((userinfo, _)) = authority.rsplit_once('@') {
            if userinfo.contains(':') {
                return refuse("a password".into());
            }
            let http = matches!(scheme.to_ascii_lowercase().as_str(), "http" | "https");
            if http && userinfo.len() > 32 {
                return refuse("a token as its user name".into());
            }
        }
        // A fragment is never sent and git has no use for it: what is
        // there is a mistake, or a secret pasted where nothing checks it
        // (round 41c: `https://host/x.git#glpat-...` was stored and
        // printed back).
        let network = matches!(
            scheme.to_ascii_lowercase().as_str(),
            "http" | "https" | "ssh" | "git"
        );
        if network && rest.contains('#') {
            return Err(SyncError::BadUrl(
                "a remote URL may not hold a fragment (`#...`): git does not use it; give the repository's URL alone".into(),
            ));
        }
        if let Some((_, query)) = rest.split_once('?') {
            for pair in query.split(['&', ';']) {
                let name = pair.split('=').next().unwrap_or("").to_ascii_lowercase();
                if [
                    "token",
                    "key",
                    "secret",
                    "auth",
                    "pass",
                    "pwd",
                    "sig",
                    "credential",
                ]
                .iter()
                .any(|word| name.contains(word))
                {
                    return refuse("a credential in its query".into());
                }
            }
        }
    }
    if let Ok(filter) = crate::redact::Redactor::new(&crate::redact::RedactConfig::default()) {
        let found = filter.scan(url);
        if !found.is_empty() {
            let kinds = crate::redact::kinds(&found);
            return refuse(crate::redact::secrets_phrase(&kinds));
        }
    }
    Ok(())
}

/// `text` with each `%XX` escape decoded (bytes that are not UTF-8 come
/// out as U+FFFD); anything else as it is.
fn percent_decoded(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && let (Some(h), Some(l)) = (
                b.get(i + 1).copied().and_then(hex),
                b.get(i + 2).copied().and_then(hex),
            )
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
