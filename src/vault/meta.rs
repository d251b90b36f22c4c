//! Commit metadata: what each commit on `refs/heads/main` records.
//!
//! The metadata is serialised in a compact binary form (vault format 3;
//! JSON before, still read: see [`encode`] and [`decode`]), sealed with
//! the vault's meta key and stored base64-encoded as the commit message. The AAD binds it to the
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
    /// Who the change was made for, as the server authenticated it (the
    /// name of the `memvault server` token), whatever the session and
    /// actor labels say. None for changes made outside a server. Format 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
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
    /// The machine the change was made on: its name and stable id
    /// (`memvault/machine`), `NAME (ID)`. Format 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// For a `merge`: the hex ids of the commits it brought in from the
    /// other side (history lists them after it). Format 5.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub merged: Vec<String>,
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

/// The first byte of the compact form (JSON starts with `{`).
const COMPACT: u8 = 0x03;

// Field tags of the compact form. A field at its default is left out.
const T_V: u8 = 1;
const T_OP: u8 = 2;
const T_PATH: u8 = 3;
const T_NEW_PATH: u8 = 4;
const T_TIME: u8 = 5;
const T_SESSION: u8 = 6;
const T_ACTOR: u8 = 7;
const T_SIZE: u8 = 8;
const T_CONTENT_HASH: u8 = 9;
const T_KEY_ID: u8 = 10;
const T_ADDED: u8 = 11;
const T_REMOVED: u8 = 12;
const T_REDACTIONS: u8 = 13;
const T_FILES: u8 = 14;
/// `files` is exactly `[path]` (the common case: one file written).
const T_FILES_IS_PATH: u8 = 15;
const T_UNDOES: u8 = 16;
const T_UNDONE_SESSION: u8 = 17;
const T_AT: u8 = 18;
const T_ERASED_KEYS: u8 = 19;
const T_KEYS: u8 = 20;
const T_DETAILS: u8 = 21;
/// Format 4: the authenticated principal.
const T_PRINCIPAL: u8 = 22;
/// Format 5: the machine, and a merge's merged commits.
const T_MACHINE: u8 = 23;
const T_MERGED: u8 = 24;

fn put_varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// A hex field as raw bytes when it is lowercase hex of even length
/// (flag 1), else as text (flag 0).
fn put_hex(out: &mut Vec<u8>, s: &str) {
    match data_encoding::HEXLOWER.decode(s.as_bytes()) {
        Ok(raw) => {
            out.push(1);
            put_bytes(out, &raw);
        }
        Err(_) => {
            out.push(0);
            put_bytes(out, s.as_bytes());
        }
    }
}

fn put_strings(out: &mut Vec<u8>, v: &[String]) {
    put_varint(out, v.len() as u64);
    for s in v {
        put_bytes(out, s.as_bytes());
    }
}

/// The metadata as a commit of format 3 stores it: [`COMPACT`], then
/// `(tag, value)` pairs; numbers as LEB128 varints, text and bytes with a
/// varint length, hex ids and hashes as raw bytes. A 1 KiB create's
/// metadata takes about 130 bytes this way, against about 340 as JSON.
pub fn encode(m: &CommitMeta) -> Vec<u8> {
    let mut out = vec![COMPACT];
    let tag = |out: &mut Vec<u8>, t: u8| out.push(t);
    tag(&mut out, T_V);
    put_varint(&mut out, u64::from(m.v));
    tag(&mut out, T_OP);
    put_bytes(&mut out, m.op.as_bytes());
    if let Some(p) = &m.path {
        tag(&mut out, T_PATH);
        put_bytes(&mut out, p.as_bytes());
    }
    if let Some(p) = &m.new_path {
        tag(&mut out, T_NEW_PATH);
        put_bytes(&mut out, p.as_bytes());
    }
    tag(&mut out, T_TIME);
    put_varint(&mut out, m.time_ms);
    tag(&mut out, T_SESSION);
    put_bytes(&mut out, m.session.as_bytes());
    tag(&mut out, T_ACTOR);
    put_bytes(&mut out, m.actor.as_bytes());
    if let Some(p) = &m.principal {
        tag(&mut out, T_PRINCIPAL);
        put_bytes(&mut out, p.as_bytes());
    }
    if let Some(n) = m.size {
        tag(&mut out, T_SIZE);
        put_varint(&mut out, n);
    }
    if let Some(h) = &m.content_hash {
        tag(&mut out, T_CONTENT_HASH);
        put_hex(&mut out, h);
    }
    if let Some(h) = &m.key_id {
        tag(&mut out, T_KEY_ID);
        put_hex(&mut out, h);
    }
    if m.lines_added != 0 {
        tag(&mut out, T_ADDED);
        put_varint(&mut out, u64::from(m.lines_added));
    }
    if m.lines_removed != 0 {
        tag(&mut out, T_REMOVED);
        put_varint(&mut out, u64::from(m.lines_removed));
    }
    if !m.redactions.is_empty() {
        tag(&mut out, T_REDACTIONS);
        put_varint(&mut out, m.redactions.len() as u64);
        for (kind, n) in &m.redactions {
            put_bytes(&mut out, kind.as_bytes());
            put_varint(&mut out, u64::from(*n));
        }
    }
    if m.files.len() == 1 && m.path.as_deref() == Some(m.files[0].as_str()) {
        tag(&mut out, T_FILES_IS_PATH);
    } else if !m.files.is_empty() {
        tag(&mut out, T_FILES);
        put_strings(&mut out, &m.files);
    }
    if !m.undoes.is_empty() {
        tag(&mut out, T_UNDOES);
        put_varint(&mut out, m.undoes.len() as u64);
        for u in &m.undoes {
            put_hex(&mut out, u);
        }
    }
    if let Some(s) = &m.undone_session {
        tag(&mut out, T_UNDONE_SESSION);
        put_bytes(&mut out, s.as_bytes());
    }
    if let Some(a) = &m.at {
        tag(&mut out, T_AT);
        put_bytes(&mut out, a.as_bytes());
    }
    if !m.erased_keys.is_empty() {
        tag(&mut out, T_ERASED_KEYS);
        put_varint(&mut out, m.erased_keys.len() as u64);
        for k in &m.erased_keys {
            put_hex(&mut out, k);
        }
    }
    if let Some(k) = m.keys {
        tag(&mut out, T_KEYS);
        put_varint(&mut out, k);
    }
    if !m.details.is_empty() {
        tag(&mut out, T_DETAILS);
        put_strings(&mut out, &m.details);
    }
    if let Some(machine) = &m.machine {
        tag(&mut out, T_MACHINE);
        put_bytes(&mut out, machine.as_bytes());
    }
    if !m.merged.is_empty() {
        tag(&mut out, T_MERGED);
        put_varint(&mut out, m.merged.len() as u64);
        for c in &m.merged {
            put_hex(&mut out, c);
        }
    }
    out
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn varint(&mut self) -> Option<u64> {
        let mut n = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            n |= u64::from(b & 0x7f).checked_shl(shift)?;
            if b & 0x80 == 0 {
                return Some(n);
            }
        }
        None
    }
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let len = usize::try_from(self.varint()?).ok()?;
        if len > self.0.len() {
            return None;
        }
        let (b, rest) = self.0.split_at(len);
        self.0 = rest;
        Some(b)
    }
    fn text(&mut self) -> Option<String> {
        String::from_utf8(self.bytes()?.to_vec()).ok()
    }
    fn hex(&mut self) -> Option<String> {
        match self.u8()? {
            1 => Some(data_encoding::HEXLOWER.encode(self.bytes()?)),
            0 => self.text(),
            _ => None,
        }
    }
    fn u32(&mut self) -> Option<u32> {
        u32::try_from(self.varint()?).ok()
    }
    fn count(&mut self) -> Option<usize> {
        // Every item takes at least one byte.
        usize::try_from(self.varint()?)
            .ok()
            .filter(|&n| n <= self.0.len())
    }
    fn strings(&mut self) -> Option<Vec<String>> {
        (0..self.count()?).map(|_| self.text()).collect()
    }
}

/// Parse stored metadata of either form: compact (format 3) or JSON
/// (formats 1 and 2). None if it does not parse.
pub fn decode(bytes: &[u8]) -> Option<CommitMeta> {
    let Some((&COMPACT, body)) = bytes.split_first() else {
        return serde_json::from_slice(bytes).ok();
    };
    let mut c = Cursor(body);
    let mut m = CommitMeta::default();
    let mut files_is_path = false;
    while let Some(tag) = c.u8() {
        match tag {
            T_V => m.v = c.u32()?,
            T_OP => m.op = c.text()?,
            T_PATH => m.path = Some(c.text()?),
            T_NEW_PATH => m.new_path = Some(c.text()?),
            T_TIME => m.time_ms = c.varint()?,
            T_SESSION => m.session = c.text()?,
            T_ACTOR => m.actor = c.text()?,
            T_PRINCIPAL => m.principal = Some(c.text()?),
            T_SIZE => m.size = Some(c.varint()?),
            T_CONTENT_HASH => m.content_hash = Some(c.hex()?),
            T_KEY_ID => m.key_id = Some(c.hex()?),
            T_ADDED => m.lines_added = c.u32()?,
            T_REMOVED => m.lines_removed = c.u32()?,
            T_REDACTIONS => {
                m.redactions = (0..c.count()?)
                    .map(|_| Some((c.text()?, c.u32()?)))
                    .collect::<Option<_>>()?;
            }
            T_FILES => m.files = c.strings()?,
            T_FILES_IS_PATH => files_is_path = true,
            T_UNDOES => m.undoes = (0..c.count()?).map(|_| c.hex()).collect::<Option<_>>()?,
            T_UNDONE_SESSION => m.undone_session = Some(c.text()?),
            T_AT => m.at = Some(c.text()?),
            T_ERASED_KEYS => {
                m.erased_keys = (0..c.count()?).map(|_| c.hex()).collect::<Option<_>>()?;
            }
            T_KEYS => m.keys = Some(c.varint()?),
            T_DETAILS => m.details = c.strings()?,
            T_MACHINE => m.machine = Some(c.text()?),
            T_MERGED => m.merged = (0..c.count()?).map(|_| c.hex()).collect::<Option<_>>()?,
            _ => return None,
        }
    }
    if files_is_path {
        m.files = vec![m.path.clone()?];
    }
    Some(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> CommitMeta {
        CommitMeta {
            v: META_VERSION,
            op: "rename".into(),
            path: Some("/memories/a.md".into()),
            new_path: Some("/memories/b.md".into()),
            time_ms: 1_764_000_000_123,
            session: "s-1".into(),
            actor: "agent".into(),
            principal: Some("ops-bot".into()),
            size: Some(1024),
            content_hash: Some("ab".repeat(32)),
            key_id: Some("cd".repeat(16)),
            lines_added: 3,
            lines_removed: 300,
            redactions: vec![("aws".into(), 2), ("jwt".into(), 1)],
            files: vec!["/memories/a.md".into(), "/memories/c.md".into()],
            undoes: vec!["0123abcd".into(), "not hex!".into()],
            undone_session: Some("s-0".into()),
            at: Some("0123456789ab".into()),
            erased_keys: vec!["ef".repeat(16)],
            keys: Some(u64::MAX),
            details: vec!["one".into(), "two".into()],
            machine: Some("laptop (0123456789abcdef)".into()),
            merged: vec!["ab".repeat(20), "cd".repeat(20)],
        }
    }

    #[test]
    fn compact_form_round_trips_every_field() {
        for m in [
            full(),
            CommitMeta::default(),
            CommitMeta {
                files: vec!["/memories/a.md".into()],
                ..full()
            },
        ] {
            assert_eq!(decode(&encode(&m)).as_ref(), Some(&m));
        }
    }

    #[test]
    fn json_of_earlier_formats_still_reads() {
        let m = full();
        assert_eq!(decode(&serde_json::to_vec(&m).unwrap()), Some(m));
    }

    #[test]
    fn compact_form_is_small() {
        let m = CommitMeta {
            v: META_VERSION,
            op: "create".into(),
            path: Some("/memories/big/note00001.md".into()),
            time_ms: 1_764_000_000_123,
            session: "session-1".into(),
            actor: "agent".into(),
            size: Some(1024),
            content_hash: Some("ab".repeat(32)),
            key_id: Some("cd".repeat(16)),
            lines_added: 20,
            files: vec!["/memories/big/note00001.md".into()],
            keys: Some(12_345),
            ..Default::default()
        };
        let compact = encode(&m).len();
        let json = serde_json::to_vec(&m).unwrap().len();
        assert!(compact * 5 / 2 < json, "{compact} vs {json}");
    }

    #[test]
    fn cut_or_unknown_input_is_refused_not_a_panic() {
        let bytes = encode(&full());
        for len in 1..bytes.len() {
            // A cut may end between fields (then it parses, as less).
            let _ = decode(&bytes[..len]);
        }
        assert!(decode(&[COMPACT, 99]).is_none());
        assert!(
            decode(&[
                COMPACT, T_FILES, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01
            ])
            .is_none()
        );
        assert!(decode(&[COMPACT, T_FILES_IS_PATH]).is_none());
        assert!(decode(b"not json").is_none());
    }
}
