//! Structural checks the rules lean on: checksums (Luhn, IBAN mod-97,
//! GitHub's CRC32 in base62, bech32), number ranges, and the shape tests
//! that tell a random secret from a word, a placeholder or a reference.
//!
//! Everything here works on ASCII bytes and runs in time linear in its
//! input; nothing allocates except [`b64url_decode_prefix`].

/// True for the base64url alphabet (`A-Za-z0-9_-`).
pub(crate) fn is_b64url(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

/// True for the standard base64 alphabet, padding included.
pub(crate) fn is_b64(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'+' || b == b'/' || b == b'='
}

// ---------------------------------------------------------------- Luhn, cards

/// Luhn check over ASCII digits (no separators).
pub(crate) fn luhn(digits: &[u8]) -> bool {
    let mut sum = 0u32;
    for (i, &d) in digits.iter().rev().enumerate() {
        let mut v = u32::from(d - b'0');
        if i % 2 == 1 {
            v *= 2;
            if v > 9 {
                v -= 9;
            }
        }
        sum += v;
    }
    !digits.is_empty() && sum.is_multiple_of(10)
}

/// Whether the digits carry the prefix and length of a card network that
/// issues them: Visa, Mastercard, American Express, Discover, JCB, Diners
/// Club or UnionPay.
pub(crate) fn card_brand_ok(digits: &[u8]) -> bool {
    let len = digits.len();
    let prefix = |n: usize| -> u32 {
        digits[..n]
            .iter()
            .fold(0u32, |acc, &d| acc * 10 + u32::from(d - b'0'))
    };
    if len < 13 {
        return false;
    }
    let p2 = prefix(2);
    let p3 = prefix(3);
    let p4 = prefix(4);
    let p6 = prefix(6);
    match digits[0] {
        b'4' => matches!(len, 13 | 16 | 19),
        b'5' => (51..=55).contains(&p2) && len == 16,
        b'2' => (2221..=2720).contains(&p4) && len == 16,
        b'3' => {
            ((p2 == 34 || p2 == 37) && len == 15)
                || ((3528..=3589).contains(&p4) && (16..=19).contains(&len))
                || (((300..=305).contains(&p3) || p2 == 36 || p2 == 38 || p2 == 39)
                    && (14..=19).contains(&len))
        }
        b'6' => {
            (p4 == 6011
                || p2 == 65
                || (644..=649).contains(&p3)
                || (622126..=622925).contains(&p6)
                || p2 == 62)
                && (16..=19).contains(&len)
        }
        _ => false,
    }
}

// ---------------------------------------------------------------- SSN

/// US Social Security number ranges: area 001-899 but not 666, group
/// 01-99, serial 0001-9999; the two numbers famous from advertising
/// (078-05-1120, 219-09-9999) are examples, not people.
pub(crate) fn ssn_ok(area: u32, group: u32, serial: u32) -> bool {
    let valid = area != 0 && area != 666 && area < 900 && group != 0 && serial != 0;
    let example = (area, group, serial) == (78, 5, 1120) || (area, group, serial) == (219, 9, 9999);
    valid && !example
}

// ---------------------------------------------------------------- IBAN

/// IBAN length by country (ISO 13616 registry).
const IBAN_LENGTHS: &[(&[u8; 2], usize)] = &[
    (b"AD", 24),
    (b"AE", 23),
    (b"AL", 28),
    (b"AT", 20),
    (b"AZ", 28),
    (b"BA", 20),
    (b"BE", 16),
    (b"BG", 22),
    (b"BH", 22),
    (b"BI", 27),
    (b"BR", 29),
    (b"BY", 28),
    (b"CH", 21),
    (b"CR", 22),
    (b"CY", 28),
    (b"CZ", 24),
    (b"DE", 22),
    (b"DJ", 27),
    (b"DK", 18),
    (b"DO", 28),
    (b"EE", 20),
    (b"EG", 29),
    (b"ES", 24),
    (b"FI", 18),
    (b"FK", 18),
    (b"FO", 18),
    (b"FR", 27),
    (b"GB", 22),
    (b"GE", 22),
    (b"GI", 23),
    (b"GL", 18),
    (b"GR", 27),
    (b"GT", 28),
    (b"HN", 28),
    (b"HR", 21),
    (b"HU", 28),
    (b"IE", 22),
    (b"IL", 23),
    (b"IQ", 23),
    (b"IS", 26),
    (b"IT", 27),
    (b"JO", 30),
    (b"KW", 30),
    (b"KZ", 20),
    (b"LB", 28),
    (b"LC", 32),
    (b"LI", 21),
    (b"LT", 20),
    (b"LU", 20),
    (b"LV", 21),
    (b"LY", 25),
    (b"MC", 27),
    (b"MD", 24),
    (b"ME", 22),
    (b"MK", 19),
    (b"MN", 20),
    (b"MR", 27),
    (b"MT", 31),
    (b"MU", 30),
    (b"NI", 28),
    (b"NL", 18),
    (b"NO", 15),
    (b"OM", 23),
    (b"PK", 24),
    (b"PL", 28),
    (b"PS", 29),
    (b"PT", 25),
    (b"QA", 29),
    (b"RO", 24),
    (b"RS", 22),
    (b"RU", 33),
    (b"SA", 24),
    (b"SC", 31),
    (b"SD", 18),
    (b"SE", 24),
    (b"SI", 19),
    (b"SK", 24),
    (b"SM", 27),
    (b"SO", 23),
    (b"ST", 25),
    (b"SV", 28),
    (b"TL", 23),
    (b"TN", 24),
    (b"TR", 26),
    (b"UA", 29),
    (b"VA", 22),
    (b"VG", 24),
    (b"XK", 20),
    (b"YE", 30),
];

/// The registered IBAN length for a country code, if it has one.
pub(crate) fn iban_length(country: &[u8]) -> Option<usize> {
    IBAN_LENGTHS
        .iter()
        .find(|(c, _)| c.as_slice() == country)
        .map(|&(_, n)| n)
}

/// ISO 7064 mod-97 check of a compact IBAN (uppercase letters and digits).
pub(crate) fn iban_mod97(compact: &[u8]) -> bool {
    if compact.len() < 5
        || !compact
            .iter()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
    {
        return false;
    }
    let rotated = compact[4..].iter().chain(&compact[..4]);
    let mut rem = 0u32;
    for &b in rotated {
        if b.is_ascii_digit() {
            rem = (rem * 10 + u32::from(b - b'0')) % 97;
        } else {
            rem = (rem * 100 + u32::from(b - b'A') + 10) % 97;
        }
    }
    rem == 1
}

// ---------------------------------------------------------------- CRC32, base62

const CRC_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
};

/// CRC-32 (IEEE 802.3, as zlib computes it).
pub(crate) fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc = CRC_TABLE[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

const BASE62: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// A number as six base62 digits, most significant first, zero-padded.
pub(crate) fn base62_6(mut v: u32) -> [u8; 6] {
    let mut out = [b'0'; 6];
    for slot in out.iter_mut().rev() {
        *slot = BASE62[(v % 62) as usize];
        v /= 62;
    }
    out
}

/// GitHub's token checksum: a `ghp_`-style token is a four-byte prefix,
/// 30 random base62 characters and the CRC32 of those 30 characters in
/// six base62 digits.
pub(crate) fn github_checksum_ok(token: &[u8]) -> bool {
    if token.len() != 40 {
        return false;
    }
    let body = &token[4..34];
    base62_6(crc32(body)) == token[34..40]
}

// ---------------------------------------------------------------- bech32

const BECH32: &[u8; 32] = b"qpzry9x8gf2tvdw0s3jn54khce6mua7l";

fn bech32_polymod(values: impl Iterator<Item = u8>) -> u32 {
    const GEN: [u32; 5] = [
        0x3b6a_57b2,
        0x2650_8e6d,
        0x1ea1_19fa,
        0x3d42_33dd,
        0x2a14_62b3,
    ];
    let mut chk = 1u32;
    for v in values {
        let top = chk >> 25;
        chk = ((chk & 0x1ff_ffff) << 5) ^ u32::from(v);
        for (i, g) in GEN.iter().enumerate() {
            if (top >> i) & 1 == 1 {
                chk ^= g;
            }
        }
    }
    chk
}

fn bech32_hrp_expand(hrp: &[u8]) -> impl Iterator<Item = u8> + '_ {
    hrp.iter()
        .map(|b| b >> 5)
        .chain(std::iter::once(0))
        .chain(hrp.iter().map(|b| b & 31))
}

/// Verifies a bech32 string (BIP 173 checksum, either case, no length cap:
/// age keys are longer than 90 characters allow).
pub(crate) fn bech32_ok(s: &[u8]) -> bool {
    let lower: Vec<u8> = s.iter().map(u8::to_ascii_lowercase).collect();
    let Some(sep) = lower.iter().rposition(|&b| b == b'1') else {
        return false;
    };
    let (hrp, data) = (&lower[..sep], &lower[sep + 1..]);
    if hrp.is_empty() || data.len() < 6 {
        return false;
    }
    let mut values = Vec::with_capacity(data.len());
    for b in data {
        match BECH32.iter().position(|c| c == b) {
            Some(v) => values.push(v as u8),
            None => return false,
        }
    }
    bech32_polymod(bech32_hrp_expand(hrp).chain(values.iter().copied())) == 1
}

/// Builds a bech32 string (for tests that need valid age keys).
#[cfg(test)]
pub(crate) fn bech32_encode(hrp: &str, data5: &[u8]) -> String {
    let hrp_b = hrp.as_bytes();
    let pm = bech32_polymod(
        bech32_hrp_expand(hrp_b)
            .chain(data5.iter().copied())
            .chain([0u8; 6]),
    ) ^ 1;
    let mut out = String::from(hrp);
    out.push('1');
    for &d in data5 {
        out.push(BECH32[d as usize] as char);
    }
    for i in 0..6 {
        out.push(BECH32[((pm >> (5 * (5 - i))) & 31) as usize] as char);
    }
    out
}

// ---------------------------------------------------------------- base64url

fn b64_value(b: u8) -> Option<u8> {
    match b {
        b'A'..=b'Z' => Some(b - b'A'),
        b'a'..=b'z' => Some(b - b'a' + 26),
        b'0'..=b'9' => Some(b - b'0' + 52),
        b'-' | b'+' => Some(62),
        b'_' | b'/' => Some(63),
        _ => None,
    }
}

/// Decodes at most `max_out` bytes from the start of base64 or base64url
/// text (no padding needed); `None` on a character outside the alphabet.
pub(crate) fn b64url_decode_prefix(s: &[u8], max_out: usize) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(max_out.min(s.len()));
    let mut acc = 0u32;
    let mut bits = 0u32;
    for &b in s {
        if b == b'=' {
            break;
        }
        acc = (acc << 6) | u32::from(b64_value(b)?);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
            if out.len() >= max_out {
                break;
            }
        }
    }
    Some(out)
}

// ---------------------------------------------------------------- shape

/// Shannon entropy in bits per byte.
pub(crate) fn entropy(s: &[u8]) -> f64 {
    if s.is_empty() {
        return 0.0;
    }
    let mut counts = [0u32; 256];
    for &b in s {
        counts[b as usize] += 1;
    }
    let n = s.len() as f64;
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = f64::from(c) / n;
            -p * p.log2()
        })
        .sum()
}

/// How often the character class (upper, lower, digit, other) changes
/// from one byte to the next: about two thirds of the bytes in random
/// base62, about one in five in `PascalCaseIdentifiers`.
pub(crate) fn class_changes(s: &[u8]) -> usize {
    let class = |b: u8| match b {
        b'a'..=b'z' => 0,
        b'A'..=b'Z' => 1,
        b'0'..=b'9' => 2,
        _ => 3,
    };
    s.windows(2).filter(|w| class(w[0]) != class(w[1])).count()
}

/// Mixed-case text of 16 bytes or more that changes class as seldom as
/// joined-up words do.
pub(crate) fn reads_like_words(s: &[u8]) -> bool {
    let c = Classes::of(s);
    s.len() >= 16 && c.upper && c.lower && class_changes(s) * 5 < s.len() * 2
}

/// Three or more parts joined by `-`, `_` or `.`, each a lower-case word
/// or a short tag (`kerberos-5p-read-only`, `my-tag-value-v2`).
pub(crate) fn joined_words(s: &[u8]) -> bool {
    let parts: Vec<&[u8]> = s.split(|&c| matches!(c, b'-' | b'_' | b'.')).collect();
    let word = |p: &[u8]| {
        p.len() >= 2
            && p.iter()
                .enumerate()
                .all(|(i, c)| c.is_ascii_lowercase() || (i == 0 && c.is_ascii_uppercase()))
    };
    parts.len() >= 3
        && parts.iter().filter(|p| word(p)).count() * 2 >= parts.len()
        && parts.iter().all(|p| word(p) || p.len() <= 4)
}

/// Number of distinct bytes.
pub(crate) fn distinct(s: &[u8]) -> usize {
    let mut seen = [false; 256];
    let mut n = 0;
    for &b in s {
        if !seen[b as usize] {
            seen[b as usize] = true;
            n += 1;
        }
    }
    n
}

/// Which character classes a value uses.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Classes {
    pub lower: bool,
    pub upper: bool,
    pub digit: bool,
    pub other: bool,
}

impl Classes {
    pub(crate) fn of(s: &[u8]) -> Classes {
        let mut c = Classes::default();
        for &b in s {
            match b {
                b'a'..=b'z' => c.lower = true,
                b'A'..=b'Z' => c.upper = true,
                b'0'..=b'9' => c.digit = true,
                _ => c.other = true,
            }
        }
        c
    }

    pub(crate) fn letter(self) -> bool {
        self.lower || self.upper
    }
}

/// Template syntax and fillers: a value holding one is a stand-in.
const TEMPLATE_MARKS: &[&str] = &["xxxx", "****", "....", "${", "{{", "}}", "%("];

static TEMPLATES: Needles = Needles::new(TEMPLATE_MARKS);

/// Words that mark a value as a stand-in for a real secret, when the value
/// is made of them (see [`stand_in_words`]).
const MARKER_WORDS: &[&str] = &[
    "your",
    "example",
    "sample",
    "dummy",
    "placeholder",
    "changeme",
    "replace",
    "redacted",
    "insert",
    "todo",
    "fixme",
    "notreal",
    "fake",
    "here",
];

/// Words a stand-in is written with beside its markers (`your-api-key-here`,
/// `replace_with_a_long_random_string`, `dummy_password`).
const FILLER_WORDS: &[&str] = &[
    "api",
    "key",
    "keys",
    "token",
    "secret",
    "password",
    "passwd",
    "pass",
    "pwd",
    "goes",
    "the",
    "a",
    "an",
    "my",
    "me",
    "value",
    "string",
    "long",
    "random",
    "with",
    "to",
    "for",
    "of",
    "id",
    "client",
    "access",
    "auth",
    "app",
    "change",
    "real",
    "not",
    "actual",
    "put",
    "fill",
    "in",
    "this",
    "generated",
    "chars",
    "characters",
    "it",
    "some",
    "something",
    "enter",
    "set",
    "own",
    "personal",
    "private",
    "public",
    "service",
    "account",
    "user",
    "name",
    "db",
    "database",
    "bearer",
    "webhook",
    "url",
    "hash",
    "salt",
    "signing",
    "encryption",
    "session",
    // Vendor prefixes and environments (`sk_live_`, `ghp_`, `xoxb-`).
    "sk",
    "pk",
    "rk",
    "live",
    "test",
    "prod",
    "dev",
    "staging",
    "ghp",
    "gho",
    "ghu",
    "ghs",
    "ghr",
    "github",
    "pat",
    "xoxb",
    "xoxp",
    "xoxa",
    "xapp",
    "glpat",
    "akia",
    "asia",
    "npm",
    "pypi",
    "hf",
    "proj",
    "org",
    "whsec",
    "rk",
    "shpat",
    "shpss",
    "dop",
    "v1",
];

/// Values that are obviously not a real secret: fillers (`xxxx`, `****`,
/// `...`), a handful of distinct characters, template syntax, a name in
/// angle brackets, AWS's documentation keys (`...EXAMPLE`), or a value
/// made of stand-in words (`your-api-key-here`, `changeme`, `example123`).
/// A real secret that merely contains such a word (`IdIayourStmrsB`,
/// `Todo1996!`) is not one.
pub(crate) fn is_placeholder(v: &[u8]) -> bool {
    if v.is_empty() {
        return true;
    }
    if v.iter().all(|&b| {
        matches!(
            b,
            b'x' | b'X' | b'*' | b'.' | b'-' | b'_' | b'#' | b'?' | b'0' | b' '
        )
    }) {
        return true;
    }
    let d = distinct(v);
    if (v.len() >= 3 && d == 1) || (v.len() >= 6 && d <= 2) {
        return true;
    }
    TEMPLATES.in_word_case(v)
        || v.windows(7).any(|w| w == b"EXAMPLE")
        || angle_name(v)
        || stand_in_words(v)
        || stand_in_phrase(v)
}

/// Words a stand-in phrase is written with (`your-strong-password`,
/// `a-long-random-string`, `change-this-to-something-secure`).
const PHRASE_WORDS: &[&str] = &[
    "strong",
    "secure",
    "super",
    "some",
    "something",
    "generate",
    "this",
    "that",
    "there",
    "gmail",
    "smtp",
    "redis",
    "postgres",
    "mysql",
    "mongo",
    "new",
    "own",
    "very",
    "good",
    "unique",
    "admin",
    "root",
    "db",
    "app",
    "here",
    "your",
    "my",
    "a",
    "an",
    "the",
    "to",
    "with",
    "long",
    "random",
    "string",
    "password",
    "passphrase",
    "secret",
    "key",
    "token",
    "change",
    "replace",
    "example",
    "sample",
    "dummy",
    "fake",
    "placeholder",
    "insert",
    "todo",
    "put",
    "enter",
    "value",
    "api",
    "user",
    "pass",
    "pw",
    "pwd",
    "for",
    "of",
    "and",
    "or",
    "it",
    "is",
    "goes",
    "real",
    "actual",
];

/// A phrase of lower-case words joined by `-`, `_` or spaces, every one a
/// stand-in's word (`your-secure-password-here`, `my-password`), two or
/// more of them.
fn stand_in_phrase(v: &[u8]) -> bool {
    let words: Vec<&[u8]> = v
        .split(|&c| matches!(c, b'-' | b'_' | b' '))
        .filter(|w| !w.is_empty())
        .collect();
    words.len() >= 2
        && words.iter().all(|w| {
            w.iter().all(u8::is_ascii_lowercase) && PHRASE_WORDS.iter().any(|p| p.as_bytes() == *w)
        })
}

/// Whether `v` is written with a marker word (`your`, `example`, `todo`)
/// and otherwise filler words (vendor prefixes among them), separators,
/// runs of filler characters (`0000111122223333`, `123456`) and at most
/// three other letters or digits: `your-api-key-here`, `example123`,
/// `sk_live_fake0000111122223333`. Words are matched left to right, longest
/// first, in any case as a word is written (`fake`, `FAKE`, `Fake`; not
/// `fAKe`).
fn stand_in_words(v: &[u8]) -> bool {
    let mut marked = false;
    let mut rest = 0usize;
    // The letters and digits between words.
    let mut run = 0..0;
    let mut end_run = |run: &mut std::ops::Range<usize>| {
        let r = &v[run.clone()];
        if !(r.len() >= 6 && distinct(r) <= 4 || sequential(r)) {
            rest += r.len();
        }
        *run = 0..0;
    };
    let mut i = 0;
    while i < v.len() {
        if !v[i].is_ascii_alphanumeric() {
            end_run(&mut run);
            i += 1;
            continue;
        }
        let word = |list: &[&str]| {
            list.iter()
                .map(|w| w.as_bytes())
                .filter(|w| {
                    v.len() - i >= w.len()
                        && v[i..i + w.len()].eq_ignore_ascii_case(w)
                        && written_as_word(&v[i..i + w.len()])
                })
                .map(<[u8]>::len)
                .max()
        };
        match (word(MARKER_WORDS), word(FILLER_WORDS)) {
            (Some(m), f) if f.is_none_or(|f| m >= f) => {
                end_run(&mut run);
                marked = true;
                i += m;
            }
            (_, Some(f)) => {
                end_run(&mut run);
                i += f;
            }
            _ => {
                if run.is_empty() {
                    run = i..i;
                }
                run.end = i + 1;
                i += 1;
            }
        }
    }
    end_run(&mut run);
    marked && rest <= 3
}

/// Three or more characters each one after the one before (`123456`,
/// `abcdef`, `987`).
fn sequential(r: &[u8]) -> bool {
    r.len() >= 3
        && (r.windows(2).all(|w| w[1] == w[0].wrapping_add(1))
            || r.windows(2).all(|w| w[1].wrapping_add(1) == w[0]))
}

/// `<your-key>`, `<TOKEN>`, `<db password>`: a name in angle brackets. A
/// `<` or `>` alone is a character of the value (`a28M<2P77myt@ujV`).
fn angle_name(v: &[u8]) -> bool {
    let mut open = None;
    for (i, &c) in v.iter().enumerate() {
        match c {
            b'<' => open = Some(i),
            b'>' => {
                if open.is_some_and(|o| i > o + 1) {
                    return true;
                }
                open = None;
            }
            c if c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b' ' | b'.' | b'/') => {}
            _ => open = None,
        }
    }
    false
}

/// Case-insensitive ASCII substring test against up to 64 lowercase
/// needles, in one pass over `hay`.
pub(crate) fn contains_any_ci(hay: &[u8], needles: &[&str]) -> bool {
    find_any_ci(hay, needles, &first_bytes(needles), false)
}

/// For each byte, the needles (bits, at most 64) that start with it.
fn first_bytes(needles: &[&str]) -> [u64; 256] {
    let mut starts = [0u64; 256];
    for (i, n) in needles.iter().take(64).enumerate() {
        if let Some(&c) = n.as_bytes().first() {
            starts[c as usize] |= 1 << i;
        }
    }
    starts
}

fn find_any_ci(hay: &[u8], needles: &[&str], starts: &[u64; 256], word_case: bool) -> bool {
    (0..hay.len()).any(|i| {
        let mut set = starts[hay[i].to_ascii_lowercase() as usize];
        while set != 0 {
            let n = needles[set.trailing_zeros() as usize].as_bytes();
            set &= set - 1;
            if hay.len() - i >= n.len()
                && hay[i + 1..i + n.len()].eq_ignore_ascii_case(&n[1..])
                && (!word_case || written_as_word(&hay[i..i + n.len()]))
            {
                return true;
            }
        }
        false
    })
}

/// Letters in one case, or a capital then lower case (`fake`, `FAKE`,
/// `Fake`), as a word is written; `FAkE` inside a random token is not.
fn written_as_word(w: &[u8]) -> bool {
    let tail = w.get(1..).unwrap_or_default();
    !tail.iter().any(u8::is_ascii_uppercase) || !w.iter().any(u8::is_ascii_lowercase)
}

/// A fixed list of lowercase needles for [`contains_any_ci`], its table of
/// first bytes built once (the filter tests values against the same lists
/// at every keyword hit).
pub(crate) struct Needles {
    list: &'static [&'static str],
    starts: std::sync::OnceLock<[u64; 256]>,
}

impl Needles {
    pub(crate) const fn new(list: &'static [&'static str]) -> Needles {
        Needles {
            list,
            starts: std::sync::OnceLock::new(),
        }
    }

    /// Whether `hay` holds one of the needles, in any case.
    pub(crate) fn in_ci(&self, hay: &[u8]) -> bool {
        let starts = self.starts.get_or_init(|| first_bytes(self.list));
        find_any_ci(hay, self.list, starts, false)
    }

    /// Like [`Needles::in_ci`], counting only a match written as a word is
    /// ([`written_as_word`]).
    pub(crate) fn in_word_case(&self, hay: &[u8]) -> bool {
        let starts = self.starts.get_or_init(|| first_bytes(self.list));
        find_any_ci(hay, self.list, starts, true)
    }
}

/// How many bytes of `b` equal `c` (eight at a time).
pub(crate) fn count_byte(b: &[u8], c: u8) -> usize {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let mut chunks = b.chunks_exact(8);
    let mut n = 0;
    for ch in &mut chunks {
        let x = u64::from_le_bytes(ch.try_into().unwrap_or([0; 8])) ^ (LO * u64::from(c));
        // High bit set in each zero byte of x.
        let zero = !((x & !HI).wrapping_add(!HI) | x) & HI;
        n += zero.count_ones() as usize;
    }
    n + chunks.remainder().iter().filter(|&&x| x == c).count()
}

/// Case-insensitive ASCII substring test.
pub(crate) fn contains_ci(hay: &[u8], needle: &[u8]) -> bool {
    let Some((&first, rest)) = needle.split_first() else {
        return true;
    };
    if needle.len() > hay.len() {
        return false;
    }
    let first = first.to_ascii_lowercase();
    (0..=hay.len() - needle.len()).any(|i| {
        hay[i].to_ascii_lowercase() == first
            && hay[i + 1..i + needle.len()].eq_ignore_ascii_case(rest)
    })
}

/// `8-4-4-4-12` hexadecimal.
pub(crate) fn is_uuid(v: &[u8]) -> bool {
    v.len() == 36
        && v.iter().enumerate().all(|(i, &b)| {
            if matches!(i, 8 | 13 | 18 | 23) {
                b == b'-'
            } else {
                b.is_ascii_hexdigit()
            }
        })
}

/// All hexadecimal digits.
pub(crate) fn is_hex(v: &[u8]) -> bool {
    !v.is_empty() && v.iter().all(u8::is_ascii_hexdigit)
}

/// The suffix of a prefixed token (after `prefix_len` bytes) looks
/// generated: not a placeholder, enough distinct characters.
pub(crate) fn random_suffix(token: &[u8], prefix_len: usize) -> bool {
    let rest = &token[prefix_len.min(token.len())..];
    !is_placeholder(rest) && distinct(rest) >= (rest.len() / 4).clamp(4, 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_known_vector() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn counts_bytes() {
        let text = "a\nbb\n\nccc\u{e9}\n12345678\n";
        assert_eq!(count_byte(text.as_bytes(), b'\n'), 5);
        assert_eq!(count_byte(&[0x8a; 17], b'\n'), 0);
        assert_eq!(count_byte(&[b'\n'; 17], b'\n'), 17);
    }

    #[test]
    fn luhn_vectors() {
        assert!(luhn(b"4111111111111111"));
        assert!(luhn(b"378282246310005"));
        assert!(!luhn(b"4111111111111112"));
    }

    #[test]
    fn iban_vectors() {
        assert!(iban_mod97(b"GB82WEST12345698765432"));
        assert!(iban_mod97(b"DE89370400440532013000"));
        assert!(!iban_mod97(b"GB82WEST12345698765433"));
        assert_eq!(iban_length(b"GB"), Some(22));
    }

    #[test]
    fn bech32_round_trip() {
        let s = bech32_encode("age-secret-key-", &[3u8; 52]);
        assert!(bech32_ok(s.as_bytes()));
        assert!(bech32_ok(s.to_ascii_uppercase().as_bytes()));
        let mut bad = s.into_bytes();
        let last = bad.len() - 1;
        bad[last] = if bad[last] == b'q' { b'p' } else { b'q' };
        assert!(!bech32_ok(&bad));
    }

    #[test]
    fn base64url_prefix() {
        assert_eq!(
            b64url_decode_prefix(b"eyJhbGciOiJIUzI1NiJ9", 64).unwrap(),
            br#"{"alg":"HS256"}"#
        );
    }

    #[test]
    fn placeholder_shapes() {
        for p in [
            "xxxxxxxx",
            "****",
            "...",
            "<your-key>",
            "${API_KEY}",
            "YOUR_API_KEY_HERE",
            "aaaaaaaa",
            "changeme",
        ] {
            assert!(is_placeholder(p.as_bytes()), "{p}");
        }
        for s in ["hunter2!x", "9f86d081884c7d65", "wJalrXUtnFEMI/K7MDENG"] {
            assert!(!is_placeholder(s.as_bytes()), "{s}");
        }
    }
}
