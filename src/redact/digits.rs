//! Numbers that are personal data: payment card numbers (Luhn and a card
//! network's prefix and length), US Social Security numbers (valid
//! ranges, dashed), and IBANs (registered length and mod-97 check digits).
//!
//! They have no keyword, so a word-at-a-time scan finds runs of digits
//! (single spaces or dashes allowed between digits) with at least nine
//! digits, and only those runs are parsed.

use super::checks::{card_brand_ok, iban_length, iban_mod97, luhn, ssn_ok};

/// Minimum digits in a run worth parsing (an SSN has nine).
pub(crate) const MIN_RUN_DIGITS: usize = 9;

const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;

/// High bit set in each byte of `x` that is an ASCII digit.
fn digit_mask(x: u64) -> u64 {
    let y = x & !HI;
    let ge0 = y.wrapping_add(LO * (0x80 - 0x30));
    let ge10 = y.wrapping_add(LO * (0x80 - 0x3a));
    ge0 & !ge10 & !x & HI
}

/// Bytes checked at once for a digit (a loop the compiler turns into
/// vector instructions).
const BLOCK: usize = 64;

/// Whether `block` holds an ASCII digit. Written so that it compiles to
/// a few vector compares and no branch per byte.
fn any_digit(block: &[u8; BLOCK]) -> bool {
    block
        .iter()
        .fold(0u8, |acc, &c| acc | u8::from(c.wrapping_sub(b'0') < 10))
        != 0
}

/// Calls `f(start, end)` for each maximal run of digits, where single
/// spaces or dashes may separate digits, holding at least `min_digits`
/// digits. Text without digits is skipped 64 bytes at a time, then eight.
pub(crate) fn runs(b: &[u8], min_digits: usize, mut f: impl FnMut(usize, usize)) {
    let n = b.len();
    let mut i = 0;
    while i < n {
        while let Some(block) = b
            .get(i..i + BLOCK)
            .and_then(|s| <&[u8; BLOCK]>::try_from(s).ok())
        {
            if any_digit(block) {
                break;
            }
            i += BLOCK;
        }
        while i + 8 <= n {
            let chunk: [u8; 8] = b[i..i + 8].try_into().unwrap_or([0; 8]);
            let m = digit_mask(u64::from_le_bytes(chunk));
            if m != 0 {
                i += (m.trailing_zeros() / 8) as usize;
                break;
            }
            i += 8;
        }
        while i < n && !b[i].is_ascii_digit() {
            i += 1;
        }
        if i >= n {
            break;
        }
        let start = i;
        let mut count = 0;
        loop {
            while i < n && b[i].is_ascii_digit() {
                i += 1;
                count += 1;
            }
            if i + 1 < n && matches!(b[i], b' ' | b'-') && b[i + 1].is_ascii_digit() {
                i += 1;
            } else {
                break;
            }
        }
        if count >= min_digits {
            f(start, i);
        }
    }
}

/// Bytes that may not touch a number on either side.
fn glued(b: &[u8], i: usize, before: bool) -> bool {
    let Some(&c) = b.get(i) else {
        return false;
    };
    if c.is_ascii_alphanumeric() || c == b'_' {
        return true;
    }
    // 3.14159…, 1,234: part of a larger number.
    let other = if before {
        i.checked_sub(1)
    } else {
        Some(i + 1)
    };
    matches!(c, b'.' | b',' | b'-' | b'/' | b':')
        && other.and_then(|j| b.get(j)).is_some_and(u8::is_ascii_digit)
}

fn edges_ok(b: &[u8], s: usize, e: usize) -> bool {
    (s == 0 || !glued(b, s - 1, true)) && !glued(b, e, false)
}

/// Digit groups of a run: `(start, end)` of each group, and separators.
fn groups(b: &[u8], s: usize, e: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = s;
    while i < e {
        let gs = i;
        while i < e && b[i].is_ascii_digit() {
            i += 1;
        }
        out.push((gs, i));
        i += 1;
    }
    out
}

/// Card numbers: 13 to 19 digits, all together or in groups split by one
/// kind of separator, with a network's prefix and length and a valid
/// Luhn digit. The longest valid number from each group start wins.
pub(crate) fn cards(text: &str, s: usize, e: usize, out: &mut Vec<(usize, usize)>) {
    let b = text.as_bytes();
    let gs = groups(b, s, e);
    let mut i = 0;
    let mut digits = Vec::with_capacity(19);
    while i < gs.len() {
        let mut best = None;
        let mut total = 0;
        digits.clear();
        for j in i..gs.len() {
            let (a, z) = gs[j];
            total += z - a;
            // All together, or groups of three to six digits after a first
            // group of four (4-4-4-4, 4-6-5, 4-4-4-4-3).
            let grouping_ok = j == i || ((gs[i].1 - gs[i].0) == 4 && (3..=6).contains(&(z - a)));
            if total > 19 || !grouping_ok {
                break;
            }
            if j > i && b[gs[j].0 - 1] != b[gs[i + 1].0 - 1] {
                break;
            }
            digits.extend_from_slice(&b[a..z]);
            if total >= 13 && card_brand_ok(&digits) && luhn(&digits) && edges_ok(b, gs[i].0, z) {
                best = Some(j);
            }
        }
        match best {
            Some(j) => {
                out.push((gs[i].0, gs[j].1));
                i = j + 1;
            }
            None => i += 1,
        }
    }
}

/// `AAA-GG-SSSS` (dashes or spaces), the whole run, in valid ranges.
pub(crate) fn ssn(text: &str, s: usize, e: usize, out: &mut Vec<(usize, usize)>) {
    let b = text.as_bytes();
    let gs = groups(b, s, e);
    if gs.len() == 1 && e - s == 9 && edges_ok(b, s, e) && names_ssn(b, s) {
        let num = |a: usize, z: usize| {
            b[a..z]
                .iter()
                .fold(0u32, |acc, &d| acc * 10 + u32::from(d - b'0'))
        };
        if ssn_ok(num(s, s + 3), num(s + 3, s + 5), num(s + 5, e)) {
            out.push((s, e));
        }
        return;
    }
    if gs.len() != 3 || !edges_ok(b, s, e) {
        return;
    }
    let lens: Vec<usize> = gs.iter().map(|(a, z)| z - a).collect();
    if lens != [3, 2, 4] || b[gs[1].0 - 1] != b[gs[2].0 - 1] {
        return;
    }
    let num = |(a, z): (usize, usize)| {
        b[a..z]
            .iter()
            .fold(0u32, |acc, &d| acc * 10 + u32::from(d - b'0'))
    };
    if ssn_ok(num(gs[0]), num(gs[1]), num(gs[2])) {
        out.push((s, e));
    }
}

/// The 48 bytes before `s` name a Social Security number (`SSN`,
/// `social security`), so nine bare digits are one.
fn names_ssn(b: &[u8], s: usize) -> bool {
    let before = &b[s.saturating_sub(48)..s];
    super::checks::contains_any_ci(before, &["ssn", "social security", "social-security"])
}

/// IBANs near a run of digits: a country code and two check digits up to
/// 40 bytes before the run, then the account part, compact or in groups
/// split by single spaces, exactly as long as the country's IBAN.
pub(crate) fn iban(text: &str, s: usize, e: usize, out: &mut Vec<(usize, usize)>) {
    let b = text.as_bytes();
    let lo = s.saturating_sub(40);
    let mut q = lo;
    let mut compact = Vec::with_capacity(34);
    while q + 4 <= e {
        let head = &b[q..q + 4];
        // Written in capitals, or all in lower case (`iban de56 2085…`):
        // its letters are all of one case.
        let lower = head[0].is_ascii_lowercase();
        let letter = |c: u8| {
            if lower {
                c.is_ascii_lowercase()
            } else {
                c.is_ascii_uppercase()
            }
        };
        let plausible = letter(head[0])
            && letter(head[1])
            && head[2].is_ascii_digit()
            && head[3].is_ascii_digit()
            && (q == 0 || !b[q - 1].is_ascii_alphanumeric());
        let country = [head[0].to_ascii_uppercase(), head[1].to_ascii_uppercase()];
        let Some(len) = plausible.then(|| iban_length(&country)).flatten() else {
            q += 1;
            continue;
        };
        compact.clear();
        let mut i = q;
        while i < b.len() && compact.len() < len {
            let c = b[i];
            if letter(c) || c.is_ascii_digit() {
                compact.push(c.to_ascii_uppercase());
                i += 1;
            } else if c == b' '
                && i > q + 1
                && b.get(i + 1)
                    .is_some_and(|&n| letter(n) || n.is_ascii_digit())
            {
                i += 1;
            } else {
                break;
            }
        }
        let end_ok = b.get(i).is_none_or(|c| !c.is_ascii_alphanumeric());
        if compact.len() == len && end_ok && iban_mod97(&compact) {
            out.push((q, i));
            q = i;
        } else {
            q += 1;
        }
    }
}

/// Asana personal access tokens: `1/<16 digits>:<32 hex>` or
/// `2/<16 digits>/<16 digits>:<32 hex>`. The run is the first group of
/// digits; the rest is read after it (at most 60 bytes).
pub(crate) fn asana(text: &str, s: usize, e: usize, out: &mut Vec<(usize, usize)>) {
    let b = text.as_bytes();
    if s < 2 || b[s - 1] != b'/' || !b[s - 2].is_ascii_digit() {
        return;
    }
    if s >= 3 && (b[s - 3].is_ascii_alphanumeric() || matches!(b[s - 3], b'/' | b'.')) {
        return;
    }
    let group = |from: usize| {
        let mut k = from;
        while k < b.len() && b[k].is_ascii_digit() && k - from < 20 {
            k += 1;
        }
        ((13..=19).contains(&(k - from))).then_some(k)
    };
    let Some(mut i) = group(s) else {
        return;
    };
    if i != e && !matches!(b.get(i), Some(b'/' | b':')) {
        return;
    }
    if b.get(i) == Some(&b'/') {
        let Some(k) = group(i + 1) else {
            return;
        };
        i = k;
    }
    if b.get(i) != Some(&b':') {
        return;
    }
    let h = i + 1;
    let mut k = h;
    while k < b.len() && k - h <= 32 && b[k].is_ascii_hexdigit() {
        k += 1;
    }
    if k - h == 32 && b.get(k).is_none_or(|c| !c.is_ascii_alphanumeric()) {
        out.push((s - 2, k));
    }
}

#[cfg(test)]
mod tests {
    /// Every maximal run, read byte by byte.
    fn naive(b: &[u8], min_digits: usize) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            if !b[i].is_ascii_digit() {
                i += 1;
                continue;
            }
            let (start, mut count) = (i, 0);
            loop {
                while i < b.len() && b[i].is_ascii_digit() {
                    i += 1;
                    count += 1;
                }
                if i + 1 < b.len() && matches!(b[i], b' ' | b'-') && b[i + 1].is_ascii_digit() {
                    i += 1;
                } else {
                    break;
                }
            }
            if count >= min_digits {
                out.push((start, i));
            }
        }
        out
    }

    #[test]
    fn word_skipping_runs_match_a_byte_by_byte_reading() {
        let mut x = 0x1234_5678_9abc_def1u64;
        let alphabet = b"0123456789 -a.\xc3";
        for len in 0..300 {
            for _ in 0..20 {
                let text: Vec<u8> = (0..len)
                    .map(|_| alphabet[crate::test_rand(&mut x, alphabet.len())])
                    .collect();
                for min in [1, 5, 9] {
                    let mut got = Vec::new();
                    super::runs(&text, min, |s, e| got.push((s, e)));
                    assert_eq!(
                        got,
                        naive(&text, min),
                        "{:?}",
                        String::from_utf8_lossy(&text)
                    );
                }
            }
        }
    }
}
