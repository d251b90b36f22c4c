//! [`MemoryPath`]: the only way to hold a validated memory path.
//!
//! Every command path goes through [`MemoryPath::parse`] before anything is
//! read or written. A path that breaks a rule is refused with a
//! [`PathError`] naming that rule; it is never "resolved" or repaired, so
//! `..`, encoded separators or look-alike characters cannot reach outside
//! `/memories` or alias another path.
//!
//! # What a `MemoryPath` promises
//!
//! - It is `/memories` or `/memories/` followed by one or more segments
//!   separated by single `/`, with no trailing `/` (the canonical form).
//! - No segment is empty, `.` or `..`; no character is a backslash, a
//!   control character (Unicode `Cc`), a format character (Unicode `Cf`:
//!   bidi controls, zero-width characters, the BOM, tags, …) or U+2028 /
//!   U+2029; no percent-encoded dot, slash or backslash appears, even after
//!   decoding `%25` any number of times.
//! - It is in Unicode NFC, so two spellings of one name cannot coexist.
//! - It is at most [`MAX_PATH_BYTES`] bytes long, at most [`MAX_DEPTH`]
//!   segments below `/memories`, each segment at most [`MAX_SEGMENT_BYTES`]
//!   bytes (the cap of the vault's name encryption).
//!
//! # Limits
//!
//! Validation is purely lexical. It does not know which paths exist, and it
//! accepts names other systems might dislike (trailing dots, names that
//! differ only in case, `node_modules`, names starting with `.`): the
//! store is not a file system, so those are harmless here. A plain `%` is
//! kept verbatim (`100%.txt`); paths are never URL-decoded.
//!
//! What displays as nothing or as a separator is refused, so a listing
//! cannot show two names alike: the rest of Unicode's default-ignorable
//! characters (variation selectors, Hangul fillers; an emoji's
//! presentation selector right after a symbol, as in `❤️`, is kept),
//! spaces other than U+0020 and the braille blank, slash and backslash
//! look-alikes (`∕`, `⁄`, `／`), a name made of dots and dot look-alikes
//! (`‥`, `٠٠`) or of dots under combining marks, a name that begins or
//! ends with a space (or is only spaces), and a name that begins with a
//! combining mark. These rules are for names being made ([`MemoryPath::parse`]);
//! [`MemoryPath::parse_stored`] takes names a vault already holds. Letters that resemble others in another
//! script (Cyrillic `о` for Latin `o`) are not refused.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use unicode_normalization::char::is_combining_mark;
use unicode_normalization::{UnicodeNormalization, is_nfc};

/// The root of every memory path.
pub const ROOT: &str = "/memories";
/// Most bytes a canonical path may have (UTF-8).
pub const MAX_PATH_BYTES: usize = 1024;
/// Most segments a path may have below `/memories`.
pub const MAX_DEPTH: usize = 20;
/// Most bytes one segment (file or directory name) may have (UTF-8).
pub const MAX_SEGMENT_BYTES: usize = 127;

/// A validated, canonical memory path (see the module docs for what it
/// promises).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct MemoryPath {
    path: String,
}

/// The rule a refused path broke, without its details (for tests and for
/// callers that branch on the reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PathRule {
    Empty,
    TooLong,
    ControlChar,
    FormatChar,
    LineSeparator,
    Backslash,
    Relative,
    OutsideRoot,
    EncodedSeparator,
    NotNfc,
    InvisibleChar,
    LookAlikeChar,
    BlankEdge,
    LeadingMark,
    EmptySegment,
    DotSegment,
    DotDotSegment,
    SegmentTooLong,
    TooDeep,
    NameContainsSlash,
}

/// Why a path was refused: one variant per rule. The `Display` text names
/// the rule and says what would work; Claude reads it.
///
/// Paths inside a variant are already made safe to print: control, format
/// and separator characters appear escaped as `\u{..}`, never raw.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("The path is empty. Use an absolute path under /memories, such as /memories/notes.md.")]
    Empty,
    #[error(
        "The path is not allowed: it is {len} bytes long, and a path may be at most 1024 bytes (UTF-8). Use shorter names or fewer directory levels."
    )]
    TooLong { len: usize },
    #[error(
        "The path {path} is not allowed: it contains the control character {}. Remove control characters (newline, tab, NUL and the like) from the path.",
        code_point(.ch)
    )]
    ControlChar { path: String, ch: char },
    #[error(
        "The path {path} is not allowed: it contains the invisible Unicode format character {} (a bidi control, zero-width character, byte order mark or similar), which can make a path look like another. Remove it and type the name plainly.",
        code_point(.ch)
    )]
    FormatChar { path: String, ch: char },
    #[error(
        "The path {path} is not allowed: it contains the Unicode line or paragraph separator {}. Remove it; a path is a single line.",
        code_point(.ch)
    )]
    LineSeparator { path: String, ch: char },
    #[error(
        "The path {path} is not allowed: it contains a backslash (`\\`). Separate names with `/`; backslashes are not allowed in names."
    )]
    Backslash { path: String },
    #[error(
        "The path {path} is not allowed: it is not absolute. Use an absolute path that starts with /memories/, such as /memories/notes.md."
    )]
    Relative { path: String },
    #[error(
        "The path {path} is not allowed: it is outside the memory directory. Every path must be /memories or start with /memories/ (lowercase), such as /memories/notes.md."
    )]
    OutsideRoot { path: String },
    #[error(
        "The path {path} is not allowed: it contains a percent-encoded dot, slash or backslash (`%2e`, `%2f` or `%5c`, also double-encoded as `%252e` and the like). Paths are never URL-decoded: write names plainly, such as /memories/notes.md, without `.` or `..` segments."
    )]
    EncodedSeparator { path: String },
    #[error(
        "The path {path} is not allowed: it is not in Unicode normalization form C (NFC). Use the composed form of the same path: {nfc}"
    )]
    NotNfc { path: String, nfc: String },
    #[error(
        "The path {path} is not allowed: it contains {}, which displays as nothing and can make a name look like another. Remove it and type the name plainly.",
        invisible_kind(.ch)
    )]
    InvisibleChar { path: String, ch: char },
    #[error(
        "The path {path} is not allowed: it contains {}. {}",
        look_alike_kind(.ch).0,
        look_alike_kind(.ch).1
    )]
    LookAlikeChar { path: String, ch: char },
    #[error(
        "The path {path} is not allowed: a name in it begins or ends with a space, or is only spaces, so it looks like another name in a listing. Remove the spaces at the edges of each name."
    )]
    BlankEdge { path: String },
    #[error(
        "The path {path} is not allowed: a name in it begins with the combining mark {}, which joins the character before it (the `/`) and hides where the name starts. Put the mark after a letter, or remove it.",
        code_point(.ch)
    )]
    LeadingMark { path: String, ch: char },
    #[error(
        "The path {path} is not allowed: it contains an empty segment (`//`). Separate names with a single `/` (one trailing `/` is allowed)."
    )]
    EmptySegment { path: String },
    #[error(
        "The path {path} is not allowed: it contains a `.` segment. Use an absolute path under /memories without `.` or `..` segments."
    )]
    DotSegment { path: String },
    #[error(
        "The path {path} is not allowed: it contains a `..` segment. Use an absolute path under /memories without `.` or `..` segments."
    )]
    DotDotSegment { path: String },
    #[error(
        "The path {path} is not allowed: one of its names is {len} bytes long, and a file or directory name may be at most 127 bytes (UTF-8). Use a shorter name."
    )]
    SegmentTooLong { path: String, len: usize },
    #[error(
        "The path {path} is not allowed: it is {depth} levels below /memories, and at most 20 are allowed. Use a flatter directory structure."
    )]
    TooDeep { path: String, depth: usize },
    #[error(
        "The name {name} is not allowed: it contains `/`, and a name is a single path segment. Give one name at a time."
    )]
    NameContainsSlash { name: String },
}

impl PathError {
    /// The rule this error reports.
    pub fn rule(&self) -> PathRule {
        match self {
            PathError::Empty => PathRule::Empty,
            PathError::TooLong { .. } => PathRule::TooLong,
            PathError::ControlChar { .. } => PathRule::ControlChar,
            PathError::FormatChar { .. } => PathRule::FormatChar,
            PathError::LineSeparator { .. } => PathRule::LineSeparator,
            PathError::Backslash { .. } => PathRule::Backslash,
            PathError::Relative { .. } => PathRule::Relative,
            PathError::OutsideRoot { .. } => PathRule::OutsideRoot,
            PathError::EncodedSeparator { .. } => PathRule::EncodedSeparator,
            PathError::NotNfc { .. } => PathRule::NotNfc,
            PathError::InvisibleChar { .. } => PathRule::InvisibleChar,
            PathError::LookAlikeChar { .. } => PathRule::LookAlikeChar,
            PathError::BlankEdge { .. } => PathRule::BlankEdge,
            PathError::LeadingMark { .. } => PathRule::LeadingMark,
            PathError::EmptySegment { .. } => PathRule::EmptySegment,
            PathError::DotSegment { .. } => PathRule::DotSegment,
            PathError::DotDotSegment { .. } => PathRule::DotDotSegment,
            PathError::SegmentTooLong { .. } => PathRule::SegmentTooLong,
            PathError::TooDeep { .. } => PathRule::TooDeep,
            PathError::NameContainsSlash { .. } => PathRule::NameContainsSlash,
        }
    }
}

fn code_point(ch: &char) -> String {
    format!("U+{:04X}", u32::from(*ch))
}

/// `Cc`: C0 controls, DEL and C1 controls.
fn is_control(c: char) -> bool {
    matches!(c, '\u{0}'..='\u{1F}' | '\u{7F}'..='\u{9F}')
}

/// Unicode general category `Cf` (format characters), as of Unicode 15.
fn is_format(c: char) -> bool {
    matches!(
        c,
        '\u{AD}'
            | '\u{600}'..='\u{605}'
            | '\u{61C}'
            | '\u{6DD}'
            | '\u{70F}'
            | '\u{890}'..='\u{891}'
            | '\u{8E2}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{206F}'
            | '\u{FEFF}'
            | '\u{FFF9}'..='\u{FFFB}'
            | '\u{110BD}'
            | '\u{110CD}'
            | '\u{13430}'..='\u{1343F}'
            | '\u{1BCA0}'..='\u{1BCA3}'
            | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0001}'
            | '\u{E0020}'..='\u{E007F}'
    )
}

/// Characters that display as nothing but are not `Cf`: the rest of
/// Unicode's `Default_Ignorable_Code_Point` (variation selectors, Hangul
/// fillers, the combining grapheme joiner, Mongolian free variation
/// selectors, Khmer inherent vowels, and the unassigned ignorable ranges).
fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{34F}'
            | '\u{115F}'..='\u{1160}'
            | '\u{17B4}'..='\u{17B5}'
            | '\u{180B}'..='\u{180F}'
            | '\u{2065}'
            | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}'
            | '\u{FFA0}'
            | '\u{FFF0}'..='\u{FFF8}'
            | '\u{E0000}'..='\u{E0FFF}'
    )
}

fn invisible_kind(c: &char) -> String {
    let what = match *c {
        '\u{FE00}'..='\u{FE0F}' | '\u{E0100}'..='\u{E01EF}' | '\u{180B}'..='\u{180F}' => {
            "the variation selector"
        }
        '\u{115F}' | '\u{1160}' | '\u{3164}' | '\u{FFA0}' => "the Hangul filler",
        _ => "the invisible character",
    };
    format!("{what} {}", code_point(c))
}

/// Characters drawn like a space, a slash or a backslash that are none of
/// them: in a name they make it look like another path (`a∕b` like
/// `a/b`). Plain spaces are allowed inside a name; other spaces are
/// refused. Dot leaders are refused only in a name made of dots
/// ([`is_dot_like`]).
fn is_look_alike(c: char) -> bool {
    matches!(
        look_alike_class(c),
        Some(LookAlike::Space | LookAlike::Slash | LookAlike::Backslash)
    )
}

fn is_dot_like(c: char) -> bool {
    matches!(look_alike_class(c), Some(LookAlike::Dots))
}

#[derive(Clone, Copy)]
enum LookAlike {
    Space,
    Slash,
    Backslash,
    Dots,
}

fn look_alike_class(c: char) -> Option<LookAlike> {
    Some(match c {
        '\u{A0}'
        | '\u{1680}'
        | '\u{2000}'..='\u{200A}'
        | '\u{202F}'
        | '\u{205F}'
        | '\u{3000}'
        | '\u{2800}' => LookAlike::Space,
        '\u{2044}' | '\u{2215}' | '\u{2571}' | '\u{27CB}' | '\u{29F8}' | '\u{FF0F}'
        | '\u{1735}' | '\u{2CC6}' | '\u{3033}' | '\u{2F03}' | '\u{31D3}' | '\u{1D23A}' => {
            LookAlike::Slash
        }
        '\u{2216}' | '\u{2572}' | '\u{27CD}' | '\u{29F5}' | '\u{29F9}' | '\u{FE68}'
        | '\u{FF3C}' => LookAlike::Backslash,
        '\u{2024}' | '\u{2025}' | '\u{2026}' | '\u{FF0E}' | '\u{FE52}' | '\u{A4F8}'
        | '\u{0660}' | '\u{06F0}' | '\u{0701}' | '\u{0702}' | '\u{00B7}' | '\u{2027}'
        | '\u{2219}' | '\u{22C5}' | '\u{30FB}' | '\u{FF65}' | '\u{2E31}' => LookAlike::Dots,
        _ => return None,
    })
}

fn look_alike_kind(c: &char) -> (String, &'static str) {
    let cp = code_point(c);
    match look_alike_class(*c) {
        Some(LookAlike::Space) => (
            format!("the space-like character {cp}, which looks like a plain space"),
            "Use a plain space (U+0020) or another name.",
        ),
        Some(LookAlike::Slash) => (
            format!("the slash-like character {cp}, which looks like the `/` between names"),
            "Use `/` to separate names, or another name.",
        ),
        Some(LookAlike::Backslash) => (
            format!("the backslash-like character {cp}"),
            "Use `/` to separate names, or another name.",
        ),
        _ => (
            format!("{cp} in a name that looks like `.` or `..`"),
            "Give the name a letter or digit.",
        ),
    }
}

fn is_line_separator(c: char) -> bool {
    matches!(c, '\u{2028}' | '\u{2029}')
}

/// Whether `label` (a session id, an actor or a machine name) is fit to
/// store and print: 1 to 128 bytes, with no control, invisible format
/// (bidi control, zero-width, ...) or line-separator character, the
/// characters a path refuses too.
///
/// No space at either end either: HTTP drops those from a header value,
/// so such a label could not be given the same way through a server.
pub fn is_plain_label(label: &str) -> bool {
    !label.is_empty()
        && label.len() <= 128
        && label.trim() == label
        && label.chars().all(is_plain_char)
}

/// Whether `label` may be given now, for memvault to record: a plain
/// label ([`is_plain_label`]) without two spaces in a row, which `history`
/// and `sessions` separate their columns with (such a label could pass for
/// more columns: an operator's revert, say). Labels stored before this
/// rule (a machine's name, say) are still read as they are.
pub fn is_new_label(label: &str) -> bool {
    is_plain_label(label) && !label.contains("  ")
}

/// The session ids memvault's own commits carry (`init`, `migrate`,
/// `sync`, `keys`) and the actor they name (`memvault`): a session or
/// actor a client gives may not be one of them, or its changes would be
/// listed as memvault's own (`sessions` counts them with the vault's
/// creation, say).
pub fn is_reserved_label(session: Option<&str>, actor: &str) -> bool {
    session.is_some_and(|s| matches!(s, "init" | "migrate" | "sync" | "keys"))
        || actor == "memvault"
}

/// A character a label may hold (see [`is_plain_label`]).
pub fn is_plain_char(c: char) -> bool {
    !(is_control(c) || is_format(c) || is_invisible(c) || is_line_separator(c))
}

/// Makes `s` safe to put in a message: control, format and line-separator
/// characters become `\u{..}` escapes; everything else is kept.
pub(crate) fn shown(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if is_control(c) || is_format(c) || is_invisible(c) || is_line_separator(c) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

/// True when `s` holds `%2e`, `%2f` or `%5c` (any case), their overlong
/// UTF-8 forms (`%c0%ae`, `%c0%af`, `%c1%9c`) or `%u002e`-style escapes,
/// also after percent-decoding it any number of times (`%252e`, and
/// `%25%32%65`, where every character of `%2e` is encoded).
fn has_encoded_separator(s: &str) -> bool {
    const NEEDLES: [&[u8]; 9] = [
        b"%2e", b"%2f", b"%5c", b"%c0%ae", b"%c0%af", b"%c1%9c", b"%u002e", b"%u002f", b"%u005c",
    ];
    if !s.contains('%') {
        return false;
    }
    let mut cur = s.as_bytes().to_ascii_lowercase();
    loop {
        if NEEDLES
            .iter()
            .any(|n| cur.windows(n.len()).any(|w| w == *n))
        {
            return true;
        }
        // One round of decoding: each `%` and two hex digits to its byte
        // (each round shortens the text, so this ends).
        let mut next = Vec::with_capacity(cur.len());
        let mut i = 0;
        while i < cur.len() {
            let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
            match (
                cur[i],
                cur.get(i + 1).and_then(|&c| hex(c)),
                cur.get(i + 2).and_then(|&c| hex(c)),
            ) {
                (b'%', Some(h), Some(l)) => {
                    next.push((h << 4 | l).to_ascii_lowercase());
                    i += 3;
                }
                (c, _, _) => {
                    next.push(c);
                    i += 1;
                }
            }
        }
        if next.len() == cur.len() {
            return false;
        }
        cur = next;
    }
}

impl MemoryPath {
    /// `/memories` itself.
    pub fn root() -> MemoryPath {
        MemoryPath {
            path: ROOT.to_owned(),
        }
    }

    /// Validates `s` and returns its canonical form. The checks run in a
    /// fixed order (emptiness, total length, characters, root prefix,
    /// percent-encoding, NFC, segments, depth) and the first rule broken is
    /// reported.
    pub fn parse(s: &str) -> Result<MemoryPath, PathError> {
        MemoryPath::parse_with(s, true)
    }

    /// [`MemoryPath::parse`] for a path the vault already holds, or one an
    /// operator names on the command line: every rule but those added
    /// against look-alike names (invisible fillers and selectors,
    /// look-alikes of a space, `/`, `\` or `..`, spaces at a name's
    /// edges, a leading combining mark), which keep an agent from making
    /// such a name. A name an older memvault stored before those rules
    /// stays readable, listed, and reachable by `history`, `show`,
    /// `restore`, `purge`, and by the deletion or renaming of its folder.
    pub fn parse_stored(s: &str) -> Result<MemoryPath, PathError> {
        MemoryPath::parse_with(s, false)
    }

    fn parse_with(s: &str, new_rules: bool) -> Result<MemoryPath, PathError> {
        if s.is_empty() {
            return Err(PathError::Empty);
        }
        let measured = match s.strip_suffix('/') {
            Some(t) if !t.is_empty() => t.len(),
            _ => s.len(),
        };
        if measured > MAX_PATH_BYTES {
            return Err(PathError::TooLong { len: measured });
        }
        for ch in s.chars() {
            if is_control(ch) {
                return Err(PathError::ControlChar { path: shown(s), ch });
            }
            if is_format(ch) {
                return Err(PathError::FormatChar { path: shown(s), ch });
            }
            if is_line_separator(ch) {
                return Err(PathError::LineSeparator { path: shown(s), ch });
            }
            if ch == '\\' {
                // Later characters are unchecked yet: escape them too.
                return Err(PathError::Backslash { path: shown(s) });
            }
        }
        if !s.starts_with('/') {
            return Err(PathError::Relative { path: s.to_owned() });
        }
        let rest = match s {
            "/memories" | "/memories/" => return Ok(MemoryPath::root()),
            _ => match s.strip_prefix("/memories/") {
                Some(rest) => rest,
                None => return Err(PathError::OutsideRoot { path: s.to_owned() }),
            },
        };
        if has_encoded_separator(s) {
            return Err(PathError::EncodedSeparator { path: s.to_owned() });
        }
        if !is_nfc(s) {
            return Err(PathError::NotNfc {
                path: s.to_owned(),
                nfc: shown(&s.nfc().collect::<String>()),
            });
        }
        let mut prev = '/';
        let new_chars = if new_rules { rest } else { "" };
        for ch in new_chars.chars() {
            // An emoji's presentation selector (`❤️`: U+2764 U+FE0F, which
            // phones put in) right after the symbol it selects is kept.
            let selects = matches!(ch, '\u{FE0E}' | '\u{FE0F}')
                && !prev.is_ascii()
                && !is_combining_mark(prev)
                && !is_invisible(prev);
            if is_invisible(ch) && !selects {
                return Err(PathError::InvisibleChar { path: shown(s), ch });
            }
            prev = ch;
            if is_look_alike(ch) {
                return Err(PathError::LookAlikeChar { path: shown(s), ch });
            }
        }
        // A name of dots and dot leaders (`‥`, `．．`), or of dots under
        // combining marks (`..̣`), reads as `.` or `..`.
        for segment in new_chars.split('/') {
            let bases: Vec<char> = segment.chars().filter(|c| !is_combining_mark(*c)).collect();
            let odd = segment
                .chars()
                .find(|c| is_dot_like(*c) || is_combining_mark(*c));
            if let Some(ch) = odd
                && !bases.is_empty()
                && bases.iter().all(|&c| c == '.' || is_dot_like(c))
            {
                return Err(PathError::LookAlikeChar { path: shown(s), ch });
            }
        }
        // One trailing `/` is allowed and ignored; a second one leaves an
        // empty segment and is refused below.
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let mut depth = 0usize;
        for segment in rest.split('/') {
            depth += 1;
            match segment {
                "" => return Err(PathError::EmptySegment { path: s.to_owned() }),
                "." => return Err(PathError::DotSegment { path: s.to_owned() }),
                ".." => return Err(PathError::DotDotSegment { path: s.to_owned() }),
                _ if segment.len() > MAX_SEGMENT_BYTES => {
                    return Err(PathError::SegmentTooLong {
                        path: s.to_owned(),
                        len: segment.len(),
                    });
                }
                _ if new_rules && (segment.starts_with(' ') || segment.ends_with(' ')) => {
                    return Err(PathError::BlankEdge { path: s.to_owned() });
                }
                _ => {}
            }
            if let Some(ch) = segment
                .chars()
                .next()
                .filter(|c| new_rules && is_combining_mark(*c))
            {
                return Err(PathError::LeadingMark { path: shown(s), ch });
            }
        }
        if depth > MAX_DEPTH {
            return Err(PathError::TooDeep {
                path: s.to_owned(),
                depth,
            });
        }
        Ok(MemoryPath {
            path: [ROOT, "/", rest].concat(),
        })
    }

    /// The canonical form: `/memories` or `/memories/a/b`.
    pub fn as_str(&self) -> &str {
        &self.path
    }

    /// True for `/memories` itself.
    pub fn is_root(&self) -> bool {
        self.path.len() == ROOT.len()
    }

    /// The segments below `/memories` (none for the root).
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        // "" for the root, "/a/b" otherwise; the first split piece is "".
        let rest = self.path.get(ROOT.len()..).unwrap_or("");
        rest.split('/').skip(1)
    }

    /// How many segments lie below `/memories` (0 for the root).
    pub fn depth(&self) -> usize {
        self.segments().count()
    }

    /// The parent directory, `None` for the root.
    pub fn parent(&self) -> Option<MemoryPath> {
        if self.is_root() {
            return None;
        }
        let cut = self.path.rfind('/')?;
        Some(MemoryPath {
            path: self.path.get(..cut)?.to_owned(),
        })
    }

    /// The last segment, `None` for the root.
    pub fn name(&self) -> Option<&str> {
        if self.is_root() {
            return None;
        }
        let cut = self.path.rfind('/')?;
        self.path.get(cut + 1..)
    }

    /// The child `name` of this path, a name the vault holds (see
    /// [`MemoryPath::parse_stored`]). `name` must be one valid segment and
    /// the result must stay within the limits.
    pub fn join(&self, name: &str) -> Result<MemoryPath, PathError> {
        self.join_with(name, false)
    }

    /// [`MemoryPath::join`] of a name that is to be made (an imported
    /// file's): every rule of [`MemoryPath::parse`], where `join` takes a
    /// name as [`MemoryPath::parse_stored`] does (a name the vault holds).
    pub fn join_new(&self, name: &str) -> Result<MemoryPath, PathError> {
        self.join_with(name, true)
    }

    fn join_with(&self, name: &str, new_rules: bool) -> Result<MemoryPath, PathError> {
        if name.contains('/') {
            return Err(PathError::NameContainsSlash { name: shown(name) });
        }
        let candidate = [self.path.as_str(), "/", name].concat();
        if name.is_empty() {
            return Err(PathError::EmptySegment {
                path: shown(&candidate),
            });
        }
        MemoryPath::parse_with(&candidate, new_rules)
    }

    /// True when `other` is this path or one of its ancestors (compared by
    /// segments: `/memories/ab` does not start with `/memories/a`).
    pub fn starts_with(&self, other: &MemoryPath) -> bool {
        self.path == other.path
            || (self.path.starts_with(&other.path)
                && self.path.as_bytes().get(other.path.len()) == Some(&b'/'))
    }

    /// This path with its prefix `from` replaced by `to`; `None` when it
    /// does not start with `from` or the result would break a limit.
    pub fn rebase(&self, from: &MemoryPath, to: &MemoryPath) -> Option<MemoryPath> {
        if !self.starts_with(from) {
            return None;
        }
        let suffix = self.path.get(from.path.len()..)?;
        MemoryPath::parse_stored(&format!("{}{}", to.path, suffix)).ok()
    }

    /// The ancestors of this path, nearest first, ending with the root
    /// (empty for the root itself).
    pub fn ancestors(&self) -> impl Iterator<Item = MemoryPath> {
        std::iter::successors(self.parent(), MemoryPath::parent)
    }
}

impl fmt::Display for MemoryPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.path)
    }
}

impl fmt::Debug for MemoryPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("MemoryPath").field(&self.path).finish()
    }
}

/// Segment-wise order: a directory sorts before everything below it, and
/// everything below it sorts together.
impl Ord for MemoryPath {
    fn cmp(&self, other: &Self) -> Ordering {
        self.segments().cmp(other.segments())
    }
}

impl PartialOrd for MemoryPath {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl AsRef<str> for MemoryPath {
    fn as_ref(&self) -> &str {
        &self.path
    }
}

impl FromStr for MemoryPath {
    type Err = PathError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        MemoryPath::parse(s)
    }
}

impl TryFrom<&str> for MemoryPath {
    type Error = PathError;
    fn try_from(s: &str) -> Result<Self, Self::Error> {
        MemoryPath::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::PathRule::*;
    use super::*;

    fn long(prefix: &str, fill: &str, n: usize) -> String {
        format!("{prefix}{}", fill.repeat(n))
    }

    /// One line per hostile input and the rule it must break.
    fn hostile() -> Vec<(String, PathRule)> {
        let s = |x: &str| x.to_owned();
        vec![
            // empty and outside the root
            (s(""), Empty),
            (s("/"), OutsideRoot),
            (s("//"), OutsideRoot),
            (s("//memories"), OutsideRoot),
            (s("/memoriesX"), OutsideRoot),
            (s("/memoriesX/a"), OutsideRoot),
            (s("/memories-old/a"), OutsideRoot),
            (s("/memories_"), OutsideRoot),
            (s("/memories."), OutsideRoot),
            (s("/memories.."), OutsideRoot),
            (s("/memories../x"), OutsideRoot),
            (s("/memorie"), OutsideRoot),
            (s("/memorie/s"), OutsideRoot),
            (s("/Memories"), OutsideRoot),
            (s("/MEMORIES/a"), OutsideRoot),
            (s("/mémories/a"), OutsideRoot),
            (s("/ memories"), OutsideRoot),
            (s("/etc/passwd"), OutsideRoot),
            (s("/tmp/memories/a"), OutsideRoot),
            (s("/memories%2f..%2fetc"), OutsideRoot),
            (s("/memories%2F"), OutsideRoot),
            (s("/memories "), OutsideRoot),
            // relative
            (s("memories"), Relative),
            (s("memories/a"), Relative),
            (s("./memories/a"), Relative),
            (s("../memories/a"), Relative),
            (s("."), Relative),
            (s(".."), Relative),
            (s("a"), Relative),
            (s(" /memories"), Relative),
            (s("~/memories"), Relative),
            (s("%2fmemories/a"), Relative),
            (s("file:///memories/a"), Relative),
            // `..` in every position
            (s("/memories/.."), DotDotSegment),
            (s("/memories/../"), DotDotSegment),
            (s("/memories/../x"), DotDotSegment),
            (s("/memories/../../secrets.env"), DotDotSegment),
            (s("/memories/a/.."), DotDotSegment),
            (s("/memories/a/../"), DotDotSegment),
            (s("/memories/a/../b"), DotDotSegment),
            (s("/memories/a/b/../../.."), DotDotSegment),
            (s("/memories/a/../../etc/passwd"), DotDotSegment),
            (s("/memories/.../.."), DotDotSegment),
            (s("/memories/a/b/c/.."), DotDotSegment),
            (s("/memories/../memories"), DotDotSegment),
            // `.`
            (s("/memories/."), DotSegment),
            (s("/memories/./"), DotSegment),
            (s("/memories/./x"), DotSegment),
            (s("/memories/a/."), DotSegment),
            (s("/memories/a/./"), DotSegment),
            (s("/memories/a/./b"), DotSegment),
            (s("/memories/./../x"), DotSegment),
            // empty segments
            (s("/memories//"), EmptySegment),
            (s("/memories///"), EmptySegment),
            (s("/memories//a"), EmptySegment),
            (s("/memories/a//b"), EmptySegment),
            (s("/memories/a//"), EmptySegment),
            (s("/memories/a///"), EmptySegment),
            (s("/memories//../x"), EmptySegment),
            // backslashes
            (s("/memories/..\\x"), Backslash),
            (s("/memories\\..\\x"), Backslash),
            (s("\\memories\\x"), Backslash),
            (s("/memories/a\\b"), Backslash),
            (s("/memories/\\"), Backslash),
            (s("/memories/a\\"), Backslash),
            (s("C:\\memories"), Backslash),
            (s("..\\..\\etc"), Backslash),
            (s("/memories/a\\b\n\u{202e}"), Backslash),
            // percent-encoded dot, slash, backslash, in every case mix
            (s("/memories/%2e%2e/x"), EncodedSeparator),
            (s("/memories/%2E%2E/x"), EncodedSeparator),
            (s("/memories/%2e%2E/x"), EncodedSeparator),
            (s("/memories/%2E%2e"), EncodedSeparator),
            (s("/memories/%2e./x"), EncodedSeparator),
            (s("/memories/.%2e/x"), EncodedSeparator),
            (s("/memories/%2e"), EncodedSeparator),
            (s("/memories/a%2eb"), EncodedSeparator),
            (s("/memories/a%2fb"), EncodedSeparator),
            (s("/memories/a%2Fb"), EncodedSeparator),
            (s("/memories/..%2fx"), EncodedSeparator),
            (s("/memories/%2f"), EncodedSeparator),
            (s("/memories/a%5cb"), EncodedSeparator),
            (s("/memories/a%5Cb"), EncodedSeparator),
            (s("/memories/..%5c..%5cx"), EncodedSeparator),
            // double- and triple-encoded
            (s("/memories/%252e%252e/x"), EncodedSeparator),
            (s("/memories/%252E%252E"), EncodedSeparator),
            (s("/memories/%252f"), EncodedSeparator),
            (s("/memories/%252F"), EncodedSeparator),
            (s("/memories/a%255cb"), EncodedSeparator),
            (s("/memories/a%255Cb"), EncodedSeparator),
            (s("/memories/%25252e"), EncodedSeparator),
            (s("/memories/%25252F"), EncodedSeparator),
            (s("/memories/%2525252f"), EncodedSeparator),
            (s("/memories/%2525255C"), EncodedSeparator),
            (s("/memories/%25%32%65"), EncodedSeparator),
            (s("/memories/%25%32%46"), EncodedSeparator),
            (s("/memories/a%25%35%63b"), EncodedSeparator),
            (s("/memories/%C0%AE%C0%AE"), EncodedSeparator),
            (s("/memories/%u002e%u002e"), EncodedSeparator),
            // control characters (Cc): C0, DEL, C1
            (s("\0"), ControlChar),
            (s("/memories/a\0b"), ControlChar),
            (s("/memories\0/x"), ControlChar),
            (s("/memories/a\u{1}"), ControlChar),
            (s("/memories/a\tb"), ControlChar),
            (s("/memories/a\n"), ControlChar),
            (s("/memories/\nb"), ControlChar),
            (s("/memories/a\rb"), ControlChar),
            (s("/memories/\u{b}"), ControlChar),
            (s("/memories/\u{c}"), ControlChar),
            (s("/memories/\u{1b}[31m"), ControlChar),
            (s("/memories/\u{1f}"), ControlChar),
            (s("/memories/\u{7f}"), ControlChar),
            (s("/memories/\u{80}"), ControlChar),
            (s("/memories/\u{85}"), ControlChar),
            (s("/memories/\u{9b}"), ControlChar),
            (s("/memories/\u{9f}"), ControlChar),
            // format characters (Cf): bidi, zero-width, BOM, tags, ...
            (s("/memories/\u{202e}txt.exe"), FormatChar),
            (s("/memories/a\u{202a}"), FormatChar),
            (s("/memories/a\u{202b}"), FormatChar),
            (s("/memories/a\u{202c}"), FormatChar),
            (s("/memories/a\u{202d}"), FormatChar),
            (s("/memories/a\u{2066}"), FormatChar),
            (s("/memories/a\u{2067}"), FormatChar),
            (s("/memories/a\u{2068}"), FormatChar),
            (s("/memories/a\u{2069}"), FormatChar),
            (s("/memories/a\u{200b}"), FormatChar),
            (s("/memories/a\u{200c}"), FormatChar),
            (s("/memories/a\u{200d}"), FormatChar),
            (s("/memories/a\u{200e}"), FormatChar),
            (s("/memories/a\u{200f}"), FormatChar),
            (s("/memories/a\u{2060}"), FormatChar),
            (s("/memories/a\u{2064}"), FormatChar),
            (s("/memories/a\u{206f}"), FormatChar),
            (s("\u{feff}/memories/a"), FormatChar),
            (s("/memories/\u{feff}a"), FormatChar),
            (s("/memories/soft\u{ad}hyphen"), FormatChar),
            (s("/memories/\u{600}"), FormatChar),
            (s("/memories/\u{61c}"), FormatChar),
            (s("/memories/\u{6dd}"), FormatChar),
            (s("/memories/\u{70f}"), FormatChar),
            (s("/memories/\u{890}"), FormatChar),
            (s("/memories/\u{8e2}"), FormatChar),
            (s("/memories/\u{180e}"), FormatChar),
            (s("/memories/\u{fff9}"), FormatChar),
            (s("/memories/\u{fffb}"), FormatChar),
            (s("/memories/\u{110bd}"), FormatChar),
            (s("/memories/\u{110cd}"), FormatChar),
            (s("/memories/\u{13430}"), FormatChar),
            (s("/memories/\u{1343f}"), FormatChar),
            (s("/memories/\u{1bca0}"), FormatChar),
            (s("/memories/\u{1d173}"), FormatChar),
            (s("/memories/\u{e0001}"), FormatChar),
            (s("/memories/\u{e0020}"), FormatChar),
            (s("/memories/\u{e007f}"), FormatChar),
            (s("/memo\u{200b}ries/a"), FormatChar),
            (s("/memories/.\u{200b}."), FormatChar),
            // invisible though not `Cf`: fillers, variation selectors
            (s("/memories/\u{3164}"), InvisibleChar),
            (s("/memories/\u{115f}.md"), InvisibleChar),
            (s("/memories/a\u{1160}"), InvisibleChar),
            (s("/memories/\u{ffa0}/x"), InvisibleChar),
            (s("/memories/notes\u{fe0f}.md"), InvisibleChar),
            (s("/memories/a\u{e0100}"), InvisibleChar),
            (s("/memories/a\u{34f}b"), InvisibleChar),
            (s("/memories/a\u{180b}"), InvisibleChar),
            // look-alikes of a space, a slash, a backslash, `..`
            (s("/memories/\u{2800}"), LookAlikeChar),
            (s("/memories/a\u{a0}b"), LookAlikeChar),
            (s("/memories/\u{3000}"), LookAlikeChar),
            (s("/memories/a\u{2009}b.md"), LookAlikeChar),
            (s("/memories/a\u{2215}b"), LookAlikeChar),
            (s("/memories/..\u{2215}etc"), LookAlikeChar),
            (s("/memories/a\u{2044}b"), LookAlikeChar),
            (s("/memories/a\u{ff0f}b"), LookAlikeChar),
            (s("/memories/a\u{29f8}b"), LookAlikeChar),
            (s("/memories/a\u{2216}b"), LookAlikeChar),
            (s("/memories/a\u{ff3c}b"), LookAlikeChar),
            (s("/memories/\u{2025}"), LookAlikeChar),
            (s("/memories/\u{2024}\u{2024}/x"), LookAlikeChar),
            (s("/memories/.\u{2024}"), LookAlikeChar),
            (s("/memories/\u{ff0e}\u{ff0e}"), LookAlikeChar),
            (s("/memories/\u{2026}"), LookAlikeChar),
            (s("/memories/a/..\u{307}/b"), LookAlikeChar),
            (s("/memories/.\u{323}"), LookAlikeChar),
            (s("/memories/\u{a4f8}\u{a4f8}"), LookAlikeChar),
            (s("/memories/\u{660}\u{660}"), LookAlikeChar),
            (s("/memories/\u{701}\u{701}"), LookAlikeChar),
            (s("/memories/a\u{31d3}b"), LookAlikeChar),
            (s("/memories/a\u{1d23a}b"), LookAlikeChar),
            (s("/memories/a\u{fe0f}"), InvisibleChar),
            (s("/memories/\u{2764}\u{fe0f}\u{fe0f}"), InvisibleChar),
            // spaces at a name's edges, or only spaces
            (s("/memories/ "), BlankEdge),
            (s("/memories/   /x"), BlankEdge),
            (s("/memories/notes.md "), BlankEdge),
            (s("/memories/ notes.md"), BlankEdge),
            (s("/memories/a /b"), BlankEdge),
            (s("/memories/a/ b/"), BlankEdge),
            // a name that begins with a combining mark
            (s("/memories/\u{301}"), LeadingMark),
            (s("/memories/\u{308}x.md"), LeadingMark),
            (s("/memories/a/\u{20dd}"), LeadingMark),
            // line and paragraph separators
            (s("/memories/a\u{2028}b"), LineSeparator),
            (s("/memories/\u{2029}"), LineSeparator),
            // not NFC
            (s("/memories/e\u{301}"), NotNfc),
            (s("/memories/cafe\u{301}.md"), NotNfc),
            (s("/memories/a\u{308}"), NotNfc),
            (s("/memories/\u{212b}"), NotNfc),
            (s("/memories/\u{2126}"), NotNfc),
            (s("/memories/\u{1100}\u{1161}"), NotNfc),
            (s("/memories/\u{f900}"), NotNfc),
            // limits
            (long("/memories/", "a", 1015), TooLong),
            (long("/memories/", "a", 1016), TooLong),
            (format!("{}/", long("/memories/", "a", 1015)), TooLong),
            (format!("{}/..", long("/memories/", "a", 1020)), TooLong),
            (long("/memories/", "\u{202e}", 400), TooLong),
            (long("/memories", "/a", 21), TooDeep),
            (format!("{}/", long("/memories", "/a", 21)), TooDeep),
            (long("/memories", "/a", 100), TooDeep),
            (long("/memories/", "a", 128), SegmentTooLong),
            (
                format!("{}/x", long("/memories/", "a", 128)),
                SegmentTooLong,
            ),
            (long("/memories/x/", "\u{e9}", 64), SegmentTooLong),
            (long("/memories/", "\u{1f980}", 32), SegmentTooLong),
        ]
    }

    #[test]
    fn hostile_inputs_are_refused_with_their_rule() {
        let table = hostile();
        assert!(table.len() >= 120, "only {} hostile inputs", table.len());
        let mut wrong = Vec::new();
        for (input, rule) in &table {
            match MemoryPath::parse(input) {
                Ok(p) => wrong.push(format!("{input:?}: accepted as {p}")),
                Err(e) if e.rule() != *rule => {
                    wrong.push(format!("{input:?}: {:?}, expected {rule:?}", e.rule()))
                }
                Err(e) => {
                    let msg = e.to_string();
                    // Never a raw control, format or separator character.
                    assert!(
                        !msg.chars().any(|c| is_control(c)
                            || is_format(c)
                            || is_invisible(c)
                            || is_line_separator(c)),
                        "{input:?} message is not escaped: {msg:?}"
                    );
                }
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn accepted_inputs_and_their_canonical_form() {
        let max_seg = long("/memories/", "a", 127);
        let max_depth = long("/memories", "/a", 20);
        // 9 + 7 * 128 + 119 = 1024 bytes.
        let max_len =
            long("/memories", &format!("/{}", "a".repeat(127)), 7) + "/" + &"b".repeat(118);
        let table: Vec<(String, String)> = vec![
            ("/memories".into(), "/memories".into()),
            ("/memories/".into(), "/memories".into()),
            ("/memories/a".into(), "/memories/a".into()),
            ("/memories/a/".into(), "/memories/a".into()),
            ("/memories/notes.md".into(), "/memories/notes.md".into()),
            ("/memories/a/b/c.txt".into(), "/memories/a/b/c.txt".into()),
            ("/memories/a/b/".into(), "/memories/a/b".into()),
            ("/memories/...".into(), "/memories/...".into()),
            ("/memories/a..b".into(), "/memories/a..b".into()),
            ("/memories/..a".into(), "/memories/..a".into()),
            ("/memories/a..".into(), "/memories/a..".into()),
            ("/memories/.hidden".into(), "/memories/.hidden".into()),
            ("/memories/.a/.b/".into(), "/memories/.a/.b".into()),
            ("/memories/100%.txt".into(), "/memories/100%.txt".into()),
            ("/memories/%20space".into(), "/memories/%20space".into()),
            ("/memories/%2".into(), "/memories/%2".into()),
            ("/memories/%25".into(), "/memories/%25".into()),
            ("/memories/%252".into(), "/memories/%252".into()),
            (
                "/memories/with space.md".into(),
                "/memories/with space.md".into(),
            ),
            (
                "/memories/caf\u{e9}.md".into(),
                "/memories/caf\u{e9}.md".into(),
            ),
            (
                "/memories/日本語/メモ.md".into(),
                "/memories/日本語/メモ.md".into(),
            ),
            ("/memories/crab 🦀.md".into(), "/memories/crab 🦀.md".into()),
            ("/memories/\u{3a9}".into(), "/memories/\u{3a9}".into()),
            ("/memories/\u{ac00}".into(), "/memories/\u{ac00}".into()),
            (
                "/memories/node_modules/x".into(),
                "/memories/node_modules/x".into(),
            ),
            (
                "/memories/a-b_c~d+e=f".into(),
                "/memories/a-b_c~d+e=f".into(),
            ),
            ("/memories/UPPER".into(), "/memories/UPPER".into()),
            (
                "/memories/in  between.md".into(),
                "/memories/in  between.md".into(),
            ),
            (
                "/memories/wait\u{2026}.md".into(),
                "/memories/wait\u{2026}.md".into(),
            ),
            (
                "/memories/\u{2764}\u{fe0f}.md".into(),
                "/memories/\u{2764}\u{fe0f}.md".into(),
            ),
            (
                "/memories/\u{30ce}\u{30fc}\u{30c8}.md".into(),
                "/memories/\u{30ce}\u{30fc}\u{30c8}.md".into(),
            ),
            ("/memories/\u{660}1".into(), "/memories/\u{660}1".into()),
            ("/memories/1\u{ff0e}2".into(), "/memories/1\u{ff0e}2".into()),
            (
                "/memories/e\u{301}\u{301}".nfc().collect::<String>(),
                "/memories/\u{e9}\u{301}".into(),
            ),
            (
                "/memories/\u{1f44d}\u{1f3fd}".into(),
                "/memories/\u{1f44d}\u{1f3fd}".into(),
            ),
            ("/memories/trailing.".into(), "/memories/trailing.".into()),
            ("/memories/a:b*c?d".into(), "/memories/a:b*c?d".into()),
            (max_seg.clone(), max_seg.clone()),
            (format!("{max_seg}/"), max_seg.clone()),
            (max_depth.clone(), max_depth.clone()),
            (max_len.clone(), max_len.clone()),
        ];
        assert_eq!(max_len.len(), MAX_PATH_BYTES);
        for (input, canonical) in &table {
            match MemoryPath::parse(input) {
                Ok(p) => assert_eq!(p.as_str(), canonical, "{input:?}"),
                Err(e) => panic!("{input:?} refused: {e}"),
            }
        }
    }

    #[test]
    fn messages_name_the_rule_and_what_works() {
        let msg = |s: &str| MemoryPath::parse(s).unwrap_err().to_string();
        assert_eq!(
            msg("/memories/../x"),
            "The path /memories/../x is not allowed: it contains a `..` segment. Use an absolute path under /memories without `.` or `..` segments."
        );
        assert_eq!(
            msg("/memories/\u{202e}gpj.exe"),
            "The path /memories/\\u{202e}gpj.exe is not allowed: it contains the invisible Unicode format character U+202E (a bidi control, zero-width character, byte order mark or similar), which can make a path look like another. Remove it and type the name plainly."
        );
        assert_eq!(
            msg("/memories/a\nb"),
            "The path /memories/a\\u{a}b is not allowed: it contains the control character U+000A. Remove control characters (newline, tab, NUL and the like) from the path."
        );
        assert_eq!(
            msg("/memoriesX/a"),
            "The path /memoriesX/a is not allowed: it is outside the memory directory. Every path must be /memories or start with /memories/ (lowercase), such as /memories/notes.md."
        );
        assert_eq!(
            msg("/memories/e\u{301}"),
            "The path /memories/e\u{301} is not allowed: it is not in Unicode normalization form C (NFC). Use the composed form of the same path: /memories/\u{e9}"
        );
        assert_eq!(
            msg(""),
            "The path is empty. Use an absolute path under /memories, such as /memories/notes.md."
        );
        assert!(msg(&long("/memories/", "a", 2000)).starts_with(
            "The path is not allowed: it is 2010 bytes long, and a path may be at most 1024 bytes"
        ));
        assert!(msg(&long("/memories/", "a", 128)).contains("128 bytes long"));
        assert!(msg(&long("/memories", "/a", 21)).contains("it is 21 levels below /memories"));
        assert!(msg("/memories/%252e").contains("percent-encoded"));
        assert!(msg("/memories/a\\b").contains("backslash"));
        assert!(msg("memories/a").contains("not absolute"));
        assert!(msg("/memories//a").contains("empty segment"));
        assert!(msg("/memories/./a").contains("a `.` segment"));
        assert!(msg("/memories/a\u{2028}").contains("U+2028"));
        assert_eq!(
            msg("/memories/\u{3164}"),
            "The path /memories/\\u{3164} is not allowed: it contains the Hangul filler U+3164, which displays as nothing and can make a name look like another. Remove it and type the name plainly."
        );
        assert_eq!(
            msg("/memories/a\u{2215}b"),
            "The path /memories/a\u{2215}b is not allowed: it contains the slash-like character U+2215, which looks like the `/` between names. Use `/` to separate names, or another name."
        );
        assert!(msg("/memories/x/notes.md ").contains("begins or ends with a space"));
        assert!(msg("/memories/\u{301}").contains("combining mark U+0301"));
    }

    #[test]
    fn labels_are_plain_with_no_space_at_their_edges() {
        for ok in ["lead", "ticket 4711", "ana@example", "é"] {
            assert!(is_plain_label(ok), "{ok:?}");
        }
        for bad in [
            "",
            " lead",
            "lead ",
            " ",
            "a\nb",
            "a\u{202e}b",
            "a\u{3164}",
            &"x".repeat(129),
        ] {
            assert!(!is_plain_label(bad), "{bad:?}");
        }
    }

    #[test]
    fn accessors() {
        let root = MemoryPath::root();
        assert!(root.is_root());
        assert_eq!(root.depth(), 0);
        assert_eq!(root.segments().count(), 0);
        assert_eq!(root.parent(), None);
        assert_eq!(root.name(), None);
        assert_eq!(root.ancestors().count(), 0);

        let p = MemoryPath::parse("/memories/a/b/c.md").unwrap();
        assert!(!p.is_root());
        assert_eq!(p.segments().collect::<Vec<_>>(), ["a", "b", "c.md"]);
        assert_eq!(p.depth(), 3);
        assert_eq!(p.name(), Some("c.md"));
        assert_eq!(p.parent().unwrap().as_str(), "/memories/a/b");
        assert_eq!(
            p.ancestors().map(|a| a.to_string()).collect::<Vec<_>>(),
            ["/memories/a/b", "/memories/a", "/memories"]
        );
        assert_eq!(
            MemoryPath::parse("/memories/a").unwrap().parent(),
            Some(root.clone())
        );
        assert_eq!(p.to_string(), "/memories/a/b/c.md");
        assert_eq!(format!("{p:?}"), "MemoryPath(\"/memories/a/b/c.md\")");
        assert_eq!(
            "/memories/x/".parse::<MemoryPath>().unwrap().as_str(),
            "/memories/x"
        );
    }

    #[test]
    fn join_validates_one_segment() {
        let root = MemoryPath::root();
        assert_eq!(root.join("a").unwrap().as_str(), "/memories/a");
        let a = root.join("a").unwrap();
        assert_eq!(a.join("b.md").unwrap().as_str(), "/memories/a/b.md");
        assert_eq!(a.join("b/c").unwrap_err().rule(), NameContainsSlash);
        assert_eq!(a.join("").unwrap_err().rule(), EmptySegment);
        assert_eq!(a.join("..").unwrap_err().rule(), DotDotSegment);
        assert_eq!(a.join(".").unwrap_err().rule(), DotSegment);
        assert_eq!(a.join("x\\y").unwrap_err().rule(), Backslash);
        assert_eq!(a.join("x\u{200b}").unwrap_err().rule(), FormatChar);
        assert_eq!(a.join(&"a".repeat(128)).unwrap_err().rule(), SegmentTooLong);
        let deep = MemoryPath::parse(&long("/memories", "/a", 20)).unwrap();
        assert_eq!(deep.join("b").unwrap_err().rule(), TooDeep);
    }

    #[test]
    fn starts_with_is_segment_wise() {
        let p = |s: &str| MemoryPath::parse(s).unwrap();
        assert!(p("/memories/a/b").starts_with(&p("/memories/a")));
        assert!(p("/memories/a").starts_with(&p("/memories/a")));
        assert!(p("/memories/a").starts_with(&MemoryPath::root()));
        assert!(MemoryPath::root().starts_with(&MemoryPath::root()));
        assert!(!p("/memories/ab").starts_with(&p("/memories/a")));
        assert!(!p("/memories/a").starts_with(&p("/memories/a/b")));
        assert!(!MemoryPath::root().starts_with(&p("/memories/a")));
    }

    #[test]
    fn rebase_replaces_the_prefix() {
        let p = |s: &str| MemoryPath::parse(s).unwrap();
        assert_eq!(
            p("/memories/a/b/c").rebase(&p("/memories/a"), &p("/memories/x/y")),
            Some(p("/memories/x/y/b/c"))
        );
        assert_eq!(
            p("/memories/a").rebase(&p("/memories/a"), &p("/memories/z")),
            Some(p("/memories/z"))
        );
        assert_eq!(
            p("/memories/a/b").rebase(&p("/memories/a"), &MemoryPath::root()),
            Some(p("/memories/b"))
        );
        assert_eq!(
            p("/memories/ab").rebase(&p("/memories/a"), &p("/memories/z")),
            None
        );
        let deep = MemoryPath::parse(&long("/memories", "/a", 20)).unwrap();
        assert_eq!(
            deep.rebase(&p("/memories/a"), &p("/memories/b/c")),
            None,
            "21 levels after rebase"
        );
    }

    #[test]
    fn order_is_segment_wise() {
        let p = |s: &str| MemoryPath::parse(s).unwrap();
        let mut v = [
            p("/memories/a b"),
            p("/memories/a/z"),
            p("/memories/a"),
            p("/memories"),
            p("/memories/a-"),
        ];
        v.sort();
        let names: Vec<_> = v.iter().map(MemoryPath::as_str).collect();
        assert_eq!(
            names,
            [
                "/memories",
                "/memories/a",
                "/memories/a/z",
                "/memories/a b",
                "/memories/a-"
            ]
        );
    }

    #[test]
    fn plain_percent_is_not_decoded() {
        assert!(!has_encoded_separator("/memories/100%.txt"));
        assert!(!has_encoded_separator("/memories/%%%"));
        assert!(has_encoded_separator("/memories/%%2e"));
        assert!(has_encoded_separator("/memories/%25%2e"));
    }
}
