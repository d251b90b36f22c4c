//! [`Rev`], the id of a commit on a vault's history, as the rest of the
//! crate and library users see it: 20 bytes shown as 40 hex digits. It
//! wraps git's object id so that no git2 type appears in the vault's public
//! API; the vault converts at its boundary (`from_oid`, `oid`).

use std::fmt;
use std::str::FromStr;

use git2::Oid;

/// A revision: one commit on the vault's main branch (see
/// `memvault history`). Shown as 40 lowercase hex digits; [`Rev::short`]
/// gives the 12 that `history` prints.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rev(Oid);

/// A string that is not 40 hex digits, given where a [`Rev`] was expected
/// (to resolve a prefix or `HEAD~N`, see [`Vault::resolve_rev`](super::Vault::resolve_rev)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a revision id (40 hex digits)")]
pub struct ParseRevError(String);

impl Rev {
    pub(crate) fn from_oid(id: Oid) -> Rev {
        Rev(id)
    }

    pub(crate) fn oid(self) -> Oid {
        self.0
    }

    /// The id's 20 bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }

    /// The first 12 hex digits, as `history` shows them.
    pub fn short(&self) -> String {
        let mut hex = self.to_string();
        hex.truncate(12);
        hex
    }
}

impl fmt::Display for Rev {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for Rev {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Rev({})", self.0)
    }
}

impl FromStr for Rev {
    type Err = ParseRevError;

    /// Exactly 40 hex digits (either case); a prefix is not a `Rev`.
    fn from_str(s: &str) -> Result<Rev, ParseRevError> {
        if s.len() != 40 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ParseRevError(s.to_string()));
        }
        Oid::from_str(s)
            .map(Rev)
            .map_err(|_| ParseRevError(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::Rev;

    #[test]
    fn rev_round_trips_through_hex_and_refuses_prefixes() {
        let hex = "0123456789abcdef0123456789abcdef01234567";
        let rev: Rev = hex.parse().unwrap();
        assert_eq!(rev.to_string(), hex);
        assert_eq!(rev.short(), "0123456789ab");
        assert_eq!(rev.as_bytes().len(), 20);
        assert_eq!(hex.to_ascii_uppercase().parse::<Rev>().unwrap(), rev);
        for bad in [
            "",
            "0123",
            &hex[..39],
            &format!("{hex}0"),
            &hex.replace('a', "g"),
        ] {
            assert!(bad.parse::<Rev>().is_err(), "{bad}");
        }
    }
}
