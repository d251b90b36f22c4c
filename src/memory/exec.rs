//! The six commands' semantics: [`Memory::execute`].
//!
//! This is where the strings of `SPEC.md` live and where a command turns
//! into at most one [`Mutation`]. The order of work is fixed:
//!
//! 1. every path is validated into a [`MemoryPath`] (a refused path gets
//!    an error naming the rule; the store is not touched);
//! 2. input-only checks (empty `old_str`, root refusals, the secret filter
//!    on new text and on the path a `create` or `rename` stores, the size
//!    of new content) run before the store is touched;
//! 3. the read and the decision run inside one [`Store::write`] closure
//!    (views use [`Store::read`]), so no other writer can interleave
//!    between what was read and what is written. The closures have no side
//!    effects and may be run again on a newer state.
//!
//! Every command answers with exactly one [`ToolResult`]; nothing here
//! panics on any input. A [`StoreError`] becomes an error result carrying
//! its `Display` text after `Error: `. An error's text is masked by the
//! filter (it echoes paths and `old_str` as given).
//!
//! Not protected here: secrets that only appear once the new text is
//! joined with the old content (the filter sees `file_text`, `new_str` and
//! `insert_text` on their own), and names stored before names were
//! filtered (listings show them as stored). A directory listing is cut at
//! `max_view_chars` like a file view.

use zeroize::Zeroizing;

use data_encoding::BASE64;

use super::command::{Command, parse_command};
use super::path::MemoryPath;
use super::render::{
    MAX_VIEW_LINES, file_header, human_size, line_count, line_index_at, lines, listing_header,
    listing_line, numbered, with_body,
};
use super::result::{Content, ToolResult};
use super::store::{
    Change, ChangeFacts, Mutation, NodeKind, Op, Outcome, Snapshot, Store, StoreError,
};

/// Settings of the memory layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryConfig {
    /// `create` on an existing file replaces it (the old content stays in
    /// history) instead of answering `Error: File {path} already exists`.
    pub overwrite_on_create: bool,
    /// The largest file, in bytes, a command may write.
    pub max_file_bytes: usize,
    /// The most characters of numbered text a `view` (or an edit snippet)
    /// shows before truncating from the middle.
    pub max_view_chars: usize,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            overwrite_on_create: false,
            max_file_bytes: 1 << 20,
            max_view_chars: 16_000,
        }
    }
}

/// What a secret filter decided about a text about to be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FilterOutcome {
    /// Nothing to remove: write the text as is.
    Clean,
    /// Write `text` instead; `kinds` says which kinds of secret were
    /// replaced and how many of each.
    Redacted {
        text: String,
        kinds: Vec<(String, u32)>,
    },
    /// Write nothing.
    Rejected { kinds: Vec<(String, u32)> },
}

/// A secret filter run on every text before it is written (the redaction
/// filter of `redact/` implements it).
pub trait TextFilter: Send + Sync {
    fn filter(&self, text: &str) -> FilterOutcome;

    /// `text` with its secrets replaced, for echoing it back in a result
    /// (the `old_str` of a failed `str_replace`); `None` when nothing in
    /// it is to be hidden. By default the text [`TextFilter::filter`]
    /// would write; a filter that refuses secrets should still mask them.
    fn mask(&self, text: &str) -> Option<String> {
        match self.filter(text) {
            FilterOutcome::Redacted { text, .. } => Some(text),
            FilterOutcome::Clean | FilterOutcome::Rejected { .. } => None,
        }
    }
}

/// The memory tool: runs commands against a [`Store`].
#[derive(Default)]
pub struct Memory {
    config: MemoryConfig,
    filter: Option<Box<dyn TextFilter>>,
}

/// The cap on line numbers listed for several matches of `old_str`.
const MAX_LISTED_MATCHES: usize = 100;

impl Memory {
    /// A memory tool with `config`, running `filter` (when given) on every
    /// text before it is written.
    pub fn new(config: MemoryConfig, filter: Option<Box<dyn TextFilter>>) -> Memory {
        Memory { config, filter }
    }

    /// The same tool, running `filter` on every text before it is written.
    pub fn with_filter(mut self, filter: Box<dyn TextFilter>) -> Memory {
        self.filter = Some(filter);
        self
    }

    /// The settings in force.
    pub fn config(&self) -> &MemoryConfig {
        &self.config
    }

    /// Parses a `tool_use` input and runs it. A malformed input gets an
    /// error result naming the problem, and nothing is touched.
    ///
    /// A [`serde_json::Value`] has already lost any repeated key (the last
    /// one won): parse untrusted text with `protocol::parse_strict`, which
    /// refuses one, or send it through `protocol::handle_line`.
    pub fn execute_json(&self, store: &mut dyn Store, input: &serde_json::Value) -> ToolResult {
        match parse_command(input) {
            Ok(cmd) => self.execute(store, &cmd),
            // It may echo the command name as given.
            Err(message) => ToolResult::error(self.mask_error(message)),
        }
    }

    /// `view` of a path already validated, which may be a name an older
    /// memvault stored before the look-alike rules
    /// ([`MemoryPath::parse_stored`]): for `show`, which an operator runs.
    pub fn view_path(&self, store: &mut dyn Store, path: &MemoryPath) -> ToolResult {
        let mut result = self.view(store, path, None);
        if result.is_error
            && let Content::Text(text) = &result.content
            && let Some(masked) = self.filter.as_ref().and_then(|f| f.mask(text))
        {
            result.content = Content::Text(masked);
        }
        result
    }

    /// An error's text as it may be sent back: its secrets masked (it may
    /// echo a name or value as the request gave it).
    pub fn mask_error(&self, text: String) -> String {
        self.filter
            .as_ref()
            .and_then(|f| f.mask(&text))
            .unwrap_or(text)
    }

    /// Runs one command. An error result's text is masked by the secret
    /// filter: it echoes paths and `old_str` as given, and a secret must
    /// not come back through an error.
    pub fn execute(&self, store: &mut dyn Store, cmd: &Command) -> ToolResult {
        let mut result = self.run(store, cmd);
        if result.is_error
            && let Content::Text(text) = &result.content
            && let Some(masked) = self.filter.as_ref().and_then(|f| f.mask(text))
        {
            result.content = Content::Text(masked);
        }
        result
    }

    fn run(&self, store: &mut dyn Store, cmd: &Command) -> ToolResult {
        let result = self.run_given(store, cmd);
        if !result.is_error {
            return result;
        }
        // A path that holds a secret is stored under its redacted form
        // (`create` and `rename` save it so, and answer with it): a command
        // naming the file as it was first written finds it there, as a
        // `create` of that path does. Tried only after an error, and only
        // when the path as given is not there (a name stored before a rule
        // stays reachable as it is).
        match self.at_redacted_path(store, cmd) {
            Some(again) => {
                let mut second = self.run_given(store, &again);
                // Every secret of a kind redacts alike: say how the file
                // was found, so that a path naming another secret of the
                // same kind is not taken for a file of its own.
                if !second.is_error
                    && let Content::Text(text) = &mut second.content
                {
                    text.push_str(
                        "\nNote: the path given holds a secret, so it was matched to the file stored under its redacted name (above); a path with another secret of the same kind names the same file.",
                    );
                }
                second
            }
            None => result,
        }
    }

    /// `cmd` with the path it acts on (`old_path` for a rename) replaced
    /// by its redacted form, when the secret filter changes it, the
    /// redacted form is a valid path, and nothing is at the path as given.
    fn at_redacted_path(&self, store: &mut dyn Store, cmd: &Command) -> Option<Command> {
        let filter = self.filter.as_ref()?;
        let mut again = cmd.clone();
        let path = match &mut again {
            Command::View { path, .. }
            | Command::StrReplace { path, .. }
            | Command::Insert { path, .. }
            | Command::Delete { path } => path,
            Command::Rename { old_path, .. } => old_path,
            Command::Create { .. } => return None,
        };
        let given = MemoryPath::parse(path).ok()?;
        let PathFilter::Redacted(redacted, _) = redact_path(filter.as_ref(), &given) else {
            return None;
        };
        let redacted_path = MemoryPath::parse(&redacted).ok()?;
        if redacted_path == given {
            return None;
        }
        let mut absent = false;
        store
            .read(&mut |snap| {
                absent = snap.kind(&given)?.is_none();
                Ok(ToolResult::ok(String::new()))
            })
            .ok()?;
        if !absent {
            return None;
        }
        *path = redacted_path.as_str().to_owned();
        Some(again)
    }

    fn run_given(&self, store: &mut dyn Store, cmd: &Command) -> ToolResult {
        match cmd {
            Command::View { path, view_range } => match valid(path) {
                Ok(path) => self.view(store, &path, *view_range),
                Err(e) => e,
            },
            Command::Create { path, file_text } => match valid(path) {
                Ok(path) => self.create(store, &path, file_text),
                Err(e) => e,
            },
            Command::StrReplace {
                path,
                old_str,
                new_str,
            } => match valid(path) {
                Ok(path) => self.str_replace(store, &path, old_str, new_str.as_deref()),
                Err(e) => e,
            },
            Command::Insert {
                path,
                insert_line,
                insert_text,
            } => match valid(path) {
                Ok(path) => self.insert(store, &path, *insert_line, insert_text),
                Err(e) => e,
            },
            Command::Delete { path } => match valid(path) {
                Ok(path) => self.delete(store, &path),
                Err(e) => e,
            },
            Command::Rename { old_path, new_path } => match (valid(old_path), valid(new_path)) {
                (Ok(from), Ok(to)) => self.rename(store, &from, &to),
                (Err(e), _) | (_, Err(e)) => e,
            },
        }
    }

    // ----- view -------------------------------------------------------

    fn view(
        &self,
        store: &mut dyn Store,
        path: &MemoryPath,
        range: Option<[i64; 2]>,
    ) -> ToolResult {
        let mut viewed_file = false;
        let answer = store.read(&mut |snap| {
            viewed_file = false;
            self.view_in(snap, path, range, &mut viewed_file)
        });
        match answer {
            Ok(result) => {
                if viewed_file && !result.is_error {
                    store.note_viewed(path);
                }
                result
            }
            Err(e) => store_error(e),
        }
    }

    fn view_in(
        &self,
        snap: &dyn Snapshot,
        path: &MemoryPath,
        range: Option<[i64; 2]>,
        viewed_file: &mut bool,
    ) -> Result<ToolResult, StoreError> {
        let missing = || {
            ToolResult::error(format!(
                "The path {path} does not exist. Please provide a valid path."
            ))
        };
        match snap.kind(path)? {
            None => Ok(missing()),
            Some(NodeKind::Dir) => listing(snap, path, range, self.config.max_view_chars),
            Some(NodeKind::File) => {
                let bytes = match snap.read(path) {
                    Ok(bytes) => bytes,
                    Err(StoreError::NotFound) => return Ok(missing()),
                    Err(e) => return Err(e),
                };
                if let Some(media_type) = image_type(path, &bytes) {
                    if let Some([a, b]) = range {
                        return Ok(ToolResult::error(format!(
                            "Error: Invalid `view_range` parameter: [{a}, {b}]. {path} is an image; view it without `view_range`."
                        )));
                    }
                    *viewed_file = true;
                    return Ok(ToolResult {
                        content: Content::Image {
                            media_type,
                            data_base64: BASE64.encode(&bytes),
                        },
                        is_error: false,
                    });
                }
                let Ok(text) = std::str::from_utf8(&bytes) else {
                    return Ok(ToolResult::error(if is_image_name(path) {
                        format!(
                            "Error: The file {path} is binary and not a PNG or JPEG image (its content does not start as one), so it cannot be shown. Only UTF-8 text files and PNG or JPEG images can be viewed."
                        )
                    } else {
                        format!(
                            "Error: The file {path} is binary (it is not UTF-8 text), so it cannot be shown as text. Only UTF-8 text files and .png, .jpg or .jpeg images can be viewed."
                        )
                    }));
                };
                let n = line_count(text);
                if n > MAX_VIEW_LINES {
                    return Ok(ToolResult::error(format!(
                        "File {path} exceeds maximum line limit of 999,999 lines."
                    )));
                }
                let (start, end) = match range {
                    None => (1, n),
                    Some(range) => match resolve_range(range, n, path) {
                        Ok(bounds) => bounds,
                        Err(message) => return Ok(ToolResult::error(message)),
                    },
                };
                let shown: Vec<&str> = lines(text)
                    .skip(start.saturating_sub(1))
                    .take((end + 1).saturating_sub(start))
                    .collect();
                // The whole answer within the cap, its header included.
                let header = file_header(path.as_str());
                let budget = self
                    .config
                    .max_view_chars
                    .saturating_sub(header.chars().count() + 1);
                let body = numbered(&shown, start, budget);
                *viewed_file = true;
                Ok(ToolResult::ok(with_body(header, &body)))
            }
        }
    }

    // ----- create -----------------------------------------------------

    fn create(&self, store: &mut dyn Store, path: &MemoryPath, file_text: &str) -> ToolResult {
        let (path, path_kinds) = match self.filter_path(path) {
            Ok(filtered) => filtered,
            Err(refusal) => return refusal,
        };
        let path = &path;
        let mut filtered = match self.filter_text(file_text) {
            Ok(f) => f,
            Err(refusal) => return refusal,
        };
        filtered.path_redactions = path_kinds;
        let text: &str = filtered.text();
        if text.len() > self.config.max_file_bytes {
            // Markers can make the text longer than what was sent: the
            // size refused is then not the size the model gave.
            let redacted = match text.len() == file_text.len() {
                true => String::new(),
                false => format!(
                    " once its secrets are replaced by [REDACTED:…] markers ({} bytes as sent)",
                    file_text.len()
                ),
            };
            return ToolResult::error(format!(
                "Error: The content is {} bytes{redacted}, over the limit of {} for one memory file. Nothing was changed; split the content into several smaller files.",
                text.len(),
                limit(self.config.max_file_bytes)
            ));
        }
        // A line takes a byte at least: no count below that many bytes.
        let lines = match text.len() > MAX_VIEW_LINES {
            true => line_count(text),
            false => 0,
        };
        if lines > MAX_VIEW_LINES {
            return ToolResult::error(too_many_lines("The content is", lines));
        }
        let overwrite = self.config.overwrite_on_create;
        let mut unchanged = false;
        let result = write(store, &mut |snap| {
            unchanged = false;
            let (op, lines_removed) = match snap.kind(path)? {
                Some(NodeKind::Dir) => {
                    let example = if path.is_root() {
                        "/memories/notes.md".to_owned()
                    } else {
                        format!("{path}/notes.md")
                    };
                    return refuse(format!(
                        "Error: The path {path} is a directory, so no file can be created there. Give a file path, such as {example}."
                    ));
                }
                Some(NodeKind::File) if !overwrite => {
                    return refuse(format!("Error: File {path} already exists"));
                }
                Some(NodeKind::File) => {
                    let old = match snap.read(path) {
                        Ok(old) => old,
                        Err(StoreError::NotFound) => Zeroizing::new(Vec::new()),
                        Err(e) => return Err(e),
                    };
                    // The same text again is answered as a create but
                    // writes nothing (no commit, no quota refusal); it
                    // counts as an access for expiry.
                    if old.as_slice() == text.as_bytes() {
                        unchanged = true;
                        let success = format!("File created successfully at: {path}");
                        return Ok(Outcome {
                            result: ToolResult::ok(filtered.with_note(success)),
                            mutation: None,
                        });
                    }
                    (Op::Overwrite, count_u32(line_count_bytes(&old)))
                }
                None => {
                    if let Some(file) = file_ancestor(snap, path)? {
                        return refuse(format!(
                            "Error: Cannot create {path}: {file} is a file, not a directory. Choose a path whose parent directories are not files."
                        ));
                    }
                    (Op::Create, 0)
                }
            };
            // Same words for an overwrite: the reference answer for create.
            let success = format!("File created successfully at: {path}");
            let redactions = filtered.all_redactions();
            Ok(Outcome {
                result: ToolResult::ok(filtered.with_note(success)),
                mutation: Some(Mutation {
                    op,
                    change: Change::Write {
                        path: path.clone(),
                        content: Zeroizing::new(text.as_bytes().to_vec()),
                    },
                    facts: ChangeFacts {
                        lines_added: count_u32(line_count(text)),
                        lines_removed,
                        redactions,
                    },
                }),
            })
        });
        if unchanged && !result.is_error {
            store.note_viewed(path);
        }
        result
    }

    // ----- str_replace ------------------------------------------------

    fn str_replace(
        &self,
        store: &mut dyn Store,
        path: &MemoryPath,
        old_str: &str,
        new_str: Option<&str>,
    ) -> ToolResult {
        if old_str.is_empty() {
            return ToolResult::error(format!(
                "Error: `old_str` is empty. Give the exact text to replace, copied from {path}; it must appear there exactly once."
            ));
        }
        let filtered = match self.filter_text(new_str.unwrap_or("")) {
            Ok(f) => f,
            Err(refusal) => return refusal,
        };
        let new_str: &str = filtered.text();
        let max_bytes = self.config.max_file_bytes;
        let max_chars = self.config.max_view_chars;
        let mut unchanged = false;
        let result = write(store, &mut |snap| {
            unchanged = false;
            let missing =
                || format!("Error: The path {path} does not exist. Please provide a valid path.");
            let bytes = match read_file(snap, path)? {
                Some(bytes) => bytes,
                None => return refuse(missing()),
            };
            let Ok(text) = std::str::from_utf8(&bytes) else {
                return refuse(format!(
                    "Error: The file {path} is binary (it is not UTF-8 text), so str_replace cannot edit it."
                ));
            };
            // A secret in `old_str` was stored redacted, as the file shows
            // it: the text as first written matches its redacted form.
            let mut found = text.find(old_str);
            let masked = match found {
                Some(_) => None,
                None => self.filter.as_ref().and_then(|f| f.mask(old_str)),
            };
            if let Some(m) = &masked {
                found = text.find(m.as_str());
            }
            let via_redaction = masked.is_some() && found.is_some();
            let old_str = match (&masked, found) {
                (Some(m), Some(_)) => m.as_str(),
                _ => old_str,
            };
            let Some(at) = found else {
                return refuse(format!(
                    "No replacement was performed, old_str `{}` did not appear verbatim in {path}.",
                    self.echo(old_str)
                ));
            };
            // A second start, overlapping the first or not, makes the edit
            // ambiguous ("aaaa" holds "aaa" twice), as the listed lines say.
            let next = at + text[at..].chars().next().map_or(1, char::len_utf8);
            if text.get(next..).is_some_and(|rest| rest.contains(old_str)) {
                return refuse(format!(
                    "No replacement was performed. Multiple occurrences of old_str `{}` in lines: {}. Please ensure it is unique",
                    self.echo(old_str),
                    match_lines(text, old_str)
                ));
            }
            let size = text.len() - old_str.len() + new_str.len();
            // A file already over the limit (a sync merged two machines'
            // edits of it, or the limit was lowered) can still be edited,
            // as long as the edit does not make it larger.
            if size > max_bytes && size > text.len() {
                return refuse(format!(
                    "Error: The edit would make {path} {size} bytes, over the limit of {} for one memory file. Nothing was changed; split the content into several smaller files.",
                    limit(max_bytes)
                ));
            }
            let mut edited = Zeroizing::new(String::with_capacity(size));
            edited.push_str(text.get(..at).unwrap_or_default());
            edited.push_str(new_str);
            edited.push_str(text.get(at + old_str.len()..).unwrap_or_default());
            let (first, last) = edit_lines(&edited, at, new_str);
            let (edited, noted) = match self.filter_result(edited, &filtered) {
                Ok(checked) => checked,
                Err(message) => return refuse(message),
            };
            let lines = match edited.len() > MAX_VIEW_LINES {
                true => line_count(&edited),
                false => 0,
            };
            if lines > MAX_VIEW_LINES && lines > line_count(text) {
                return refuse(too_many_lines(
                    &format!("The edit would make {path}"),
                    lines,
                ));
            }

            let snippet = match edited.is_empty() {
                true => "(the file is now empty)".to_owned(),
                false => snippet_of_lines(&edited, first, last, max_chars),
            };
            let mut result = with_body(
                "The memory file has been edited. Here is the snippet showing the change (with line numbers):".to_owned(),
                &snippet,
            );
            if via_redaction {
                result.push_str(
                    "\nNote: `old_str` holds a secret, so it was matched to the redacted text stored in its place; another secret of the same kind would match it too.",
                );
            }
            // An edit that leaves the file as it was answers as an edit
            // but writes nothing: no commit, no history entry, and no
            // refusal at a storage quota.
            if edited.as_bytes() == text.as_bytes() {
                unchanged = true;
                return Ok(Outcome {
                    result: ToolResult::ok(noted.with_note(result)),
                    mutation: None,
                });
            }
            Ok(Outcome {
                result: ToolResult::ok(noted.with_note(result)),
                mutation: Some(Mutation {
                    op: Op::StrReplace,
                    change: Change::Write {
                        path: path.clone(),
                        content: into_bytes(edited),
                    },
                    facts: ChangeFacts {
                        lines_added: count_u32(line_count(new_str)),
                        lines_removed: count_u32(line_count(old_str)),
                        redactions: noted.redactions.clone(),
                    },
                }),
            })
        });
        // An edit that wrote nothing still counts as an access (expiry).
        if unchanged && !result.is_error {
            store.note_viewed(path);
        }
        result
    }

    // ----- insert -----------------------------------------------------

    fn insert(
        &self,
        store: &mut dyn Store,
        path: &MemoryPath,
        insert_line: i64,
        insert_text: &str,
    ) -> ToolResult {
        let filtered = match self.filter_text(insert_text) {
            Ok(f) => f,
            Err(refusal) => return refusal,
        };
        let insert_text: &str = filtered.text();
        // A trailing newline of the text does not add an empty line.
        let body = insert_text.strip_suffix('\n').unwrap_or(insert_text);
        let max_bytes = self.config.max_file_bytes;
        write(store, &mut |snap| {
            let bytes = match read_file(snap, path)? {
                Some(bytes) => bytes,
                None => return refuse(format!("Error: The path {path} does not exist")),
            };
            let Ok(text) = std::str::from_utf8(&bytes) else {
                return refuse(format!(
                    "Error: The file {path} is binary (it is not UTF-8 text), so insert cannot edit it."
                ));
            };
            let n = line_count(text);
            let line = match usize::try_from(insert_line) {
                Ok(line) if line <= n => line,
                _ => {
                    return refuse(format!(
                        "Error: Invalid `insert_line` parameter: {insert_line}. It should be within the range of lines of the file: [0, {n}]"
                    ));
                }
            };
            // Byte offset where line `line + 1` starts (or the end).
            let at = match line {
                0 => 0,
                _ => text
                    .match_indices('\n')
                    .nth(line - 1)
                    .map_or(text.len(), |(i, _)| i + 1),
            };
            let (before, after) = (
                text.get(..at).unwrap_or_default(),
                text.get(at..).unwrap_or_default(),
            );
            let mut edited = Zeroizing::new(String::with_capacity(text.len() + body.len() + 2));
            edited.push_str(before);
            if !edited.is_empty() && !edited.ends_with('\n') {
                edited.push('\n');
            }
            edited.push_str(body);
            edited.push('\n');
            edited.push_str(after);
            if !edited.ends_with('\n') {
                edited.push('\n');
            }
            if edited.len() > max_bytes {
                return refuse(format!(
                    "Error: The insert would make {path} {} bytes, over the limit of {} for one memory file. Nothing was changed; split the content into several smaller files.",
                    edited.len(),
                    limit(max_bytes)
                ));
            }
            let (edited, noted) = match self.filter_result(edited, &filtered) {
                Ok(checked) => checked,
                Err(message) => return refuse(message),
            };
            let lines = match edited.len() > MAX_VIEW_LINES {
                true => line_count(&edited),
                false => 0,
            };
            if lines > MAX_VIEW_LINES {
                return refuse(too_many_lines(
                    &format!("The insert would make {path}"),
                    lines,
                ));
            }
            Ok(Outcome {
                result: ToolResult::ok(
                    noted.with_note(format!("The file {path} has been edited.")),
                ),
                mutation: Some(Mutation {
                    op: Op::Insert,
                    change: Change::Write {
                        path: path.clone(),
                        content: into_bytes(edited),
                    },
                    facts: ChangeFacts {
                        lines_added: count_u32(body.split('\n').count()),
                        lines_removed: 0,
                        redactions: noted.redactions.clone(),
                    },
                }),
            })
        })
    }

    // ----- delete -----------------------------------------------------

    fn delete(&self, store: &mut dyn Store, path: &MemoryPath) -> ToolResult {
        if path.is_root() {
            return ToolResult::error(
                "Error: The /memories directory itself cannot be deleted. Delete the files and directories inside it instead.",
            );
        }
        write(store, &mut |snap| {
            if snap.kind(path)?.is_none() {
                return refuse(format!("Error: The path {path} does not exist"));
            }
            Ok(Outcome {
                result: ToolResult::ok(format!("Successfully deleted {path}")),
                mutation: Some(Mutation {
                    op: Op::Delete,
                    change: Change::Delete { path: path.clone() },
                    facts: ChangeFacts::default(),
                }),
            })
        })
    }

    // ----- rename -----------------------------------------------------

    fn rename(&self, store: &mut dyn Store, from: &MemoryPath, to: &MemoryPath) -> ToolResult {
        if from.is_root() {
            return ToolResult::error(
                "Error: The /memories directory itself cannot be renamed or moved. Rename the files and directories inside it instead.",
            );
        }
        if to.is_root() {
            // A missing source is said first, as for any destination.
            let missing = store.read(&mut |snap| {
                Ok(match snap.kind(from)? {
                    None => ToolResult::error(format!("Error: The path {from} does not exist")),
                    Some(_) => {
                        ToolResult::error(format!("Error: The destination {to} already exists"))
                    }
                })
            });
            return missing.unwrap_or_else(store_error);
        }
        let (to, path_kinds) = match self.filter_path(to) {
            Ok(filtered) => filtered,
            Err(refusal) => return refusal,
        };
        let to = &to;
        let noted = Filtered {
            owned: None,
            borrowed: "",
            redactions: Vec::new(),
            path_redactions: path_kinds,
        };
        write(store, &mut |snap| {
            let Some(kind) = snap.kind(from)? else {
                return refuse(format!("Error: The path {from} does not exist"));
            };
            if snap.kind(to)?.is_some() {
                return refuse(format!("Error: The destination {to} already exists"));
            }
            if to.starts_with(from) {
                return refuse(format!(
                    "Error: Cannot move {from} into itself: {to} is inside {from}. Choose a destination outside {from}."
                ));
            }
            if let Some(file) = file_ancestor(snap, to)? {
                return refuse(format!(
                    "Error: Cannot rename {from} to {to}: {file} is a file, not a directory. Choose a destination whose parent directories are not files."
                ));
            }
            let too_long = match kind {
                NodeKind::Dir => breaks_limits_when_moved(snap, from, to)?,
                NodeKind::File => None,
            };
            if let Some(too_long) = too_long {
                return refuse(format!(
                    "Error: Cannot rename {from} to {to}: {too_long} would move past the path limits (1024 bytes, 20 levels below /memories, 127 bytes per name). Choose a shorter or shallower destination."
                ));
            }
            Ok(Outcome {
                result: ToolResult::ok(
                    noted.with_note(format!("Successfully renamed {from} to {to}")),
                ),
                mutation: Some(Mutation {
                    op: Op::Rename,
                    change: Change::Rename {
                        from: from.clone(),
                        to: to.clone(),
                    },
                    facts: ChangeFacts {
                        redactions: noted.all_redactions(),
                        ..ChangeFacts::default()
                    },
                }),
            })
        })
    }

    // ----- secret filter ----------------------------------------------

    /// `path` with each name's secrets replaced by their markers, as this
    /// tool stores a path it is given (a file created as
    /// `/memories/n-AKIA…` is stored as
    /// `/memories/n-[REDACTED:aws-access-key-id]`), when that differs from
    /// `path`; None when it holds no secret or the filter refuses it.
    /// The tool's commands use it when nothing is at the path as given.
    pub fn redacted_path(&self, path: &MemoryPath) -> Option<MemoryPath> {
        match self.filter_path(path) {
            Ok((stored, _)) if stored != *path => Some(stored),
            _ => None,
        }
    }

    /// Runs the secret filter on a path about to be stored (a `create`
    /// path, a `rename` destination): names reach history and listings, so
    /// they are held to the same rule as content. Each name is filtered on
    /// its own, so that a value read past a `/` never joins a directory
    /// and its file into one name. Redacted, the path is the redacted one
    /// (it must still be a valid path); refused, `Err` is the result to
    /// answer with. The refusal does not echo the path.
    fn filter_path(
        &self,
        path: &MemoryPath,
    ) -> Result<(MemoryPath, Vec<(String, u32)>), ToolResult> {
        let Some(filter) = &self.filter else {
            return Ok((path.clone(), Vec::new()));
        };
        match redact_path(filter.as_ref(), path) {
            PathFilter::Clean => Ok((path.clone(), Vec::new())),
            PathFilter::Redacted(text, kinds) => match MemoryPath::parse(&text) {
                Ok(redacted) => Ok((redacted, kinds)),
                Err(_) => Err(ToolResult::error(format!(
                    "Error: Nothing was saved: the path holds {} and, with it redacted, it is no longer a valid memory path (it would break the length limits). Choose a name without the secret.",
                    crate::redact::secrets_phrase(&kinds)
                ))),
            },
            PathFilter::Rejected(kinds) => Err(ToolResult::error(format!(
                "Error: Nothing was saved: the path holds {} that this memory store refuses to keep, in a file or directory name as in content. Choose a name without it.",
                crate::redact::secrets_phrase(&kinds)
            ))),
            PathFilter::Split(kinds) => Err(ToolResult::error(format!(
                "Error: Nothing was saved: the path holds {} split between its names, which redacting one name cannot hide. Choose names without it.",
                crate::redact::secrets_phrase(&kinds)
            ))),
        }
    }

    /// `text` as it may be echoed back in a result: its secrets masked.
    fn echo<'a>(&self, text: &'a str) -> std::borrow::Cow<'a, str> {
        match self.filter.as_ref().and_then(|f| f.mask(text)) {
            Some(masked) => std::borrow::Cow::Owned(masked),
            None => std::borrow::Cow::Borrowed(text),
        }
    }

    /// The file an edit leaves, through the secret filter whole: a secret
    /// the edit completes from parts (a key split between the old text and
    /// the new, a separator deleted, a private key inserted a line at a
    /// time) is caught as a whole text's is. Gives the text to store
    /// (redacted where needed) and the redactions of the command (`text`'s,
    /// the fragment's, and these); `Err` is the refusal to answer with.
    fn filter_result(
        &self,
        edited: Zeroizing<String>,
        text: &Filtered<'_>,
    ) -> Result<(Zeroizing<String>, Filtered<'static>), String> {
        let noted = |extra: Vec<(String, u32)>| Filtered {
            owned: None,
            borrowed: "",
            redactions: merge_kinds(text.redactions.iter().cloned().chain(extra).collect()),
            path_redactions: text.path_redactions.clone(),
        };
        let Some(filter) = &self.filter else {
            return Ok((edited, noted(Vec::new())));
        };
        match filter.filter(&edited) {
            FilterOutcome::Clean => Ok((edited, noted(Vec::new()))),
            FilterOutcome::Redacted { text, kinds } => Ok((Zeroizing::new(text), noted(kinds))),
            FilterOutcome::Rejected { kinds } => Err(format!(
                "Error: Nothing was saved: with this edit the file would contain {} that this memory store refuses to keep. Remove it (note where the secret is kept instead of its value) and try again.",
                crate::redact::secrets_phrase(&merge_kinds(kinds))
            )),
        }
    }

    /// Runs the secret filter on a text about to be written. `Err` is the
    /// result to answer with when the filter refused the text.
    fn filter_text<'a>(&self, text: &'a str) -> Result<Filtered<'a>, ToolResult> {
        let Some(filter) = &self.filter else {
            return Ok(Filtered::clean(text));
        };
        match filter.filter(text) {
            FilterOutcome::Clean => Ok(Filtered::clean(text)),
            FilterOutcome::Redacted { text, kinds } => Ok(Filtered {
                owned: Some(Zeroizing::new(text)),
                borrowed: "",
                redactions: merge_kinds(kinds),
                path_redactions: Vec::new(),
            }),
            FilterOutcome::Rejected { kinds } => {
                let what = crate::redact::secrets_phrase(&merge_kinds(kinds));
                Err(ToolResult::error(format!(
                    "Error: Nothing was saved: the text contains {what} that this memory store refuses to keep. Remove it (note where the secret is kept instead of its value) and try again."
                )))
            }
        }
    }
}

/// A text after the secret filter, with what was redacted in it and in
/// the path it is written to.
struct Filtered<'a> {
    owned: Option<Zeroizing<String>>,
    borrowed: &'a str,
    redactions: Vec<(String, u32)>,
    path_redactions: Vec<(String, u32)>,
}

impl<'a> Filtered<'a> {
    fn clean(text: &'a str) -> Filtered<'a> {
        Filtered {
            owned: None,
            borrowed: text,
            redactions: Vec::new(),
            path_redactions: Vec::new(),
        }
    }

    /// Every redaction of the command, text and path, for its history.
    fn all_redactions(&self) -> Vec<(String, u32)> {
        merge_kinds(
            self.redactions
                .iter()
                .chain(&self.path_redactions)
                .cloned()
                .collect(),
        )
    }

    fn text(&self) -> &str {
        match &self.owned {
            Some(owned) => owned.as_str(),
            None => self.borrowed,
        }
    }

    /// `success`, followed by the redaction notices when something was
    /// redacted: one for the path (it was saved under the redacted name,
    /// which `success` shows), one for the text.
    fn with_note(&self, success: String) -> String {
        let success = if self.path_redactions.is_empty() {
            success
        } else {
            format!(
                "{success}\nNote: the path held {}; it was saved under the redacted name shown above.",
                crate::redact::secrets_phrase(&self.path_redactions)
            )
        };
        let total: u64 = self.redactions.iter().map(|(_, n)| u64::from(*n)).sum();
        let names: Vec<&str> = self.redactions.iter().map(|(k, _)| k.as_str()).collect();
        match total {
            0 => success,
            1 => format!(
                "{success}\nNote: 1 secret was redacted before saving ({}).",
                names.join(", ")
            ),
            n => format!(
                "{success}\nNote: {n} secrets were redacted before saving ({}).",
                names.join(", ")
            ),
        }
    }
}

/// Kinds sorted by name, each once with its counts summed; zero counts
/// dropped.
fn merge_kinds(kinds: Vec<(String, u32)>) -> Vec<(String, u32)> {
    let mut merged: std::collections::BTreeMap<String, u32> = std::collections::BTreeMap::new();
    for (kind, n) in kinds {
        let slot = merged.entry(kind).or_insert(0);
        *slot = slot.saturating_add(n);
    }
    merged.into_iter().filter(|(_, n)| *n > 0).collect()
}

// ----- helpers ---------------------------------------------------------

/// A path through the secret filter.
enum PathFilter {
    Clean,
    /// The path's text with its redacted names, and what was redacted.
    Redacted(String, Vec<(String, u32)>),
    Rejected(Vec<(String, u32)>),
    /// A secret made by names only together.
    Split(Vec<(String, u32)>),
}

/// Runs `filter` on each name of `path` on its own: a value a rule reads
/// to the end of the text stops at its name, so a directory and its file
/// never become one name, and a name is judged as it is listed.
fn redact_path(filter: &dyn TextFilter, path: &MemoryPath) -> PathFilter {
    let mut out = String::from("/memories");
    let mut kinds = Vec::new();
    let mut rejected = Vec::new();
    for name in path.segments() {
        out.push('/');
        match filter.filter(name) {
            FilterOutcome::Clean => out.push_str(name),
            FilterOutcome::Redacted { text, kinds: k } => {
                out.push_str(&text);
                kinds.extend(k);
            }
            FilterOutcome::Rejected { kinds: k } => rejected.extend(k),
        }
    }
    // A secret split between names (`/memories/ghp_<half>/<half>.md`) is
    // in no one name: the names joined are filtered too, and a path whose
    // names make a secret only together is refused (no one name could be
    // redacted for it).
    if rejected.is_empty() && path.depth() > 1 {
        let joined: String = out
            .strip_prefix("/memories")
            .unwrap_or(&out)
            .split('/')
            .collect();
        match filter.filter(&joined) {
            FilterOutcome::Clean => {}
            FilterOutcome::Redacted { kinds: k, .. } | FilterOutcome::Rejected { kinds: k } => {
                return PathFilter::Split(merge_kinds(k));
            }
        }
    }
    if !rejected.is_empty() {
        PathFilter::Rejected(merge_kinds(rejected))
    } else if kinds.is_empty() {
        PathFilter::Clean
    } else {
        PathFilter::Redacted(out, merge_kinds(kinds))
    }
}

/// Validates a command path; a refused path becomes its error result.
fn valid(path: &str) -> Result<MemoryPath, ToolResult> {
    MemoryPath::parse(path).map_err(|e| ToolResult::error(format!("Error: {e}")))
}

/// Runs a write closure and turns a store failure into an error result.
fn write(
    store: &mut dyn Store,
    f: &mut dyn FnMut(&dyn Snapshot) -> Result<Outcome, StoreError>,
) -> ToolResult {
    store.write(f).unwrap_or_else(store_error)
}

/// An outcome that answers with an error and changes nothing.
fn refuse(message: String) -> Result<Outcome, StoreError> {
    Ok(Outcome {
        result: ToolResult::error(message),
        mutation: None,
    })
}

fn store_error(e: StoreError) -> ToolResult {
    match e {
        StoreError::NotFound => ToolResult::error(
            "Error: The store reported a path as missing while running the command; nothing was changed. View the directory to see what exists, then try again.",
        ),
        other => ToolResult::error(format!("Error: {other}")),
    }
}

/// The content of the file at `path`; `None` when it is missing or a
/// directory.
fn read_file(
    snap: &dyn Snapshot,
    path: &MemoryPath,
) -> Result<Option<Zeroizing<Vec<u8>>>, StoreError> {
    if snap.kind(path)? != Some(NodeKind::File) {
        return Ok(None);
    }
    match snap.read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(StoreError::NotFound) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The nearest ancestor of `path` that is a file, if any.
fn file_ancestor(snap: &dyn Snapshot, path: &MemoryPath) -> Result<Option<MemoryPath>, StoreError> {
    for ancestor in path.ancestors() {
        match snap.kind(&ancestor)? {
            Some(NodeKind::File) => return Ok(Some(ancestor)),
            // A directory's ancestors are directories.
            Some(NodeKind::Dir) => return Ok(None),
            None => {}
        }
    }
    Ok(None)
}

/// The first path below the directory `from` that would break a path
/// limit once moved to `to`, if any.
fn breaks_limits_when_moved(
    snap: &dyn Snapshot,
    from: &MemoryPath,
    to: &MemoryPath,
) -> Result<Option<MemoryPath>, StoreError> {
    if to.as_str().len() <= from.as_str().len() && to.depth() <= from.depth() {
        return Ok(None);
    }
    let mut pending = vec![from.clone()];
    while let Some(dir) = pending.pop() {
        for entry in snap.list(&dir)? {
            let Ok(child) = dir.join(&entry.name) else {
                return Err(StoreError::Damaged(
                    "a stored name is not a valid path segment".into(),
                ));
            };
            if child.rebase(from, to).is_none() {
                return Ok(Some(child));
            }
            if entry.kind == NodeKind::Dir {
                pending.push(child);
            }
        }
    }
    Ok(None)
}

/// The directory view of `dir`: the header, the directory itself, then
/// two levels of entries (hidden names and `node_modules` left out). With
/// `range`, only those of its entries (numbered from 1, the directory's
/// own row, in listing order): the way to the entries a listing past
/// `max_chars` leaves out, in a directory too flat for its subdirectories
/// to show them.
fn listing(
    snap: &dyn Snapshot,
    dir: &MemoryPath,
    range: Option<[i64; 2]>,
    max_chars: usize,
) -> Result<ToolResult, StoreError> {
    let entries = match snap.list(dir) {
        Ok(entries) => entries,
        Err(StoreError::NotFound) => {
            return Ok(ToolResult::error(format!(
                "The path {dir} does not exist. Please provide a valid path."
            )));
        }
        Err(e) => return Err(e),
    };
    let total = entries
        .iter()
        .fold(0u64, |sum, e| sum.saturating_add(e.size));
    // Each row, with the subdirectory of `dir` it lies in (for the hint).
    let mut rows: Vec<Row> = vec![Row {
        line: listing_line(total, dir.as_str()),
        sub: None,
        deep: false,
    }];
    for entry in visible(entries) {
        let shown = format!("{dir}/{}", entry.name);
        if entry.kind == NodeKind::File {
            rows.push(Row {
                line: listing_line(entry.size, &shown),
                sub: None,
                deep: false,
            });
            continue;
        }
        let sub_dir = Some(format!("{shown}/"));
        rows.push(Row {
            line: listing_line(entry.size, &format!("{shown}/")),
            sub: sub_dir.clone(),
            deep: false,
        });
        let Ok(child) = dir.join(&entry.name) else {
            return Err(StoreError::Damaged(
                "a stored name is not a valid path segment".into(),
            ));
        };
        for sub in visible(snap.list(&child)?) {
            let line = match sub.kind {
                NodeKind::File => listing_line(sub.size, &format!("{shown}/{}", sub.name)),
                NodeKind::Dir => listing_line(sub.size, &format!("{shown}/{}/", sub.name)),
            };
            rows.push(Row {
                line,
                sub: sub_dir.clone(),
                deep: true,
            });
        }
    }
    let Some(range) = range else {
        return Ok(ToolResult::ok(capped_listing(
            listing_header(dir.as_str()),
            &rows,
            dir,
            max_chars,
        )));
    };
    let (start, end) = match resolve_entries(range, rows.len(), dir) {
        Ok(bounds) => bounds,
        Err(message) => return Ok(ToolResult::error(message)),
    };
    Ok(ToolResult::ok(listing_part(
        dir, &rows, start, end, max_chars,
    )))
}

/// Entries `start..=end` (1-based) of a listing's `rows`, in order, cut at
/// whole rows within `max_chars` with a closing row that gives the
/// `view_range` of the rest.
fn listing_part(
    dir: &MemoryPath,
    rows: &[Row],
    start: usize,
    end: usize,
    max_chars: usize,
) -> String {
    let n = rows.len();
    let header = |last: usize| {
        let plain = listing_header(dir.as_str());
        let plain = plain.strip_suffix(':').unwrap_or(&plain).to_owned();
        format!("{plain} (entries {start} to {last} of {n}):")
    };
    let len_of = |row: &str| row.chars().count() + 1;
    let closing = |next: usize| {
        let left = end + 1 - next;
        let entries = if left == 1 { "entry" } else { "entries" };
        let to = if end == n {
            "-1".to_owned()
        } else {
            end.to_string()
        };
        format!(
            "… {left} more {entries} not shown: a listing stops at {max_chars} characters. View {dir} with view_range [{next}, {to}] to list them …"
        )
    };
    let all: usize = rows[start - 1..end].iter().map(|r| len_of(&r.line)).sum();
    let whole = header(end);
    if whole.chars().count() + all <= max_chars {
        let mut out = whole;
        for row in &rows[start - 1..end] {
            out.push('\n');
            out.push_str(&row.line);
        }
        return out;
    }
    // Room for the header and closing row at their longest; at least one
    // entry is shown, whatever its length.
    let budget = max_chars.saturating_sub(header(end).chars().count() + len_of(&closing(start)));
    let mut used = 0usize;
    let mut last = start - 1;
    for row in &rows[start - 1..end] {
        let len = len_of(&row.line);
        if last >= start && used + len > budget {
            break;
        }
        used += len;
        last += 1;
    }
    let mut out = header(last);
    for row in &rows[start - 1..last] {
        out.push('\n');
        out.push_str(&row.line);
    }
    if last < end {
        out.push('\n');
        out.push_str(&closing(last + 1));
    }
    out
}

/// Checks `view_range` against a listing of `n` entries; `(start, end)`
/// are 1-based and inclusive.
fn resolve_entries(range: [i64; 2], n: usize, dir: &MemoryPath) -> Result<(usize, usize), String> {
    let [start, end] = range;
    let prefix = format!("Error: Invalid `view_range` parameter: [{start}, {end}].");
    let last = i64::try_from(n).unwrap_or(i64::MAX);
    let what = format!(
        "for a directory it selects entries of its listing, numbered from 1 ({dir} itself) to {n}"
    );
    if start < 1 || start > last {
        return Err(format!(
            "{prefix} Its first element `{start}` should be within [1, {n}]: {what}."
        ));
    }
    let end = if end == -1 { last } else { end };
    if end < start || end > last {
        return Err(format!(
            "{prefix} Its second element `{}` should be within [{start}, {n}], or -1 for the last entry: {what}.",
            range[1]
        ));
    }
    match (usize::try_from(start), usize::try_from(end)) {
        (Ok(s), Ok(e)) => Ok((s, e)),
        _ => Err(format!("{prefix} The listing has {n} entries.")),
    }
}

/// One row of a listing.
struct Row {
    line: String,
    /// The subdirectory of the listed directory it lies in (or is).
    sub: Option<String>,
    /// Whether it is an entry of a subdirectory (the second level).
    deep: bool,
}

/// A listing's rows under its header, cut at whole rows once they pass
/// `max_chars` characters (newlines counted), with one closing row that
/// says how many entries were left out and how to see them.
///
/// When not every row fits, the directory's own entries come first, so
/// that a big subdirectory never hides a file or folder beside it: they
/// are kept in order while they fit, then the subdirectories' entries in
/// order while they fit; the rows kept are shown in their listing order.
fn capped_listing(header: String, rows: &[Row], dir: &MemoryPath, max_chars: usize) -> String {
    // The whole answer within `max_chars`, header and closing row
    // included: unless every row fits, the closing row's room is kept for
    // it, at its longest (with the longest subdirectory as its example)
    // if that leaves room for the directory's own row, else without an
    // example; after the cut it names the first subdirectory with entries
    // left out that fits. Only the header and the directory's own row are
    // shown whatever their length (paths of up to 1,024 bytes).
    let header_len = header.chars().count();
    let len_of = |row: &str| row.chars().count() + 1;
    let all: usize = rows.iter().map(|r| len_of(&r.line)).sum();
    let budget = if header_len + all <= max_chars {
        max_chars - header_len
    } else {
        let longest = rows
            .iter()
            .filter_map(|r| r.sub.as_deref())
            .max_by_key(|sub| sub.chars().count())
            .unwrap_or("");
        let own = rows.first().map_or(0, |r| len_of(&r.line));
        let n = rows.len();
        let closing = [longest, ""]
            .map(|example| len_of(&omitted_row(n, n, dir, example, max_chars)))
            .into_iter()
            .find(|closing| header_len + own + closing <= max_chars)
            .unwrap_or_else(|| len_of(&omitted_row(n, n, dir, "", max_chars)));
        max_chars.saturating_sub(header_len + closing)
    };
    let mut keep = vec![false; rows.len()];
    let mut used = 0usize;
    // The directory's own entries first; its subdirectories' entries only
    // when all of those fit, so that no entry is shown without the row of
    // the subdirectory it is in, and the rows left out from the first
    // one on are listed in order by the `view_range` the closing row gives.
    let mut own_all = true;
    for deep in [false, true] {
        if deep && !own_all {
            break;
        }
        for (i, row) in rows.iter().enumerate().filter(|(_, r)| r.deep == deep) {
            let len = len_of(&row.line);
            // The directory's own row is always shown.
            if i > 0 && used + len > budget {
                own_all &= deep;
                break;
            }
            used += len;
            keep[i] = true;
        }
    }
    let mut out = header;
    for (row, _) in rows.iter().zip(&keep).filter(|(_, k)| **k) {
        out.push('\n');
        out.push_str(&row.line);
    }
    let omitted = keep.iter().filter(|k| !**k).count();
    if omitted > 0 {
        let room = max_chars.saturating_sub(header_len + used);
        // Entries are numbered from 1 (the directory's own row). When some
        // of the directory's own entries were left out, the range starts
        // at the first of them (the subdirectories' entries before it are
        // listed by viewing the subdirectory); else at the first row left
        // out.
        let first = rows
            .iter()
            .zip(&keep)
            .position(|(r, k)| !*k && (own_all || !r.deep))
            .map_or(1, |i| i + 1);
        let closing = rows
            .iter()
            .zip(&keep)
            .filter(|(r, k)| !**k && r.deep)
            .filter_map(|(r, _)| r.sub.as_deref())
            .map(|sub| omitted_row(omitted, first, dir, sub, max_chars))
            .find(|row| len_of(row) <= room)
            .unwrap_or_else(|| omitted_row(omitted, first, dir, "", max_chars));
        out.push('\n');
        out.push_str(&closing);
    }
    out
}

/// The closing row of a listing cut short: `omitted` entries left out,
/// the first of them entry `first` (numbered from 1, the directory's own
/// row), a subdirectory among them to view (`""`: none).
fn omitted_row(
    omitted: usize,
    first: usize,
    dir: &MemoryPath,
    example: &str,
    max_chars: usize,
) -> String {
    let entries = if omitted == 1 { "entry" } else { "entries" };
    let example = match example {
        "" => String::new(),
        sub => format!(" (such as {sub})"),
    };
    format!(
        "… {omitted} more {entries} not shown: a listing stops at {max_chars} characters. View {dir} with view_range [{first}, -1] to list the entries from the first one left out, view a subdirectory{example} to list what is in it, or view a file by its path …"
    )
}

/// Entries shown in a listing, sorted by name.
fn visible(mut entries: Vec<super::store::DirEntry>) -> Vec<super::store::DirEntry> {
    entries.retain(|e| !e.name.starts_with('.') && e.name != "node_modules");
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    entries
}

/// The media type of an image file named `.png`, `.jpg` or `.jpeg` (any
/// case), from its content's signature, whatever the extension says (a
/// PNG saved as `.jpg` is sent as the PNG it is): a text file named
/// `.png` is still shown as text and no broken image block is ever sent.
fn image_type(path: &MemoryPath, bytes: &[u8]) -> Option<&'static str> {
    if !is_image_name(path) {
        return None;
    }
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some("image/jpeg")
    } else {
        None
    }
}

/// The name ends in `.png`, `.jpg` or `.jpeg`, in any case.
fn is_image_name(path: &MemoryPath) -> bool {
    path.name()
        .and_then(|name| name.rsplit_once('.'))
        .is_some_and(|(_, ext)| {
            ["png", "jpg", "jpeg"]
                .iter()
                .any(|e| ext.eq_ignore_ascii_case(e))
        })
}

/// Checks `view_range` against a file of `n` lines; `(start, end)` are
/// 1-based and inclusive.
fn resolve_range(range: [i64; 2], n: usize, path: &MemoryPath) -> Result<(usize, usize), String> {
    let [start, end] = range;
    let prefix = format!("Error: Invalid `view_range` parameter: [{start}, {end}].");
    if n == 0 {
        return Err(format!(
            "{prefix} The file {path} is empty (0 lines); view it without `view_range`."
        ));
    }
    let last = i64::try_from(n).unwrap_or(i64::MAX);
    if start < 1 || start > last {
        return Err(format!(
            "{prefix} Its first element `{start}` should be within the range of lines of the file: [1, {n}]."
        ));
    }
    let end = if end == -1 { last } else { end };
    if end < start {
        return Err(format!(
            "{prefix} Its second element `{}` should be at least its first element `{start}`, or -1 to view to the end of the file.",
            range[1]
        ));
    }
    if end > last {
        return Err(format!(
            "{prefix} Its second element `{end}` should be at most the number of lines in the file, {n}, or -1 to view to the end of the file."
        ));
    }
    // Both are in 1..=n here, so they fit in usize.
    match (usize::try_from(start), usize::try_from(end)) {
        (Ok(s), Ok(e)) => Ok((s, e)),
        _ => Err(format!("{prefix} The file has {n} lines.")),
    }
}

/// The line numbers where each match of `needle` starts (overlapping ones too),
/// joined by `, `; a line holding two matches is listed twice. Past
/// [`MAX_LISTED_MATCHES`] the rest is summed up.
fn match_lines(text: &str, needle: &str) -> String {
    let mut listed = Vec::new();
    let mut count = 0usize;
    let mut line = 1usize;
    let mut scanned = 0usize;
    // Every start of the needle, overlapping ones too, as the SDK's
    // reference tool lists them ("aaaa" holds "aa" at 0, 1 and 2).
    for at in overlapping_starts(text.as_bytes(), needle.as_bytes()) {
        line += text
            .as_bytes()
            .get(scanned..at)
            .map_or(0, |b| b.iter().filter(|&&c| c == b'\n').count());
        scanned = at;
        count += 1;
        if listed.len() < MAX_LISTED_MATCHES {
            listed.push(line.to_string());
        }
    }
    let mut out = listed.join(", ");
    if count > listed.len() {
        out.push_str(&format!(", … ({count} occurrences in all)"));
    }
    out
}

/// Every byte offset where `needle` starts in `hay`, overlapping matches
/// included, in time linear in both lengths (Knuth-Morris-Pratt). A
/// search restarted one character after each match took the needle's
/// length again at every start: a 1 MiB file of one letter and a needle
/// of 16,000 of it took over a minute. Matches of a `str` needle in a
/// `str` start on a character boundary (a UTF-8 text never holds a
/// character's leading byte inside another character).
fn overlapping_starts<'a>(hay: &'a [u8], needle: &'a [u8]) -> impl Iterator<Item = usize> + 'a {
    // fail[i]: the length of the longest proper border of needle[..=i].
    let mut fail = vec![0u32; needle.len()];
    let mut k = 0usize;
    for i in 1..needle.len() {
        while k > 0 && needle[i] != needle[k] {
            k = fail[k - 1] as usize;
        }
        if needle[i] == needle[k] {
            k += 1;
        }
        fail[i] = k as u32;
    }
    let mut k = 0usize;
    hay.iter().enumerate().filter_map(move |(i, &b)| {
        if needle.is_empty() {
            return None;
        }
        while k > 0 && b != needle[k] {
            k = fail[k - 1] as usize;
        }
        if b == needle[k] {
            k += 1;
        }
        if k == needle.len() {
            k = fail[k - 1] as usize;
            return Some(i + 1 - needle.len());
        }
        None
    })
}

/// The numbered lines of `edited` from two lines before the first changed
/// line to two lines after the last, where `new_str` was put at byte `at`.
/// The first and last line (0-based) of `new_str` written at byte `at`
/// of `edited`.
fn edit_lines(edited: &str, at: usize, new_str: &str) -> (usize, usize) {
    let first = line_index_at(edited, at);
    let last = match new_str.len() {
        0 => first,
        len => line_index_at(edited, at + len - 1),
    };
    (first, last)
}

/// The lines `first..=last` of `text` with two more on each side,
/// numbered (within the text's lines: a redaction of the whole file may
/// have joined some).
fn snippet_of_lines(text: &str, first: usize, last: usize, max_chars: usize) -> String {
    let n = line_count(text);
    if n == 0 {
        return String::new();
    }
    let from = first.saturating_sub(2).min(n - 1);
    let to = (last + 2).min(n - 1);
    let shown: Vec<&str> = lines(text).skip(from).take(to + 1 - from).collect();
    numbered(&shown, from + 1, max_chars)
}

/// Lines of raw bytes (same model as [`line_count`]).
fn line_count_bytes(bytes: &[u8]) -> usize {
    if bytes.is_empty() {
        return 0;
    }
    let newlines = bytes.iter().filter(|&&b| b == b'\n').count();
    if bytes.ends_with(b"\n") {
        newlines
    } else {
        newlines + 1
    }
}

fn count_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The refusal of a write that would leave a file of `lines` lines, more
/// than `view` shows (it would answer only "exceeds maximum line limit").
fn too_many_lines(what: &str, lines: usize) -> String {
    format!(
        "Error: {what} {lines} lines, over the limit of 999,999 lines that view can show. Nothing was changed; split the content into several smaller files."
    )
}

/// A byte limit as `{n} bytes ({human})`.
fn limit(bytes: usize) -> String {
    let human = human_size(u64::try_from(bytes).unwrap_or(u64::MAX));
    format!("{bytes} bytes ({human})")
}

/// Moves a secret string into a wiped byte buffer without copying it.
fn into_bytes(mut text: Zeroizing<String>) -> Zeroizing<Vec<u8>> {
    Zeroizing::new(std::mem::take(&mut *text).into_bytes())
}

#[cfg(test)]
#[path = "exec_tests.rs"]
mod tests;
