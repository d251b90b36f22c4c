//! How results are laid out: sizes, line numbers, truncation, listings.
//!
//! Pure text functions, no store access. The line model used by every
//! command lives here: a text's lines are its `\n`-separated pieces, and a
//! final `\n` ends the last line instead of starting an empty one (`""` has
//! no lines, `"a\n"` one, `"a\n\n"` two). A `\r` stays part of its line.
//!
//! Everything counts characters (Unicode scalar values), never bytes, and
//! never slices inside a character.

use std::fmt::Write as _;

/// Width of the right-aligned line number column.
pub const LINE_NUMBER_WIDTH: usize = 6;

/// The most lines a file may have to be viewed.
pub const MAX_VIEW_LINES: usize = 999_999;

/// `{n}B` below 1,024 bytes, else one decimal and a unit in steps of 1,024
/// (`1.5K`, `4.0K`, `12.3M`). Rounding never shows `1024.0` of a unit: it
/// moves to the next one (1,048,575 bytes is `1.0M`).
pub fn human_size(bytes: u64) -> String {
    const UNITS: [char; 6] = ['K', 'M', 'G', 'T', 'P', 'E'];
    if bytes < 1024 {
        return format!("{bytes}B");
    }
    // Precision loss in the cast only matters far below the one decimal shown.
    #[allow(clippy::cast_precision_loss)]
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    loop {
        let text = format!("{value:.1}");
        let rounds_up = text.parse::<f64>().is_ok_and(|v| v >= 1024.0);
        if rounds_up && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
            continue;
        }
        return format!("{text}{}", UNITS[unit]);
    }
}

/// The lines of `text` (see the module docs for the line model).
pub fn lines(text: &str) -> impl Iterator<Item = &str> {
    let body = text.strip_suffix('\n').unwrap_or(text);
    let mut pieces = body.split('\n');
    if text.is_empty() {
        // `"".split` yields one empty piece; an empty text has no lines.
        pieces.next();
    }
    pieces
}

/// How many lines `text` has: `lines(text).count()`, without allocating.
pub fn line_count(text: &str) -> usize {
    if text.is_empty() {
        return 0;
    }
    let newlines = text.bytes().filter(|&b| b == b'\n').count();
    if text.ends_with('\n') {
        newlines
    } else {
        newlines + 1
    }
}

/// The 0-based line that byte offset `at` of `text` lies on.
pub fn line_index_at(text: &str, at: usize) -> usize {
    let end = at.min(text.len());
    text.as_bytes()
        .get(..end)
        .map_or(0, |b| b.iter().filter(|&&c| c == b'\n').count())
}

/// One numbered line: the number right-aligned in 6 characters, a tab,
/// the text.
pub fn numbered_line(number: usize, line: &str) -> String {
    format!("{number:>LINE_NUMBER_WIDTH$}\t{line}")
}

fn digits(n: usize) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// Characters in `numbered_line(number, line)` for a line of `chars`
/// characters.
fn numbered_len(number: usize, chars: usize) -> usize {
    digits(number).max(LINE_NUMBER_WIDTH) + 1 + chars
}

/// Numbers `lines` (the first is line `first_number`) and joins them with
/// `\n`, keeping the result, its marker line included, within
/// `max_chars` characters.
///
/// When everything fits, every line is shown. Otherwise whole numbered
/// lines are kept from the start (up to half the budget) and from the end
/// (the rest of the budget), and one line in the middle says how many lines
/// were left out and which `view_range` shows them. Each kept line counts
/// with its newline. A single line longer than half the budget is cut
/// inside (at character boundaries): its first two thirds of what fits and
/// its last third are kept, with how many characters were left out
/// between, so the start and the end of the text are always visible.
pub fn numbered(lines: &[&str], first_number: usize, max_chars: usize) -> String {
    let chars: Vec<usize> = lines.iter().map(|l| l.chars().count()).collect();
    let total: usize = chars
        .iter()
        .enumerate()
        .map(|(i, &c)| numbered_len(first_number.saturating_add(i), c) + 1)
        .sum();
    if total.saturating_sub(1) <= max_chars {
        let mut out = String::with_capacity(total);
        for (i, line) in lines.iter().enumerate() {
            if i > 0 {
                out.push('\n');
            }
            let _ = write!(
                out,
                "{:>LINE_NUMBER_WIDTH$}\t{line}",
                first_number.saturating_add(i)
            );
        }
        return out;
    }

    // The marker line comes out of the budget too (at its longest: every
    // number in it as long as the last line's).
    let widest = "9".repeat(digits(first_number.saturating_add(lines.len())));
    let marker = format!(
        "… {widest} lines omitted (lines {widest}-{widest}); call view with view_range [{widest}, {widest}] to see them …"
    )
    .chars()
    .count();
    let max_chars = max_chars.saturating_sub(marker + 1);
    // Half the budget for the head; all of it for a lone line (a
    // `view_range` of one long line).
    let cap = if lines.len() == 1 {
        max_chars
    } else {
        max_chars / 2
    };
    // A line as shown when truncating: whole, or cut to fit in `cap`.
    let shown = |i: usize| -> (usize, Option<String>) {
        let number = first_number.saturating_add(i);
        let full = numbered_len(number, chars[i]);
        // Fits in half the budget with its newline: shown whole.
        if full < cap {
            return (full, None);
        }
        // Its start and its end, the middle left out: the line's end can
        // matter as much as the file's.
        let widest = format!(
            " … [{0} of this line's {0} characters not shown] … ",
            chars[i]
        );
        let room = cap.saturating_sub(numbered_len(number, 0) + widest.chars().count() + 1);
        let start = room - room / 3;
        let end = room / 3;
        let omitted = chars[i].saturating_sub(start + end);
        let mut kept: String = lines[i].chars().take(start).collect();
        let _ = write!(
            kept,
            " … [{omitted} of this line's {} characters not shown] … ",
            chars[i]
        );
        kept.extend(lines[i].chars().skip(chars[i] - end));
        let text = numbered_line(number, &kept);
        (text.chars().count(), Some(text))
    };

    let n = lines.len();
    let mut head: Vec<(usize, Option<String>)> = Vec::new();
    let mut used = 0usize;
    while head.len() < n {
        let (len, text) = shown(head.len());
        if used + len + 1 > cap {
            break;
        }
        used += len + 1;
        head.push((len, text));
    }
    let mut tail: Vec<(usize, Option<String>)> = Vec::new();
    while head.len() + tail.len() < n {
        let (len, text) = shown(n - 1 - tail.len());
        if used + len + 1 > max_chars {
            break;
        }
        used += len + 1;
        tail.push((len, text));
    }
    tail.reverse();

    let mut out = String::with_capacity(used + 128);
    let push = |out: &mut String, s: &str| {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(s);
    };
    for (i, (_, text)) in head.iter().enumerate() {
        match text {
            Some(t) => push(&mut out, t),
            None => push(
                &mut out,
                &numbered_line(first_number.saturating_add(i), lines[i]),
            ),
        }
    }
    let omitted = n - head.len() - tail.len();
    if omitted > 0 {
        let first = first_number.saturating_add(head.len());
        let last = first.saturating_add(omitted - 1);
        push(&mut out, &omitted_marker(first, last));
    }
    let tail_start = n - tail.len();
    for (k, (_, text)) in tail.iter().enumerate() {
        let i = tail_start + k;
        match text {
            Some(t) => push(&mut out, t),
            None => push(
                &mut out,
                &numbered_line(first_number.saturating_add(i), lines[i]),
            ),
        }
    }
    out
}

/// The one line that stands for the lines `first..=last` left out.
pub fn omitted_marker(first: usize, last: usize) -> String {
    if first == last {
        format!(
            "… 1 line omitted (line {first}); call view with view_range [{first}, {first}] to see it …"
        )
    } else {
        let count = last.saturating_sub(first).saturating_add(1);
        format!(
            "… {count} lines omitted (lines {first}-{last}); call view with view_range [{first}, {last}] to see them …"
        )
    }
}

/// The first line of a directory view.
pub fn listing_header(path: &str) -> String {
    format!(
        "Here're the files and directories up to 2 levels deep in {path}, excluding hidden items and node_modules:"
    )
}

/// One entry of a directory view: `{size}\t{path}`.
pub fn listing_line(size: u64, path: &str) -> String {
    format!("{}\t{path}", human_size(size))
}

/// The first line of a file view.
pub fn file_header(path: &str) -> String {
    format!("Here's the content of {path} with line numbers:")
}

/// A header followed by a body on the next line; just the header when the
/// body is empty.
pub fn with_body(header: String, body: &str) -> String {
    if body.is_empty() {
        header
    } else {
        let mut out = header;
        out.push('\n');
        out.push_str(body);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        let cases: [(u64, &str); 16] = [
            (0, "0B"),
            (1, "1B"),
            (1023, "1023B"),
            (1024, "1.0K"),
            (1536, "1.5K"),
            (4096, "4.0K"),
            (5632, "5.5K"),
            (1_048_000, "1023.4K"),
            (1_048_575, "1.0M"),
            (1_048_576, "1.0M"),
            (1_258_291, "1.2M"),
            (12_897_485, "12.3M"),
            (1 << 30, "1.0G"),
            ((1 << 30) - 1, "1.0G"),
            (1 << 40, "1.0T"),
            (u64::MAX, "16.0E"),
        ];
        for (bytes, text) in cases {
            assert_eq!(human_size(bytes), text, "{bytes}");
        }
        // 1023.95K and above rounds to the next unit, never "1024.0K".
        for bytes in (1_048_000..1_048_576).step_by(7) {
            assert!(!human_size(bytes).starts_with("1024"), "{bytes}");
        }
    }

    #[test]
    fn line_model() {
        let cases: [(&str, &[&str]); 8] = [
            ("", &[]),
            ("a", &["a"]),
            ("a\n", &["a"]),
            ("a\nb", &["a", "b"]),
            ("a\n\n", &["a", ""]),
            ("\n", &[""]),
            ("\n\n", &["", ""]),
            ("a\r\nb\r\n", &["a\r", "b\r"]),
        ];
        for (text, expected) in cases {
            assert_eq!(lines(text).collect::<Vec<_>>(), expected, "{text:?}");
            assert_eq!(line_count(text), expected.len(), "{text:?}");
        }
        assert_eq!(line_index_at("a\nb\nc", 0), 0);
        assert_eq!(line_index_at("a\nb\nc", 2), 1);
        assert_eq!(line_index_at("a\nb\nc", 99), 2);
    }

    #[test]
    fn numbered_lines_are_six_wide_with_a_tab() {
        assert_eq!(numbered_line(1, "Hello World"), "     1\tHello World");
        assert_eq!(numbered_line(100, "x"), "   100\tx");
        assert_eq!(numbered_line(999_999, ""), "999999\t");
        assert_eq!(
            numbered(&["Hello World", "This is line two"], 1, 16_000),
            "     1\tHello World\n     2\tThis is line two"
        );
        assert_eq!(numbered(&["x", "y"], 10, 16_000), "    10\tx\n    11\ty");
        assert_eq!(numbered(&[], 1, 16_000), "");
    }

    #[test]
    fn truncation_keeps_both_ends_within_budget() {
        let owned: Vec<String> = (1..=5000).map(|i| format!("line {i} é")).collect();
        let lines: Vec<&str> = owned.iter().map(String::as_str).collect();
        let out = numbered(&lines, 1, 16_000);
        let rows: Vec<&str> = out.split('\n').collect();
        let marker: Vec<&&str> = rows.iter().filter(|r| r.starts_with('…')).collect();
        assert_eq!(marker.len(), 1);
        assert!(out.starts_with("     1\tline 1 é\n     2\tline 2 é\n"));
        assert!(out.ends_with("  4999\tline 4999 é\n  5000\tline 5000 é"));
        assert!(out.chars().count() <= 16_000 + marker[0].chars().count() + 1);
        // Every row but the marker is a whole numbered line, in order.
        let mut numbers = rows.iter().filter(|r| !r.starts_with('…')).map(|r| {
            r.split('\t')
                .next()
                .unwrap()
                .trim()
                .parse::<usize>()
                .unwrap()
        });
        let first_tail = numbers
            .clone()
            .zip(numbers.clone().skip(1))
            .find(|(a, b)| b - a > 1);
        let (last_head, first_tail) = first_tail.unwrap();
        assert_eq!(
            *marker[0],
            format!(
                "… {} lines omitted (lines {}-{}); call view with view_range [{}, {}] to see them …",
                first_tail - last_head - 1,
                last_head + 1,
                first_tail - 1,
                last_head + 1,
                first_tail - 1
            )
        );
        assert!(numbers.all(|n| (1..=5000).contains(&n)));
    }

    #[test]
    fn truncation_numbers_ranged_lines_from_their_start() {
        let owned: Vec<String> = (0..3000).map(|i| format!("{i:0>20}")).collect();
        let lines: Vec<&str> = owned.iter().map(String::as_str).collect();
        let out = numbered(&lines, 101, 2000);
        assert!(out.starts_with("   101\t"), "{out}");
        assert!(out.ends_with("  3100\t00000000000000002999"), "{out}");
        assert!(out.contains("lines omitted (lines "));
    }

    #[test]
    fn one_omitted_line_is_singular() {
        let lines = ["a".repeat(100), "b".repeat(100), "c".repeat(100)];
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        // Room for two numbered lines of 107 characters with their
        // newlines, and for the marker at its longest.
        let marker =
            "… 9 lines omitted (lines 9-9); call view with view_range [9, 9] to see them …";
        let budget = 2 * 108 + marker.chars().count() + 1;
        let out = numbered(&lines, 1, budget);
        assert_eq!(
            out,
            format!(
                "     1\t{}\n… 1 line omitted (line 2); call view with view_range [2, 2] to see it …\n     3\t{}",
                "a".repeat(100),
                "c".repeat(100)
            )
        );
        assert!(out.chars().count() <= budget);
    }

    #[test]
    fn a_giant_line_is_cut_inside_at_a_char_boundary() {
        let giant = "é".repeat(100_000);
        let out = numbered(&[giant.as_str()], 1, 16_000);
        assert!(out.starts_with("     1\téé"));
        // Its end is shown too, past the note of what was left out.
        let tail = "x".repeat(10) + "THE-END";
        let ended = giant.clone() + &tail;
        let cut = numbered(&[ended.as_str()], 1, 16_000);
        assert!(cut.ends_with(&tail), "{}", &cut[cut.len() - 100..]);
        let note = cut.split(" … [").nth(1).unwrap();
        let omitted: usize = note.split(' ').next().unwrap().parse().unwrap();
        assert!(note.starts_with(&format!(
            "{omitted} of this line's 100017 characters not shown] … "
        )));
        // What is shown and what the note counts make the whole line.
        let shown = cut.chars().filter(|&c| c == 'é' || c == 'x').count() + "THE-END".len();
        assert_eq!(shown + omitted, 100_017);
        assert!(cut.chars().count() <= 16_000);
        assert!(out.contains("1 line omitted") || out.chars().count() <= 16_000);
        assert!(out.chars().count() <= 16_000 + 200);
        // Alone (a view_range of that line), it has the whole budget.
        assert!(out.chars().count() > 15_800, "{}", out.chars().count());
        let two = [giant.as_str(), "end"];
        let out = numbered(&two, 1, 16_000);
        assert!(out.starts_with("     1\téé"));
        assert!(out.ends_with("     2\tend"), "{out}");
        // A giant first line still leads, then the marker, then the end.
        let mut many = vec![giant.as_str()];
        many.extend(std::iter::repeat_n("filler line", 3000));
        many.push("the end");
        let out = numbered(&many, 1, 16_000);
        assert!(out.starts_with("     1\téé"));
        let rows: Vec<&str> = out.split('\n').collect();
        assert!(
            rows[0].contains(" characters not shown] … éé"),
            "{}",
            rows[0]
        );
        assert!(rows[1].starts_with("… "), "{}", rows[1]);
        assert!(out.ends_with("  3002\tthe end"));
        assert!(out.chars().count() <= 16_000 + rows[1].chars().count() + 1);
    }

    #[test]
    fn tiny_budgets_do_not_panic() {
        let lines = ["abc", "def", "ghi"];
        for budget in 0..40 {
            let out = numbered(&lines, 1, budget);
            assert!(
                out.contains("omitted") || out.chars().count() <= budget,
                "{budget}: {out}"
            );
        }
    }

    #[test]
    fn headers() {
        assert_eq!(
            listing_header("/memories"),
            "Here're the files and directories up to 2 levels deep in /memories, excluding hidden items and node_modules:"
        );
        assert_eq!(listing_line(1536, "/memories/a"), "1.5K\t/memories/a");
        assert_eq!(
            file_header("/memories/a"),
            "Here's the content of /memories/a with line numbers:"
        );
        assert_eq!(with_body("H".into(), ""), "H");
        assert_eq!(with_body("H".into(), "b"), "H\nb");
    }
}
