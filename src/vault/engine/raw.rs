//! Raw git objects as the engine moves them: kind, id and bytes, and the
//! one table of git's type codes (as packs and the write-ahead log store
//! them: commit 1, tree 2, blob 3, tag 4; nothing else is ever written,
//! and any other code is refused when read).

use git2::{ObjectType, Oid};

/// One git object with its bytes (a log record's, a pack entry's).
pub(crate) struct Object {
    pub kind: ObjectType,
    pub id: Oid,
    pub data: Vec<u8>,
}

/// The type code of a kind of object; None for the kinds no object is
/// stored as (`Any`).
pub(crate) fn type_code(kind: ObjectType) -> Option<u8> {
    match kind {
        ObjectType::Commit => Some(1),
        ObjectType::Tree => Some(2),
        ObjectType::Blob => Some(3),
        ObjectType::Tag => Some(4),
        _ => None,
    }
}

/// The kind of a type code; None for any other code.
pub(crate) fn code_type(code: u8) -> Option<ObjectType> {
    Some(match code {
        1 => ObjectType::Commit,
        2 => ObjectType::Tree,
        3 => ObjectType::Blob,
        4 => ObjectType::Tag,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_and_nothing_else_is_a_kind() {
        for code in 0..=255u8 {
            match code_type(code) {
                Some(kind) => assert_eq!(type_code(kind), Some(code)),
                None => assert!(!(1..=4).contains(&code)),
            }
        }
        assert_eq!(type_code(ObjectType::Any), None);
    }
}
