//! Keyslots: the serialised [`Keyring`] wrapped by a passphrase or a key file.
//!
//! Owns: the slot format
//! `"MVKS" || version 1 || kind u8 || slot id 8 || salt 16 ||
//! [passphrase only: m_kib u32 BE, t u32 BE, p u32 BE] || nonce 24 ||
//! XChaCha20-Poly1305(wrap key, aad = every header byte, keyring)`.
//! Kind 1: wrap key = Argon2id v1.3 (passphrase, salt, m, t, p) -> 32 bytes.
//! Kind 2: wrap key = HKDF-SHA256(ikm = key file, salt, "memvault keyfile slot").
//!
//! Promises: the KDF parameters are authenticated (changing them fails the
//! unlock); parameters above [`KdfParams::MAX`] are refused with
//! [`CryptoError::ExcessiveWork`] before any memory is allocated, so a
//! hostile slot cannot burn memory or time; a secret of the wrong kind is
//! refused before any work; the Argon2 block memory, the wrap key and the
//! serialised keyring are wiped. Changing a passphrase rewrites one slot,
//! never the data.
//!
//! Does not protect: a weak passphrase (offline guessing costs one Argon2id
//! run per guess), or a slot that is deleted (that is a vault decision).
//!
//! Timing is not measured here: benchmarks live outside this module, and
//! tests use m = 64 KiB, t = 1, p = 1.

use argon2::{Algorithm, Argon2, Block, Params, Version};
use zeroize::Zeroizing;

use super::primitives::{NONCE_LEN, SecretBytes, TAG_LEN, be_u32, hkdf, open, random_bytes, seal};
use super::{CryptoError, KeyFileKey, Keyring, Passphrase, labels};

const VERSION: u8 = 1;
const KIND_PASSPHRASE: u8 = 1;
const KIND_KEYFILE: u8 = 2;
const SALT_AT: usize = 4 + 1 + 1 + 8;
const PARAMS_AT: usize = SALT_AT + 16;
const KEYFILE_HEADER_LEN: usize = PARAMS_AT + NONCE_LEN;
const PASSPHRASE_HEADER_LEN: usize = PARAMS_AT + 12 + NONCE_LEN;

/// Argon2id cost: memory in KiB, passes, lanes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KdfParams {
    pub m_kib: u32,
    pub t: u32,
    pub p: u32,
}

impl KdfParams {
    /// 64 MiB, 3 passes, 1 lane (about 0.2 s in a release build).
    pub const DEFAULT: KdfParams = KdfParams {
        m_kib: 65_536,
        t: 3,
        p: 1,
    };
    /// The ceiling: 4 GiB, 100 passes, 16 lanes. Anything above is refused.
    pub const MAX: KdfParams = KdfParams {
        m_kib: 4_194_304,
        t: 100,
        p: 16,
    };

    /// `ExcessiveWork` above [`MAX`](Self::MAX); `BadParams` below Argon2's
    /// minimums (t >= 1, p >= 1, m_kib >= 8 * p).
    pub fn validate(&self) -> Result<(), CryptoError> {
        let max = Self::MAX;
        if self.m_kib > max.m_kib || self.t > max.t || self.p > max.p {
            return Err(CryptoError::ExcessiveWork);
        }
        if self.t < 1 || self.p < 1 || self.m_kib < 8 * self.p {
            return Err(CryptoError::BadParams);
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotKind {
    Passphrase(KdfParams),
    KeyFile,
}

/// What a slot's header says, readable without any secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotInfo {
    /// Random, names the slot (show as hex).
    pub id: [u8; 8],
    pub kind: SlotKind,
}

/// The secret offered to a slot.
#[derive(Debug, Clone, Copy)]
pub enum Unlock<'a> {
    Passphrase(&'a Passphrase),
    KeyFile(&'a KeyFileKey),
}

struct Header {
    info: SlotInfo,
    salt: [u8; 16],
    len: usize,
}

fn parse(bytes: &[u8]) -> Result<Header, CryptoError> {
    let malformed = CryptoError::Malformed;
    if bytes.len() < PARAMS_AT || &bytes[..4] != labels::SLOT_MAGIC || bytes[4] != VERSION {
        return Err(malformed);
    }
    let (kind, len) = match bytes[5] {
        KIND_PASSPHRASE => {
            let at = |i: usize| be_u32(bytes, PARAMS_AT + 4 * i).ok_or(malformed);
            let params = KdfParams {
                m_kib: at(0)?,
                t: at(1)?,
                p: at(2)?,
            };
            (SlotKind::Passphrase(params), PASSPHRASE_HEADER_LEN)
        }
        KIND_KEYFILE => (SlotKind::KeyFile, KEYFILE_HEADER_LEN),
        _ => return Err(malformed),
    };
    if bytes.len() < len + TAG_LEN {
        return Err(malformed);
    }
    Ok(Header {
        info: SlotInfo {
            id: bytes[6..SALT_AT].try_into().map_err(|_| malformed)?,
            kind,
        },
        salt: bytes[SALT_AT..PARAMS_AT]
            .try_into()
            .map_err(|_| malformed)?,
        len,
    })
}

/// Argon2id with our own block buffer, wiped on every return path.
fn argon2id(
    pass: &Passphrase,
    salt: &[u8],
    params: KdfParams,
) -> Result<SecretBytes<32>, CryptoError> {
    params.validate()?;
    let params = Params::new(params.m_kib, params.t, params.p, Some(32))
        .map_err(|_| CryptoError::BadParams)?;
    let count = params.block_count();
    let mut blocks: Zeroizing<Vec<Block>> = Zeroizing::new(Vec::new());
    blocks
        .try_reserve_exact(count)
        .map_err(|_| CryptoError::ExcessiveWork)?;
    blocks.resize(count, Block::new());
    let mut key = SecretBytes::zeroed();
    Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
        .hash_password_into_with_memory(
            pass.expose_secret().as_bytes(),
            salt,
            key.expose_mut(),
            &mut blocks[..],
        )
        .map_err(|_| CryptoError::BadParams)?;
    Ok(key)
}

fn keyfile_wrap_key(key: &KeyFileKey, salt: &[u8]) -> SecretBytes<32> {
    hkdf(salt, key.expose_secret(), labels::KEYFILE_SLOT)
}

fn header(kind: u8, salt: &[u8; 16], params: Option<KdfParams>) -> Vec<u8> {
    let mut out = Vec::with_capacity(PASSPHRASE_HEADER_LEN);
    out.extend_from_slice(labels::SLOT_MAGIC);
    out.extend_from_slice(&[VERSION, kind]);
    out.extend_from_slice(&random_bytes::<8>());
    out.extend_from_slice(salt);
    if let Some(p) = params {
        for v in [p.m_kib, p.t, p.p] {
            out.extend_from_slice(&v.to_be_bytes());
        }
    }
    out
}

/// Wraps `keyring` under a passphrase with Argon2id `params` (validated first).
pub fn seal_passphrase_slot(
    keyring: &Keyring,
    pass: &Passphrase,
    params: KdfParams,
) -> Result<Vec<u8>, CryptoError> {
    params.validate()?;
    let salt = random_bytes();
    let wrap = argon2id(pass, &salt, params)?;
    let header = header(KIND_PASSPHRASE, &salt, Some(params));
    Ok(seal(wrap.expose(), header, &[], &keyring.to_bytes()))
}

/// Wraps `keyring` under a raw 32-byte key file.
pub fn seal_keyfile_slot(keyring: &Keyring, key: &KeyFileKey) -> Vec<u8> {
    let salt = random_bytes();
    let wrap = keyfile_wrap_key(key, &salt);
    seal(
        wrap.expose(),
        header(KIND_KEYFILE, &salt, None),
        &[],
        &keyring.to_bytes(),
    )
}

/// Reads a slot's header only: no key work, parameters not validated.
pub fn slot_info(bytes: &[u8]) -> Result<SlotInfo, CryptoError> {
    parse(bytes).map(|h| h.info)
}

/// Unwraps the keyring. Order: parse, match the kind (`WrongKind`, no
/// work), validate parameters (`ExcessiveWork`/`BadParams`, no work),
/// derive, decrypt (`DecryptionFailed` for a wrong secret or any change).
pub fn open_slot(bytes: &[u8], secret: &Unlock) -> Result<Keyring, CryptoError> {
    let header = parse(bytes)?;
    let wrap = match (header.info.kind, secret) {
        (SlotKind::Passphrase(params), Unlock::Passphrase(pass)) => {
            argon2id(pass, &header.salt, params)?
        }
        (SlotKind::KeyFile, Unlock::KeyFile(key)) => keyfile_wrap_key(key, &header.salt),
        _ => return Err(CryptoError::WrongKind),
    };
    let plain = open(wrap.expose(), bytes, header.len, &[])?;
    Keyring::from_bytes(&plain)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    const TINY: KdfParams = KdfParams {
        m_kib: 64,
        t: 1,
        p: 1,
    };

    fn pass(s: &str) -> Passphrase {
        Passphrase::new(s.to_owned())
    }

    fn same_keys(a: &Keyring, b: &Keyring) -> bool {
        a.current_epoch() == b.current_epoch()
            && (0..=a.current_epoch()).all(|e| {
                a.data_key(e).map(|k| k.expose_secret()) == b.data_key(e).map(|k| k.expose_secret())
            })
    }

    fn with_params(slot: &[u8], params: KdfParams) -> Vec<u8> {
        let mut out = slot.to_vec();
        for (i, v) in [params.m_kib, params.t, params.p].into_iter().enumerate() {
            out[PARAMS_AT + 4 * i..PARAMS_AT + 4 * i + 4].copy_from_slice(&v.to_be_bytes());
        }
        out
    }

    #[test]
    fn passphrase_slot_round_trip_with_three_epochs() {
        let mut ring = Keyring::new_random();
        ring.add_epoch();
        ring.add_epoch();
        let slot = seal_passphrase_slot(&ring, &pass("correct horse"), TINY).unwrap();
        assert_eq!(slot.len(), PASSPHRASE_HEADER_LEN + 3 + 3 * 36 + TAG_LEN);
        let info = slot_info(&slot).unwrap();
        assert_eq!(info.kind, SlotKind::Passphrase(TINY));
        let back = open_slot(&slot, &Unlock::Passphrase(&pass("correct horse"))).unwrap();
        assert!(same_keys(&ring, &back));
        let again = seal_passphrase_slot(&ring, &pass("correct horse"), TINY).unwrap();
        assert_ne!(slot_info(&again).unwrap().id, info.id);
        assert_ne!(slot[SALT_AT..PARAMS_AT], again[SALT_AT..PARAMS_AT]);
    }

    #[test]
    fn keyfile_slot_round_trip() {
        let ring = Keyring::new_random();
        let key = KeyFileKey::generate();
        let slot = seal_keyfile_slot(&ring, &key);
        assert_eq!(slot_info(&slot).unwrap().kind, SlotKind::KeyFile);
        assert!(same_keys(
            &ring,
            &open_slot(&slot, &Unlock::KeyFile(&key)).unwrap()
        ));
        let other = KeyFileKey::generate();
        let err = open_slot(&slot, &Unlock::KeyFile(&other)).unwrap_err();
        assert_eq!(err, CryptoError::DecryptionFailed);
    }

    #[test]
    fn wrong_passphrase_fails() {
        let slot = seal_passphrase_slot(&Keyring::new_random(), &pass("right"), TINY).unwrap();
        for wrong in ["wrong", "Right", "right ", ""] {
            let err = open_slot(&slot, &Unlock::Passphrase(&pass(wrong))).unwrap_err();
            assert_eq!(err, CryptoError::DecryptionFailed);
        }
    }

    #[test]
    fn wrong_kind_is_refused_without_work() {
        let ring = Keyring::new_random();
        let key = KeyFileKey::generate();
        let p = pass("x");
        let pslot = seal_passphrase_slot(&ring, &p, TINY).unwrap();
        let kslot = seal_keyfile_slot(&ring, &key);
        assert_eq!(
            open_slot(&pslot, &Unlock::KeyFile(&key)).unwrap_err(),
            CryptoError::WrongKind
        );
        assert_eq!(
            open_slot(&kslot, &Unlock::Passphrase(&p)).unwrap_err(),
            CryptoError::WrongKind
        );
        // Hostile parameters and the wrong kind: the kind check comes first.
        let hostile = with_params(
            &pslot,
            KdfParams {
                m_kib: u32::MAX,
                t: u32::MAX,
                p: 1,
            },
        );
        assert_eq!(
            open_slot(&hostile, &Unlock::KeyFile(&key)).unwrap_err(),
            CryptoError::WrongKind
        );
    }

    #[test]
    fn hostile_params_are_refused_before_deriving() {
        let p = pass("x");
        let slot = seal_passphrase_slot(&Keyring::new_random(), &p, TINY).unwrap();
        let hostile = [
            KdfParams {
                m_kib: u32::MAX,
                t: 1,
                p: 1,
            },
            KdfParams {
                m_kib: 64,
                t: 1_000_000,
                p: 1,
            },
            // Just above the ceiling: deriving this would take hours.
            KdfParams {
                m_kib: KdfParams::MAX.m_kib + 1,
                t: 100,
                p: 16,
            },
            KdfParams {
                m_kib: KdfParams::MAX.m_kib,
                t: 101,
                p: 16,
            },
            KdfParams {
                m_kib: KdfParams::MAX.m_kib,
                t: 100,
                p: 17,
            },
        ];
        let start = Instant::now();
        for params in hostile {
            let bad = with_params(&slot, params);
            assert_eq!(slot_info(&bad).unwrap().kind, SlotKind::Passphrase(params));
            assert_eq!(
                open_slot(&bad, &Unlock::Passphrase(&p)).unwrap_err(),
                CryptoError::ExcessiveWork
            );
            let sealed = seal_passphrase_slot(&Keyring::new_random(), &p, params);
            assert_eq!(sealed.unwrap_err(), CryptoError::ExcessiveWork);
        }
        assert!(start.elapsed() < Duration::from_millis(500));
    }

    #[test]
    fn params_validation_table() {
        let ok = [
            KdfParams::DEFAULT,
            KdfParams::MAX,
            TINY,
            KdfParams {
                m_kib: 16,
                t: 1,
                p: 2,
            },
        ];
        for params in ok {
            assert_eq!(params.validate(), Ok(()), "{params:?}");
        }
        let too_small = [
            KdfParams {
                m_kib: 64,
                t: 0,
                p: 1,
            },
            KdfParams {
                m_kib: 64,
                t: 1,
                p: 0,
            },
            KdfParams {
                m_kib: 7,
                t: 1,
                p: 1,
            },
            KdfParams {
                m_kib: 15,
                t: 1,
                p: 2,
            },
        ];
        for params in too_small {
            assert_eq!(params.validate(), Err(CryptoError::BadParams), "{params:?}");
            let slot = seal_passphrase_slot(&Keyring::new_random(), &pass("x"), params);
            assert_eq!(slot.unwrap_err(), CryptoError::BadParams);
        }
    }

    #[test]
    fn params_are_authenticated() {
        let p = pass("x");
        let slot = seal_passphrase_slot(&Keyring::new_random(), &p, TINY).unwrap();
        for params in [KdfParams { m_kib: 128, ..TINY }, KdfParams { t: 2, ..TINY }] {
            let bad = with_params(&slot, params);
            assert_eq!(
                open_slot(&bad, &Unlock::Passphrase(&p)).unwrap_err(),
                CryptoError::DecryptionFailed
            );
        }
    }

    #[test]
    fn tamper_flip_truncate_extend() {
        let ring = Keyring::new_random();
        let (p, key) = (pass("x"), KeyFileKey::generate());
        let slots = [
            (
                seal_passphrase_slot(&ring, &p, TINY).unwrap(),
                Unlock::Passphrase(&p),
            ),
            (seal_keyfile_slot(&ring, &key), Unlock::KeyFile(&key)),
        ];
        for (slot, secret) in &slots {
            assert!(open_slot(slot, secret).is_ok());
            for i in 0..slot.len() {
                let mut bad = slot.clone();
                bad[i] ^= 0x01;
                assert!(open_slot(&bad, secret).is_err(), "byte {i}");
            }
            for len in 0..slot.len() {
                assert!(
                    open_slot(&slot[..len], secret).is_err(),
                    "truncated to {len}"
                );
            }
            assert!(open_slot(&[&slot[..], &[0]].concat(), secret).is_err());
        }
    }

    #[test]
    fn header_parse_rejects_foreign_data() {
        let slot = seal_keyfile_slot(&Keyring::new_random(), &KeyFileKey::generate());
        for (at, value) in [(0, b'X'), (4, 2), (5, 0), (5, 3)] {
            let mut bad = slot.clone();
            bad[at] = value;
            assert_eq!(slot_info(&bad).unwrap_err(), CryptoError::Malformed);
        }
        assert_eq!(
            slot_info(&slot[..KEYFILE_HEADER_LEN + TAG_LEN - 1]).unwrap_err(),
            CryptoError::Malformed
        );
    }
}
