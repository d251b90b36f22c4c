//! Throughput of the secret filter, single-threaded, in MB/s (median of
//! several runs) on two corpora of about 10 MB:
//!
//! - notes: markdown-ish notes (prose, lists, code, URLs, dates, config
//!   snippets) with a few secrets every ~10 KB; redacted as one text and
//!   as ~10 KB notes one by one (the memory tool writes small files);
//! - plain: prose with none of the filter's keywords.
//!
//! Then end to end: the release `memvault redact FILE` process (start,
//! reading, UTF-8 check, filter, writing its stdout into a pipe that the
//! bench drains) on about 50 MB of each.
//!
//! Run: `cargo bench --bench redact` (release profile); `REDACT_BENCH=e2e`
//! runs only the end-to-end part, `REDACT_BENCH=filter` only the filter,
//! `REDACT_BENCH=plain` only the filter on text with no keywords;
//! `REDACT_BENCH_KEEP=DIR` keeps the end-to-end corpora in `DIR`.

use std::hint::black_box;
use std::time::Instant;

use memvault::redact::{RedactConfig, Redactor};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
    fn chars(&mut self, alphabet: &str, n: usize) -> String {
        let a = alphabet.as_bytes();
        (0..n).map(|_| a[self.below(a.len())] as char).collect()
    }
}

const ALNUM: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// Words with none of the filter's keywords in them.
const WORDS: &[&str] = &[
    "the",
    "user",
    "prefers",
    "short",
    "answers",
    "and",
    "works",
    "in",
    "the",
    "morning",
    "we",
    "agreed",
    "to",
    "move",
    "the",
    "build",
    "to",
    "a",
    "faster",
    "runner",
    "after",
    "review",
    "notes",
    "from",
    "Monday",
    "meeting",
    "about",
    "design",
    "of",
    "cache",
    "layer",
    "which",
    "should",
    "reduce",
    "latency",
    "for",
    "search",
    "results",
    "remember",
    "that",
    "Alice",
    "owns",
    "billing",
    "module",
    "while",
    "Bob",
    "handles",
    "onboarding",
    "flow",
    "tests",
    "fail",
    "when",
    "clock",
    "drifts",
    "so",
    "use",
    "fixed",
    "time",
    "in",
    "fixtures",
    "deploy",
    "on",
    "Thursday",
    "only",
    "is",
    "it",
    "with",
    "this",
    "that",
    "was",
    "be",
    "has",
    "by",
    "its",
    "an",
    "or",
    "at",
    "which",
    "editor",
    "dark",
    "mode",
    "project",
    "milestone",
    "draft",
    "customer",
    "feedback",
    "dashboard",
    "report",
    "weekly",
    "summary",
    "follow",
    "up",
    "open",
    "question",
    "decision",
    "record",
    "rollout",
    "plan",
];

fn sentence(rng: &mut Rng, out: &mut String) {
    let n = 8 + rng.below(14);
    for i in 0..n {
        let w = rng.pick(WORDS);
        if i == 0 {
            let mut c = w.chars();
            if let Some(f) = c.next() {
                out.extend(f.to_uppercase());
                out.push_str(c.as_str());
            }
        } else {
            out.push(' ');
            out.push_str(w);
        }
    }
    out.push_str(". ");
}

fn plain_text(size: usize) -> String {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut out = String::with_capacity(size + 1024);
    while out.len() < size {
        for _ in 0..3 + rng.below(4) {
            sentence(&mut rng, &mut out);
        }
        out.push_str("\n\n");
    }
    out
}

/// Ordinary note material, keywords included (key, token, password, URLs).
fn note_block(rng: &mut Rng, out: &mut String) {
    match rng.below(8) {
        0 => {
            out.push_str(&format!("## {} standup, 2024-05-{:02}\n\n", rng.pick(&["Team", "Infra", "Billing"]), 1 + rng.below(28)));
        }
        1 => {
            for _ in 0..3 {
                out.push_str("- ");
                sentence(rng, out);
                out.push('\n');
            }
            out.push('\n');
        }
        2 => out.push_str(
            "```python\ndef load_config(path):\n    with open(path) as f:\n        data = json.load(f)\n    return data.get(\"api_key\") or os.environ[\"API_KEY\"]\n```\n\n",
        ),
        3 => out.push_str(&format!(
            "See https://docs.example.com/guide/{} and the runbook at https://wiki.internal/ops/{}.\n",
            rng.below(1000),
            rng.below(100)
        )),
        4 => out.push_str(
            "The key insight: tokens expire after 15 minutes, so the client refreshes early. Password resets go through the auth service; never paste secrets into notes.\n\n",
        ),
        5 => out.push_str(&format!(
            "config:\n  port: {}\n  timeout_ms: {}\n  password: ${{DB_PASSWORD}}\n  api_key: <set in vault>\n\n",
            8000 + rng.below(1000),
            100 * rng.below(50)
        )),
        6 => out.push_str(&format!(
            "commit {} fixed issue #{}; request id {:08x}-1234-4abc-9def-0123456789ab.\n",
            rng.chars("0123456789abcdef", 40),
            rng.below(5000),
            rng.next() as u32
        )),
        _ => {
            sentence(rng, out);
            sentence(rng, out);
            out.push('\n');
        }
    }
}

fn secret_line(rng: &mut Rng) -> String {
    match rng.below(7) {
        0 => format!(
            "AWS_ACCESS_KEY_ID=AKIA{}\n",
            rng.chars("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 16)
        ),
        1 => format!("api_key: {}\n", rng.chars(ALNUM, 32)),
        2 => format!(
            "DATABASE_URL=postgres://app:{}@db.internal:5432/app\n",
            rng.chars(ALNUM, 16)
        ),
        3 => format!(
            "token eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.{}\n",
            rng.chars(ALNUM, 43)
        ),
        4 => format!("Stripe key sk_live_{}\n", rng.chars(ALNUM, 40)),
        5 => "Card 4111 1111 1111 1111 exp 12/27\n".to_owned(),
        _ => format!("ANTHROPIC_API_KEY=sk-ant-api03-{}\n", rng.chars(ALNUM, 93)),
    }
}

/// About `size` bytes of notes, split into ~10 KB notes, with two or three
/// secrets in each.
fn notes(size: usize) -> Vec<String> {
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let mut all = Vec::new();
    let mut total = 0;
    while total < size {
        let mut note = String::from("# Memory: project notes\n\n");
        let secrets_at: Vec<usize> = (0..2 + rng.below(2)).map(|_| rng.below(10_000)).collect();
        while note.len() < 10_000 {
            let before = note.len();
            note_block(&mut rng, &mut note);
            if secrets_at.iter().any(|&s| s >= before && s < note.len()) {
                note.push_str(&secret_line(&mut rng));
            }
        }
        total += note.len();
        all.push(note);
    }
    all
}

/// A throughput: the median and the best of several runs (this VM's speed
/// varies between phases; the best is the least disturbed run).
struct Rate {
    median: f64,
    best: f64,
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:7.1} MB/s (best {:7.1})", self.median, self.best)
    }
}

fn median_mb_s(bytes: usize, runs: usize, mut f: impl FnMut() -> usize) -> (Rate, usize) {
    let mut rates = Vec::with_capacity(runs);
    let mut found = 0;
    for _ in 0..runs {
        let t = Instant::now();
        found = black_box(f());
        rates.push(bytes as f64 / 1e6 / t.elapsed().as_secs_f64());
    }
    rates.sort_by(f64::total_cmp);
    let rate = Rate {
        median: rates[runs / 2],
        best: rates[runs - 1],
    };
    (rate, found)
}

/// Median MB/s of `memvault redact FILE | consumer` over `runs` runs (the
/// bench drains the pipe), and the exit code.
fn end_to_end(input: &std::path::Path, bytes: usize, runs: usize) -> (Rate, Option<i32>) {
    use std::io::Read;
    let mut code = None;
    let (rate, _) = median_mb_s(bytes, runs, || {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_memvault"))
            .arg("redact")
            .arg(input)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("run memvault");
        let mut stdout = child.stdout.take().expect("stdout");
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0;
        loop {
            match stdout.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
        code = child.wait().expect("wait").code();
        total
    });
    (rate, code)
}

fn e2e() {
    let dir = tempfile::tempdir().expect("temp dir");
    // REDACT_BENCH_KEEP=DIR keeps the two corpora there, to time other
    // consumers (`memvault redact DIR/plain.md >/dev/null`, say).
    let keep = std::env::var_os("REDACT_BENCH_KEEP").map(std::path::PathBuf::from);
    let out = keep.as_deref().unwrap_or(dir.path());
    let notes = notes(50_000_000).concat();
    let notes_path = out.join("notes.md");
    std::fs::write(&notes_path, &notes).expect("write notes");
    let (rate, code) = end_to_end(&notes_path, notes.len(), 7);
    println!(
        "end to end, notes:              {}  ({:.1} MB, exit {})",
        rate,
        notes.len() as f64 / 1e6,
        code.unwrap_or(-1)
    );
    let plain = plain_text(50_000_000);
    let plain_path = out.join("plain.md");
    std::fs::write(&plain_path, &plain).expect("write plain");
    let (rate, code) = end_to_end(&plain_path, plain.len(), 7);
    println!(
        "end to end, no keywords:        {}  ({:.1} MB, exit {})",
        rate,
        plain.len() as f64 / 1e6,
        code.unwrap_or(-1)
    );
}

fn main() {
    let only = std::env::var("REDACT_BENCH").unwrap_or_default();
    if only.is_empty() || only == "filter" {
        filter_notes();
    }
    if only.is_empty() || only == "filter" || only == "plain" {
        filter_plain();
    }
    if only.is_empty() || only == "e2e" {
        e2e();
    }
}

fn filter_notes() {
    let redactor = Redactor::new(&RedactConfig::default()).expect("default settings");
    let runs = 9;

    let notes = notes(10_000_000);
    let joined = notes.concat();
    let (rate, found) = median_mb_s(joined.len(), runs, || {
        redactor.redact(black_box(&joined)).findings.len()
    });
    println!(
        "notes with secrets, one text:   {}  ({:.1} MB, {found} findings)",
        rate,
        joined.len() as f64 / 1e6
    );
    let (rate, found) = median_mb_s(joined.len(), runs, || {
        notes
            .iter()
            .map(|n| redactor.redact(black_box(n)).findings.len())
            .sum()
    });
    println!(
        "notes with secrets, per note:   {}  ({} notes, {found} findings)",
        rate,
        notes.len()
    );
}

fn filter_plain() {
    let redactor = Redactor::new(&RedactConfig::default()).expect("default settings");
    let runs = 9;
    let plain = plain_text(10_000_000);
    assert!(
        redactor.scan(&plain).is_empty(),
        "the plain corpus should hold no secret"
    );
    let (rate, _) = median_mb_s(plain.len(), runs, || {
        redactor.redact(black_box(&plain)).findings.len()
    });
    println!(
        "no keywords, one text:          {}  ({:.1} MB)",
        rate,
        plain.len() as f64 / 1e6
    );
    let (rate, _) = median_mb_s(plain.len(), runs, || redactor.scan(black_box(&plain)).len());
    println!("no keywords, scan only:         {}", rate);
}
