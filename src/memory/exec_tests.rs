//! Every SPEC.md string and behaviour, against [`MemStore`].

use data_encoding::BASE64;
use serde_json::{Value, json};

use super::*;
use crate::memory::MemStore;

const EDITED: &str =
    "The memory file has been edited. Here is the snippet showing the change (with line numbers):";

fn p(s: &str) -> MemoryPath {
    MemoryPath::parse(s).unwrap()
}

fn store(files: &[(&str, &str)]) -> MemStore {
    let mut s = MemStore::default();
    for (path, content) in files {
        s.seed(&p(path), content.as_bytes().to_vec()).unwrap();
    }
    s
}

fn run(m: &Memory, s: &mut MemStore, input: Value) -> ToolResult {
    m.execute_json(s, &input)
}

/// The text of a successful result.
#[track_caller]
fn ok(r: &ToolResult) -> &str {
    assert!(!r.is_error, "expected success, got error: {r:?}");
    r.text().unwrap()
}

/// The text of an error result.
#[track_caller]
fn err(r: &ToolResult) -> &str {
    assert!(r.is_error, "expected an error, got: {r:?}");
    r.text().unwrap()
}

fn content(s: &MemStore, path: &str) -> Option<String> {
    s.get(&p(path))
        .map(|b| String::from_utf8_lossy(b).into_owned())
}

fn files(s: &MemStore) -> Vec<(String, Vec<u8>)> {
    s.paths()
        .map(|k| (k.to_owned(), s.get(&p(k)).unwrap().to_vec()))
        .collect()
}

fn config(f: impl FnOnce(&mut MemoryConfig)) -> Memory {
    let mut c = MemoryConfig::default();
    f(&mut c);
    Memory::new(c, None)
}

// ----- view: directories ------------------------------------------------

#[test]
fn first_view_of_an_empty_store_is_the_header_and_the_root() {
    let mut s = MemStore::default();
    let r = run(
        &Memory::default(),
        &mut s,
        json!({"command": "view", "path": "/memories"}),
    );
    assert_eq!(
        ok(&r),
        "Here're the files and directories up to 2 levels deep in /memories, excluding hidden items and node_modules:\n0B\t/memories"
    );
    assert!(s.viewed().is_empty(), "directory views are not noted");
    let r = run(
        &Memory::default(),
        &mut s,
        json!({"command": "view", "path": "/memories/"}),
    );
    assert_eq!(
        ok(&r),
        "Here're the files and directories up to 2 levels deep in /memories, excluding hidden items and node_modules:\n0B\t/memories"
    );
}

fn listing_store() -> MemStore {
    let mut s = store(&[
        ("/memories/notes.md", "hello"),
        ("/memories/a/.secret", &"s".repeat(100)),
        ("/memories/a/sub/deep.txt", "0123456789"),
        ("/memories/a/node_modules/x.js", "1234567"),
        ("/memories/.hidden/x", "abc"),
        ("/memories/node_modules/y", "abcd"),
        ("/memories/z.txt", ""),
        ("/memories/B.md", "1"),
    ]);
    s.seed(&p("/memories/a/b.txt"), vec![b'x'; 2000]).unwrap();
    s
}

#[test]
fn listing_goes_two_levels_deep_sorted_without_hidden_items() {
    let mut s = listing_store();
    let r = run(
        &Memory::default(),
        &mut s,
        json!({"command": "view", "path": "/memories"}),
    );
    assert_eq!(
        ok(&r),
        [
            "Here're the files and directories up to 2 levels deep in /memories, excluding hidden items and node_modules:",
            "2.1K\t/memories",
            "1B\t/memories/B.md",
            "2.1K\t/memories/a/",
            "2.0K\t/memories/a/b.txt",
            "10B\t/memories/a/sub/",
            "5B\t/memories/notes.md",
            "0B\t/memories/z.txt",
        ]
        .join("\n")
    );
}

#[test]
fn listing_of_a_subdirectory() {
    let mut s = listing_store();
    let r = run(
        &Memory::default(),
        &mut s,
        json!({"command": "view", "path": "/memories/a/"}),
    );
    assert_eq!(
        ok(&r),
        [
            "Here're the files and directories up to 2 levels deep in /memories/a, excluding hidden items and node_modules:",
            "2.1K\t/memories/a",
            "2.0K\t/memories/a/b.txt",
            "10B\t/memories/a/sub/",
            "10B\t/memories/a/sub/deep.txt",
        ]
        .join("\n")
    );
}

#[test]
fn view_range_on_a_directory_selects_entries_of_its_listing() {
    let mut s = listing_store();
    let m = Memory::default();
    let whole = run(
        &m,
        &mut s,
        json!({"command": "view", "path": "/memories/a"}),
    );
    let rows: Vec<&str> = ok(&whole).lines().skip(1).collect();
    let n = rows.len();
    let r = run(
        &m,
        &mut s,
        json!({"command": "view", "path": "/memories/a", "view_range": [2, -1]}),
    );
    assert_eq!(
        ok(&r),
        format!(
            "Here're the files and directories up to 2 levels deep in /memories/a, excluding hidden items and node_modules (entries 2 to {n} of {n}):\n{}",
            rows[1..].join("\n")
        )
    );
    for (range, words) in [
        (
            json!([0, 1]),
            format!("Its first element `0` should be within [1, {n}]"),
        ),
        (
            json!([2, 1]),
            format!("Its second element `1` should be within [2, {n}]"),
        ),
        (
            json!([1, n + 1]),
            format!("should be within [1, {n}], or -1 for the last entry"),
        ),
    ] {
        let r = run(
            &m,
            &mut s,
            json!({"command": "view", "path": "/memories/a", "view_range": range}),
        );
        assert!(err(&r).contains(&words), "{range}: {}", err(&r));
        assert!(err(&r).contains("for a directory it selects entries of its listing"));
    }
}

#[test]
fn a_flat_directory_past_the_cap_is_listed_whole_through_view_range() {
    // 200 files of long names in one directory: no subdirectory shows the
    // ones a listing leaves out; the view_range its closing row gives does.
    let mut names: Vec<String> = (0..200)
        .map(|i| format!("/memories/L/{}-{i:03}.md", "n".repeat(90)))
        .collect();
    // A subdirectory among them, early and late in the listing.
    names.push("/memories/L/a-sub/inner.md".into());
    names.push("/memories/L/z-sub/inner.md".into());
    let files: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "x")).collect();
    let mut s = store(&files);
    let m = Memory::default();
    let mut seen = std::collections::BTreeSet::new();
    let mut rows_seen = 0;
    let mut range = None;
    for _ in 0..10 {
        let mut input = json!({"command": "view", "path": "/memories/L"});
        if let Some(r) = &range {
            input["view_range"] = json!(r);
        }
        let r = run(&m, &mut s, input);
        let text = ok(&r);
        assert!(text.chars().count() <= 16_000, "{}", text.chars().count());
        let rows: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("\t/memories/L/"))
            .collect();
        for (i, line) in rows.iter().enumerate() {
            let path = line.split('\t').nth(1).unwrap();
            // An entry of a subdirectory comes right after that
            // subdirectory's row or another entry of it.
            if let Some((sub, _)) = path.strip_prefix("/memories/L/").unwrap().split_once('/')
                && !sub.is_empty()
                && !path.ends_with('/')
            {
                assert!(
                    i > 0 && rows[i - 1].contains(&format!("/memories/L/{sub}/")),
                    "{path} shown without its directory: {:?}",
                    rows.get(i.wrapping_sub(1))
                );
            }
            seen.insert(path.to_owned());
            rows_seen += 1;
        }
        let last = text.lines().last().unwrap();
        let Some(at) = last.find("view_range [") else {
            break;
        };
        let rest = &last[at + "view_range [".len()..];
        let (a, b) = rest.split_once(']').unwrap().0.split_once(", ").unwrap();
        range = Some([a.parse::<i64>().unwrap(), b.parse::<i64>().unwrap()]);
    }
    // 200 files, 2 subdirectories and their 2 files, each listed once; the
    // entries of a subdirectory whose row came before the cut are listed
    // by viewing it, as the first closing row says.
    let first = run(
        &m,
        &mut s,
        json!({"command": "view", "path": "/memories/L"}),
    );
    assert!(
        ok(&first)
            .lines()
            .last()
            .unwrap()
            .contains("view a subdirectory (such as /memories/L/a-sub/)"),
        "{}",
        ok(&first).lines().last().unwrap()
    );
    let sub = run(
        &m,
        &mut s,
        json!({"command": "view", "path": "/memories/L/a-sub"}),
    );
    assert!(ok(&sub).contains("\t/memories/L/a-sub/inner.md"));
    assert!(!seen.contains("/memories/L/a-sub/inner.md"));
    assert_eq!(
        seen.len(),
        203,
        "every other entry listed by following the hints"
    );
    assert_eq!(rows_seen, 203, "no entry listed twice");
}

#[test]
fn view_of_a_missing_path() {
    let mut s = listing_store();
    for path in [
        "/memories/nope.txt",
        "/memories/notes.md/child",
        "/memories/a/b",
    ] {
        let r = run(
            &Memory::default(),
            &mut s,
            json!({"command": "view", "path": path}),
        );
        assert_eq!(
            err(&r),
            format!("The path {path} does not exist. Please provide a valid path.")
        );
    }
    assert!(s.viewed().is_empty());
}

// ----- view: files ------------------------------------------------------

#[test]
fn file_view_has_a_header_and_numbered_lines() {
    let mut s = store(&[("/memories/notes.txt", "Hello World\nThis is line two\n")]);
    let r = run(
        &Memory::default(),
        &mut s,
        json!({"command": "view", "path": "/memories/notes.txt"}),
    );
    assert_eq!(
        ok(&r),
        "Here's the content of /memories/notes.txt with line numbers:\n     1\tHello World\n     2\tThis is line two"
    );
    assert_eq!(s.viewed(), [p("/memories/notes.txt")]);
}

#[test]
fn file_view_line_model() {
    let mut s = store(&[
        ("/memories/empty.txt", ""),
        ("/memories/no-newline.txt", "a\nb"),
        ("/memories/blank-last.txt", "a\n\n"),
        ("/memories/tabs.txt", "\tx\r\n"),
    ]);
    let m = Memory::default();
    let view = |s: &mut MemStore, path: &str| {
        ok(&run(&m, s, json!({"command": "view", "path": path}))).to_owned()
    };
    assert_eq!(
        view(&mut s, "/memories/empty.txt"),
        "Here's the content of /memories/empty.txt with line numbers:"
    );
    assert_eq!(
        view(&mut s, "/memories/no-newline.txt"),
        "Here's the content of /memories/no-newline.txt with line numbers:\n     1\ta\n     2\tb"
    );
    assert_eq!(
        view(&mut s, "/memories/blank-last.txt"),
        "Here's the content of /memories/blank-last.txt with line numbers:\n     1\ta\n     2\t"
    );
    assert_eq!(
        view(&mut s, "/memories/tabs.txt"),
        "Here's the content of /memories/tabs.txt with line numbers:\n     1\t\tx\r"
    );
    assert_eq!(s.viewed().len(), 4);
}

#[test]
fn view_range_shows_those_lines_numbered_as_in_the_file() {
    let mut s = store(&[("/memories/f.txt", "l1\nl2\nl3\nl4\nl5\n")]);
    let m = Memory::default();
    let cases: [([i64; 2], &str); 5] = [
        ([2, 3], "     2\tl2\n     3\tl3"),
        ([4, -1], "     4\tl4\n     5\tl5"),
        ([5, 5], "     5\tl5"),
        (
            [1, 5],
            "     1\tl1\n     2\tl2\n     3\tl3\n     4\tl4\n     5\tl5",
        ),
        (
            [1, -1],
            "     1\tl1\n     2\tl2\n     3\tl3\n     4\tl4\n     5\tl5",
        ),
    ];
    for (range, body) in cases {
        let r = run(
            &m,
            &mut s,
            json!({"command": "view", "path": "/memories/f.txt", "view_range": range}),
        );
        assert_eq!(
            ok(&r),
            format!("Here's the content of /memories/f.txt with line numbers:\n{body}"),
            "{range:?}"
        );
    }
}

#[test]
fn invalid_view_ranges_say_what_is_valid() {
    let mut s = store(&[
        ("/memories/f.txt", "l1\nl2\nl3\nl4\nl5\n"),
        ("/memories/e.txt", ""),
    ]);
    let m = Memory::default();
    let cases: [(&str, [i64; 2], &str); 8] = [
        (
            "/memories/f.txt",
            [0, 2],
            "Error: Invalid `view_range` parameter: [0, 2]. Its first element `0` should be within the range of lines of the file: [1, 5].",
        ),
        (
            "/memories/f.txt",
            [-1, -1],
            "Error: Invalid `view_range` parameter: [-1, -1]. Its first element `-1` should be within the range of lines of the file: [1, 5].",
        ),
        (
            "/memories/f.txt",
            [6, 6],
            "Error: Invalid `view_range` parameter: [6, 6]. Its first element `6` should be within the range of lines of the file: [1, 5].",
        ),
        (
            "/memories/f.txt",
            [6, -1],
            "Error: Invalid `view_range` parameter: [6, -1]. Its first element `6` should be within the range of lines of the file: [1, 5].",
        ),
        (
            "/memories/f.txt",
            [3, 2],
            "Error: Invalid `view_range` parameter: [3, 2]. Its second element `2` should be at least its first element `3`, or -1 to view to the end of the file.",
        ),
        (
            "/memories/f.txt",
            [2, -2],
            "Error: Invalid `view_range` parameter: [2, -2]. Its second element `-2` should be at least its first element `2`, or -1 to view to the end of the file.",
        ),
        (
            "/memories/f.txt",
            [1, 6],
            "Error: Invalid `view_range` parameter: [1, 6]. Its second element `6` should be at most the number of lines in the file, 5, or -1 to view to the end of the file.",
        ),
        (
            "/memories/e.txt",
            [1, -1],
            "Error: Invalid `view_range` parameter: [1, -1]. The file /memories/e.txt is empty (0 lines); view it without `view_range`.",
        ),
    ];
    for (path, range, message) in cases {
        let r = run(
            &m,
            &mut s,
            json!({"command": "view", "path": path, "view_range": range}),
        );
        assert_eq!(err(&r), message);
    }
    assert!(s.viewed().is_empty(), "failed views are not noted");
}

#[test]
fn a_file_over_999_999_lines_is_refused() {
    let m = config(|c| c.max_file_bytes = 2 << 20);
    let mut s = MemStore::default();
    // No command makes one (round 38a): create, insert and str_replace
    // refuse, and change nothing.
    let big = "\n".repeat(1_000_000);
    let r = run(
        &m,
        &mut s,
        json!({"command": "create", "path": "/memories/big.txt", "file_text": big}),
    );
    assert_eq!(
        err(&r),
        "Error: The content is 1000000 lines, over the limit of 999,999 lines that view can show. Nothing was changed; split the content into several smaller files."
    );
    assert!(content(&s, "/memories/big.txt").is_none());
    let full = "\n".repeat(999_998) + "x\n";
    s.seed(&p("/memories/full.txt"), full.clone().into_bytes())
        .unwrap();
    let r = run(
        &m,
        &mut s,
        json!({"command": "insert", "path": "/memories/full.txt", "insert_line": 999_999, "insert_text": "y"}),
    );
    assert_eq!(
        err(&r),
        "Error: The insert would make /memories/full.txt 1000000 lines, over the limit of 999,999 lines that view can show. Nothing was changed; split the content into several smaller files."
    );
    let r = run(
        &m,
        &mut s,
        json!({"command": "str_replace", "path": "/memories/full.txt", "old_str": "x", "new_str": "x\ny"}),
    );
    assert!(err(&r).starts_with("Error: The edit would make /memories/full.txt 1000000 lines"));
    assert_eq!(content(&s, "/memories/full.txt").unwrap(), full);
    // One already over (a merge of two machines' edits can make one) can
    // be edited as long as the edit adds no line; view refuses it.
    s.seed(&p("/memories/big.txt"), (big + "x").into_bytes())
        .unwrap();
    let r = run(
        &m,
        &mut s,
        json!({"command": "str_replace", "path": "/memories/big.txt", "old_str": "x", "new_str": "y"}),
    );
    assert!(!r.is_error, "{r:?}");
    let r = run(
        &m,
        &mut s,
        json!({"command": "view", "path": "/memories/big.txt"}),
    );
    assert_eq!(
        err(&r),
        "File /memories/big.txt exceeds maximum line limit of 999,999 lines."
    );
    let r = run(
        &m,
        &mut s,
        json!({"command": "view", "path": "/memories/big.txt", "view_range": [1, 1]}),
    );
    assert_eq!(
        err(&r),
        "File /memories/big.txt exceeds maximum line limit of 999,999 lines."
    );
    // 999,999 lines is still fine.
    s.seed(&p("/memories/ok.txt"), vec![b'\n'; 999_999])
        .unwrap();
    let r = run(
        &m,
        &mut s,
        json!({"command": "view", "path": "/memories/ok.txt"}),
    );
    assert!(ok(&r).ends_with("999999\t"));
}

fn long_file(lines: usize) -> String {
    (1..=lines)
        .map(|i| format!("line {i} of a long note é\n"))
        .collect()
}

/// Checks a truncated view: header, both ends, one marker, the bound.
#[track_caller]
fn check_truncated(text: &str, header: &str, first: usize, last: usize, budget: usize) {
    let body = text
        .strip_prefix(header)
        .and_then(|t| t.strip_prefix('\n'))
        .expect("header");
    assert!(
        body.starts_with(&format!("{first:>6}\tline {first} of a long note é\n")),
        "{body:.200}"
    );
    assert!(body.ends_with(&format!("{last:>6}\tline {last} of a long note é")));
    let markers: Vec<&str> = body
        .lines()
        .filter(|l| l.contains("lines omitted"))
        .collect();
    assert_eq!(markers.len(), 1, "one marker line");
    let marker = markers[0];
    assert!(
        marker.starts_with("… ") && marker.ends_with("to see them …"),
        "{marker}"
    );
    assert!(marker.contains("call view with view_range ["), "{marker}");
    // The whole answer, header and marker included, within the budget.
    assert!(text.chars().count() <= budget, "{}", text.chars().count());
    assert!(body.chars().count() > budget * 9 / 10, "the budget is used");
}

#[test]
fn long_files_are_truncated_from_the_middle() {
    let mut s = store(&[("/memories/long.txt", &long_file(3000))]);
    let r = run(
        &Memory::default(),
        &mut s,
        json!({"command": "view", "path": "/memories/long.txt"}),
    );
    check_truncated(
        ok(&r),
        "Here's the content of /memories/long.txt with line numbers:",
        1,
        3000,
        16_000,
    );
    // The marker's range is exactly the lines that are missing.
    let text = ok(&r);
    let marker = text.lines().find(|l| l.contains("omitted")).unwrap();
    let numbers: Vec<usize> = text
        .lines()
        .skip(1)
        .filter(|l| !l.contains("omitted"))
        .map(|l| l.split('\t').next().unwrap().trim().parse().unwrap())
        .collect();
    let gap = numbers.windows(2).find(|w| w[1] != w[0] + 1).unwrap();
    assert_eq!(
        marker,
        format!(
            "… {} lines omitted (lines {}-{}); call view with view_range [{}, {}] to see them …",
            gap[1] - gap[0] - 1,
            gap[0] + 1,
            gap[1] - 1,
            gap[0] + 1,
            gap[1] - 1
        )
    );
}

#[test]
fn ranged_views_are_truncated_the_same_way() {
    let mut s = store(&[("/memories/long.txt", &long_file(3000))]);
    let m = Memory::default();
    let r = run(
        &m,
        &mut s,
        json!({"command": "view", "path": "/memories/long.txt", "view_range": [1000, -1]}),
    );
    check_truncated(
        ok(&r),
        "Here's the content of /memories/long.txt with line numbers:",
        1000,
        3000,
        16_000,
    );
    let r = run(
        &m,
        &mut s,
        json!({"command": "view", "path": "/memories/long.txt", "view_range": [1500, 1502]}),
    );
    assert_eq!(
        ok(&r),
        "Here's the content of /memories/long.txt with line numbers:\n  1500\tline 1500 of a long note é\n  1501\tline 1501 of a long note é\n  1502\tline 1502 of a long note é"
    );
}

#[test]
fn truncation_budget_is_configurable() {
    let mut s = store(&[("/memories/long.txt", &long_file(300))]);
    let m = config(|c| c.max_view_chars = 1000);
    let r = run(
        &m,
        &mut s,
        json!({"command": "view", "path": "/memories/long.txt"}),
    );
    check_truncated(
        ok(&r),
        "Here's the content of /memories/long.txt with line numbers:",
        1,
        300,
        1000,
    );
}

#[test]
fn a_1_mib_file_views_quickly() {
    let text: String = (0..50_000).map(|i| format!("{i:>25}\n")).collect();
    assert!(text.len() > 1 << 20);
    let mut s = store(&[("/memories/big.txt", &text)]);
    let start = std::time::Instant::now();
    let r = run(
        &Memory::default(),
        &mut s,
        json!({"command": "view", "path": "/memories/big.txt"}),
    );
    assert!(ok(&r).contains("lines omitted"));
    assert!(start.elapsed() < std::time::Duration::from_secs(5));
}

// ----- view: images and binary -------------------------------------------

const PNG: &[u8] = &[
    0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 13, 0xff, 0xfe,
];
const JPEG: &[u8] = &[
    0xff, 0xd8, 0xff, 0xe0, 0, 0x10, b'J', b'F', b'I', b'F', 0xff,
];

#[test]
fn images_come_back_as_image_blocks() {
    let mut s = MemStore::default();
    s.seed(&p("/memories/pic.png"), PNG.to_vec()).unwrap();
    s.seed(&p("/memories/pic.PNG"), PNG.to_vec()).unwrap();
    s.seed(&p("/memories/photo.jpg"), JPEG.to_vec()).unwrap();
    s.seed(&p("/memories/photo.JPEG"), JPEG.to_vec()).unwrap();
    let m = Memory::default();
    for (path, media_type, bytes) in [
        ("/memories/pic.png", "image/png", PNG),
        ("/memories/pic.PNG", "image/png", PNG),
        ("/memories/photo.jpg", "image/jpeg", JPEG),
        ("/memories/photo.JPEG", "image/jpeg", JPEG),
    ] {
        let r = run(&m, &mut s, json!({"command": "view", "path": path}));
        assert_eq!(
            r,
            ToolResult {
                content: Content::Image {
                    media_type,
                    data_base64: BASE64.encode(bytes),
                },
                is_error: false,
            }
        );
    }
    assert_eq!(s.viewed().len(), 4, "image views are file views");
    let r = run(
        &m,
        &mut s,
        json!({"command": "view", "path": "/memories/pic.png", "view_range": [1, 1]}),
    );
    assert_eq!(
        err(&r),
        "Error: Invalid `view_range` parameter: [1, 1]. /memories/pic.png is an image; view it without `view_range`."
    );
}

#[test]
fn a_text_file_named_like_an_image_is_shown_as_text() {
    let mut s = store(&[("/memories/fake.png", "not an image\n")]);
    let r = run(
        &Memory::default(),
        &mut s,
        json!({"command": "view", "path": "/memories/fake.png"}),
    );
    assert_eq!(
        ok(&r),
        "Here's the content of /memories/fake.png with line numbers:\n     1\tnot an image"
    );
}

#[test]
fn other_binary_content_is_an_error() {
    let mut s = MemStore::default();
    s.seed(&p("/memories/blob.bin"), vec![0xff, 0xfe, 0x00, 0x80])
        .unwrap();
    s.seed(&p("/memories/bad.png"), vec![0xff, 0xfe]).unwrap();
    let m = Memory::default();
    let r = run(
        &m,
        &mut s,
        json!({"command": "view", "path": "/memories/blob.bin"}),
    );
    assert_eq!(
        err(&r),
        "Error: The file /memories/blob.bin is binary (it is not UTF-8 text), so it cannot be shown as text. Only UTF-8 text files and .png, .jpg or .jpeg images can be viewed."
    );
    // Named as an image, it is told apart from one: the message does not
    // say that the kind of file it refuses can be viewed.
    let r = run(
        &m,
        &mut s,
        json!({"command": "view", "path": "/memories/bad.png"}),
    );
    assert_eq!(
        err(&r),
        "Error: The file /memories/bad.png is binary and not a PNG or JPEG image (its content does not start as one), so it cannot be shown. Only UTF-8 text files and PNG or JPEG images can be viewed."
    );
    assert!(s.viewed().is_empty());
}

#[test]
fn an_image_is_sent_with_the_media_type_of_its_content_whatever_its_extension() {
    let mut s = MemStore::default();
    s.seed(&p("/memories/photo.jpg"), PNG.to_vec()).unwrap();
    s.seed(&p("/memories/pic.png"), JPEG.to_vec()).unwrap();
    let m = Memory::default();
    for (path, media, bytes) in [
        ("/memories/photo.jpg", "image/png", PNG),
        ("/memories/pic.png", "image/jpeg", JPEG),
    ] {
        let r = run(&m, &mut s, json!({"command": "view", "path": path}));
        assert_eq!(
            r,
            ToolResult {
                content: Content::Image {
                    media_type: media,
                    data_base64: BASE64.encode(bytes),
                },
                is_error: false,
            },
            "{path}"
        );
    }
}

// ----- create -------------------------------------------------------------

#[test]
fn create_makes_a_file_and_its_parents() {
    let mut s = MemStore::default();
    let m = Memory::default();
    let r = run(
        &m,
        &mut s,
        json!({"command": "create", "path": "/memories/notes.txt", "file_text": "Meeting notes:\n- a\n- b\n"}),
    );
    assert_eq!(ok(&r), "File created successfully at: /memories/notes.txt");
    assert_eq!(
        content(&s, "/memories/notes.txt").unwrap(),
        "Meeting notes:\n- a\n- b\n"
    );
    let r = run(
        &m,
        &mut s,
        json!({"command": "create", "path": "/memories/a/b/c.md/", "file_text": "deep"}),
    );
    assert_eq!(ok(&r), "File created successfully at: /memories/a/b/c.md");
    assert_eq!(content(&s, "/memories/a/b/c.md").unwrap(), "deep");
    assert_eq!(s.commits(), 2);
    assert_eq!(s.log()[0].0, Op::Create);
    assert_eq!(
        s.log()[0].1,
        ChangeFacts {
            lines_added: 3,
            lines_removed: 0,
            redactions: vec![]
        }
    );
}

#[test]
fn create_refuses_an_existing_file_by_default() {
    let mut s = store(&[("/memories/a.txt", "old\n")]);
    let r = run(
        &Memory::default(),
        &mut s,
        json!({"command": "create", "path": "/memories/a.txt", "file_text": "new"}),
    );
    assert_eq!(err(&r), "Error: File /memories/a.txt already exists");
    assert_eq!(content(&s, "/memories/a.txt").unwrap(), "old\n");
    assert_eq!(s.commits(), 0);
}

#[test]
fn create_overwrites_when_configured() {
    let mut s = store(&[("/memories/a.txt", "one\ntwo\n")]);
    let m = config(|c| c.overwrite_on_create = true);
    let r = run(
        &m,
        &mut s,
        json!({"command": "create", "path": "/memories/a.txt", "file_text": "three\n"}),
    );
    assert_eq!(ok(&r), "File created successfully at: /memories/a.txt");
    assert_eq!(content(&s, "/memories/a.txt").unwrap(), "three\n");
    assert_eq!(
        s.log(),
        [(
            Op::Overwrite,
            ChangeFacts {
                lines_added: 1,
                lines_removed: 2,
                redactions: vec![]
            }
        )]
    );
}

#[test]
fn create_on_a_directory_is_refused() {
    let mut s = store(&[("/memories/d/x", "x")]);
    let m = config(|c| c.overwrite_on_create = true);
    let r = run(
        &m,
        &mut s,
        json!({"command": "create", "path": "/memories/d", "file_text": "x"}),
    );
    assert_eq!(
        err(&r),
        "Error: The path /memories/d is a directory, so no file can be created there. Give a file path, such as /memories/d/notes.md."
    );
    let r = run(
        &m,
        &mut s,
        json!({"command": "create", "path": "/memories", "file_text": "x"}),
    );
    assert_eq!(
        err(&r),
        "Error: The path /memories is a directory, so no file can be created there. Give a file path, such as /memories/notes.md."
    );
    assert_eq!(s.commits(), 0);
}

#[test]
fn create_below_a_file_is_refused() {
    let mut s = store(&[("/memories/f.txt", "x")]);
    let r = run(
        &Memory::default(),
        &mut s,
        json!({"command": "create", "path": "/memories/f.txt/a/child", "file_text": "x"}),
    );
    assert_eq!(
        err(&r),
        "Error: Cannot create /memories/f.txt/a/child: /memories/f.txt is a file, not a directory. Choose a path whose parent directories are not files."
    );
    assert_eq!(s.commits(), 0);
}

#[test]
fn create_over_the_size_limit_changes_nothing() {
    let mut s = MemStore::default();
    let m = config(|c| c.max_file_bytes = 10);
    let r = run(
        &m,
        &mut s,
        json!({"command": "create", "path": "/memories/a.txt", "file_text": "01234567890"}),
    );
    assert_eq!(
        err(&r),
        "Error: The content is 11 bytes, over the limit of 10 bytes (10B) for one memory file. Nothing was changed; split the content into several smaller files."
    );
    assert_eq!(s.commits(), 0);
    let r = run(
        &m,
        &mut s,
        json!({"command": "create", "path": "/memories/a.txt", "file_text": "0123456789"}),
    );
    ok(&r);
    let r = run(
        &Memory::default(),
        &mut s,
        json!({"command": "create", "path": "/memories/b.txt", "file_text": "x".repeat((1 << 20) + 1)}),
    );
    assert_eq!(
        err(&r),
        "Error: The content is 1048577 bytes, over the limit of 1048576 bytes (1.0M) for one memory file. Nothing was changed; split the content into several smaller files."
    );
}

// ----- str_replace ----------------------------------------------------------

#[test]
fn str_replace_shows_two_lines_around_the_change() {
    let mut s = store(&[("/memories/n.txt", "1\n2\n3\n4\n5\n6\n7\n")]);
    let m = Memory::default();
    let r = run(
        &m,
        &mut s,
        json!({"command": "str_replace", "path": "/memories/n.txt", "old_str": "4", "new_str": "four"}),
    );
    assert_eq!(
        ok(&r),
        format!("{EDITED}\n     2\t2\n     3\t3\n     4\tfour\n     5\t5\n     6\t6")
    );
    assert_eq!(
        content(&s, "/memories/n.txt").unwrap(),
        "1\n2\n3\nfour\n5\n6\n7\n"
    );
    let r = run(
        &m,
        &mut s,
        json!({"command": "str_replace", "path": "/memories/n.txt", "old_str": "four\n", "new_str": "x\ny\n"}),
    );
    assert_eq!(
        ok(&r),
        format!("{EDITED}\n     2\t2\n     3\t3\n     4\tx\n     5\ty\n     6\t5\n     7\t6")
    );
    let r = run(
        &m,
        &mut s,
        json!({"command": "str_replace", "path": "/memories/n.txt", "old_str": "1\n", "new_str": "one\n"}),
    );
    assert_eq!(
        ok(&r),
        format!("{EDITED}\n     1\tone\n     2\t2\n     3\t3")
    );
    let r = run(
        &m,
        &mut s,
        json!({"command": "str_replace", "path": "/memories/n.txt", "old_str": "7", "new_str": "seven"}),
    );
    assert_eq!(
        ok(&r),
        format!("{EDITED}\n     6\t5\n     7\t6\n     8\tseven")
    );
    assert_eq!(s.commits(), 4);
    assert!(s.log().iter().all(|(op, _)| *op == Op::StrReplace));
    assert_eq!(
        s.log()[1].1,
        ChangeFacts {
            lines_added: 2,
            lines_removed: 1,
            redactions: vec![]
        }
    );
}

#[test]
fn str_replace_without_new_str_deletes() {
    let mut s = store(&[("/memories/n.txt", "Hello World\nBye\n")]);
    let m = Memory::default();
    let r = run(
        &m,
        &mut s,
        json!({"command": "str_replace", "path": "/memories/n.txt", "old_str": "Hello "}),
    );
    assert_eq!(ok(&r), format!("{EDITED}\n     1\tWorld\n     2\tBye"));
    assert_eq!(content(&s, "/memories/n.txt").unwrap(), "World\nBye\n");
    let r = run(
        &m,
        &mut s,
        json!({"command": "str_replace", "path": "/memories/n.txt", "old_str": "World\nBye\n", "new_str": null}),
    );
    assert_eq!(
        ok(&r),
        format!("{EDITED}\n(the file is now empty)"),
        "an emptied file has no lines to show, and says so"
    );
    assert_eq!(content(&s, "/memories/n.txt").unwrap(), "");
}

/// An edit that leaves the file as it was answers as an edit and writes
/// nothing (no commit, no history entry, no quota refusal).
#[test]
fn str_replace_that_changes_nothing_is_answered_but_not_written() {
    let mut s = store(&[("/memories/n.txt", "Hello World\nBye\n")]);
    let m = Memory::default();
    let r = run(
        &m,
        &mut s,
        json!({"command": "str_replace", "path": "/memories/n.txt", "old_str": "World", "new_str": "World"}),
    );
    assert_eq!(
        ok(&r),
        format!("{EDITED}\n     1\tHello World\n     2\tBye")
    );
    assert_eq!(s.commits(), 0);
    let r = run(
        &m,
        &mut s,
        json!({"command": "str_replace", "path": "/memories/n.txt", "old_str": "World", "new_str": "Earth"}),
    );
    ok(&r);
    assert_eq!(s.commits(), 1);
    // The no-op counted as an access (expiry); the real edit did not.
    assert_eq!(s.viewed(), &[MemoryPath::parse("/memories/n.txt").unwrap()]);
}

#[test]
fn create_over_a_file_with_the_same_text_is_answered_but_not_written() {
    let mut s = store(&[("/memories/n.txt", "same\n")]);
    let m = config(|c| c.overwrite_on_create = true);
    let same = json!({"command": "create", "path": "/memories/n.txt", "file_text": "same\n"});
    assert_eq!(
        ok(&run(&m, &mut s, same)),
        "File created successfully at: /memories/n.txt"
    );
    assert_eq!(s.commits(), 0);
    assert_eq!(s.viewed(), &[MemoryPath::parse("/memories/n.txt").unwrap()]);
    let other = json!({"command": "create", "path": "/memories/n.txt", "file_text": "same"});
    ok(&run(&m, &mut s, other));
    assert_eq!(s.commits(), 1);
    assert_eq!(
        s.get(&MemoryPath::parse("/memories/n.txt").unwrap()),
        Some(&b"same"[..])
    );
    // Without overwrite, the same text is still "already exists".
    let same = json!({"command": "create", "path": "/memories/n.txt", "file_text": "same"});
    let r = run(&Memory::default(), &mut s, same);
    assert_eq!(err(&r), "Error: File /memories/n.txt already exists");
}

#[test]
fn str_replace_on_a_missing_file_or_a_directory() {
    let mut s = store(&[("/memories/d/x", "x")]);
    for path in ["/memories/nope", "/memories/d", "/memories"] {
        let r = run(
            &Memory::default(),
            &mut s,
            json!({"command": "str_replace", "path": path, "old_str": "x", "new_str": "y"}),
        );
        assert_eq!(
            err(&r),
            format!("Error: The path {path} does not exist. Please provide a valid path.")
        );
    }
    assert_eq!(s.commits(), 0);
}

#[test]
fn str_replace_not_found() {
    let mut s = store(&[("/memories/a.txt", "abc\n")]);
    let r = run(
        &Memory::default(),
        &mut s,
        json!({"command": "str_replace", "path": "/memories/a.txt", "old_str": "zzz", "new_str": "y"}),
    );
    assert_eq!(
        err(&r),
        "No replacement was performed, old_str `zzz` did not appear verbatim in /memories/a.txt."
    );
    assert_eq!(s.commits(), 0);
}

#[test]
fn str_replace_several_matches_lists_their_lines() {
    let mut s = store(&[
        ("/memories/a.txt", "ab ab\ncd\nab\n"),
        ("/memories/b.txt", "a\nb\na\nb\n"),
    ]);
    let m = Memory::default();
    let r = run(
        &m,
        &mut s,
        json!({"command": "str_replace", "path": "/memories/a.txt", "old_str": "ab", "new_str": "y"}),
    );
    assert_eq!(
        err(&r),
        "No replacement was performed. Multiple occurrences of old_str `ab` in lines: 1, 1, 3. Please ensure it is unique"
    );
    let r = run(
        &m,
        &mut s,
        json!({"command": "str_replace", "path": "/memories/b.txt", "old_str": "a\nb", "new_str": "y"}),
    );
    assert_eq!(
        err(&r),
        "No replacement was performed. Multiple occurrences of old_str `a\nb` in lines: 1, 3. Please ensure it is unique"
    );
    assert_eq!(s.commits(), 0);
    assert_eq!(content(&s, "/memories/a.txt").unwrap(), "ab ab\ncd\nab\n");
    // Every start counts, overlapping ones too, for the refusal as for the
    // listed lines: "aaaa" holds "aaa" twice, so replacing it is ambiguous
    // (the SDK's reference tool counts without overlap there and replaces
    // the first).
    run(
        &m,
        &mut s,
        json!({"command": "create", "path": "/memories/c.txt", "file_text": "aaaa\nzaaz\n"}),
    );
    let r = run(
        &m,
        &mut s,
        json!({"command": "str_replace", "path": "/memories/c.txt", "old_str": "aa", "new_str": "b"}),
    );
    assert_eq!(
        err(&r),
        "No replacement was performed. Multiple occurrences of old_str `aa` in lines: 1, 1, 1, 2. Please ensure it is unique"
    );
    let r = run(
        &m,
        &mut s,
        json!({"command": "str_replace", "path": "/memories/c.txt", "old_str": "aaa", "new_str": "b"}),
    );
    assert_eq!(
        err(&r),
        "No replacement was performed. Multiple occurrences of old_str `aaa` in lines: 1, 1. Please ensure it is unique"
    );
    let r = run(
        &m,
        &mut s,
        json!({"command": "str_replace", "path": "/memories/c.txt", "old_str": "aaaa", "new_str": "b"}),
    );
    assert!(!r.is_error, "{r:?}");
    assert_eq!(content(&s, "/memories/c.txt").unwrap(), "b\nzaaz\n");
}

/// Round 38b: markers can make the stored text longer than what was sent;
/// the refusal says so rather than give a size the model never sent.
#[test]
fn a_create_over_the_size_limit_once_redacted_says_its_size_as_sent() {
    let m = Memory::new(
        MemoryConfig {
            overwrite_on_create: false,
            max_file_bytes: 20,
            max_view_chars: 16_000,
        },
        Some(Box::new(Toy)),
    );
    let mut s = MemStore::default();
    let r = run(
        &m,
        &mut s,
        json!({"command": "create", "path": "/memories/a.txt", "file_text": "ghp_EXAMPLE ghp_EXAMPLE"}),
    );
    let e = err(&r);
    assert!(e.contains("bytes once its secrets are replaced by [REDACTED:…] markers (23 bytes as sent), over the limit of 20"), "{e}");
    assert!(content(&s, "/memories/a.txt").is_none());
}

#[test]
fn str_replace_many_matches_are_summed_up() {
    let mut s = store(&[("/memories/a.txt", &"x\n".repeat(500))]);
    let r = run(
        &Memory::default(),
        &mut s,
        json!({"command": "str_replace", "path": "/memories/a.txt", "old_str": "x", "new_str": "y"}),
    );
    let listed: Vec<String> = (1..=100).map(|i| i.to_string()).collect();
    assert_eq!(
        err(&r),
        format!(
            "No replacement was performed. Multiple occurrences of old_str `x` in lines: {}, … (500 occurrences in all). Please ensure it is unique",
            listed.join(", ")
        )
    );
}

#[test]
fn str_replace_that_empties_the_file_says_so() {
    let mut s = store(&[("/memories/a.txt", "gone\n")]);
    let r = run(
        &Memory::default(),
        &mut s,
        json!({"command": "str_replace", "path": "/memories/a.txt", "old_str": "gone\n"}),
    );
    assert_eq!(ok(&r), format!("{EDITED}\n(the file is now empty)"));
    assert_eq!(content(&s, "/memories/a.txt").unwrap(), "");
}

#[test]
fn str_replace_counts_overlapping_matches_as_several() {
    // "aaa" holds "aa" at 0 and 1: which to replace is not said.
    let mut s = store(&[("/memories/a.txt", "aaa")]);
    let r = run(
        &Memory::default(),
        &mut s,
        json!({"command": "str_replace", "path": "/memories/a.txt", "old_str": "aa", "new_str": "b"}),
    );
    assert_eq!(
        err(&r),
        "No replacement was performed. Multiple occurrences of old_str `aa` in lines: 1, 1. Please ensure it is unique"
    );
    assert_eq!(content(&s, "/memories/a.txt").unwrap(), "aaa");
}

#[test]
fn str_replace_refuses_an_empty_old_str() {
    let mut s = store(&[("/memories/a.txt", "abc")]);
    let r = run(
        &Memory::default(),
        &mut s,
        json!({"command": "str_replace", "path": "/memories/a.txt", "old_str": "", "new_str": "x"}),
    );
    assert_eq!(
        err(&r),
        "Error: `old_str` is empty. Give the exact text to replace, copied from /memories/a.txt; it must appear there exactly once."
    );
    assert_eq!(s.commits(), 0);
}

#[test]
fn str_replace_refuses_binary_files_and_oversized_results() {
    let mut s = store(&[("/memories/a.txt", "abc")]);
    s.seed(&p("/memories/b.bin"), vec![0xff, b'x']).unwrap();
    let m = config(|c| c.max_file_bytes = 10);
    let r = run(
        &m,
        &mut s,
        json!({"command": "str_replace", "path": "/memories/b.bin", "old_str": "x", "new_str": "y"}),
    );
    assert_eq!(
        err(&r),
        "Error: The file /memories/b.bin is binary (it is not UTF-8 text), so str_replace cannot edit it."
    );
    let r = run(
        &m,
        &mut s,
        json!({"command": "str_replace", "path": "/memories/a.txt", "old_str": "b", "new_str": "0123456789"}),
    );
    assert_eq!(
        err(&r),
        "Error: The edit would make /memories/a.txt 12 bytes, over the limit of 10 bytes (10B) for one memory file. Nothing was changed; split the content into several smaller files."
    );
    assert_eq!(s.commits(), 0);
    assert_eq!(content(&s, "/memories/a.txt").unwrap(), "abc");
    // A file already over the limit (a merge, a lowered limit): an edit
    // that does not make it larger is taken; one that does is refused.
    let mut s = store(&[("/memories/big.txt", "0123456789abcdef")]);
    let r = run(
        &m,
        &mut s,
        json!({"command": "str_replace", "path": "/memories/big.txt", "old_str": "abc", "new_str": "ABC"}),
    );
    assert!(!r.is_error, "{r:?}");
    let r = run(
        &m,
        &mut s,
        json!({"command": "str_replace", "path": "/memories/big.txt", "old_str": "ABCdef", "new_str": ""}),
    );
    assert!(!r.is_error, "{r:?}");
    assert_eq!(content(&s, "/memories/big.txt").unwrap(), "0123456789");
    let mut s = store(&[("/memories/big.txt", "0123456789abcdef")]);
    let r = run(
        &m,
        &mut s,
        json!({"command": "str_replace", "path": "/memories/big.txt", "old_str": "f", "new_str": "fg"}),
    );
    assert!(
        err(&r).starts_with("Error: The edit would make /memories/big.txt 17 bytes"),
        "{r:?}"
    );
}

#[test]
fn str_replace_snippet_is_truncated_like_a_view() {
    let mut s = store(&[("/memories/a.txt", "start\nend\n")]);
    let new: String = long_file(2000);
    let r = run(
        &Memory::default(),
        &mut s,
        json!({"command": "str_replace", "path": "/memories/a.txt", "old_str": "start\n", "new_str": new}),
    );
    let text = ok(&r);
    assert!(text.starts_with(&format!("{EDITED}\n     1\tline 1 of a long note é\n")));
    assert!(text.ends_with("  2000\tline 2000 of a long note é\n  2001\tend"));
    assert_eq!(text.matches("lines omitted").count(), 1);
}

// ----- insert -----------------------------------------------------------------

#[test]
fn insert_puts_text_after_the_given_line() {
    let m = Memory::default();
    let cases: [(&str, i64, &str, &str); 9] = [
        ("a\nb\nc\n", 0, "first\n", "first\na\nb\nc\n"),
        ("a\nb\nc\n", 1, "x\ny", "a\nx\ny\nb\nc\n"),
        ("a\nb\nc\n", 3, "last", "a\nb\nc\nlast\n"),
        ("a\nb", 2, "c", "a\nb\nc\n"),
        ("a\nb", 1, "m", "a\nm\nb\n"),
        ("", 0, "x", "x\n"),
        ("a\n", 1, "", "a\n\n"),
        ("a\n", 1, "x\n\n", "a\nx\n\n"),
        ("a\r\nb\r\n", 1, "m\r\n", "a\r\nm\r\nb\r\n"),
    ];
    for (before, line, text, after) in cases {
        let mut s = store(&[("/memories/t.txt", before)]);
        let r = run(
            &m,
            &mut s,
            json!({"command": "insert", "path": "/memories/t.txt", "insert_line": line, "insert_text": text}),
        );
        assert_eq!(ok(&r), "The file /memories/t.txt has been edited.");
        assert_eq!(
            content(&s, "/memories/t.txt").unwrap(),
            after,
            "{before:?} {line} {text:?}"
        );
        assert_eq!(s.log()[0].0, Op::Insert);
    }
}

#[test]
fn insert_facts_count_the_inserted_lines() {
    let mut s = store(&[("/memories/t.txt", "a\n")]);
    run(
        &Memory::default(),
        &mut s,
        json!({"command": "insert", "path": "/memories/t.txt", "insert_line": 1, "insert_text": "x\ny\n"}),
    );
    assert_eq!(
        s.log()[0].1,
        ChangeFacts {
            lines_added: 2,
            lines_removed: 0,
            redactions: vec![]
        }
    );
}

#[test]
fn insert_refuses_a_line_outside_the_file() {
    let mut s = store(&[("/memories/t.txt", "a\nb\nc\n"), ("/memories/e.txt", "")]);
    let m = Memory::default();
    for (path, line, n) in [
        ("/memories/t.txt", -1, 3),
        ("/memories/t.txt", 4, 3),
        ("/memories/t.txt", i64::MAX, 3),
        ("/memories/t.txt", i64::MIN, 3),
        ("/memories/e.txt", 1, 0),
    ] {
        let r = run(
            &m,
            &mut s,
            json!({"command": "insert", "path": path, "insert_line": line, "insert_text": "x"}),
        );
        assert_eq!(
            err(&r),
            format!(
                "Error: Invalid `insert_line` parameter: {line}. It should be within the range of lines of the file: [0, {n}]"
            )
        );
    }
    assert_eq!(s.commits(), 0);
}

#[test]
fn insert_on_a_missing_file_or_a_directory() {
    let mut s = store(&[("/memories/d/x", "x")]);
    for path in ["/memories/nope", "/memories/d", "/memories"] {
        let r = run(
            &Memory::default(),
            &mut s,
            json!({"command": "insert", "path": path, "insert_line": 0, "insert_text": "x"}),
        );
        assert_eq!(err(&r), format!("Error: The path {path} does not exist"));
    }
    assert_eq!(s.commits(), 0);
}

#[test]
fn insert_refuses_binary_files_and_oversized_results() {
    let mut s = store(&[("/memories/a.txt", "abc\n")]);
    s.seed(&p("/memories/b.bin"), vec![0xff]).unwrap();
    let m = config(|c| c.max_file_bytes = 8);
    let r = run(
        &m,
        &mut s,
        json!({"command": "insert", "path": "/memories/b.bin", "insert_line": 0, "insert_text": "x"}),
    );
    assert_eq!(
        err(&r),
        "Error: The file /memories/b.bin is binary (it is not UTF-8 text), so insert cannot edit it."
    );
    let r = run(
        &m,
        &mut s,
        json!({"command": "insert", "path": "/memories/a.txt", "insert_line": 1, "insert_text": "defg"}),
    );
    assert_eq!(
        err(&r),
        "Error: The insert would make /memories/a.txt 9 bytes, over the limit of 8 bytes (8B) for one memory file. Nothing was changed; split the content into several smaller files."
    );
    let r = run(
        &m,
        &mut s,
        json!({"command": "insert", "path": "/memories/a.txt", "insert_line": 1, "insert_text": "def"}),
    );
    ok(&r);
    assert_eq!(content(&s, "/memories/a.txt").unwrap(), "abc\ndef\n");
}

// ----- delete -------------------------------------------------------------------

#[test]
fn delete_a_file() {
    let mut s = store(&[("/memories/a.txt", "x"), ("/memories/b.txt", "y")]);
    let r = run(
        &Memory::default(),
        &mut s,
        json!({"command": "delete", "path": "/memories/a.txt"}),
    );
    assert_eq!(ok(&r), "Successfully deleted /memories/a.txt");
    assert_eq!(s.paths().collect::<Vec<_>>(), ["/memories/b.txt"]);
    assert_eq!(s.log()[0].0, Op::Delete);
}

#[test]
fn delete_a_directory_recursively() {
    let mut s = store(&[
        ("/memories/d/a", "1"),
        ("/memories/d/s/b", "2"),
        ("/memories/d/s/t/c", "3"),
        ("/memories/dd", "4"),
    ]);
    let r = run(
        &Memory::default(),
        &mut s,
        json!({"command": "delete", "path": "/memories/d/"}),
    );
    assert_eq!(ok(&r), "Successfully deleted /memories/d");
    assert_eq!(s.paths().collect::<Vec<_>>(), ["/memories/dd"]);
    assert_eq!(s.commits(), 1);
}

#[test]
fn delete_a_missing_path() {
    let mut s = store(&[("/memories/a.txt", "x")]);
    let r = run(
        &Memory::default(),
        &mut s,
        json!({"command": "delete", "path": "/memories/nope"}),
    );
    assert_eq!(err(&r), "Error: The path /memories/nope does not exist");
    assert_eq!(s.commits(), 0);
}

#[test]
fn delete_of_the_root_is_refused() {
    let mut s = store(&[("/memories/a.txt", "x")]);
    for path in ["/memories", "/memories/"] {
        let r = run(
            &Memory::default(),
            &mut s,
            json!({"command": "delete", "path": path}),
        );
        assert_eq!(
            err(&r),
            "Error: The /memories directory itself cannot be deleted. Delete the files and directories inside it instead."
        );
    }
    assert_eq!(s.commits(), 0);
    assert_eq!(s.paths().count(), 1);
}

// ----- rename -------------------------------------------------------------------

#[test]
fn rename_a_file_into_new_parents() {
    let mut s = store(&[("/memories/draft.txt", "text")]);
    let r = run(
        &Memory::default(),
        &mut s,
        json!({"command": "rename", "old_path": "/memories/draft.txt", "new_path": "/memories/x/y/final.txt"}),
    );
    assert_eq!(
        ok(&r),
        "Successfully renamed /memories/draft.txt to /memories/x/y/final.txt"
    );
    assert_eq!(s.paths().collect::<Vec<_>>(), ["/memories/x/y/final.txt"]);
    assert_eq!(content(&s, "/memories/x/y/final.txt").unwrap(), "text");
    assert_eq!(s.log()[0].0, Op::Rename);
}

#[test]
fn rename_a_directory_with_everything_below_it() {
    let mut s = store(&[
        ("/memories/d/a", "1"),
        ("/memories/d/s/b", "2"),
        ("/memories/e", "3"),
    ]);
    let r = run(
        &Memory::default(),
        &mut s,
        json!({"command": "rename", "old_path": "/memories/d/", "new_path": "/memories/z/moved/"}),
    );
    assert_eq!(
        ok(&r),
        "Successfully renamed /memories/d to /memories/z/moved"
    );
    assert_eq!(
        s.paths().collect::<Vec<_>>(),
        [
            "/memories/e",
            "/memories/z/moved/a",
            "/memories/z/moved/s/b"
        ]
    );
}

#[test]
fn rename_of_a_missing_source() {
    let mut s = MemStore::default();
    let r = run(
        &Memory::default(),
        &mut s,
        json!({"command": "rename", "old_path": "/memories/nope", "new_path": "/memories/x"}),
    );
    assert_eq!(err(&r), "Error: The path /memories/nope does not exist");
}

#[test]
fn rename_never_overwrites() {
    let mut s = store(&[
        ("/memories/a.txt", "a"),
        ("/memories/b.txt", "b"),
        ("/memories/d/x", "x"),
    ]);
    let m = config(|c| c.overwrite_on_create = true);
    for (from, to) in [
        ("/memories/a.txt", "/memories/b.txt"),
        ("/memories/a.txt", "/memories/d"),
        ("/memories/d", "/memories/a.txt"),
        ("/memories/a.txt", "/memories/a.txt"),
    ] {
        let r = run(
            &m,
            &mut s,
            json!({"command": "rename", "old_path": from, "new_path": to}),
        );
        assert_eq!(
            err(&r),
            format!("Error: The destination {to} already exists")
        );
    }
    assert_eq!(s.commits(), 0);
    assert_eq!(content(&s, "/memories/b.txt").unwrap(), "b");
}

#[test]
fn rename_refusals() {
    let mut s = store(&[("/memories/a/x", "x"), ("/memories/f.txt", "f")]);
    let m = Memory::default();
    let cases = [
        (
            "/memories",
            "/memories/x",
            "Error: The /memories directory itself cannot be renamed or moved. Rename the files and directories inside it instead.",
        ),
        (
            "/memories/",
            "/memories/x",
            "Error: The /memories directory itself cannot be renamed or moved. Rename the files and directories inside it instead.",
        ),
        (
            "/memories/a",
            "/memories",
            "Error: The destination /memories already exists",
        ),
        (
            "/memories/nope.md",
            "/memories",
            "Error: The path /memories/nope.md does not exist",
        ),
        (
            "/memories/a",
            "/memories/a/inside",
            "Error: Cannot move /memories/a into itself: /memories/a/inside is inside /memories/a. Choose a destination outside /memories/a.",
        ),
        (
            "/memories/f.txt",
            "/memories/f.txt/x",
            "Error: Cannot move /memories/f.txt into itself: /memories/f.txt/x is inside /memories/f.txt. Choose a destination outside /memories/f.txt.",
        ),
        (
            "/memories/a",
            "/memories/f.txt/b/a",
            "Error: Cannot rename /memories/a to /memories/f.txt/b/a: /memories/f.txt is a file, not a directory. Choose a destination whose parent directories are not files.",
        ),
    ];
    for (from, to, message) in cases {
        let r = run(
            &m,
            &mut s,
            json!({"command": "rename", "old_path": from, "new_path": to}),
        );
        assert_eq!(err(&r), message);
    }
    assert_eq!(s.commits(), 0);
}

#[test]
fn rename_refuses_to_push_paths_past_the_limits() {
    let deep = format!("/memories/d{}", "/a".repeat(19));
    let mut s = store(&[(&deep, "x")]);
    let r = run(
        &Memory::default(),
        &mut s,
        json!({"command": "rename", "old_path": "/memories/d", "new_path": "/memories/x/y"}),
    );
    let expected_child = format!("/memories/d{}", "/a".repeat(19));
    assert_eq!(
        err(&r),
        format!(
            "Error: Cannot rename /memories/d to /memories/x/y: {expected_child} would move past the path limits (1024 bytes, 20 levels below /memories, 127 bytes per name). Choose a shorter or shallower destination."
        )
    );
    assert_eq!(s.commits(), 0);
    let r = run(
        &Memory::default(),
        &mut s,
        json!({"command": "rename", "old_path": "/memories/d", "new_path": "/memories/e"}),
    );
    ok(&r);
}

// ----- paths and input ------------------------------------------------------------

#[test]
fn refused_paths_change_nothing_and_name_the_rule() {
    let hostile = [
        "/memories/../etc/passwd",
        "/memories/./a",
        "/memories//a",
        "/memories\\a",
        "/memories/%2e%2e/x",
        "/memories/%252E/x",
        "/memoriesX/a",
        "memories/a",
        "",
        "/memories/a\u{0}b",
        "/memories/\u{202e}txt.exe",
        "/memories/line\u{2028}sep",
        "/memories/e\u{301}",
    ];
    let mut s = store(&[("/memories/keep.txt", "keep\n")]);
    let before = files(&s);
    let m = config(|c| c.overwrite_on_create = true);
    for path in hostile {
        let expected = format!("Error: {}", MemoryPath::parse(path).unwrap_err());
        let commands = [
            json!({"command": "view", "path": path}),
            json!({"command": "create", "path": path, "file_text": "x"}),
            json!({"command": "str_replace", "path": path, "old_str": "keep", "new_str": "y"}),
            json!({"command": "insert", "path": path, "insert_line": 0, "insert_text": "x"}),
            json!({"command": "delete", "path": path}),
            json!({"command": "rename", "old_path": "/memories/keep.txt", "new_path": path}),
            json!({"command": "rename", "old_path": path, "new_path": "/memories/stolen.txt"}),
        ];
        for cmd in commands {
            let r = run(&m, &mut s, cmd.clone());
            assert_eq!(err(&r), expected, "{cmd}");
            assert!(expected.starts_with("Error: The path "), "{expected}");
        }
    }
    assert_eq!(s.commits(), 0);
    assert_eq!(files(&s), before);
    assert!(s.viewed().is_empty());
}

#[test]
fn malformed_input_gets_a_precise_error() {
    let mut s = MemStore::default();
    let m = Memory::default();
    let cases = [
        (
            json!({"command": "create", "path": "/memories/a"}),
            "Error: invalid input for `create`: missing required field `file_text` (string).",
        ),
        (
            json!({"command": "explode"}),
            "Error: unknown command `explode`. Valid commands are: `view`, `create`, `str_replace`, `insert`, `delete`, `rename`.",
        ),
        (
            json!(42),
            "Error: invalid input: expected a JSON object with a `command` field (one of `view`, `create`, `str_replace`, `insert`, `delete`, `rename`), got the number 42.",
        ),
        (
            json!({"command": "insert", "path": "/memories/a", "insert_line": "two", "insert_text": "x"}),
            "Error: invalid input for `insert`: field `insert_line` must be an integer (a line number, 0 for the start of the file), got a string.",
        ),
    ];
    for (input, message) in cases {
        assert_eq!(err(&run(&m, &mut s, input)), message);
    }
    assert_eq!(s.commits(), 0);
}

#[test]
fn execute_and_execute_json_agree() {
    let mut a = store(&[("/memories/a.txt", "x\n")]);
    let mut b = store(&[("/memories/a.txt", "x\n")]);
    let m = Memory::default();
    let input = json!({"command": "str_replace", "path": "/memories/a.txt", "old_str": "x", "new_str": "y"});
    let cmd = parse_command(&input).unwrap();
    assert_eq!(m.execute(&mut a, &cmd), m.execute_json(&mut b, &input));
    assert_eq!(files(&a), files(&b));
}

// ----- redaction ------------------------------------------------------------------

/// Redacts two fake secret shapes, one finding per occurrence and in
/// unsorted order; refuses anything holding a private key.
struct Toy;

impl TextFilter for Toy {
    fn filter(&self, text: &str) -> FilterOutcome {
        if text.contains("BEGIN PRIVATE KEY") {
            return FilterOutcome::Rejected {
                kinds: vec![("private-key".into(), 1)],
            };
        }
        let mut out = text.to_owned();
        let mut kinds = Vec::new();
        for (needle, kind) in [
            ("ghp_EXAMPLE", "github-token"),
            ("AKIAEXAMPLE", "aws-access-key-id"),
        ] {
            for _ in 0..out.matches(needle).count() {
                kinds.push((kind.to_owned(), 1));
            }
            out = out.replace(needle, &format!("[REDACTED:{kind}]"));
        }
        if kinds.is_empty() {
            FilterOutcome::Clean
        } else {
            FilterOutcome::Redacted { text: out, kinds }
        }
    }
}

fn toy() -> Memory {
    Memory::new(MemoryConfig::default(), Some(Box::new(Toy)))
}

#[test]
fn redacted_create_says_how_many_and_which_kinds() {
    let mut s = MemStore::default();
    let r = run(
        &toy(),
        &mut s,
        json!({"command": "create", "path": "/memories/s.txt", "file_text": "ghp_EXAMPLE and AKIAEXAMPLE\n"}),
    );
    assert_eq!(
        ok(&r),
        "File created successfully at: /memories/s.txt\nNote: 2 secrets were redacted before saving (aws-access-key-id, github-token)."
    );
    assert_eq!(
        content(&s, "/memories/s.txt").unwrap(),
        "[REDACTED:github-token] and [REDACTED:aws-access-key-id]\n"
    );
    assert_eq!(
        s.log()[0].1.redactions,
        [
            ("aws-access-key-id".to_owned(), 1),
            ("github-token".to_owned(), 1)
        ]
    );
}

#[test]
fn a_path_or_old_str_as_first_written_finds_what_was_stored_redacted() {
    const VIA: &str = "\nNote: the path given holds a secret, so it was matched to the file stored under its redacted name (above); a path with another secret of the same kind names the same file.";
    let mut s = MemStore::default();
    let m = toy();
    let secret_path = "/memories/n-AKIAEXAMPLE.md";
    let stored = "/memories/n-[REDACTED:aws-access-key-id].md";
    let r = run(
        &m,
        &mut s,
        json!({"command": "create", "path": secret_path, "file_text": "alpha\nbeta\n"}),
    );
    assert!(ok(&r).starts_with(&format!("File created successfully at: {stored}\n")));
    // Each command naming the path as the model wrote it acts on the file
    // stored under its redacted name, answers with that name, and says how
    // it found it.
    let r = run(&m, &mut s, json!({"command": "view", "path": secret_path}));
    assert_eq!(
        ok(&r),
        format!(
            "Here's the content of {stored} with line numbers:\n     1\talpha\n     2\tbeta{VIA}"
        )
    );
    let r = run(
        &m,
        &mut s,
        json!({"command": "str_replace", "path": secret_path, "old_str": "alpha", "new_str": "key=AKIAEXAMPLE"}),
    );
    assert!(ok(&r).ends_with(VIA), "{r:?}");
    // The old text as first written matches its redacted form in the file,
    // and the answer says so.
    let r = run(
        &m,
        &mut s,
        json!({"command": "str_replace", "path": stored, "old_str": "key=AKIAEXAMPLE", "new_str": "gamma"}),
    );
    assert!(
        ok(&r).contains("Note: `old_str` holds a secret, so it was matched to the redacted text stored in its place"),
        "{r:?}"
    );
    let r = run(
        &m,
        &mut s,
        json!({"command": "insert", "path": secret_path, "insert_line": 0, "insert_text": "top"}),
    );
    assert_eq!(ok(&r), format!("The file {stored} has been edited.{VIA}"));
    assert_eq!(content(&s, stored).unwrap(), "top\ngamma\nbeta\n");
    let r = run(
        &m,
        &mut s,
        json!({"command": "rename", "old_path": secret_path, "new_path": "/memories/plain.md"}),
    );
    assert_eq!(
        ok(&r),
        format!("Successfully renamed {stored} to /memories/plain.md{VIA}")
    );
    let r = run(
        &m,
        &mut s,
        json!({"command": "create", "path": secret_path, "file_text": "x"}),
    );
    assert!(!r.is_error);
    let r = run(
        &m,
        &mut s,
        json!({"command": "delete", "path": secret_path}),
    );
    assert_eq!(ok(&r), format!("Successfully deleted {stored}{VIA}"));
    // Missing either way: the answer names the path as it may be shown.
    let r = run(&m, &mut s, json!({"command": "view", "path": secret_path}));
    assert_eq!(
        err(&r),
        format!("The path {stored} does not exist. Please provide a valid path.")
    );
    // A name stored with the secret in it (before a rule knew it) is found
    // as it is.
    let mut old = MemStore::default();
    old.seed(&p(secret_path), b"kept\n".to_vec()).unwrap();
    let r = run(
        &m,
        &mut old,
        json!({"command": "delete", "path": secret_path}),
    );
    assert_eq!(ok(&r), format!("Successfully deleted {secret_path}"));
    assert!(files(&old).is_empty());
}

#[test]
fn a_secret_split_between_names_of_a_path_is_refused() {
    let m = toy();
    let mut s = MemStore::default();
    for path in ["/memories/ghp_/EXAMPLE.md", "/memories/a/ghp_EX/AMPLE/b.md"] {
        let r = run(
            &m,
            &mut s,
            json!({"command": "create", "path": path, "file_text": "x"}),
        );
        assert!(
            err(&r)
                == "Error: Nothing was saved: the path holds 1 secret (github-token) split between its names, which redacting one name cannot hide. Choose names without it.",
            "{path}: {r:?}"
        );
        assert!(!err(&r).contains("EXAMPLE"), "{r:?}");
    }
    let r = run(
        &m,
        &mut s,
        json!({"command": "create", "path": "/memories/a.md", "file_text": "x"}),
    );
    assert!(!r.is_error);
    let r = run(
        &m,
        &mut s,
        json!({"command": "rename", "old_path": "/memories/a.md", "new_path": "/memories/ghp_/EXAMPLE.md"}),
    );
    assert!(err(&r).starts_with("Error: Nothing was saved"), "{r:?}");
    assert_eq!(files(&s).len(), 1);
    assert!(content(&s, "/memories/a.md").is_some());
}

/// Redacts from `pw=` to the end of the text, as a rule that reads a
/// value to the next blank does.
struct Greedy;

impl TextFilter for Greedy {
    fn filter(&self, text: &str) -> FilterOutcome {
        // As the real filter, a value that is already a marker is left.
        match text
            .find("pw=")
            .filter(|&at| !text[at + 3..].starts_with("[REDACTED:"))
        {
            Some(at) => FilterOutcome::Redacted {
                text: format!("{}pw=[REDACTED:password]", &text[..at]),
                kinds: vec![("password".into(), 1)],
            },
            None => FilterOutcome::Clean,
        }
    }
}

#[test]
fn a_path_is_filtered_name_by_name_so_a_directory_never_merges_with_its_file() {
    let m = Memory::new(MemoryConfig::default(), Some(Box::new(Greedy)));
    let mut s = MemStore::default();
    let r = run(
        &m,
        &mut s,
        json!({"command": "create", "path": "/memories/pw=hunter2/f.md", "file_text": "one"}),
    );
    assert!(
        ok(&r).starts_with("File created successfully at: /memories/pw=[REDACTED:password]/f.md\n"),
        "{r:?}"
    );
    let r = run(
        &m,
        &mut s,
        json!({"command": "create", "path": "/memories/pw=hunter2/g.md", "file_text": "two"}),
    );
    assert!(!r.is_error, "{r:?}");
    // A file never created there is not found through its directory's
    // redacted name, and nothing else is touched.
    let r = run(
        &m,
        &mut s,
        json!({"command": "delete", "path": "/memories/pw=hunter2/zzz.md"}),
    );
    // (The echo is masked as a whole text, so this greedy filter hides
    // the rest of the message.)
    assert!(
        err(&r).starts_with("Error: The path /memories/pw=[REDACTED:password]"),
        "{r:?}"
    );
    assert_eq!(files(&s).len(), 2);
    let r = run(
        &m,
        &mut s,
        json!({"command": "view", "path": "/memories/pw=hunter2/g.md"}),
    );
    assert!(ok(&r).contains("     1\ttwo"), "{r:?}");
}

#[test]
fn redaction_notice_singular_and_same_kind_twice() {
    let mut s = MemStore::default();
    let r = run(
        &toy(),
        &mut s,
        json!({"command": "create", "path": "/memories/a.txt", "file_text": "ghp_EXAMPLE"}),
    );
    assert_eq!(
        ok(&r),
        "File created successfully at: /memories/a.txt\nNote: 1 secret was redacted before saving (github-token)."
    );
    let r = run(
        &toy(),
        &mut s,
        json!({"command": "create", "path": "/memories/b.txt", "file_text": "ghp_EXAMPLE ghp_EXAMPLE"}),
    );
    assert_eq!(
        ok(&r),
        "File created successfully at: /memories/b.txt\nNote: 2 secrets were redacted before saving (github-token)."
    );
    assert_eq!(s.log()[1].1.redactions, [("github-token".to_owned(), 2)]);
    let r = run(
        &toy(),
        &mut s,
        json!({"command": "create", "path": "/memories/c.txt", "file_text": "clean"}),
    );
    assert_eq!(ok(&r), "File created successfully at: /memories/c.txt");
}

#[test]
fn redaction_applies_to_str_replace_and_insert() {
    let mut s = store(&[("/memories/a.txt", "key: TODO\n")]);
    let r = run(
        &toy(),
        &mut s,
        json!({"command": "str_replace", "path": "/memories/a.txt", "old_str": "TODO", "new_str": "AKIAEXAMPLE"}),
    );
    assert_eq!(
        ok(&r),
        format!(
            "{EDITED}\n     1\tkey: [REDACTED:aws-access-key-id]\nNote: 1 secret was redacted before saving (aws-access-key-id)."
        )
    );
    let r = run(
        &toy(),
        &mut s,
        json!({"command": "insert", "path": "/memories/a.txt", "insert_line": 1, "insert_text": "gh: ghp_EXAMPLE\n"}),
    );
    assert_eq!(
        ok(&r),
        "The file /memories/a.txt has been edited.\nNote: 1 secret was redacted before saving (github-token)."
    );
    assert_eq!(
        content(&s, "/memories/a.txt").unwrap(),
        "key: [REDACTED:aws-access-key-id]\ngh: [REDACTED:github-token]\n"
    );
}

#[test]
fn rejected_text_is_never_written() {
    let mut s = store(&[("/memories/a.txt", "x\n")]);
    let message = "Error: Nothing was saved: the text contains 1 secret (private-key) that this memory store refuses to keep. Remove it (note where the secret is kept instead of its value) and try again.";
    for cmd in [
        json!({"command": "create", "path": "/memories/k.pem", "file_text": "-----BEGIN PRIVATE KEY-----"}),
        json!({"command": "str_replace", "path": "/memories/a.txt", "old_str": "x", "new_str": "BEGIN PRIVATE KEY"}),
        json!({"command": "insert", "path": "/memories/a.txt", "insert_line": 0, "insert_text": "BEGIN PRIVATE KEY"}),
    ] {
        assert_eq!(err(&run(&toy(), &mut s, cmd)), message);
    }
    assert_eq!(s.commits(), 0);
    assert_eq!(s.paths().collect::<Vec<_>>(), ["/memories/a.txt"]);
}

// ----- store errors and retries ----------------------------------------------------

#[test]
fn store_errors_become_error_results() {
    let mut s = store(&[("/memories/a.txt", "x")]);
    s.set_unavailable(Some("disk on fire".into()));
    let m = Memory::default();
    for cmd in [
        json!({"command": "view", "path": "/memories"}),
        json!({"command": "view", "path": "/memories/a.txt"}),
        json!({"command": "create", "path": "/memories/b.txt", "file_text": "x"}),
        json!({"command": "delete", "path": "/memories/a.txt"}),
    ] {
        assert_eq!(
            err(&run(&m, &mut s, cmd)),
            "Error: the vault could not complete the operation (disk on fire); nothing was changed"
        );
    }
    assert!(s.viewed().is_empty());
    assert_eq!(s.commits(), 0);
}

/// A store whose every access finds damage.
struct Damaged;

impl Store for Damaged {
    fn read(
        &mut self,
        _f: &mut dyn FnMut(&dyn Snapshot) -> Result<ToolResult, StoreError>,
    ) -> Result<ToolResult, StoreError> {
        Err(StoreError::Damaged("bad tag".into()))
    }
    fn write(
        &mut self,
        _f: &mut dyn FnMut(&dyn Snapshot) -> Result<Outcome, StoreError>,
    ) -> Result<ToolResult, StoreError> {
        Err(StoreError::Damaged("bad tag".into()))
    }
}

#[test]
fn damage_is_reported_not_returned() {
    let r = Memory::default().execute_json(
        &mut Damaged,
        &json!({"command": "view", "path": "/memories/a"}),
    );
    assert_eq!(
        err(&r),
        "Error: the vault is damaged (bad tag); nothing was returned or changed. Run `memvault verify` to locate the damage"
    );
}

/// A store that runs every write closure twice, as a store retrying on a
/// newer tip would, and checks that both runs decide the same.
struct Twice(MemStore);

impl Store for Twice {
    fn read(
        &mut self,
        f: &mut dyn FnMut(&dyn Snapshot) -> Result<ToolResult, StoreError>,
    ) -> Result<ToolResult, StoreError> {
        self.0.read(&mut |snap| {
            let first = f(snap)?;
            let second = f(snap)?;
            assert_eq!(first, second);
            Ok(second)
        })
    }
    fn write(
        &mut self,
        f: &mut dyn FnMut(&dyn Snapshot) -> Result<Outcome, StoreError>,
    ) -> Result<ToolResult, StoreError> {
        self.0.write(&mut |snap| {
            let first = f(snap)?;
            let second = f(snap)?;
            assert_eq!(first.result, second.result);
            assert_eq!(first.mutation.is_some(), second.mutation.is_some());
            Ok(second)
        })
    }
    fn note_viewed(&mut self, path: &MemoryPath) {
        self.0.note_viewed(path);
    }
}

#[test]
fn write_closures_can_run_again() {
    let mut s = Twice(store(&[("/memories/a.txt", "a\nb\n")]));
    let m = toy();
    for cmd in [
        json!({"command": "create", "path": "/memories/n.txt", "file_text": "ghp_EXAMPLE"}),
        json!({"command": "str_replace", "path": "/memories/a.txt", "old_str": "a", "new_str": "c"}),
        json!({"command": "insert", "path": "/memories/a.txt", "insert_line": 2, "insert_text": "d"}),
        json!({"command": "rename", "old_path": "/memories/a.txt", "new_path": "/memories/b/a.txt"}),
        json!({"command": "view", "path": "/memories/b/a.txt"}),
        json!({"command": "delete", "path": "/memories/b"}),
    ] {
        ok(&m.execute_json(&mut s, &cmd));
    }
    assert_eq!(s.0.commits(), 5);
    assert_eq!(s.0.viewed(), [p("/memories/b/a.txt")]);
    assert_eq!(s.0.paths().collect::<Vec<_>>(), ["/memories/n.txt"]);
}

// ----- no panics, nothing changed by errors ---------------------------------------

#[test]
fn random_commands_keep_the_contracts() {
    let paths = [
        "/memories",
        "/memories/",
        "/memories/a",
        "/memories/a/b",
        "/memories/a/b.txt",
        "/memories/c.txt",
        "/memories/a/b/c.png",
        "/memories/../x",
        "/memories/a/.h",
        "/memories/é",
        "/memories/e\u{301}",
        "",
    ];
    let texts = [
        "",
        "x",
        "x\n",
        "a\nb\nc\n",
        "é\u{301}\n\n",
        "ghp_EXAMPLE",
        "BEGIN PRIVATE KEY",
        "\u{0}\u{ff}",
    ];
    let mut seed = 0x9E37_79B9_7F4A_7C15_u64;
    let mut next = move |n: usize| crate::test_rand(&mut seed, n);
    let m = Memory::new(
        MemoryConfig {
            overwrite_on_create: false,
            max_file_bytes: 64,
            max_view_chars: 40,
        },
        Some(Box::new(Toy)),
    );
    let mut s = MemStore::default();
    for _ in 0..4000 {
        let path = paths[next(paths.len())];
        let other = paths[next(paths.len())];
        let text = texts[next(texts.len())];
        let line = i64::try_from(next(7)).unwrap() - 1;
        let cmd = match next(7) {
            0 => json!({"command": "view", "path": path}),
            1 => {
                json!({"command": "view", "path": path, "view_range": [line, line + 1 - i64::try_from(next(3)).unwrap()]})
            }
            2 => json!({"command": "create", "path": path, "file_text": text}),
            3 => {
                json!({"command": "str_replace", "path": path, "old_str": texts[next(texts.len())], "new_str": text})
            }
            4 => {
                json!({"command": "insert", "path": path, "insert_line": line, "insert_text": text})
            }
            5 => json!({"command": "delete", "path": path}),
            _ => json!({"command": "rename", "old_path": path, "new_path": other}),
        };
        let before = files(&s);
        let commits = s.commits();
        let r = m.execute_json(&mut s, &cmd);
        let mutating = cmd["command"] != "view";
        if r.is_error || !mutating {
            assert_eq!(s.commits(), commits, "{cmd}");
            assert_eq!(files(&s), before, "{cmd}");
        } else if cmd["command"] == "str_replace" && files(&s) == before {
            // An edit that leaves the file as it was writes nothing.
            assert_eq!(s.commits(), commits, "{cmd}");
        } else {
            assert_eq!(s.commits(), commits + 1, "{cmd}");
        }
        // Every stored path is canonical and within the limits.
        for key in s.paths() {
            assert_eq!(MemoryPath::parse(key).unwrap().as_str(), key);
        }
    }
}

#[test]
fn a_session_walkthrough_of_the_spec_strings() {
    let mut s = MemStore::default();
    let m = Memory::default();
    let header = "Here're the files and directories up to 2 levels deep in /memories, excluding hidden items and node_modules:";
    let steps: Vec<(Value, bool, String)> = vec![
        (json!({"command": "view", "path": "/memories"}), false, format!("{header}\n0B\t/memories")),
        (json!({"command": "create", "path": "/memories/notes.txt", "file_text": "Hello World\nThis is line two\n"}), false, "File created successfully at: /memories/notes.txt".into()),
        (json!({"command": "create", "path": "/memories/notes.txt", "file_text": "x"}), true, "Error: File /memories/notes.txt already exists".into()),
        (json!({"command": "view", "path": "/memories/notes.txt"}), false, "Here's the content of /memories/notes.txt with line numbers:\n     1\tHello World\n     2\tThis is line two".into()),
        (json!({"command": "str_replace", "path": "/memories/notes.txt", "old_str": "line two", "new_str": "line 2"}), false, format!("{EDITED}\n     1\tHello World\n     2\tThis is line 2")),
        (json!({"command": "str_replace", "path": "/memories/notes.txt", "old_str": "zzz", "new_str": "y"}), true, "No replacement was performed, old_str `zzz` did not appear verbatim in /memories/notes.txt.".into()),
        (json!({"command": "insert", "path": "/memories/notes.txt", "insert_line": 1, "insert_text": "middle\n"}), false, "The file /memories/notes.txt has been edited.".into()),
        (json!({"command": "insert", "path": "/memories/notes.txt", "insert_line": 7, "insert_text": "x"}), true, "Error: Invalid `insert_line` parameter: 7. It should be within the range of lines of the file: [0, 3]".into()),
        (json!({"command": "rename", "old_path": "/memories/notes.txt", "new_path": "/memories/d/n.txt"}), false, "Successfully renamed /memories/notes.txt to /memories/d/n.txt".into()),
        (json!({"command": "view", "path": "/memories"}), false, format!("{header}\n34B\t/memories\n34B\t/memories/d/\n34B\t/memories/d/n.txt")),
        (json!({"command": "delete", "path": "/memories/d"}), false, "Successfully deleted /memories/d".into()),
        (json!({"command": "view", "path": "/memories/d/n.txt"}), true, "The path /memories/d/n.txt does not exist. Please provide a valid path.".into()),
        (json!({"command": "delete", "path": "/memories/d"}), true, "Error: The path /memories/d does not exist".into()),
    ];
    for (cmd, is_error, text) in steps {
        let r = run(&m, &mut s, cmd.clone());
        assert_eq!(
            r,
            ToolResult {
                content: Content::Text(text),
                is_error
            },
            "{cmd}"
        );
    }
    assert_eq!(s.commits(), 5);
}

/// A big subdirectory does not hide the entries beside it: the listed
/// directory's own entries come first when not every row fits.
#[test]
fn a_listing_cut_short_still_shows_every_entry_of_the_directory_itself() {
    let mut files: Vec<(String, String)> = (0..500)
        .map(|i| (format!("/memories/archive/note-{i:04}.md"), "x".into()))
        .collect();
    files.push(("/memories/profile.md".into(), "me".into()));
    files.push(("/memories/zz-important/README.md".into(), "read me".into()));
    let files: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, c)| (p.as_str(), c.as_str()))
        .collect();
    let mut s = store(&files);
    let m = Memory::default();
    let r = run(&m, &mut s, json!({"command": "view", "path": "/memories"}));
    let text = ok(&r);
    assert!(text.chars().count() <= 16_000, "{}", text.chars().count());
    for shown in [
        "\t/memories/archive/\n",
        "\t/memories/profile.md\n",
        "\t/memories/zz-important/\n",
        "\t/memories/archive/note-0000.md\n",
    ] {
        assert!(text.contains(shown), "{shown:?} missing from {text}");
    }
    let rows = text.lines().count();
    // The rows are in listing order, the archive's first entries among them.
    let at = |p: &str| text.find(p).unwrap();
    assert!(at("/memories/archive/note-0000.md") < at("/memories/profile.md"));
    assert!(
        text.lines().last().unwrap().contains(
            "more entries not shown: a listing stops at 16000 characters. View /memories with view_range ["
        ) && text
            .lines()
            .last()
            .unwrap()
            .contains("view a subdirectory (such as /memories/archive/)"),
        "{rows} rows: {}",
        text.lines().last().unwrap()
    );
    // Only subdirectory entries were left out.
    assert!(!text.contains("/memories/zz-important/README.md"));
}

/// Listing rows from (line, subdirectory) pairs: a row in a subdirectory
/// is one of its entries.
fn rows_of(rows: &[(String, Option<String>)]) -> Vec<Row> {
    rows.iter()
        .map(|(line, sub)| Row {
            line: line.clone(),
            sub: sub.clone(),
            deep: sub.is_some(),
        })
        .collect()
}

#[test]
fn capped_listing_keeps_whole_rows_and_its_own_row() {
    let rows: Vec<(String, Option<String>)> = (0..10)
        .map(|i| {
            let sub = (i > 4).then(|| "/memories/d/".to_owned());
            (format!("1B\t/memories/f{i}"), sub)
        })
        .collect();
    // Room for everything: no marker.
    let root = p("/memories");
    let all = capped_listing("H".into(), &rows_of(&rows), &root, 10_000);
    assert_eq!(all.lines().count(), 11);
    // No room at all: the first row still shows, then the marker, without
    // an example it has no room for.
    let none = capped_listing("H".into(), &rows_of(&rows), &root, 0);
    assert_eq!(
        none,
        "H\n1B\t/memories/f0\n… 9 more entries not shown: a listing stops at 0 characters. View /memories with view_range [2, -1] to list the entries from the first one left out, view a subdirectory to list what is in it, or view a file by its path …"
    );
    // Subdirectories whose paths are longer than the cap leaves for the
    // example: the answer stays within the cap, the example left out.
    let long = format!("/memories/{}/", "d".repeat(900));
    let long_rows: Vec<(String, Option<String>)> =
        std::iter::once(("5K\t/memories".to_owned(), None))
            .chain((0..3).map(|i| (format!("1K\t{long}f{i}"), Some(long.clone()))))
            .collect();
    let header = listing_header("/memories");
    let capped = capped_listing(header.clone(), &rows_of(&long_rows), &root, 1_000);
    assert!(
        capped.chars().count() <= 1_000,
        "{}",
        capped.chars().count()
    );
    assert_eq!(
        capped,
        format!(
            "{header}\n5K\t/memories\n… 3 more entries not shown: a listing stops at 1000 characters. View /memories with view_range [2, -1] to list the entries from the first one left out, view a subdirectory to list what is in it, or view a file by its path …"
        )
    );
    // With room for the example, it is named.
    let roomy = capped_listing(header.clone(), &rows_of(&long_rows), &root, 1_500);
    assert!(roomy.chars().count() <= 1_500, "{}", roomy.chars().count());
    assert!(roomy.contains(&format!("(such as {long})")), "{roomy}");
    // Rows are 16 characters with their newline: 3 fit beside the header
    // and the closing row (whose room, at its longest, is kept), and the
    // whole answer is within the cap.
    let many: Vec<(String, Option<String>)> = (0..30)
        .map(|i| {
            let sub = (i > 4).then(|| "/memories/d/".to_owned());
            (format!("1B\t/memories/f{i:02}"), sub)
        })
        .collect();
    // Rows of 17 characters with their newline.
    let closing = "… 30 more entries not shown: a listing stops at 999 characters. View /memories with view_range [30, -1] to list the entries from the first one left out, view a subdirectory (such as /memories/d/) to list what is in it, or view a file by its path …";
    let cap = 1 + 3 * 17 + closing.chars().count() + 1;
    let some = capped_listing("H".into(), &rows_of(&many), &root, cap);
    assert_eq!(some.lines().count(), 1 + 3 + 1, "{some}");
    assert!(some.chars().count() <= cap, "{some}");
    assert!(some.ends_with(&format!("… 27 more entries not shown: a listing stops at {cap} characters. View /memories with view_range [4, -1] to list the entries from the first one left out, view a subdirectory (such as /memories/d/) to list what is in it, or view a file by its path …")), "{some}");
    let one_left = capped_listing("H".into(), &rows_of(&rows[..2]), &root, 15);
    assert!(one_left.contains("… 1 more entry not shown"), "{one_left}");
    assert!(
        one_left.contains("view a subdirectory to list"),
        "{one_left}"
    );
}

#[test]
fn secrets_in_names_are_redacted_and_echoes_masked() {
    let mut s = MemStore::default();
    let r = run(
        &toy(),
        &mut s,
        json!({"command": "create", "path": "/memories/ghp_EXAMPLE.md", "file_text": "AKIAEXAMPLE\n"}),
    );
    assert_eq!(
        ok(&r),
        "File created successfully at: /memories/[REDACTED:github-token].md\nNote: the path held 1 secret (github-token); it was saved under the redacted name shown above.\nNote: 1 secret was redacted before saving (aws-access-key-id)."
    );
    assert_eq!(
        s.log()[0].1.redactions,
        [
            ("aws-access-key-id".to_owned(), 1),
            ("github-token".to_owned(), 1)
        ]
    );
    s.seed(
        &p("/memories/two.md"),
        b"x ghp_EXAMPLE\nx ghp_EXAMPLE\n".to_vec(),
    )
    .unwrap();
    let r = run(
        &toy(),
        &mut s,
        json!({"command": "str_replace", "path": "/memories/two.md", "old_str": "x ghp_EXAMPLE"}),
    );
    assert_eq!(
        err(&r),
        "No replacement was performed. Multiple occurrences of old_str `x [REDACTED:github-token]` in lines: 1, 2. Please ensure it is unique"
    );
    let r = run(
        &toy(),
        &mut s,
        json!({"command": "rename", "old_path": "/memories/two.md", "new_path": "/memories/AKIAEXAMPLE/two.md"}),
    );
    assert!(
        ok(&r).starts_with("Successfully renamed /memories/two.md to /memories/[REDACTED:aws-access-key-id]/two.md\nNote: the path held 1 secret"),
        "{r:?}"
    );
}

/// The overlapping starts that list an ambiguous `old_str`'s lines are
/// every start a naive search finds, on texts made of few letters (where
/// needles overlap themselves most), and a highly repetitive file and
/// needle at the size limit are answered (the search is linear: the
/// restarted search it replaced took over a minute on such input).
#[test]
fn overlapping_starts_are_every_start_and_linear() {
    let mut seed = 0x5eed_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..2000 {
        let hay: Vec<u8> = (0..next() % 40)
            .map(|_| b"ab\n"[(next() % 3) as usize])
            .collect();
        let needle: Vec<u8> = (0..1 + next() % 5)
            .map(|_| b"ab"[(next() % 2) as usize])
            .collect();
        let naive: Vec<usize> = (0..hay.len())
            .filter(|&i| hay[i..].starts_with(&needle))
            .collect();
        let fast: Vec<usize> = overlapping_starts(&hay, &needle).collect();
        assert_eq!(fast, naive, "{:?} in {:?}", needle, hay);
    }
    let file = "a".repeat(1 << 20);
    let needle = "a".repeat(16_000);
    assert_eq!(
        overlapping_starts(file.as_bytes(), needle.as_bytes()).count(),
        (1 << 20) - 16_000 + 1
    );
    let m = Memory::new(MemoryConfig::default(), None);
    let mut s = store(&[("/memories/a.txt", &file)]);
    let r = run(
        &m,
        &mut s,
        json!({"command": "str_replace", "path": "/memories/a.txt", "old_str": needle, "new_str": "b"}),
    );
    assert!(
        err(&r).ends_with(&format!(
            ", … ({} occurrences in all). Please ensure it is unique",
            (1 << 20) - 16_000 + 1
        )),
        "{}",
        err(&r).chars().rev().take(200).collect::<String>()
    );
}
