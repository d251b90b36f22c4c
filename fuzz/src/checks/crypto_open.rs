//! Opening sealed formats from hostile bytes: a blob, a keyslot and a
//! key-table shard. Opening never panics and never succeeds on bytes that
//! were not sealed with the key, and a genuine sealed value opens only
//! while it is unchanged.
//!
//! Raw bytes are offered to fixed keys, so a finding replays: a key-file
//! slot sealed once with the key file `[0x4b; 32]` over a two-epoch keyring
//! ([`GENUINE_SLOT`]) gives the vault keys, and a shard sealed once under
//! them ([`GENUINE_SHARD`], shard 0, two entries) gives the file keys. These
//! constants also pin the formats: if one stops opening, the on-disk format
//! changed. Nothing else is ever sealed under the fixed keys: the mutation
//! modes seal under keys made fresh for each input. (They once used the
//! fixed keys, and libFuzzer, which watches comparisons, copied a genuine
//! shard from `bytes == sealed` into a raw input: not a forgery, just the
//! documented rollback limit, an old sealed value still opens.)
//!
//! Input: the first byte picks a mode.
//! - 0..=3: the rest is raw bytes offered as slot, blob and shard;
//! - 4: seal a blob (plaintext and path from the input), then mutate it;
//! - 5: seal a key-file slot over the fixed keyring, then mutate it;
//! - 6: seal a passphrase slot (tiny Argon2 cost), then mutate it;
//! - 7: seal a shard (entries from the input), then mutate it.
//!
//! Mutations (from the input): flip, set, insert or remove a byte, truncate,
//! append, swap two bytes; a mutation may leave the bytes unchanged, and
//! then opening must succeed with the original content.

use std::sync::OnceLock;

use memvault::crypto::{
    BLOB_OVERHEAD, CryptoError, FileKey, FileKeyId, KdfParams, KeyFileKey, KeyTable, Keyring,
    Passphrase, ShardLayout, SlotKind, Unlock, VaultKeys, blob_key_id, open_blob, open_slot,
    plaintext_len, random_bytes, seal_blob, seal_keyfile_slot, seal_passphrase_slot, slot_info,
};

use super::input::Input;

const KEY_FILE: [u8; 32] = [0x4b; 32];

/// `seal_keyfile_slot(two-epoch keyring, KEY_FILE)`.
pub const GENUINE_SLOT: &str = "4d564b5301028fc471226f8fb9ecc772c7dc15f55b4db6c08b23aed709798bbc35963ff6c0b05def484c8bd12b9d33ec9e4a084ba35fe79285c7be52fe2bc0d12be83835c17bf7b92c7dda3d18e732b5982a179e3318f27d81b881f23f933bfab281c10448918b7269be438a6879ceaf8bf155cfe3e5f55e5e65b19fba07f3ced7e60e2277f4524d54fd26dcf2fb1519b2";

/// `seal_table_shard(0, {00..01: random key, 00..02: random key})` under
/// the keys of [`GENUINE_SLOT`].
pub const GENUINE_SHARD: &str = "4d564b540100000001df2cf2148386f5452705e21f9c2b3b09b2ddf7b66824787d5c17805f18787947d54271c4e53d1e8af41524017471c59d38b4f918ad76b7e7238efc53d98f622ff1523e1feae04020ec7768837166897fee92b5c76e9c409c202fa7abc07fd0ebf9a44e058938c724a59a1d7c2a637443a73343728b19d16a8d28a4b58eb77b1deb1e212624c74bcc8b1b052e";

/// Argon2id cost small enough to run on every input.
const TINY: KdfParams = KdfParams {
    m_kib: 8,
    t: 1,
    p: 1,
};

/// The passphrase raw bytes are offered to (the mutation mode uses a fresh one).
const PASSPHRASE: &str = "correct horse";

const PATHS: &[&str] = &["/memories/a", "/memories/b", "/memories/a/b.txt", ""];

struct Fixed {
    key_file: KeyFileKey,
    slot: Vec<u8>,
    shard: Vec<u8>,
    keys: VaultKeys,
    table: KeyTable,
}

fn fixed() -> &'static Fixed {
    static FIXED: OnceLock<Fixed> = OnceLock::new();
    FIXED.get_or_init(|| {
        let key_file = KeyFileKey::from_bytes(&KEY_FILE).expect("32 bytes");
        let slot = unhex(GENUINE_SLOT);
        let shard = unhex(GENUINE_SHARD);
        let ring = open_slot(&slot, &Unlock::KeyFile(&key_file)).expect("the genuine slot opens");
        assert_eq!(ring.current_epoch(), 1);
        let keys = VaultKeys::derive(&ring);
        let table = keys
            .open_table_shard(ShardLayout::Byte, 0, &shard)
            .expect("the genuine shard opens");
        assert_eq!(table.len(), 2);
        Fixed {
            key_file,
            slot,
            shard,
            keys,
            table,
        }
    })
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// A fingerprint of the keys a keyring derives (the keys stay hidden).
fn fingerprint(keys: &VaultKeys) -> Vec<u8> {
    keys.mac(b"memvault fuzz fingerprint")
}

pub fn check(data: &[u8]) {
    let mut input = Input::new(data);
    match input.byte() % 8 {
        0..=3 => raw(input.rest()),
        4 => blob(&mut input),
        5 => keyfile_slot(&mut input),
        6 => passphrase_slot(&mut input),
        _ => shard(&mut input),
    }
}

/// Arbitrary bytes offered to every opener.
fn raw(bytes: &[u8]) {
    let f = fixed();
    // Keyslot: only the genuine slot opens with the key file.
    let info = slot_info(bytes);
    let opened = open_slot(bytes, &Unlock::KeyFile(&f.key_file));
    match &info {
        Err(e) => {
            assert_eq!(*e, CryptoError::Malformed);
            assert_eq!(opened.err(), Some(CryptoError::Malformed));
        }
        Ok(info) => match info.kind {
            SlotKind::KeyFile => {
                assert_eq!(opened.is_ok(), bytes == f.slot, "a forged slot opened");
            }
            SlotKind::Passphrase(params) => {
                assert_eq!(opened.err(), Some(CryptoError::WrongKind));
                let pass = Passphrase::new(PASSPHRASE.to_owned());
                passphrase_on(bytes, &pass, params, false);
            }
        },
    }
    // Blob: no raw bytes are a blob under the fixed file keys.
    let _ = plaintext_len(bytes.len() as u64);
    if let Ok(id) = blob_key_id(bytes) {
        assert!(bytes.len() >= BLOB_OVERHEAD);
        assert_eq!(
            plaintext_len(bytes.len() as u64),
            Some((bytes.len() - BLOB_OVERHEAD) as u64)
        );
        assert_eq!(bytes.get(5..21), Some(&id.0[..]));
    }
    for (_, key) in f.table.iter() {
        for path in PATHS {
            assert!(open_blob(key, path, bytes).is_err(), "a forged blob opened");
        }
    }
    // Shard: only the genuine shard, under its own number.
    for shard in [0, 1, u16::from(bytes.first().copied().unwrap_or(0xff))] {
        for layout in [ShardLayout::Byte, ShardLayout::Wide] {
            let opened = f.keys.open_table_shard(layout, shard, bytes);
            assert_eq!(
                opened.is_ok(),
                layout == ShardLayout::Byte && shard == 0 && bytes == f.shard,
                "a forged shard opened"
            );
        }
    }
}

/// A passphrase offered to a passphrase slot with `params`: parameters out
/// of bounds are refused before any work; tiny ones are tried (and must
/// fail unless `may_open`); others would cost too much to try here.
fn passphrase_on(
    bytes: &[u8],
    pass: &Passphrase,
    params: KdfParams,
    may_open: bool,
) -> Option<Keyring> {
    if let Err(refused) = params.validate() {
        assert_eq!(
            open_slot(bytes, &Unlock::Passphrase(pass)).err(),
            Some(refused)
        );
        return None;
    }
    if params.m_kib > 64 || params.t > 2 || params.p > 2 {
        return None;
    }
    let opened = open_slot(bytes, &Unlock::Passphrase(pass));
    assert!(
        may_open || opened.is_err(),
        "a forged passphrase slot opened"
    );
    opened.ok()
}

/// Applies 1 to 4 mutations read from `input` to `bytes`.
fn mutate(input: &mut Input, bytes: &[u8]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    for _ in 0..1 + input.below(4) {
        let len = out.len();
        match input.byte() % 7 {
            0 if len > 0 => {
                let at = input.below(len);
                out[at] ^= input.byte();
            }
            1 if len > 0 => {
                let at = input.below(len);
                out[at] = input.byte();
            }
            2 => {
                let at = input.below(len + 1);
                out.insert(at, input.byte());
            }
            3 if len > 0 => {
                out.remove(input.below(len));
            }
            4 => out.truncate(input.below(len + 1)),
            5 => out.extend_from_slice(input.bytes(33)),
            6 if len > 1 => {
                let (a, b) = (input.below(len), input.below(len));
                out.swap(a, b);
            }
            _ => {}
        }
    }
    out
}

fn blob(input: &mut Input) {
    let mut table = KeyTable::new();
    for n in 1..=2 {
        table.insert(FileKeyId([n; 16]), FileKey::generate());
    }
    let entries: Vec<(&FileKeyId, &FileKey)> = table.iter().collect();
    let (id, key) = entries[input.below(entries.len())];
    let path = input.pick(PATHS);
    let open_at = input.pick(PATHS);
    let plain = input.bytes(256);
    let sealed = seal_blob(key, id, path, plain);
    assert_eq!(sealed.len(), plain.len() + BLOB_OVERHEAD);
    assert_eq!(blob_key_id(&sealed).ok().as_ref(), Some(id));
    let bytes = mutate(input, &sealed);
    for (other_id, other_key) in &entries {
        let genuine = bytes == sealed && open_at == path && *other_id == id;
        match open_blob(other_key, open_at, &bytes) {
            Ok(content) => {
                assert!(genuine, "a changed, moved or foreign blob opened");
                assert_eq!(&content[..], plain);
            }
            Err(_) => assert!(!genuine, "a genuine blob did not open"),
        }
    }
}

fn keyfile_slot(input: &mut Input) {
    let key_file = KeyFileKey::generate();
    let ring = Keyring::new_random();
    let sealed = seal_keyfile_slot(&ring, &key_file);
    let bytes = mutate(input, &sealed);
    match open_slot(&bytes, &Unlock::KeyFile(&key_file)) {
        Ok(back) => {
            assert!(bytes == sealed, "a changed key-file slot opened");
            assert_eq!(
                fingerprint(&VaultKeys::derive(&back)),
                fingerprint(&VaultKeys::derive(&ring))
            );
        }
        Err(_) => assert!(bytes != sealed, "a genuine key-file slot did not open"),
    }
    let wrong = KeyFileKey::generate();
    assert!(open_slot(&bytes, &Unlock::KeyFile(&wrong)).is_err());
}

fn passphrase_slot(input: &mut Input) {
    let pass = Passphrase::new(format!("{:?}", random_bytes::<16>()));
    let ring = Keyring::new_random();
    let sealed = seal_passphrase_slot(&ring, &pass, TINY).expect("tiny parameters are valid");
    let bytes = mutate(input, &sealed);
    let Ok(info) = slot_info(&bytes) else {
        assert!(open_slot(&bytes, &Unlock::Passphrase(&pass)).is_err());
        return;
    };
    let SlotKind::Passphrase(params) = info.kind else {
        assert!(open_slot(&bytes, &Unlock::Passphrase(&pass)).is_err());
        return;
    };
    let opened = passphrase_on(&bytes, &pass, params, bytes == sealed);
    if let Some(back) = &opened {
        assert_eq!(
            fingerprint(&VaultKeys::derive(back)),
            fingerprint(&VaultKeys::derive(&ring))
        );
    }
    if bytes == sealed {
        assert!(opened.is_some(), "a genuine passphrase slot did not open");
    }
}

fn shard(input: &mut Input) {
    let keys = VaultKeys::derive(&Keyring::new_random());
    let layout = if input.byte() < 0x80 {
        ShardLayout::Byte
    } else {
        ShardLayout::Wide
    };
    let shard = u16::from_be_bytes([input.byte(), input.byte()]) % layout.shards();
    let mut table = KeyTable::new();
    for _ in 0..input.below(5) {
        let mut id = [0u8; 16];
        let got = input.take(16);
        id[..got.len()].copy_from_slice(got);
        // Mostly ids of the shard: its number in the leading bits.
        if input.byte() < 0xf0 {
            match layout {
                ShardLayout::Byte => id[0] = shard as u8,
                ShardLayout::Wide => {
                    id[0] = (shard >> 4) as u8;
                    id[1] = (id[1] & 0x0f) | (((shard & 0xf) as u8) << 4);
                }
            }
        }
        table.insert(FileKeyId(id), FileKey::generate());
    }
    let sealed = keys.seal_table_shard(layout, shard, &table);
    let open_as = if input.byte() < 0xf0 {
        shard
    } else {
        u16::from(input.byte())
    };
    let bytes = mutate(input, &sealed);
    let genuine = bytes == sealed && open_as == shard;
    match keys.open_table_shard(layout, open_as, &bytes) {
        Ok(back) => {
            assert!(genuine, "a changed or moved shard opened");
            let want: Vec<(FileKeyId, [u8; 32])> = table
                .iter()
                .filter(|(id, _)| layout.shard_of(id) == shard)
                .map(|(id, key)| (*id, key.content_hash(b"x")))
                .collect();
            let got: Vec<(FileKeyId, [u8; 32])> = back
                .iter()
                .map(|(id, key)| (*id, key.content_hash(b"x")))
                .collect();
            assert_eq!(got, want);
        }
        Err(_) => assert!(!genuine, "a genuine shard did not open"),
    }
}
