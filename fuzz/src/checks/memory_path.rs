//! `MemoryPath::parse` never panics; what it accepts is canonical, stays
//! under `/memories`, keeps every documented limit and round-trips; what it
//! refuses gets a message with no raw control or invisible character.
//!
//! Input: a path, optionally followed by `0xFF` and a name for `join` (and
//! a third part for `rebase`). Each part is read as UTF-8 (lossy).

use memvault::memory::{MAX_DEPTH, MAX_PATH_BYTES, MAX_SEGMENT_BYTES, MemoryPath, ROOT};

pub fn check(data: &[u8]) {
    let mut parts = data.split(|&b| b == 0xFF);
    let path = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let name = parts.next().map(String::from_utf8_lossy);
    let other = parts.next().map(String::from_utf8_lossy);

    let Some(p) = parsed(&path) else { return };
    if let Some(name) = name
        && let Some(child) = joined(&p, &name)
    {
        assert_eq!(child.parent().as_ref(), Some(&p), "join({p}, {name:?})");
        assert_eq!(child.name(), Some(&*name), "join({p}, {name:?})");
        assert!(child.starts_with(&p) && !p.starts_with(&child));
        if let Some(other) = other.as_deref().and_then(parsed) {
            rebased(&child, &p, &other);
        }
    }
}

/// Parses `s` and checks everything a `MemoryPath` promises.
fn parsed(s: &str) -> Option<MemoryPath> {
    let p = match MemoryPath::parse(s) {
        Ok(p) => p,
        Err(e) => {
            assert_printable(&e.to_string());
            // The rule is stable: parsing again refuses for the same reason.
            assert_eq!(MemoryPath::parse(s).map_err(|e| e.rule()), Err(e.rule()));
            return None;
        }
    };
    let c = p.as_str();
    // Round trip: the input was the canonical form, or it plus one `/`.
    assert!(c == s || format!("{c}/") == s, "{s:?} parsed as {c:?}");
    // Canonical: parsing the canonical form gives the same path.
    let again = MemoryPath::parse(c).unwrap_or_else(|e| panic!("{c:?} does not re-parse: {e}"));
    assert_eq!(again, p);
    assert_eq!(again.as_str(), c);
    assert_eq!(c.parse::<MemoryPath>().ok().as_ref(), Some(&p));
    assert_eq!(p.to_string(), c);
    // Under /memories, with the documented shape and limits.
    assert!(c == ROOT || c.starts_with("/memories/"), "{c:?}");
    assert!(c.len() <= MAX_PATH_BYTES, "{c:?}");
    assert!(!c.ends_with('/') && !c.contains("//") && !c.contains('\\'));
    let segments: Vec<&str> = p.segments().collect();
    assert_eq!(segments.len(), p.depth());
    assert!(p.depth() <= MAX_DEPTH);
    assert_eq!(p.is_root(), segments.is_empty());
    for seg in &segments {
        assert!(!seg.is_empty() && *seg != "." && *seg != "..", "{c:?}");
        assert!(seg.len() <= MAX_SEGMENT_BYTES, "{c:?}");
        assert!(!seg.starts_with(' ') && !seg.ends_with(' '), "{c:?}");
    }
    assert!(
        c.chars().all(|ch| !forbidden(ch) && !look_alike(ch)),
        "{c:?}"
    );
    let lower = c.to_ascii_lowercase();
    assert!(!["%2e", "%2f", "%5c"].iter().any(|e| lower.contains(e)));
    // Parent, name and ancestors agree with the segments.
    match (p.parent(), p.name()) {
        (None, None) => assert!(p.is_root()),
        (Some(parent), Some(name)) => {
            assert_eq!(Some(name), segments.last().copied());
            assert_eq!(parent.depth() + 1, p.depth());
            assert_eq!(parent.join(name).as_ref(), Ok(&p));
            assert!(p.starts_with(&parent) && parent < p);
        }
        other => panic!("{c:?}: parent and name disagree: {other:?}"),
    }
    let ancestors: Vec<MemoryPath> = p.ancestors().collect();
    assert_eq!(ancestors.len(), p.depth());
    assert!(ancestors.last().is_none_or(MemoryPath::is_root));
    assert!(ancestors.iter().all(|a| p.starts_with(a)));
    Some(p)
}

/// `p.join(name)`: refused when `name` is not one valid segment.
fn joined(p: &MemoryPath, name: &str) -> Option<MemoryPath> {
    match p.join_new(name) {
        Ok(child) => {
            assert!(!name.is_empty() && !name.contains('/'));
            parsed(child.as_str())
        }
        Err(e) => {
            assert_printable(&e.to_string());
            None
        }
    }
}

/// Moving `path` from `from` to `to` keeps the part below `from`.
fn rebased(path: &MemoryPath, from: &MemoryPath, to: &MemoryPath) {
    let Some(moved) = path.rebase(from, to) else {
        return;
    };
    let moved = parsed(moved.as_str()).expect("a rebased path is valid");
    assert!(moved.starts_with(to));
    assert_eq!(moved.rebase(to, from).as_ref(), Some(path));
}

/// What a canonical path never holds: controls, the Unicode format
/// characters memvault refuses, and the line/paragraph separators.
fn forbidden(ch: char) -> bool {
    ch.is_control()
        || matches!(
            ch,
            '\u{AD}'
                | '\u{600}'..='\u{605}'
                | '\u{61C}'
                | '\u{6DD}'
                | '\u{70F}'
                | '\u{180E}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{206F}'
                | '\u{FEFF}'
                | '\u{FFF9}'..='\u{FFFB}'
                | '\u{E0001}'
                | '\u{E0020}'..='\u{E007F}'
                // invisible though not `Cf`: fillers, variation selectors
                | '\u{115F}'..='\u{1160}'
                | '\u{3164}'
                | '\u{FFA0}'
                // (U+FE0E and U+FE0F are kept after the emoji they select)
                | '\u{FE00}'..='\u{FE0D}'
                | '\u{E0100}'..='\u{E01EF}'
        )
}

/// Drawn like a space or a slash in an accepted name.
fn look_alike(ch: char) -> bool {
    matches!(
        ch,
        '\u{A0}' | '\u{2000}'
            ..='\u{200A}' | '\u{3000}' | '\u{2800}' | '\u{2215}' | '\u{2044}' | '\u{FF0F}'
    )
}

/// A message Claude reads: no raw control, format or separator character.
fn assert_printable(message: &str) {
    assert!(
        message.chars().all(|ch| !forbidden(ch)),
        "unsafe character in message: {message:?}"
    );
}
