//! Key management on an unlocked vault: list, add and remove keyslots,
//! change a passphrase, and rekey (a new data-key epoch).
//!
//! Owns: every change to the `slots/` part of the key state. Each change is
//! one new key-state commit, logged and synced through the write-ahead log
//! under the writer lock (the same path as erasure), so a crash leaves the
//! old key state or the new one, never a mix: after `passwd` either the old
//! or the new passphrase opens the vault.
//!
//! Promises:
//! - no data is re-encrypted by any of these operations; a slot wraps the
//!   [`Keyring`] and only the slots are rewritten;
//! - the last slot is never removed, and the slot this handle was unlocked
//!   with is removed only when asked with `force`;
//! - [`Vault::rekey`] adds a data-key epoch: commit metadata, the commit
//!   MAC, key-table shards written afterwards and the access table use it;
//!   every older epoch stays in the keyring, so all history still opens.
//!
//! Does not protect (rekey): it does not re-encrypt anything written
//! before, so whoever copied an older keyring can still read old history.
//! Names are encrypted under a key of epoch 0 (so paths stay stable) and
//! an existing file keeps its file key when edited: someone who holds the
//! old keyring and the old key table can read names written later and
//! later versions of files that existed before the rekey. A commit MAC of an
//! old epoch still verifies, so an old-key holder can still forge commits.
//! Rekey protects the content of files created afterwards and metadata.
//! Slots whose secret is not offered cannot be rewrapped: rekey refuses
//! while such slots exist unless told to drop them. A handle opened before
//! a rekey elsewhere (a running `serve`) refuses to go on with a clear
//! error until it is reopened.

use std::collections::BTreeMap;

use super::{CommitMeta, KeyChange, Vault, VaultError, damaged, slot_name};
use crate::crypto::{
    self, CryptoError, KdfParams, KeyFileKey, Keyring, Passphrase, SlotInfo, SlotKind, Unlock,
};

/// A secret for a new keyslot.
pub enum NewSlot<'a> {
    KeyFile(&'a KeyFileKey),
    Passphrase(&'a Passphrase, KdfParams),
}

/// One keyslot as `memvault key list` shows it (no secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotEntry {
    /// 16 hex digits.
    pub id: String,
    pub kind: SlotKind,
    /// This handle was unlocked with this slot.
    pub unlocked_with: bool,
}

/// What [`Vault::rekey`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RekeyReport {
    /// The epoch new data is written under from now on.
    pub epoch: u32,
    /// The new id of the slot that was rewrapped.
    pub slot: String,
    /// Slots dropped because their secret was not offered.
    pub dropped: Vec<String>,
}

fn crypto_err(e: CryptoError) -> VaultError {
    match e {
        CryptoError::ExcessiveWork => VaultError::ExcessiveWork,
        CryptoError::BadParams => VaultError::Refused(
            "the Argon2 parameters are below the minimum (passes >= 1, lanes >= 1, memory >= 8 KiB per lane)".into(),
        ),
        CryptoError::DecryptionFailed => VaultError::WrongSecret,
        CryptoError::WrongKind => VaultError::NoSlotOfKind,
        _ => damaged("a keyslot is malformed"),
    }
}

fn seal(keyring: &Keyring, secret: &NewSlot<'_>) -> Result<Vec<u8>, VaultError> {
    match secret {
        NewSlot::KeyFile(k) => Ok(crypto::seal_keyfile_slot(keyring, k)),
        NewSlot::Passphrase(p, params) => {
            crypto::seal_passphrase_slot(keyring, p, *params).map_err(crypto_err)
        }
    }
}

/// A handle opened before another process rekeyed the vault does not hold
/// the new epoch: it refuses to go on rather than report damage.
pub(crate) fn rekeyed_elsewhere() -> VaultError {
    VaultError::Refused(
        "the vault was rekeyed by another process since this one unlocked it; nothing was changed. Restart this process (unlock again) to use the new key".into(),
    )
}

impl Vault {
    /// The keyslots `secret` opens besides the one this handle was
    /// unlocked with (already known to open; a passphrase slot costs an
    /// Argon2 run to try), by id: none, or some when two machines each
    /// added a slot for one secret and a sync merged them (then removing
    /// one of them revokes nothing).
    pub fn slots_opened_by(&self, secret: &Unlock<'_>) -> Vec<String> {
        self.key_state
            .slots
            .iter()
            .filter(|(id, _)| self.unlocked_slot.as_deref() != Some(id.as_str()))
            .filter(|(_, bytes)| crypto::open_slot(bytes, secret).is_ok())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// The keyslots as of the last refresh, by id.
    pub fn slots(&self) -> Result<Vec<SlotEntry>, VaultError> {
        self.key_state
            .slots
            .iter()
            .map(|(id, bytes)| {
                let SlotInfo { kind, .. } =
                    crypto::slot_info(bytes).map_err(|_| damaged("a keyslot does not parse"))?;
                Ok(SlotEntry {
                    id: id.clone(),
                    kind,
                    unlocked_with: self.unlocked_slot.as_deref() == Some(id),
                })
            })
            .collect()
    }

    /// Add a keyslot wrapping this vault's keyring; returns its id.
    pub fn add_slot(&mut self, secret: &NewSlot<'_>) -> Result<String, VaultError> {
        let slot = seal(&self.keyring, secret)?;
        let name = slot_name(&slot)?;
        let added = name.clone();
        let details = vec![format!("added keyslot {name}")];
        let unlock = match secret {
            NewSlot::KeyFile(k) => Unlock::KeyFile(k),
            NewSlot::Passphrase(p, _) => Unlock::Passphrase(p),
        };
        self.change_slots("keyslot", details, move |_, slots, _| {
            // A second slot for a secret that already opens one would make
            // `key remove` of either claim a revocation that did not
            // happen.
            if let Some(id) = slots
                .iter()
                .find(|(_, bytes)| crypto::open_slot(bytes, &unlock).is_ok())
                .map(|(id, _)| id)
            {
                return Err(VaultError::Refused(format!(
                    "that secret already opens keyslot {id}; nothing was changed (a secret needs only one slot)"
                )));
            }
            slots.insert(name, slot);
            Ok(None)
        })?;
        Ok(added)
    }

    /// Remove the keyslot `id`. Refuses the last slot, and the slot this
    /// handle was unlocked with unless `force`.
    pub fn remove_slot(&mut self, id: &str, force: bool) -> Result<(), VaultError> {
        let id = id.to_ascii_lowercase();
        let unlocked = self.unlocked_slot.clone();
        let details = vec![format!("removed keyslot {id}")];
        self.change_slots("keyslot", details, |_, slots, _| {
            if !slots.contains_key(&id) {
                return Err(VaultError::Refused(format!(
                    "this vault has no keyslot {id:?} (see `memvault key list`)"
                )));
            }
            if slots.len() == 1 {
                return Err(VaultError::Refused(
                    "refusing to remove the last keyslot: the vault could never be unlocked again (add another slot first)".into(),
                ));
            }
            if unlocked.as_deref() == Some(id.as_str()) && !force {
                return Err(VaultError::Refused(format!(
                    "keyslot {id} is the one this command was unlocked with; pass --force to remove it anyway (the secret you used will stop working)"
                )));
            }
            slots.remove(&id);
            Ok(None)
        })
    }

    /// Replace a passphrase slot with one for `new` (one atomic key-state
    /// change): `slot` names it, else the slot this handle was unlocked
    /// with if it is a passphrase slot, else the only passphrase slot.
    /// Returns the new slot's id.
    pub fn change_passphrase(
        &mut self,
        slot: Option<&str>,
        new: &Passphrase,
        params: KdfParams,
    ) -> Result<String, VaultError> {
        params.validate().map_err(crypto_err)?;
        let target = self.passphrase_slot(slot)?;
        let sealed = seal(&self.keyring, &NewSlot::Passphrase(new, params))?;
        let name = slot_name(&sealed)?;
        let added = name.clone();
        let details = vec![format!("replaced keyslot {target} by {name}")];
        let unlock = Unlock::Passphrase(new);
        self.change_slots("passwd", details, move |_, slots, _| {
            // As `add_slot`: a passphrase that already opens a slot (this
            // one: the same passphrase again; or another) would leave one
            // secret in two slots, and a later change or removal of one
            // would not stop it.
            if let Some(id) = slots
                .iter()
                .find(|(_, bytes)| crypto::open_slot(bytes, &unlock).is_ok())
                .map(|(id, _)| id)
            {
                return Err(VaultError::Refused(if *id == target {
                    format!(
                        "that is the passphrase keyslot {id} already has; nothing was changed (choose a new one)"
                    )
                } else {
                    format!(
                        "that passphrase already opens keyslot {id}; nothing was changed (choose another passphrase, or remove keyslot {id} with `memvault key remove`)"
                    )
                }));
            }
            if slots.remove(&target).is_none() {
                return Err(VaultError::Refused(format!(
                    "keyslot {target} was removed meanwhile; nothing was changed"
                )));
            }
            slots.insert(name, sealed);
            Ok(None)
        })?;
        if self.unlocked_slot.is_some() {
            self.unlocked_slot = Some(added.clone());
        }
        Ok(added)
    }

    fn passphrase_slot(&self, slot: Option<&str>) -> Result<String, VaultError> {
        let entries = self.slots()?;
        let is_pass = |e: &&SlotEntry| matches!(e.kind, SlotKind::Passphrase(_));
        if let Some(id) = slot {
            let id = id.to_ascii_lowercase();
            return match entries.iter().find(|e| e.id == id) {
                Some(e) if is_pass(&e) => Ok(id),
                Some(_) => Err(VaultError::Refused(format!(
                    "keyslot {id} is a key-file slot, not a passphrase slot"
                ))),
                None => Err(VaultError::Refused(format!(
                    "this vault has no keyslot {id:?} (see `memvault key list`)"
                ))),
            };
        }
        if let Some(e) = entries.iter().filter(is_pass).find(|e| e.unlocked_with) {
            return Ok(e.id.clone());
        }
        // Unlocked with a slot that is gone now (another process's
        // `passwd`, `key remove` or `rekey` since this one unlocked): the
        // one passphrase slot left is not the one this secret opened, and
        // replacing it would lock out whoever set it.
        if let Some(id) = &self.unlocked_slot
            && !entries.iter().any(|e| &e.id == id)
        {
            return Err(VaultError::Refused(format!(
                "keyslot {id}, which this command was unlocked with, was replaced or removed by another process meanwhile; nothing was changed"
            )));
        }
        let pass: Vec<_> = entries.iter().filter(is_pass).collect();
        match pass.as_slice() {
            [one] => Ok(one.id.clone()),
            [] => Err(VaultError::Refused(
                "this vault has no passphrase slot to change (add one with `memvault key add --new-passphrase-file FILE`)".into(),
            )),
            _ => Err(VaultError::Refused(
                "this vault has several passphrase slots: name one with --slot ID (see `memvault key list`)".into(),
            )),
        }
    }

    /// Start a new data-key epoch for future writes. `secret` must be the
    /// secret this handle was unlocked with: its slot is rewrapped around
    /// the new keyring (same kind and KDF parameters, new salt and id).
    /// Other slots cannot be rewrapped without their secrets: rekey
    /// refuses while any exist, unless `drop_others`, which removes them.
    pub fn rekey(
        &mut self,
        secret: &Unlock<'_>,
        drop_others: bool,
    ) -> Result<RekeyReport, VaultError> {
        let Some(unlocked) = self.unlocked_slot.clone() else {
            return Err(VaultError::Refused(
                "this handle does not know which keyslot unlocked it; open the vault with its secret and try again".into(),
            ));
        };
        let mut report = None;
        let details = vec!["new data-key epoch".to_string()];
        self.change_slots("rekey", details, |vault, slots, details| {
            let Some(bytes) = slots.get(&unlocked) else {
                return Err(VaultError::Refused(
                    "the keyslot this command was unlocked with was removed meanwhile; nothing was changed".into(),
                ));
            };
            // The secret must really open that slot: a mistake here would
            // lock the vault.
            let current = crypto::open_slot(bytes, secret).map_err(crypto_err)?;
            if current.current_epoch() != vault.keyring.current_epoch() {
                return Err(VaultError::Refused(
                    "the vault was rekeyed meanwhile; nothing was changed".into(),
                ));
            }
            let others: Vec<String> = slots.keys().filter(|k| **k != unlocked).cloned().collect();
            if !others.is_empty() && !drop_others {
                return Err(VaultError::Refused(format!(
                    "rekey can only rewrap the keyslot it was unlocked with; the vault also has {} other slot(s) ({}). Remove them first (`memvault key remove ID`) and add them back after the rekey, or pass --drop-other-slots; nothing was changed",
                    others.len(),
                    others.join(", ")
                )));
            }
            let mut keyring = vault.keyring.duplicate();
            if keyring.current_epoch() >= u32::from(u16::MAX) - 1 {
                return Err(VaultError::Refused(
                    "the keyring holds the most epochs it can".into(),
                ));
            }
            let epoch = keyring.add_epoch();
            let sealed = match (crypto::slot_info(bytes).map_err(crypto_err)?.kind, secret) {
                (SlotKind::Passphrase(params), Unlock::Passphrase(p)) => {
                    seal(&keyring, &NewSlot::Passphrase(p, params))?
                }
                (SlotKind::KeyFile, Unlock::KeyFile(k)) => seal(&keyring, &NewSlot::KeyFile(k))?,
                _ => return Err(VaultError::NoSlotOfKind),
            };
            let name = slot_name(&sealed)?;
            slots.clear();
            slots.insert(name.clone(), sealed);
            // What happened to every slot, as `key add`/`key remove` say it.
            details.push(format!("replaced keyslot {unlocked} by {name}"));
            for id in &others {
                details.push(format!("removed keyslot {id}"));
            }
            report = Some(RekeyReport {
                epoch,
                slot: name,
                dropped: others,
            });
            Ok(Some(keyring))
        })?;
        let report = report.expect("set by a successful change");
        self.unlocked_slot = Some(report.slot.clone());
        Ok(report)
    }

    /// Under the writer lock: let `edit` change a copy of the slots (and
    /// optionally return a new keyring, and add to `details`), then
    /// publish the new key state with a commit on main (`op`, `details`:
    /// what changed, slot ids, no secret), durably. On any failure the key
    /// state on disk is unchanged.
    fn change_slots(
        &mut self,
        op: &'static str,
        mut details: Vec<String>,
        edit: impl FnOnce(
            &Vault,
            &mut BTreeMap<String, Vec<u8>>,
            &mut Vec<String>,
        ) -> Result<Option<Keyring>, VaultError>,
    ) -> Result<(), VaultError> {
        self.with_writer_lock(|vault, tip| {
            let mut slots = vault.key_state.slots.clone();
            let keyring = edit(vault, &mut slots, &mut details)?;
            if slots.is_empty() {
                return Err(damaged("a key change left no keyslot"));
            }
            let change = KeyChange {
                slots: Some(slots),
                keyring,
                ..Default::default()
            };
            let meta = CommitMeta {
                details: std::mem::take(&mut details),
                ..vault.new_meta(op)
            };
            vault.publish_key_change(tip, change, meta)?;
            vault.sync_now()
        })
    }
}
