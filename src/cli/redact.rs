//! `memvault redact [FILE]`: the filter over a file or stdin, a piece at a
//! time.
//!
//! A file is read twice, in pieces into reused buffers: once to check
//! that it is UTF-8 (so a file that is not text is refused before
//! anything is written; a regular file's pieces are checked on several
//! threads, see [`check_utf8_file`]), then to redact it, about a MiB at
//! a time. Each piece ends at a
//! line break and is scanned together with [`MARGIN`] bytes before and
//! after it, more than any rule reads for context; a secret that reaches
//! the end of that window (a long key block) makes the window grow until
//! the secret ends inside it. Consecutive pieces are scanned on threads of
//! their own, while the output of the batch before is written (stdout,
//! when a pipe, is asked for a 1 MiB buffer). Findings that start in the
//! piece are
//! redacted, so the output is what redacting the whole text at once
//! gives, while memory stays a few MiB whatever the file's size: the
//! piece is scanned while it is still in cache, and no fresh memory is
//! touched (for a 50 MB file, faulting in a 50 MB buffer cost more than
//! scanning it).

use std::io::{self, BufRead, Read, Write};
use std::path::Path;

use super::CliError;
use crate::redact::Redactor;

/// Bytes redacted per step.
pub(crate) const PIECE: usize = 1 << 20;

/// Context scanned on each side of a piece.
pub(crate) const MARGIN: usize = 16 << 10;

/// The rule ids redacted, with how often each was.
pub(crate) type Kinds = Vec<(String, u32)>;

/// Bytes read per step of the UTF-8 check (a buffer that stays in cache).
const CHECK_PIECE: usize = 256 << 10;

/// Checks that `input` is UTF-8, reading it a piece at a time.
pub(crate) fn check_utf8(input: &mut dyn Read) -> Result<(), CliError> {
    let mut buf: Vec<u8> = Vec::with_capacity(CHECK_PIECE + 4);
    loop {
        if fill(input, &mut buf, CHECK_PIECE)? == 0 {
            // Left over: the start of a character the input never finished.
            return if buf.is_empty() {
                Ok(())
            } else {
                Err(not_text())
            };
        }
        match std::str::from_utf8(&buf) {
            Ok(_) => buf.clear(),
            // A character cut by the piece's end: keep its first bytes.
            Err(e) if e.error_len().is_none() => {
                let keep = e.valid_up_to();
                buf.drain(..keep);
            }
            Err(_) => return Err(not_text()),
        }
    }
}

/// Checks that the file `f` is UTF-8, reading pieces of it on several
/// threads at once (one per available core, at most [`MAX_THREADS`]):
/// for a file already in the page cache, this check costs as much as
/// reading it, and would otherwise keep all but one core idle.
///
/// Each piece is checked from its first byte that is not a UTF-8
/// continuation byte to the first such byte after its end, so every
/// character falls whole in exactly one piece, and the file is UTF-8 if
/// and only if every piece is (a piece that starts with more than three
/// continuation bytes is not).
#[cfg(unix)]
pub(crate) fn check_utf8_file(f: &std::fs::File) -> Result<(), CliError> {
    use std::os::unix::fs::FileExt;
    let len = usize::try_from(f.metadata()?.len())
        .map_err(|_| CliError::failure("the input is too large"))?;
    let pieces = len.div_ceil(CHECK_PIECE);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, MAX_THREADS)
        .min(pieces.max(1));
    let check = |t: usize| -> Result<(), CliError> {
        let mut buf = vec![0u8; CHECK_PIECE + 4];
        for k in (t..pieces).step_by(threads) {
            let start = k * CHECK_PIECE;
            let end = (start + CHECK_PIECE + 4).min(len);
            let b = &mut buf[..end - start];
            f.read_exact_at(b, start as u64)?;
            let continuation = |c: &u8| c & 0xc0 == 0x80;
            let from = if start == 0 {
                0
            } else {
                b.iter().take(4).take_while(|c| continuation(c)).count()
            };
            let core = CHECK_PIECE.min(b.len());
            let to = core + b[core..].iter().take_while(|c| continuation(c)).count();
            if from > 3 || std::str::from_utf8(&b[from..to]).is_err() {
                return Err(not_text());
            }
        }
        Ok(())
    };
    if threads == 1 {
        return check(0);
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| scope.spawn(move || check(t)))
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .map_err(|_| CliError::failure("internal error in the UTF-8 check"))?
        })
    })
}

/// Reads `input` into `buf` until `buf` is full or the input ends, in as
/// few reads as the input allows; returns how many bytes it read.
fn read_full(input: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match input.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Appends up to `want` bytes of `input` to `buf` (fewer only at its
/// end); returns how many.
fn fill(input: &mut dyn Read, buf: &mut Vec<u8>, want: usize) -> io::Result<usize> {
    let start = buf.len();
    buf.resize(start + want, 0);
    let got = read_full(input, &mut buf[start..]);
    buf.truncate(start + *got.as_ref().unwrap_or(&0));
    got
}

fn not_text() -> CliError {
    CliError::failure("the input is not UTF-8 text; redact reads text files only")
}

/// Pieces scanned at once, one per thread (at most).
const MAX_THREADS: usize = 4;

/// A stretch of the input held in memory: `data[..filled]` is the input
/// from offset `base`. `data` keeps its length between batches, so a
/// read lands in memory already written once (no zeroing per batch).
#[derive(Default)]
struct Held {
    data: Vec<u8>,
    filled: usize,
    base: usize,
}

impl Held {
    /// Reads `input` until this holds it up to offset `end`, in reads of
    /// at least 64 KiB; returns whether the input ended first.
    fn fill_to(&mut self, input: &mut dyn Read, end: usize) -> io::Result<bool> {
        let want = end.saturating_sub(self.base + self.filled);
        if want == 0 {
            return Ok(false);
        }
        let want = want.max(64 << 10);
        let stop = self.filled + want;
        if self.data.len() < stop {
            self.data.resize(stop, 0);
        }
        let got = read_full(input, &mut self.data[self.filled..stop])?;
        self.filled += got;
        Ok(got < want)
    }

    /// Makes this the input from offset `from` on, as `other` holds it.
    fn take_tail(&mut self, other: &Held, from: usize) {
        self.filled = 0;
        self.base = from;
        self.append(&other.data[from - other.base..other.filled]);
    }

    fn append(&mut self, bytes: &[u8]) {
        let end = self.filled + bytes.len();
        if self.data.len() < end {
            self.data.resize(end, 0);
        }
        self.data[self.filled..end].copy_from_slice(bytes);
        self.filled = end;
    }
}

/// A piece of output: input bytes (a range of the batch's [`Held`]) or a
/// marker naming a rule.
enum Out<'r> {
    Text(std::ops::Range<usize>),
    Marker(&'r str),
}

fn write_out(out: &mut dyn Write, held: &[u8], pieces: &[Out<'_>]) -> io::Result<()> {
    for p in pieces {
        match p {
            Out::Text(r) => out.write_all(&held[r.clone()])?,
            Out::Marker(rule) => {
                out.write_all(b"[REDACTED:")?;
                out.write_all(rule.as_bytes())?;
                out.write_all(b"]")?;
            }
        }
    }
    Ok(())
}

/// Writes `input` to `out` with every secret replaced by its marker;
/// returns the kinds redacted. `piece` and `margin` are [`PIECE`] and
/// [`MARGIN`] outside tests.
///
/// Consecutive pieces are scanned on their own threads (one per
/// available core, at most [`MAX_THREADS`]), each checking its window is
/// UTF-8 first. Meanwhile this thread reads the next batch and writes the
/// output of the batch before, in order. Three buffers take turns: the
/// batch being scanned, the next one being read (it starts with the
/// scanned batch's last `margin` bytes, as context), and the one before,
/// whose output is written straight from it (no copy of the text).
pub(crate) fn redact_stream(
    redactor: &Redactor,
    input: &mut dyn Read,
    out: &mut dyn Write,
    piece: usize,
    margin: usize,
) -> Result<Kinds, CliError> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, MAX_THREADS);
    // Clean stretches go straight through; markers and the short text
    // between them are gathered.
    let mut out = io::BufWriter::with_capacity(64 << 10, out);
    let mut kinds: Kinds = Vec::new();
    // `cur`: the batch to scan; `next`: the batch after it, read while
    // `cur` is scanned; `old`: the batch before, whose output (`pending`)
    // is written meanwhile.
    let (mut cur, mut next, mut old) = (Held::default(), Held::default(), Held::default());
    let mut pending: Vec<Out<'_>> = Vec::new();
    // Output is written up to input offset `pos`.
    let mut pos = 0usize;
    let mut margin = margin;
    let mut eof = false;
    loop {
        let rel = pos - cur.base;
        let ahead = threads * piece + margin;
        if !eof {
            eof = cur.fill_to(input, pos + ahead)?;
        }
        let buf = &cur.data[..cur.filled];
        if rel >= buf.len() && eof {
            break;
        }
        // Whether `buf` ends where the input does (`eof` may change below,
        // while the next batch is read).
        let whole = eof;
        // The pieces: (cut, window start, window end), the first starting
        // at `rel` and each next one at the last one's cut.
        // The buffer may end inside a character until the input ends.
        let limit = if whole { buf.len() } else { buf.len() - 1 };
        let mut plans: Vec<(usize, usize, usize)> = Vec::with_capacity(threads);
        let mut start = rel;
        while plans.len() < threads && start < buf.len() {
            let (cut, wend) = if whole && buf.len() <= start + piece + margin {
                (buf.len(), buf.len())
            } else {
                let target = start + piece;
                let cut = match memchr::memrchr(b'\n', &buf[start..target]) {
                    Some(i) => start + i + 1,
                    None => char_floor(buf, target).max(start + 1),
                };
                (cut, char_floor(buf, (cut + margin).min(limit)))
            };
            plans.push((cut, char_ceil(buf, start.saturating_sub(margin)), wend));
            start = cut;
        }
        // Where the next batch starts when every piece is done.
        let last_cut = cur.base + start;
        let (found, ready) = std::thread::scope(|scope| {
            let handles: Vec<_> = plans
                .iter()
                .map(|&(_, ws, we)| {
                    let window = &buf[ws..we];
                    scope.spawn(move || {
                        let text = std::str::from_utf8(window).map_err(|_| not_text())?;
                        Ok::<_, CliError>((text, redactor.locate(text)))
                    })
                })
                .collect();
            // The next batch: this one's last `margin` bytes, then input.
            let ready = (|| -> Result<(), CliError> {
                next.take_tail(&cur, last_cut.saturating_sub(margin).max(cur.base));
                if !eof {
                    eof = next.fill_to(input, last_cut + ahead)?;
                }
                write_out(&mut out, &old.data, &pending)?;
                Ok(())
            })();
            let found = handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .map_err(|_| CliError::failure("internal error in the redaction filter"))?
                })
                .collect::<Result<Vec<_>, CliError>>();
            (found, ready)
        });
        let found = found?;
        ready?;
        pending.clear();
        for (&(cut, wstart, wend), (text, spans)) in plans.iter().zip(&found) {
            let (core_start, core_end) = (pos - cur.base - wstart, cut - wstart);
            // A secret that runs to the window's end may go on after it:
            // scan this piece again with more context.
            let reaches_end = !(whole && wend == buf.len())
                && spans
                    .iter()
                    .any(|(r, _)| r.start < core_end && r.end + margin / 2 > text.len());
            if reaches_end {
                margin *= 2;
                break;
            }
            let mut p = core_start;
            for (r, rule) in spans {
                if r.start < p {
                    // Begun in the last piece (and redacted there): what
                    // runs on past it is part of that secret.
                    p = p.max(r.end);
                    continue;
                }
                if r.start >= core_end {
                    continue;
                }
                if p < r.start {
                    pending.push(Out::Text(wstart + p..wstart + r.start));
                }
                pending.push(Out::Marker(rule));
                match kinds.iter_mut().find(|(k, _)| k == rule) {
                    Some((_, n)) => *n += 1,
                    None => kinds.push(((*rule).to_owned(), 1)),
                }
                p = r.end;
            }
            if p < core_end {
                pending.push(Out::Text(wstart + p..wstart + core_end));
                p = core_end;
            }
            pos = cur.base + wstart + p;
        }
        drop(found);
        if pos != last_cut {
            // Stopped early (a secret reached a window's end): the next
            // batch starts `margin` bytes before `pos`, in what `cur`
            // holds, then what `next` read beyond it.
            let from = pos.saturating_sub(margin).max(cur.base);
            old.take_tail(&cur, from);
            let beyond = cur.base + cur.filled - next.base;
            old.append(&next.data[beyond.min(next.filled)..next.filled]);
            std::mem::swap(&mut next, &mut old);
        }
        // `cur` holds the output's text now, `next` the next batch.
        std::mem::swap(&mut old, &mut cur);
        std::mem::swap(&mut cur, &mut next);
    }
    write_out(&mut out, &old.data, &pending)?;
    out.flush()?;
    kinds.sort();
    Ok(kinds)
}

fn char_floor(b: &[u8], mut i: usize) -> usize {
    while i > 0 && i < b.len() && (b[i] as i8) < -0x40 {
        i -= 1;
    }
    i
}

/// The smallest character boundary of `b` at or after `i`.
fn char_ceil(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && (b[i] as i8) < -0x40 {
        i += 1;
    }
    i
}

/// `memvault redact --json-lines`: each line of the input is one text as
/// a JSON string; each is redacted on its own and printed as a JSON string
/// on a line of its own, in order. A line that is not a JSON string stops
/// the run with its line number (the lines before it are printed). Exit 1
/// when a secret was redacted, as for a text.
pub(crate) fn redact_json_lines(
    file: Option<&Path>,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<u8, CliError> {
    let redactor = Redactor::new(&crate::redact::RedactConfig {
        mode: crate::redact::Mode::Redact,
        ..Default::default()
    })
    .map_err(|e| CliError::failure(e.to_string()))?;
    let input: Box<dyn BufRead> = match file {
        Some(f) => Box::new(io::BufReader::new(std::fs::File::open(f).map_err(|e| {
            CliError::failure(format!(
                "cannot read {}: {}",
                f.display(),
                super::describe_io(&e)
            ))
        })?)),
        None => Box::new(io::stdin().lock()),
    };
    let mut counts: std::collections::BTreeMap<String, u32> = Default::default();
    let mut buf = io::BufWriter::new(out);
    for (n, line) in input.split(b'\n').enumerate() {
        let line = line?;
        let line = line.strip_suffix(b"\r").unwrap_or(&line);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let text: String = serde_json::from_slice(line).map_err(|_| {
            CliError::failure(format!(
                "line {} is not a JSON string (--json-lines takes one text per line, such as \"a note\\non two lines\")",
                n + 1
            ))
        })?;
        let red = redactor.redact(&text);
        for (kind, k) in red.kinds() {
            *counts.entry(kind).or_default() += k;
        }
        serde_json::to_writer(&mut buf, &red.text).map_err(io::Error::from)?;
        buf.write_all(b"\n")?;
    }
    buf.flush()?;
    if counts.is_empty() {
        return Ok(0);
    }
    let kinds: Kinds = counts.into_iter().collect();
    writeln!(err, "{}", summary(&kinds))?;
    Ok(1)
}

/// `memvault: N secrets redacted: kind (n), ...`, for stderr.
pub(crate) fn summary(kinds: &Kinds) -> String {
    let total: u32 = kinds.iter().map(|(_, n)| n).sum();
    let list: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} ({n})")).collect();
    format!(
        "memvault: {total} secret{} redacted: {}",
        if total == 1 { "" } else { "s" },
        list.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redact::RedactConfig;

    fn redactor() -> Redactor {
        Redactor::new(&RedactConfig::default()).expect("default settings")
    }

    /// Deterministic filler with secrets, key blocks, multibyte text and
    /// long lines.
    fn corpus(seed: u64, size: usize) -> String {
        let mut x = seed | 1;
        let mut next = move |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as usize
        };
        let alnum = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        let rand = |n: usize, next: &mut dyn FnMut(usize) -> usize| -> String {
            (0..n).map(|_| alnum[next(alnum.len())] as char).collect()
        };
        let mut out = String::new();
        while out.len() < size {
            match next(9) {
                0 => out.push_str(&format!("api_key: {}\n", rand(32, &mut next))),
                1 => out.push_str(&format!(
                    "DB=postgres://app:{}@db/app\n",
                    rand(14, &mut next)
                )),
                2 => {
                    let lines = 1 + next(40);
                    out.push_str("-----BEGIN RSA PRIVATE KEY-----\n");
                    for _ in 0..lines {
                        out.push_str(&rand(64, &mut next));
                        out.push('\n');
                    }
                    out.push_str("-----END RSA PRIVATE KEY-----\n");
                }
                3 => out.push_str("Thé façade, 日本語 and ünïcödé prose in the notes.\n"),
                4 => out.push_str(&"a long line without a break ".repeat(1 + next(30))),
                5 => out.push_str(&format!("the password is {}9!\n", rand(10, &mut next))),
                _ => out.push_str("Notes from the meeting about the cache layer.\n"),
            }
        }
        out
    }

    /// A reader that gives at most `most` bytes a read.
    struct Trickle<'a> {
        rest: &'a [u8],
        most: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = buf.len().min(self.most).min(self.rest.len());
            buf[..n].copy_from_slice(&self.rest[..n]);
            self.rest = &self.rest[n..];
            Ok(n)
        }
    }

    #[test]
    fn piece_by_piece_output_equals_whole_text_redaction() {
        let r = redactor();
        for seed in 1..12u64 {
            let text = corpus(seed, 40_000);
            let whole = r.redact(&text);
            for (piece, margin) in [(97, 2048), (1000, 4096), (4096, 256), (50_000, 64)] {
                // Reads of any size: the whole request, or a few bytes
                // at a time (the batches then end wherever reads do).
                let reads: &[usize] = if seed < 4 {
                    &[usize::MAX, 1, 333]
                } else {
                    &[usize::MAX]
                };
                for &most in reads {
                    let mut input = Trickle {
                        rest: text.as_bytes(),
                        most,
                    };
                    let mut out = Vec::new();
                    let kinds = redact_stream(&r, &mut input, &mut out, piece, margin).unwrap();
                    assert_eq!(
                        String::from_utf8(out).unwrap(),
                        whole.text,
                        "seed {seed}, piece {piece}, margin {margin}, reads of {most}"
                    );
                    assert_eq!(kinds, whole.kinds());
                }
            }
        }
    }

    #[test]
    fn a_key_block_longer_than_the_margin_is_redacted_whole() {
        let r = redactor();
        let body: String = (0..400)
            .map(|i| format!("{:064}\n", i).replace('0', "Ab3"))
            .map(|l| l[..64].to_owned() + "\n")
            .collect();
        let text = format!(
            "before\n-----BEGIN PRIVATE KEY-----\n{body}-----END PRIVATE KEY-----\nafter\n"
        );
        let mut out = Vec::new();
        redact_stream(&r, &mut text.as_bytes(), &mut out, 300, 128).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "before\n[REDACTED:private-key]\nafter\n"
        );
    }

    /// The file check against `from_utf8` of the whole file, for text
    /// whose characters straddle piece ends at every offset, and for one
    /// bad byte placed around piece ends.
    #[cfg(unix)]
    #[test]
    fn utf8_file_check_agrees_with_the_whole_text_check() {
        use std::io::Write as _;
        let check = |bytes: &[u8]| {
            let mut f = tempfile::tempfile().unwrap();
            f.write_all(bytes).unwrap();
            check_utf8_file(&f).is_ok()
        };
        assert!(check(b""));
        for lead in 0..4 {
            let text = format!("{}{}", "a".repeat(lead), "日本語€ß".repeat(200_000));
            assert!(check(text.as_bytes()), "lead {lead}");
            for at in [
                CHECK_PIECE - 2,
                CHECK_PIECE,
                CHECK_PIECE + 1,
                3 * CHECK_PIECE + 3,
            ] {
                for bad in [0xffu8, 0x80, 0xe6] {
                    let mut b = text.clone().into_bytes();
                    b[at] = bad;
                    assert_eq!(
                        check(&b),
                        std::str::from_utf8(&b).is_ok(),
                        "{lead} {at} {bad}"
                    );
                }
            }
            let mut cut = text.into_bytes();
            cut.truncate(CHECK_PIECE * 2 + 1);
            assert_eq!(check(&cut), std::str::from_utf8(&cut).is_ok());
        }
        // Continuation bytes only, across a piece end.
        assert!(!check(&vec![0x80; CHECK_PIECE + 10]));
    }

    #[test]
    fn utf8_check_reads_characters_cut_by_a_piece_end() {
        let text = "日本語".repeat(3_000_000);
        assert!(check_utf8(&mut text.as_bytes()).is_ok());
        let mut bad = text.into_bytes();
        bad.push(0xff);
        assert!(check_utf8(&mut bad.as_slice()).is_err());
        assert!(check_utf8(&mut &b"ok\xe6\x97"[..]).is_err());
    }
}
