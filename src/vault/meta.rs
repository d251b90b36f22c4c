//! Commit metadata: what each commit on `refs/heads/main` records.
//!
//! The metadata is serialised as JSON, sealed with the vault's meta key and
//! stored base64-encoded as the commit message. The AAD binds it to the
//! commit's tree and parent, so metadata cannot be moved to another commit.
//! Everything here is readable only by key holders.

use serde::{Deserialize, Serialize};

/// Format version written into every record.
pub const META_VERSION: u32 = 1;

/// The audit record of one commit.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CommitMeta {
    pub v: u32,
    /// create, overwrite, str_replace, insert, delete, rename, init, revert, ...
    pub op: String,
    /// The path the operation named (`old_path` for a rename).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The destination of a rename.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_path: Option<String>,
    /// Wall-clock time of the commit, milliseconds since the Unix epoch.
    pub time_ms: u64,
    pub session: String,
    pub actor: String,
    /// Plaintext size of the file after the write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Hex HMAC-SHA256 of the new content under the file's own key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_hash: Option<String>,
    /// Hex id of the file key the written blob uses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    #[serde(default)]
    pub lines_added: u32,
    #[serde(default)]
    pub lines_removed: u32,
    /// Redaction kinds and counts applied to the written text.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redactions: Vec<(String, u32)>,
    /// Every file path the commit touched (for directory deletes and
    /// renames: each file below, in its old location).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<String>,
    /// For undo operations: the revision(s) undone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub undoes: Vec<String>,
    /// For `revert --session`: the session undone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undone_session: Option<String>,
    /// For `restore`: the revision the path was put back to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    /// For expiry and purge: the hex ids of the file keys destroyed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub erased_keys: Vec<String>,
    /// The counter of the key state written with this commit, in the same
    /// log record (vault format 2): a key state with a smaller counter was
    /// rolled back. Absent in commits of format 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<u64>,
    /// For key and settings changes (`keyslot`, `config`, `migrate`): what
    /// changed, in words (slot ids, setting names; never a secret).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<String>,
}

/// The additional data that binds sealed metadata to its commit.
pub fn meta_aad(tree: git2::Oid, parent: Option<git2::Oid>) -> Vec<u8> {
    let mut aad = b"memvault commit meta v1\0".to_vec();
    aad.extend_from_slice(tree.as_bytes());
    if let Some(p) = parent {
        aad.extend_from_slice(p.as_bytes());
    }
    aad
}
