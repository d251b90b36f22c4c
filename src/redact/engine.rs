//! The scanner: finds keyword hits, runs each rule only around its own
//! hits, and resolves overlaps.
//!
//! 1. Keyword search. All rule keywords are literal strings (case variants
//!    listed explicitly). Keywords that begin a token with a short word and
//!    a separator (`dop_v1_`, `sk-`, `dp.pt.`: most vendor prefixes) are
//!    found from their separator, with one SIMD search for `_`, `-` and `.`
//!    and a hash of the bytes before it ([`Heads`]). The others are
//!    searched with SIMD multi-literal searchers (Teddy, through
//!    `aho-corasick`'s packed API): keywords starting with a lower-case
//!    letter in groups of at most 8, about one per Teddy bucket, so that
//!    prose sets off few false candidates, the rest (rare in prose) in wider
//!    groups; three-byte keywords share groups so the others get four-byte
//!    fingerprints. Every occurrence is reported, overlapping ones
//!    included. Hits are gathered a block of text at a time.
//! 2. Rules. A regex rule runs on the union of the windows around its hits
//!    (each byte scanned once per rule); a parser rule runs at each hit and
//!    reports how far it read, so later hits inside that stretch are
//!    skipped; digit rules run on each run of nine or more digits.
//! 3. Resolution. Matches that overlap an existing `[REDACTED:...]` marker
//!    or base64 image data are dropped; overlapping matches merge into one
//!    span that covers them all, named after the most specific rule.
//! 4. Re-scan. The redacted text is scanned again around each new marker,
//!    in case redaction changed what a rule sees (see [`Engine::scan`]).
//!
//! Every step is linear in the input (the regex crate guarantees linear
//! time per search; windows are merged; parsers read bounded or
//! non-overlapping stretches), so no input can make the scan hang.

use std::sync::OnceLock;

use aho_corasick::{Anchored, Input, MatchKind, packed};
use regex::Regex;
use regex::bytes::Regex as BytesRegex;

use super::rules::{Edge, HitFn, How, ManyFn, RunFn, SPECS};
use super::{CustomRule, RedactError, digits};

/// Text that is never a secret: what to do at a hit of its keyword.
#[derive(Clone, Copy, Debug)]
enum Exclusion {
    /// `[REDACTED:rule-id]`
    Marker,
    /// `data:image/png;base64,...`
    DataUri,
    /// Raw base64 of a PNG or JPEG.
    RawImage,
    /// A credential published as an example in a specification or a
    /// well-known page (RFC 7617's `Aladdin:open sesame`, jwt.io's token):
    /// the whole token around the hit.
    KnownExample,
}

const EXCLUSION_ANCHORS: &[(&str, Exclusion)] = &[
    ("[REDACTED:", Exclusion::Marker),
    (";base64,", Exclusion::DataUri),
    ("iVBORw0KGgo", Exclusion::RawImage),
    ("/9j/4AAQ", Exclusion::RawImage),
    // RFC 7617, section 2: `Aladdin:open sesame`.
    ("QWxhZGRpbjpvcGVuIHNlc2FtZQ", Exclusion::KnownExample),
    // jwt.io's example token (HS256, "John Doe"): its signature.
    ("SflKxwRJSMeKKF2QT4fwpMeJf36POk6y", Exclusion::KnownExample),
    // Google Authenticator's documented example seed (`Hello!`).
    ("JBSWY3DPEHPK3PXP", Exclusion::KnownExample),
];

/// One compiled matcher of a rule.
pub(crate) struct Pattern {
    /// Index into [`Engine::ids`].
    pub rule: usize,
    pub prio: u8,
    pub kind: Kind,
}

pub(crate) enum Kind {
    Re {
        /// Compiled at the first hit of one of its keywords: most texts
        /// never need most rules, and compiling them all would cost a
        /// short run more than its scan.
        re: OnceLock<Option<Regex>>,
        src: &'static str,
        back: usize,
        fwd: usize,
        group: usize,
        check_group: usize,
        left: Edge,
        right: Edge,
        check: fn(&[u8]) -> bool,
    },
    Hit(HitFn),
    Many(ManyFn),
    Run(RunFn),
}

/// A user rule from the settings.
struct Custom {
    rule: usize,
    re: Regex,
    group: usize,
    keywords: Option<BytesRegex>,
}

enum Searcher {
    Teddy(packed::Searcher),
    Dfa(aho_corasick::AhoCorasick),
    One(BytesRegex),
}

/// A group of keywords searched together; `ids` maps a pattern index in
/// the group to a keyword index.
struct Group {
    searcher: Searcher,
    ids: Vec<usize>,
}

struct Anchor {
    len: usize,
    /// Patterns to run at a hit: this keyword's, and those of every
    /// keyword that is a prefix of it (a hit reports the longest keyword
    /// starting at a position).
    patterns: Vec<usize>,
    exclusion: Option<Exclusion>,
}

/// A match: byte span and rule index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Found {
    pub start: usize,
    pub end: usize,
    pub rule: usize,
}

#[derive(Clone, Copy, Debug)]
struct Cand {
    start: usize,
    end: usize,
    pattern: usize,
}

/// Keywords that begin a token with a word and a separator (`dop_v1_`,
/// `sk-`, `dp.pt.`), found from their first separator: one SIMD search for
/// `_`, `-` and `.` replaces a Teddy pass per sixteen of them. A hit needs
/// the word before the separator to start the token (no letter or digit
/// before it), which is what every rule anchored this way asks anyway.
struct Heads {
    /// First segment (the word and its separator) -> keyword indexes,
    /// sorted by segment.
    by_segment: Vec<(&'static [u8], Vec<usize>)>,
    /// Bit `seg_hash(segment)`: set for every segment (rejects most
    /// separators, those after ordinary words, without a search).
    seen: Vec<u64>,
    /// Bit `tail_hash(two bytes before the separator, separator)`: set for
    /// every segment (every segment has two or more bytes before it).
    tails: Vec<u64>,
    /// Longest first segment.
    max_len: usize,
    /// Keyword literals, by keyword index.
    lits: Vec<(usize, &'static [u8])>,
    /// Keywords found at a fixed distance before a separator (see
    /// [`FIXED_HEADS`]): keyword index, literal, word length, separator.
    fixed: Vec<(usize, &'static [u8], usize, u8)>,
}

/// Keywords that start a word of fixed length ending at a separator, found
/// from that separator rather than searched for: `pat` starts the
/// 17-character word before the `.` of an Airtable token (`path` and
/// `pattern` would make it a frequent Teddy hit).
const FIXED_HEADS: &[(&str, usize, u8)] = &[("pat", 17, b'.')];

/// The first segment of a keyword, if it is `[A-Za-z0-9]{1,15}` then `_`,
/// `-` or `.`.
fn head_segment(lit: &str) -> Option<&[u8]> {
    let b = lit.as_bytes();
    let n = b.iter().take_while(|c| c.is_ascii_alphanumeric()).count();
    ((1..=15).contains(&n) && matches!(b.get(n), Some(b'_' | b'-' | b'.'))).then(|| &b[..=n])
}

/// A 16-bit hash of a segment's length, first two bytes and separator.
fn seg_hash(seg: &[u8]) -> usize {
    let n = seg.len();
    let key = (n as u32) << 24
        | u32::from(seg[0]) << 16
        | u32::from(seg[n.min(3) - 2]) << 8
        | u32::from(seg[n - 1]);
    (key.wrapping_mul(0x9E37_79B1) >> 16) as usize
}

/// A 15-bit hash of the two bytes before a separator and the separator.
fn tail_hash(a: u8, b: u8, sep: u8) -> usize {
    let key = u32::from(a) << 16 | u32::from(b) << 8 | u32::from(sep);
    (key.wrapping_mul(0x9E37_79B1) >> 17) as usize
}

impl Heads {
    /// Every position in `[from, to)` where a keyword starts a token (and
    /// ends before `to`).
    fn collect(&self, hay: &[u8], from: usize, to: usize, out: &mut Vec<(usize, usize)>) {
        for i in memchr::memchr3_iter(b'_', b'-', b'.', &hay[from..to]) {
            let sep = from + i;
            for &(anchor, lit, len, s) in &self.fixed {
                if hay[sep] == s
                    && sep >= from + len
                    && hay[sep - len] == lit[0]
                    && hay[sep - len..sep].starts_with(lit)
                    && hay[sep - len..sep].iter().all(u8::is_ascii_alphanumeric)
                    && (sep == len
                        || !hay[sep - len - 1].is_ascii_alphanumeric()
                        || after_percent_escape(hay, sep - len))
                {
                    out.push((sep - len, anchor));
                }
            }
            if sep < from + 2 {
                continue;
            }
            let t = tail_hash(hay[sep - 2], hay[sep - 1], hay[sep]);
            if self.tails[t / 64] & (1 << (t % 64)) == 0 {
                continue;
            }
            let mut j = sep;
            while j > from && sep - j < self.max_len && hay[j - 1].is_ascii_alphanumeric() {
                j -= 1;
            }
            if j == sep || (j > 0 && hay[j - 1].is_ascii_alphanumeric()) {
                continue;
            }
            // After a `%XX` escape (URL-encoded text), the token may start
            // past its two hex digits too.
            let escaped = (j > 0 && hay[j - 1] == b'%' && j + 2 < sep)
                .then(|| j + 2)
                .filter(|&k| after_percent_escape(hay, k));
            for j in std::iter::once(j).chain(escaped) {
                let seg = &hay[j..=sep];
                let h = seg_hash(seg);
                if self.seen[h / 64] & (1 << (h % 64)) == 0 {
                    continue;
                }
                let Ok(k) = self.by_segment.binary_search_by(|(s, _)| (*s).cmp(seg)) else {
                    continue;
                };
                for &l in &self.by_segment[k].1 {
                    let (anchor, lit) = self.lits[l];
                    if j + lit.len() <= to && hay[j..].starts_with(lit) {
                        out.push((j, anchor));
                    }
                }
            }
        }
    }
}

pub(crate) struct Engine {
    /// Rule ids: built-in (enabled or not) then custom.
    pub ids: Vec<String>,
    heads: Heads,
    groups: Vec<Group>,
    anchors: Vec<Anchor>,
    patterns: Vec<Pattern>,
    digit_patterns: Vec<usize>,
    customs: Vec<Custom>,
}

/// Largest number of keywords searched in one Teddy pass, for keywords
/// that start with a lower-case letter (the common bytes of prose). Slim
/// Teddy has eight buckets: with one keyword in each, a bucket's
/// fingerprint is that keyword's first bytes exactly, so prose sets off
/// few false candidates. Verifying false candidates cost more than the
/// extra pass: on prose with no keyword, four groups of eight scan about
/// 10% faster than two of sixteen (`REDACT_BENCH=plain cargo bench
/// --bench redact`).
const GROUP_SIZE: usize = 8;

/// The same for keywords that start with a capital, a digit or
/// punctuation: rare in prose, so their fingerprints seldom fire and a
/// wider (fat Teddy) group costs about what a narrow one does.
const WIDE_GROUP_SIZE: usize = 64;

/// Bytes of text whose keyword hits are gathered at once.
const BLOCK: usize = 1 << 18;

/// Longest built-in keyword (checked when the engine is built).
const MAX_KEYWORD: usize = 64;

/// Passes over the text: the first, then re-scans around new markers (see
/// [`Engine::scan`]).
const MAX_ROUNDS: usize = 4;

/// How far around a new marker the re-scan looks: more than any rule
/// reads for context (a key name and operator before a value, a keyword
/// before an AWS secret, a URL's scheme and user before its password).
const RESCAN_REACH: usize = 512;

impl Engine {
    pub(crate) fn new(disabled: &[String], customs: &[CustomRule]) -> Result<Engine, RedactError> {
        let builtin = super::rules::ids();
        for id in disabled {
            if !builtin.contains(&id.as_str()) {
                return Err(RedactError::UnknownDisabledRule { id: id.clone() });
            }
        }
        let mut ids: Vec<String> = builtin.iter().map(|s| (*s).to_owned()).collect();
        let mut patterns = Vec::new();
        let mut keyword_lists: Vec<(&'static str, usize)> = Vec::new();
        let mut digit_patterns = Vec::new();
        for spec in SPECS {
            if disabled.iter().any(|d| d == spec.id) {
                continue;
            }
            let rule = builtin
                .iter()
                .position(|id| *id == spec.id)
                .ok_or_else(|| RedactError::Internal {
                    message: format!("built-in rule `{}` has no description", spec.id),
                })?;
            let kind = match &spec.how {
                How::Re(r) => Kind::Re {
                    // The built-in patterns are tested to compile
                    // (`every_builtin_regex_compiles`).
                    re: OnceLock::new(),
                    src: r.re,
                    back: r.back,
                    fwd: r.fwd,
                    group: r.group,
                    check_group: r.check_group,
                    left: separator_edge(spec.prio, r.left),
                    right: separator_edge(spec.prio, r.right),
                    check: r.check,
                },
                How::Hit(f) => Kind::Hit(*f),
                How::Many(f) => Kind::Many(*f),
                How::Run(f) => Kind::Run(*f),
            };
            let index = patterns.len();
            patterns.push(Pattern {
                rule,
                prio: spec.prio,
                kind,
            });
            if matches!(spec.how, How::Run(_)) {
                digit_patterns.push(index);
            }
            for a in spec.anchors {
                keyword_lists.push((a, index));
            }
        }
        let customs = compile_customs(customs, &mut ids)?;
        // A pattern that may be found from a token's first separator: a
        // regex that starts at its keyword and may not follow a letter or
        // digit.
        let bounded: Vec<bool> = patterns
            .iter()
            .map(|p| match &p.kind {
                Kind::Re { back, left, .. } => *back == 0 && left.blocks(b'a') && left.blocks(b'0'),
                Kind::Hit(_) | Kind::Many(_) | Kind::Run(_) => false,
            })
            .collect();
        let (heads, groups, anchors) = build_anchors(&keyword_lists, &bounded)?;
        Ok(Engine {
            ids,
            heads,
            groups,
            anchors,
            patterns,
            digit_patterns,
            customs,
        })
    }

    /// All matches in `text`, in text coordinates, non-overlapping and
    /// sorted.
    ///
    /// Redacting can change the context of text next to a secret (a
    /// keyword moves closer to a value, a word boundary appears), so the
    /// redacted text is scanned again around each new marker (within
    /// [`RESCAN_REACH`] bytes, farther than any rule looks for context) and
    /// anything new is added, until nothing changes. That makes redaction
    /// idempotent: running the filter on its own output finds nothing.
    ///
    /// Also returns the redacted text when it was built along the way.
    /// Compile every rule's pattern now rather than at its first hit
    /// (where one filter serves several tenants, the time of a first hit
    /// would show another tenant wrote that kind of secret first).
    pub(crate) fn compile_all(&self) {
        for p in &self.patterns {
            if let Kind::Re { re, src, .. } = &p.kind {
                re.get_or_init(|| Regex::new(src).ok());
            }
        }
    }

    /// Every rule's pattern is compiled (see [`Engine::compile_all`]).
    #[cfg(test)]
    pub(crate) fn all_compiled(&self) -> bool {
        self.patterns.iter().all(|p| match &p.kind {
            Kind::Re { re, .. } => re.get().is_some_and(Option::is_some),
            _ => true,
        })
    }

    pub(crate) fn scan(&self, text: &str) -> (Vec<Found>, Option<String>) {
        let mut found = self.scan_once(text, None, &[]);
        let mut fresh = vec![true; found.len()];
        for round in 1..=MAX_ROUNDS {
            if found.is_empty() {
                break;
            }
            let (redacted, markers) = self.apply(text, &found);
            if round == MAX_ROUNDS {
                return (found, Some(redacted));
            }
            let mut windows: Vec<(usize, usize)> = Vec::new();
            for (&(ms, me), _) in markers.iter().zip(&fresh).filter(|(_, f)| **f) {
                let ws = floor_boundary(&redacted, ms.saturating_sub(RESCAN_REACH));
                let we = ceil_boundary(&redacted, me + RESCAN_REACH);
                match windows.last_mut() {
                    Some(last) if ws <= last.1 => last.1 = last.1.max(we),
                    _ => windows.push((ws, we)),
                }
            }
            let more = self.scan_once(&redacted, Some(&windows), &markers);
            if more.is_empty() {
                return (found, Some(redacted));
            }
            // Map back: none of `more` overlaps a marker.
            let mut shift = Vec::with_capacity(markers.len() + 1);
            shift.push(0isize);
            for (i, &(ms, me)) in markers.iter().enumerate() {
                let f = found[i];
                let grown = (me - ms) as isize - (f.end - f.start) as isize;
                shift.push(shift[i] + grown);
            }
            let mut merged: Vec<(Found, bool)> = found.iter().map(|&f| (f, false)).collect();
            for m in more {
                let k = markers.partition_point(|&(_, me)| me <= m.start);
                let d = shift[k];
                let start = (m.start as isize - d) as usize;
                let end = (m.end as isize - d) as usize;
                merged.push((
                    Found {
                        start,
                        end,
                        rule: m.rule,
                    },
                    true,
                ));
            }
            merged.sort_unstable_by_key(|(f, _)| f.start);
            found = merged.iter().map(|(f, _)| *f).collect();
            fresh = merged.iter().map(|(_, n)| *n).collect();
        }
        (found, None)
    }

    /// The text with each match replaced by its marker, and the markers'
    /// spans in the new text.
    pub(crate) fn apply(&self, text: &str, found: &[Found]) -> (String, Vec<(usize, usize)>) {
        let extra: usize = found.iter().map(|f| self.ids[f.rule].len() + 11).sum();
        let mut out = String::with_capacity(text.len() + extra);
        let mut spans = Vec::with_capacity(found.len());
        let mut last = 0;
        for f in found {
            out.push_str(&text[last..f.start]);
            let ms = out.len();
            out.push_str("[REDACTED:");
            out.push_str(&self.ids[f.rule]);
            out.push(']');
            spans.push((ms, out.len()));
            last = f.end;
        }
        out.push_str(&text[last..]);
        (out, spans)
    }

    /// One pass: the whole text, or only keyword hits and digit runs inside
    /// `windows` (rules still read the whole text around them). `known`
    /// spans (markers placed by an earlier pass) are excluded.
    fn scan_once(
        &self,
        text: &str,
        windows: Option<&[(usize, usize)]>,
        known: &[(usize, usize)],
    ) -> Vec<Found> {
        let b = text.as_bytes();
        let whole = [(0, b.len())];
        let windows = windows.unwrap_or(&whole);
        let np = self.patterns.len();
        let mut region: Vec<Option<(usize, usize)>> = vec![None; np];
        let mut skip = vec![0usize; np];
        let mut cands = Vec::new();
        let mut excluded = known.to_vec();
        // Hits are gathered a block at a time (in text order, so the
        // regions and skips below carry over): the lists stay small
        // however long the text is.
        let mut hits: Vec<(usize, usize)> = Vec::new();
        for &(ws, we) in windows {
            let mut bs = ws;
            while bs < we {
                let be = (bs + BLOCK).min(we);
                // A keyword starting in the block may end after it.
                let to = (be + MAX_KEYWORD).min(we);
                hits.clear();
                self.heads.collect(b, bs, to, &mut hits);
                for g in &self.groups {
                    g.collect(b, bs, to, &mut hits);
                }
                hits.retain(|&(pos, _)| pos < be);
                // Each searcher's hits are sorted: a stable sort merges runs.
                hits.sort();
                for &(pos, a) in &hits {
                    self.at_hit(
                        text,
                        pos,
                        a,
                        &mut region,
                        &mut skip,
                        &mut cands,
                        &mut excluded,
                    );
                }
                bs = be;
            }
        }
        for (p, r) in region.iter().enumerate() {
            if let Some((rs, re)) = *r {
                self.run_re(p, text, rs, re, &mut cands);
            }
        }
        if !self.digit_patterns.is_empty() {
            let mut spans = Vec::new();
            for &(ws, we) in windows {
                digits::runs(&b[ws..we], digits::MIN_RUN_DIGITS, |rs, re| {
                    for &p in &self.digit_patterns {
                        if let Kind::Run(f) = self.patterns[p].kind {
                            spans.clear();
                            f(text, ws + rs, ws + re, &mut spans);
                            cands.extend(spans.iter().map(|&(start, end)| Cand {
                                start,
                                end,
                                pattern: p,
                            }));
                        }
                    }
                });
            }
        }
        let mut custom_found = Vec::new();
        for c in &self.customs {
            c.run(text, &mut custom_found);
        }
        self.resolve(text, cands, custom_found, excluded)
    }

    /// Runs the patterns of keyword `a` at its hit `pos`: a regex pattern
    /// grows its region (run when the next hit is past it), a parser runs
    /// now unless an earlier run read past `pos`.
    #[allow(clippy::too_many_arguments)]
    fn at_hit(
        &self,
        text: &str,
        pos: usize,
        a: usize,
        region: &mut [Option<(usize, usize)>],
        skip: &mut [usize],
        cands: &mut Vec<Cand>,
        excluded: &mut Vec<(usize, usize)>,
    ) {
        let b = text.as_bytes();
        let anchor = &self.anchors[a];
        let end = pos + anchor.len;
        if let Some(x) = anchor.exclusion {
            if let Some(span) = exclusion(x, b, pos, end) {
                excluded.push(span);
            }
            return;
        }
        for &p in &anchor.patterns {
            match &self.patterns[p].kind {
                Kind::Re { back, fwd, .. } => {
                    let ws = pos.saturating_sub(*back);
                    let we = (end + fwd).min(b.len());
                    match &mut region[p] {
                        Some(r) if ws <= r.1 => r.1 = r.1.max(we),
                        r => {
                            if let Some((rs, re)) = r.take() {
                                self.run_re(p, text, rs, re, cands);
                            }
                            *r = Some((ws, we));
                        }
                    }
                }
                Kind::Hit(f) => {
                    if pos < skip[p] {
                        continue;
                    }
                    if let Some((start, end)) = f(text, pos, end, &mut skip[p]) {
                        cands.push(Cand {
                            start,
                            end,
                            pattern: p,
                        });
                    }
                }
                Kind::Many(f) => {
                    if pos < skip[p] {
                        continue;
                    }
                    let mut spans = Vec::new();
                    f(text, pos, end, &mut skip[p], &mut spans);
                    cands.extend(spans.into_iter().map(|(start, end)| Cand {
                        start,
                        end,
                        pattern: p,
                    }));
                }
                Kind::Run(_) => {}
            }
        }
    }

    /// Runs a regex pattern over `[rs, re)`, with the text before `rs` as
    /// look-behind context and edges checked against the whole text.
    fn run_re(&self, p: usize, text: &str, rs: usize, re: usize, out: &mut Vec<Cand>) {
        let Kind::Re {
            re: regex,
            src,
            group,
            check_group,
            left,
            right,
            check,
            ..
        } = &self.patterns[p].kind
        else {
            return;
        };
        let Some(regex) = regex.get_or_init(|| Regex::new(src).ok()) else {
            return;
        };
        let b = text.as_bytes();
        let rs = floor_boundary(text, rs);
        let re = ceil_boundary(text, re);
        let hay = &text[..re];
        let mut locs = regex.capture_locations();
        let mut at = rs;
        // The end of the last match taken: a token glued to it (`AKIA…AKIA…`)
        // is not refused for the letter before it.
        let mut glued_to = None;
        while at < re {
            let Some(m) = regex.captures_read_at(&mut locs, hay, at) else {
                break;
            };
            at = if m.end() > m.start() {
                m.end()
            } else {
                ceil_boundary(text, m.end() + 1)
            };
            let Some((gs, ge)) = locs.get(*group) else {
                continue;
            };
            if gs == ge
                || (gs > 0
                    && left.blocks(b[gs - 1])
                    && !after_percent_escape(b, gs)
                    && glued_to != Some(gs))
                || (ge < b.len() && right.blocks(b[ge]) && !glued_token_at(regex, text, gs, ge))
            {
                continue;
            }
            let Some((cs, ce)) = locs.get(*check_group) else {
                continue;
            };
            if check(&b[cs..ce]) {
                out.push(Cand {
                    start: gs,
                    end: ge,
                    pattern: p,
                });
                glued_to = Some(ge);
            }
        }
    }

    fn resolve(
        &self,
        text: &str,
        mut cands: Vec<Cand>,
        customs: Vec<Found>,
        mut excluded: Vec<(usize, usize)>,
    ) -> Vec<Found> {
        if cands.is_empty() && customs.is_empty() {
            return Vec::new();
        }
        // Custom rules rank as formats confirmed by context.
        let mut all: Vec<(usize, usize, usize, u8)> = cands
            .drain(..)
            .map(|c| {
                (
                    c.start,
                    c.end,
                    self.patterns[c.pattern].rule,
                    self.patterns[c.pattern].prio,
                )
            })
            .chain(customs.into_iter().map(|f| (f.start, f.end, f.rule, 2)))
            .collect();
        // Parsers stop at ASCII bytes or at a length cap; make sure every
        // span falls on character boundaries all the same.
        for a in &mut all {
            a.0 = floor_boundary(text, a.0);
            a.1 = ceil_boundary(text, a.1);
        }
        all.retain(|a| a.0 < a.1);
        excluded.sort_unstable();
        let mut disjoint: Vec<(usize, usize)> = Vec::with_capacity(excluded.len());
        for (xs, xe) in excluded {
            match disjoint.last_mut() {
                Some(last) if xs <= last.1 => last.1 = last.1.max(xe),
                _ => disjoint.push((xs, xe)),
            }
        }
        let excluded = disjoint;
        all.retain(|&(s, e, _, _)| {
            let k = excluded.partition_point(|&(_, xe)| xe <= s);
            excluded[k..]
                .iter()
                .take_while(|&&(xs, _)| xs < e)
                .all(|&(xs, xe)| xe <= s || xs >= e)
        });
        all.sort_unstable_by_key(|&(s, e, _, _)| (s, std::cmp::Reverse(e)));
        let mut out: Vec<Found> = Vec::new();
        let mut best: (u8, usize) = (0, 0);
        for (s, e, rule, prio) in all {
            match out.last_mut() {
                Some(cur) if s < cur.end => {
                    cur.end = cur.end.max(e);
                    if (prio, e - s) > best {
                        best = (prio, e - s);
                        cur.rule = rule;
                    }
                }
                _ => {
                    out.push(Found {
                        start: s,
                        end: e,
                        rule,
                    });
                    best = (prio, e - s);
                }
            }
        }
        out
    }
}

impl Group {
    /// Every position in `[from, to)` where one of the group's keywords
    /// starts (and ends before `to`).
    fn collect(&self, hay: &[u8], from: usize, to: usize, out: &mut Vec<(usize, usize)>) {
        let mut at = from;
        while at < to {
            let found = match &self.searcher {
                Searcher::Teddy(s) => s
                    .find_in(hay, aho_corasick::Span::from(at..to))
                    .map(|m| (m.start(), m.pattern().as_usize())),
                Searcher::Dfa(ac) => ac
                    .find(Input::new(hay).span(at..to).anchored(Anchored::No))
                    .map(|m| (m.start(), m.pattern().as_usize())),
                Searcher::One(re) => re.find_at(&hay[..to], at).map(|m| (m.start(), 0)),
            };
            let Some((start, pid)) = found else {
                break;
            };
            out.push((start, self.ids[pid]));
            at = start + 1;
        }
    }
}

impl Custom {
    fn run(&self, text: &str, out: &mut Vec<Found>) {
        let b = text.as_bytes();
        match &self.keywords {
            None => self.run_window(text, 0, text.len(), out),
            Some(kw) => {
                // Lines holding a keyword, each scanned once.
                let mut covered = 0;
                for m in kw.find_iter(b) {
                    if m.start() < covered {
                        continue;
                    }
                    let mut ls = m.start();
                    while ls > covered && b[ls - 1] != b'\n' {
                        ls -= 1;
                    }
                    let le = b[m.end()..]
                        .iter()
                        .position(|&c| c == b'\n')
                        .map_or(b.len(), |i| m.end() + i);
                    self.run_window(text, ls, le, out);
                    covered = le;
                }
            }
        }
    }

    fn run_window(&self, text: &str, ws: usize, we: usize, out: &mut Vec<Found>) {
        let hay = &text[..we];
        let mut locs = self.re.capture_locations();
        let mut at = ws;
        while at < we {
            let Some(m) = self.re.captures_read_at(&mut locs, hay, at) else {
                break;
            };
            at = if m.end() > m.start() {
                m.end()
            } else {
                ceil_boundary(text, m.end() + 1)
            };
            if let Some((s, e)) = locs.get(self.group).filter(|(s, e)| s < e) {
                out.push(Found {
                    start: s,
                    end: e,
                    rule: self.rule,
                });
            }
        }
    }
}

fn compile_customs(
    customs: &[CustomRule],
    ids: &mut Vec<String>,
) -> Result<Vec<Custom>, RedactError> {
    let mut out = Vec::new();
    for (index, c) in customs.iter().enumerate() {
        let id = c.id.clone();
        if id.is_empty() {
            return Err(RedactError::EmptyRuleId { index });
        }
        if !valid_id(&id) {
            return Err(RedactError::InvalidRuleId { index, id });
        }
        if ids.contains(&id) {
            let builtin = super::rules::ids().contains(&id.as_str());
            return Err(RedactError::DuplicateRuleId { index, id, builtin });
        }
        let re = Regex::new(&c.regex).map_err(|e| RedactError::InvalidRegex {
            index,
            id: id.clone(),
            message: e.to_string(),
        })?;
        if re.is_match("") {
            return Err(RedactError::MatchesEmpty { index, id });
        }
        let group = re
            .capture_names()
            .position(|n| n == Some("secret"))
            .unwrap_or(0);
        let keywords = if c.keywords.is_empty() {
            None
        } else {
            if c.keywords.iter().any(|k| k.is_empty()) {
                return Err(RedactError::EmptyKeyword { index, id });
            }
            let alt: Vec<String> = c.keywords.iter().map(|k| regex::escape(k)).collect();
            let kw = BytesRegex::new(&format!("(?i-u:{})", alt.join("|"))).map_err(|e| {
                RedactError::InvalidRegex {
                    index,
                    id: id.clone(),
                    message: format!("keywords: {e}"),
                }
            })?;
            Some(kw)
        };
        ids.push(id);
        out.push(Custom {
            rule: ids.len() - 1,
            re,
            group,
            keywords,
        });
    }
    Ok(out)
}

/// Lowercase kebab-case: `[a-z0-9]+(-[a-z0-9]+)*`, at most 64 bytes.
pub(crate) fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && !id.starts_with('-')
        && !id.ends_with('-')
        && !id.contains("--")
}

type Anchors = (Heads, Vec<Group>, Vec<Anchor>);

fn build_anchors(
    lists: &[(&'static str, usize)],
    bounded: &[bool],
) -> Result<Anchors, RedactError> {
    let mut lits: Vec<&'static str> = Vec::new();
    let mut anchors: Vec<Anchor> = Vec::new();
    for &(lit, p) in lists {
        match lits.iter().position(|l| *l == lit) {
            Some(i) => anchors[i].patterns.push(p),
            None => {
                lits.push(lit);
                anchors.push(Anchor {
                    len: lit.len(),
                    patterns: vec![p],
                    exclusion: None,
                });
            }
        }
    }
    if let Some(long) = lits.iter().find(|l| l.len() > MAX_KEYWORD) {
        return Err(RedactError::Internal {
            message: format!("keyword `{long}` is longer than {MAX_KEYWORD} bytes"),
        });
    }
    for &(lit, x) in EXCLUSION_ANCHORS {
        lits.push(lit);
        anchors.push(Anchor {
            len: lit.len(),
            patterns: Vec::new(),
            exclusion: Some(x),
        });
    }
    // Token heads: found from their separator, every one that matches.
    let is_head: Vec<bool> = lits
        .iter()
        .zip(&anchors)
        .map(|(lit, a)| {
            head_segment(lit).is_some()
                && !a.patterns.is_empty()
                && a.patterns.iter().all(|&p| bounded[p])
        })
        .collect();
    let mut heads = Heads {
        by_segment: Vec::new(),
        seen: vec![0u64; 1 << 10],
        tails: vec![0u64; 1 << 9],
        fixed: Vec::new(),
        max_len: 0,
        lits: Vec::new(),
    };
    for (i, lit) in lits.iter().enumerate().filter(|(i, _)| is_head[*i]) {
        let seg = head_segment(lit).unwrap_or_default();
        let h = seg_hash(seg);
        heads.seen[h / 64] |= 1 << (h % 64);
        let n = seg.len();
        if n < 3 {
            return Err(RedactError::Internal {
                message: format!("keyword `{lit}` starts with a word of one byte"),
            });
        }
        let t = tail_hash(seg[n - 3], seg[n - 2], seg[n - 1]);
        heads.tails[t / 64] |= 1 << (t % 64);
        heads.max_len = heads.max_len.max(seg.len());
        let l = heads.lits.len();
        heads.lits.push((i, lit.as_bytes()));
        match heads.by_segment.iter_mut().find(|(s, _)| *s == seg) {
            Some((_, v)) => v.push(l),
            None => heads.by_segment.push((seg, vec![l])),
        }
    }
    heads.by_segment.sort_by(|a, b| a.0.cmp(b.0));
    let mut is_head = is_head;
    for &(lit, len, sep) in FIXED_HEADS {
        if let Some(i) = lits.iter().position(|l| *l == lit) {
            is_head[i] = true;
            heads.fixed.push((i, lit.as_bytes(), len, sep));
        }
    }
    // A Teddy hit reports one keyword per position (the longest): give it
    // the patterns of the shorter Teddy keywords it starts with.
    let own: Vec<Vec<usize>> = anchors.iter().map(|a| a.patterns.clone()).collect();
    for (i, lit) in lits.iter().enumerate() {
        for (j, other) in lits.iter().enumerate() {
            if i != j && !is_head[i] && !is_head[j] && lit.starts_with(other) {
                for &p in &own[j] {
                    if !anchors[i].patterns.contains(&p) {
                        anchors[i].patterns.push(p);
                    }
                }
            }
        }
    }
    // Two-byte keywords get a searcher each (memchr-based); the rest go in
    // Teddy groups, longest first within a group so the longest keyword at
    // a position is the one reported. Groups hold keywords of one kind of
    // first byte (lower case; anything else), the second kind in wider
    // groups.
    // Teddy fingerprints the first min(4, shortest keyword) bytes of each
    // keyword, so three-byte keywords share groups and the rest get
    // four-byte fingerprints (fewer false candidates in prose).
    let lower = |i: usize| lits[i].as_bytes()[0].is_ascii_lowercase();
    let mut order: Vec<usize> = (0..lits.len()).filter(|&i| !is_head[i]).collect();
    order.sort_by_key(|&i| (lits[i].len() <= 2, !lower(i), lits[i].len() > 3, i));
    let (short, long): (Vec<usize>, Vec<usize>) =
        order.into_iter().partition(|&i| lits[i].len() <= 2);
    let mut groups = Vec::new();
    for i in short {
        let re = BytesRegex::new(&regex::escape(lits[i])).map_err(|e| RedactError::Internal {
            message: format!("keyword does not compile: {e}"),
        })?;
        groups.push(Group {
            searcher: Searcher::One(re),
            ids: vec![i],
        });
    }
    let (narrow, wide): (Vec<usize>, Vec<usize>) = long.into_iter().partition(|&i| lower(i));
    let chunks = narrow
        .chunks(GROUP_SIZE)
        .chain(wide.chunks(WIDE_GROUP_SIZE));
    for chunk in chunks {
        let mut ids = chunk.to_vec();
        ids.sort_by_key(|&i| std::cmp::Reverse(lits[i].len()));
        let pats: Vec<&str> = ids.iter().map(|&i| lits[i]).collect();
        let teddy = packed::Config::new()
            .match_kind(packed::MatchKind::LeftmostFirst)
            .builder()
            .extend(&pats)
            .build();
        let searcher = match teddy {
            Some(t) => Searcher::Teddy(t),
            None => Searcher::Dfa(
                aho_corasick::AhoCorasick::builder()
                    .match_kind(MatchKind::LeftmostFirst)
                    .kind(Some(aho_corasick::AhoCorasickKind::DFA))
                    .build(&pats)
                    .map_err(|e| RedactError::Internal {
                        message: format!("keyword search: {e}"),
                    })?,
            ),
        };
        groups.push(Group { searcher, ids });
    }
    Ok((heads, groups, anchors))
}

/// The span of excluded text at a hit, if the hit really starts one.
fn exclusion(x: Exclusion, b: &[u8], s: usize, e: usize) -> Option<(usize, usize)> {
    match x {
        Exclusion::Marker => {
            let mut i = e;
            while i < b.len()
                && i - e < 64
                && (b[i].is_ascii_lowercase() || b[i].is_ascii_digit() || b[i] == b'-')
            {
                i += 1;
            }
            (i > e && b.get(i) == Some(&b']')).then_some((s, i + 1))
        }
        Exclusion::DataUri => {
            // data:<type>/<subtype>;base64,<payload>
            let lo = s.saturating_sub(100);
            let mut j = s;
            while j > lo
                && (b[j - 1].is_ascii_alphanumeric()
                    || matches!(b[j - 1], b'/' | b'.' | b'+' | b'-' | b'=' | b';'))
            {
                j -= 1;
            }
            if j < 5 || &b[j - 5..j] != b"data:" {
                return None;
            }
            let mut i = e;
            while i < b.len() && (super::checks::is_b64(b[i]) || b[i] == b'\n' || b[i] == b'\r') {
                i += 1;
            }
            Some((j - 5, i))
        }
        Exclusion::KnownExample => {
            let token =
                |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.' | b'+' | b'/');
            let lo = s.saturating_sub(4096);
            let mut j = s;
            while j > lo && token(b[j - 1]) {
                j -= 1;
            }
            let mut i = e;
            while i < b.len() && i - e < 256 && (token(b[i]) || b[i] == b'=') {
                i += 1;
            }
            Some((j, i))
        }
        Exclusion::RawImage => {
            if s > 0 && super::checks::is_b64(b[s - 1]) && b[s] != b'/' {
                return None;
            }
            let mut i = s;
            while i < b.len() && (super::checks::is_b64(b[i]) || b[i] == b'\n' || b[i] == b'\r') {
                i += 1;
            }
            (i - s >= 64).then_some((s, i))
        }
    }
}

/// Whether another token of the same rule starts right at `ge`, with the
/// same first four bytes as the one at `gs..ge` (the literal prefix of a
/// vendor's format: two keys pasted together, `AKIA…AKIA…`): then the
/// letter at `ge` does not refuse the first. Only for prefixed formats, so
/// a long run of hex is not cut into two keys.
fn glued_token_at(regex: &Regex, text: &str, gs: usize, ge: usize) -> bool {
    let b = text.as_bytes();
    ge - gs >= 8
        && b[gs..gs + 4].iter().any(|c| !c.is_ascii_hexdigit())
        && b.get(ge..ge + 4) == Some(&b[gs..gs + 4])
        && text.is_char_boundary(ge)
        && regex.find_at(text, ge).is_some_and(|m| m.start() == ge)
}

/// Whether a `%XX` escape ends just before `at` (URL-encoded text:
/// `%22ghp_...%22`): a separator, though its hex digits are letters or
/// digits.
pub(crate) fn after_percent_escape(b: &[u8], at: usize) -> bool {
    at >= 3 && b[at - 3] == b'%' && b[at - 2].is_ascii_hexdigit() && b[at - 1].is_ascii_hexdigit()
}

/// The edge an exact token format (priority 3: a vendor's fixed prefix,
/// alphabet and length) keeps against its neighbours: a letter or digit
/// only, never `_` or `-`. Those join words in names (`prod-<token>.md`,
/// `backup_<token>`), and the format itself is exact enough that a token
/// so joined is still one; a letter or digit beside it would make it part
/// of a longer string.
fn separator_edge(prio: u8, edge: Edge) -> Edge {
    match edge {
        Edge::Word | Edge::Token if prio >= 3 => Edge::Alnum,
        other => other,
    }
}

pub(crate) fn floor_boundary(text: &str, mut i: usize) -> usize {
    i = i.min(text.len());
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

pub(crate) fn ceil_boundary(text: &str, mut i: usize) -> usize {
    if i >= text.len() {
        return text.len();
    }
    while !text.is_char_boundary(i) {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_regex_compiles() {
        for spec in SPECS {
            if let How::Re(r) = &spec.how {
                assert!(
                    Regex::new(r.re).is_ok(),
                    "rule {} does not compile",
                    spec.id
                );
            }
        }
    }
}
