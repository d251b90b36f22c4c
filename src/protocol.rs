//! JSON framing for `serve` and `exec`: one request line in, one
//! `tool_result` line out.
//!
//! A request is a `tool_use` block (`{"type":"tool_use","id":..,"name":"memory","input":{..}}`)
//! or a bare command object (`{"command":"view",..}`). Whatever the line
//! holds, exactly one result line comes back; nothing else is written to
//! the output.

use std::io::{self, BufRead, Write};

use serde_json::{Value, json};

use crate::memory::{Content, Memory, Store, ToolResult};

/// One answer: the result and the id of the `tool_use` it answers.
pub struct Reply {
    pub tool_use_id: Option<String>,
    pub result: ToolResult,
}

impl Reply {
    /// The `tool_result` block as a JSON value.
    pub fn to_json(&self) -> Value {
        let content = match &self.result.content {
            Content::Text(t) => Value::String(t.clone()),
            Content::Image {
                media_type,
                data_base64,
            } => json!([{
                "type": "image",
                "source": {"type": "base64", "media_type": media_type, "data": data_base64}
            }]),
        };
        json!({
            "type": "tool_result",
            "tool_use_id": self.tool_use_id,
            "content": content,
            "is_error": self.result.is_error,
        })
    }

    /// The `tool_result` block as one line of JSON (no trailing newline).
    pub fn to_line(&self) -> String {
        self.to_json().to_string()
    }
}

fn error_reply(id: Option<String>, text: String) -> Reply {
    Reply {
        tool_use_id: id,
        result: ToolResult::error(text),
    }
}

/// Handle one request line.
pub fn handle_line(memory: &Memory, store: &mut dyn Store, line: &[u8]) -> Reply {
    let value: Value = match parse_strict(line) {
        Ok(v) => v,
        // A key given twice inside a block whose own `id` is given once
        // is answered to that id, so the client can pair the error.
        Err(ParseError::DuplicateKey(key)) => {
            return error_reply(tool_use_id_in_head(line), duplicate_key_message(&key));
        }
        Err(ParseError::Syntax(e)) => {
            // Bytes that are not UTF-8 are said as such, not as a JSON
            // syntax error at some column (round 38a).
            if let Err(bad) = std::str::from_utf8(line) {
                return error_reply(
                    None,
                    format!(
                        "Error: the request is not UTF-8 text (an invalid byte at offset {}). Send one JSON object per line, in UTF-8: a tool_use block or a command object such as {{\"command\":\"view\",\"path\":\"/memories\"}}.",
                        bad.valid_up_to()
                    ),
                );
            }
            return error_reply(None, not_json_message(&e));
        }
    };
    handle_value(memory, store, &value)
}

/// The tool error for a request that is not valid JSON (the parser's
/// error says where, never what).
pub fn not_json_message(e: &serde_json::Error) -> String {
    format!(
        "Error: the request is not valid JSON ({e}). Send one JSON object per line: a tool_use block or a command object such as {{\"command\":\"view\",\"path\":\"/memories\"}}."
    )
}

/// Why a request's text was not taken as a JSON value.
#[derive(Debug)]
pub enum ParseError {
    /// Not JSON (or more than one value).
    Syntax(serde_json::Error),
    /// An object, at any depth, gives this key twice.
    DuplicateKey(String),
}

/// Parses untrusted JSON text into a [`Value`], refusing an object that
/// gives a key twice, at any depth.
///
/// `serde_json` keeps the last of repeated keys, so
/// `{"command":"view","command":"delete"}` would delete; a request whose
/// meaning depends on which duplicate wins is refused instead. Callers of
/// [`Memory::execute_json`] that parse text themselves should use this.
///
/// A leading UTF-8 byte order mark is skipped (RFC 8259 lets a parser
/// ignore it; editors and Windows tools write one).
pub fn parse_strict(text: &[u8]) -> Result<Value, ParseError> {
    let text = text.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(text);
    let duplicate = std::cell::RefCell::new(None);
    let mut de = serde_json::Deserializer::from_slice(text);
    let parsed = serde::de::DeserializeSeed::deserialize(
        strict::Seed {
            duplicate: &duplicate,
        },
        &mut de,
    )
    .and_then(|v| de.end().map(|()| v));
    match parsed {
        Ok(v) => Ok(v),
        Err(e) => match duplicate.into_inner() {
            // A key given twice is the fault only in text that is JSON
            // otherwise: the strict pass stops at the duplicate, so the
            // rest is read once more (only on this error path).
            Some(key) => match serde_json::from_slice::<serde::de::IgnoredAny>(text) {
                Ok(_) => Err(ParseError::DuplicateKey(key)),
                Err(e) => Err(ParseError::Syntax(e)),
            },
            None => Err(ParseError::Syntax(e)),
        },
    }
}

/// Every field a memory command object may hold (the tool's input schema).
pub const COMMAND_FIELDS: [&str; 10] = [
    "command",
    "path",
    "view_range",
    "file_text",
    "old_str",
    "new_str",
    "insert_line",
    "insert_text",
    "old_path",
    "new_path",
];

/// The tool error for a key given twice. Only the request's own field
/// names are echoed; any other key is not (it could be anything).
pub fn duplicate_key_message(key: &str) -> String {
    // The tool_use block's keys, and an MCP message's (`memvault mcp`).
    let known = [
        "type",
        "id",
        "name",
        "input",
        "arguments",
        "params",
        "method",
        "jsonrpc",
    ]
    .contains(&key)
        || COMMAND_FIELDS.contains(&key);
    let which = if known {
        format!("the key `{key}`")
    } else {
        "a key".to_owned()
    };
    format!(
        "Error: the request gives {which} twice in one object; nothing was done. Give each key once: a repeated key is refused, never resolved by taking one of the values."
    )
}

/// A [`Value`] builder that fails on a repeated object key.
mod strict {
    use std::cell::RefCell;
    use std::fmt;

    use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
    use serde_json::{Map, Number, Value};

    #[derive(Clone, Copy)]
    pub(super) struct Seed<'a> {
        pub(super) duplicate: &'a RefCell<Option<String>>,
    }

    impl<'de> DeserializeSeed<'de> for Seed<'_> {
        type Value = Value;
        fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
            d.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for Seed<'_> {
        type Value = Value;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
            Ok(Value::Bool(v))
        }
        fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
            Ok(Value::Number(v.into()))
        }
        fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
            Ok(Value::Number(v.into()))
        }
        fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
            Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
        }
        fn visit_str<E>(self, v: &str) -> Result<Value, E> {
            Ok(Value::String(v.to_owned()))
        }
        fn visit_string<E>(self, v: String) -> Result<Value, E> {
            Ok(Value::String(v))
        }
        fn visit_unit<E>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }
        fn visit_none<E>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
            let mut items = Vec::new();
            while let Some(v) = seq.next_element_seed(self)? {
                items.push(v);
            }
            Ok(Value::Array(items))
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
            let mut out = Map::new();
            while let Some(key) = map.next_key::<String>()? {
                if out.contains_key(&key) {
                    *self.duplicate.borrow_mut() = Some(key);
                    return Err(de::Error::custom("a key given twice"));
                }
                let v = map.next_value_seed(self)?;
                out.insert(key, v);
            }
            Ok(Value::Object(out))
        }
    }
}

/// Handle one parsed request. An error this makes may echo what the
/// request gave (a tool name, a block type): masked by the secret filter.
pub fn handle_value(memory: &Memory, store: &mut dyn Store, value: &Value) -> Reply {
    let mut reply = reply_to(memory, store, value);
    if reply.result.is_error
        && let Content::Text(text) = &mut reply.result.content
    {
        *text = memory.mask_error(std::mem::take(text));
    }
    reply
}

fn reply_to(memory: &Memory, store: &mut dyn Store, value: &Value) -> Reply {
    let Some(obj) = value.as_object() else {
        return error_reply(
            None,
            "Error: the request must be a JSON object: a tool_use block or a command object."
                .into(),
        );
    };
    if obj.get("type").and_then(Value::as_str) == Some("tool_use") {
        let id = obj.get("id").and_then(Value::as_str).map(str::to_string);
        if id.is_none() {
            return error_reply(None, "Error: the tool_use block has no string `id`.".into());
        }
        match obj.get("name").and_then(Value::as_str) {
            Some("memory") => {}
            other => {
                return error_reply(
                    id,
                    format!(
                        "Error: this server only runs the `memory` tool, not {}.",
                        other
                            .map(|n| format!("`{n}`"))
                            .unwrap_or_else(|| "a tool_use without a name".into())
                    ),
                );
            }
        }
        let Some(input) = obj.get("input") else {
            return error_reply(
                id,
                "Error: the tool_use block has no `input` object.".into(),
            );
        };
        return Reply {
            tool_use_id: id,
            result: memory.execute_json(store, input),
        };
    }
    if let Some(t) = obj.get("type").and_then(Value::as_str) {
        return error_reply(
            None,
            format!(
                "Error: unexpected block type `{t}`; send a tool_use block or a command object."
            ),
        );
    }
    Reply {
        tool_use_id: None,
        result: memory.execute_json(store, value),
    }
}

/// The reply to a request line over `max_line` bytes (it is not parsed):
/// to the `id` of the `tool_use` block it starts, when its first bytes
/// ([`Line::TooLong`]'s head) name one.
pub(crate) fn too_long_reply(n: usize, max_line: usize, head: &[u8]) -> Reply {
    error_reply(tool_use_id_in_head(head), too_long_message(n, max_line))
}

/// How much of an over-long line is kept to find its `tool_use` id.
const HEAD_BYTES: usize = 4096;

/// The `id` of the object that `head` (the start of a JSON text) begins,
/// when a string `id` key comes in `head` at the object's top level and
/// no `type` other than `tool_use` comes before it. The SDKs write a
/// `tool_use` block's `id` before its `input`, so an over-long block is
/// still answered to its id.
fn tool_use_id_in_head(head: &[u8]) -> Option<String> {
    let head = head.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(head);
    // What the head shows: an id found, or a reason to answer to none.
    // Where the head ends (it is a cut line), what was found stands.
    let mut id: Option<String> = None;
    let mut at = 0;
    let ws = |at: &mut usize| {
        while head.get(*at).is_some_and(u8::is_ascii_whitespace) {
            *at += 1;
        }
    };
    // The end (exclusive) of the string that starts at `from` (a `"`).
    let string_end = |from: usize| -> Option<usize> {
        let mut i = from + 1;
        loop {
            match head.get(i)? {
                b'\\' => i += 2,
                b'"' => return Some(i + 1),
                _ => i += 1,
            }
        }
    };
    ws(&mut at);
    if head.get(at) != Some(&b'{') {
        return None;
    }
    at += 1;
    loop {
        ws(&mut at);
        if head.get(at) != Some(&b'"') {
            return if at >= head.len() { id } else { None };
        }
        let Some(key_end) = string_end(at) else {
            return id;
        };
        let key: String = serde_json::from_slice(&head[at..key_end]).ok()?;
        at = key_end;
        ws(&mut at);
        match head.get(at) {
            Some(b':') => at += 1,
            None => return id,
            Some(_) => return None,
        }
        ws(&mut at);
        let value_start = at;
        // Skip the value: a string, or anything up to the `,` or `}` that
        // closes it at this level (nested strings skipped whole).
        let mut depth = 0usize;
        loop {
            let Some(&b) = head.get(at) else {
                // The head ends inside this value: an id's value must be
                // whole, any other value's end does not matter.
                return if key == "id" || key == "command" {
                    None
                } else {
                    id
                };
            };
            match b {
                b'"' => {
                    let Some(end) = string_end(at) else {
                        return if key == "id" { None } else { id };
                    };
                    at = end;
                    if depth == 0 {
                        break;
                    }
                    continue;
                }
                b'{' | b'[' => depth += 1,
                b'}' | b']' if depth > 0 => {
                    depth -= 1;
                    if depth == 0 {
                        at += 1;
                        break;
                    }
                }
                b',' | b'}' if depth == 0 => break,
                _ => {}
            }
            at += 1;
        }
        let value = &head[value_start..at];
        match key.as_str() {
            // Given twice, the request is refused whole; a bare command
            // (with a `command` key) has no id to answer to.
            "id" if id.is_some() => return None,
            "command" => return None,
            "id" => id = Some(serde_json::from_slice::<String>(value).ok()?),
            "type"
                if serde_json::from_slice::<String>(value).ok().as_deref() != Some("tool_use") =>
            {
                return None;
            }
            _ => {}
        }
        ws(&mut at);
        match head.get(at) {
            Some(b',') => at += 1,
            _ => return id,
        }
    }
}

/// The tool error for a request of `n` bytes over the limit `max_line`.
pub(crate) fn too_long_message(n: usize, max_line: usize) -> String {
    format!(
        "Error: the request line is {n} bytes, over this server's limit of {max_line} bytes; nothing was done. Split the content into smaller files."
    )
}

/// The answer to an empty request frame (a `serve` follower never sends
/// one; its client's blank lines get no answer).
#[cfg(feature = "cli")]
pub(crate) fn blank_reply() -> Reply {
    error_reply(
        None,
        "Error: the request is empty; nothing was done. Send one JSON object per line.".into(),
    )
}

/// Outcome of reading one bounded line.
pub(crate) enum Line {
    Ok(Vec<u8>),
    /// Its length, and its first bytes (up to 4 KiB).
    TooLong(usize, Vec<u8>),
    Eof,
}

/// Read one line of at most `max` bytes (without the newline). A longer
/// line is consumed to its end and reported, so the stream stays in step.
pub(crate) fn read_bounded(input: &mut dyn BufRead, max: usize) -> io::Result<Line> {
    read_bounded_ended(input, max).map(|(line, _)| line)
}

/// [`read_bounded`], and whether the line ended with a newline (false for
/// a last line cut short by the end of the stream).
pub(crate) fn read_bounded_ended(input: &mut dyn BufRead, max: usize) -> io::Result<(Line, bool)> {
    let mut buf = Vec::new();
    let mut total = 0usize;
    let mut too_long = false;
    let mut ended = false;
    loop {
        let chunk = input.fill_buf()?;
        if chunk.is_empty() {
            if total == 0 {
                return Ok((Line::Eof, false));
            }
            break;
        }
        let (take, done) = match memchr_newline(chunk) {
            Some(i) => (i, true),
            None => (chunk.len(), false),
        };
        total += take;
        if !too_long {
            if buf.len() + take > max {
                too_long = true;
                let more = take.min(HEAD_BYTES.saturating_sub(buf.len()));
                buf.extend_from_slice(&chunk[..more]);
                buf.truncate(HEAD_BYTES);
                buf.shrink_to_fit();
            } else {
                buf.extend_from_slice(&chunk[..take]);
            }
        } else if buf.len() < HEAD_BYTES {
            let more = take.min(HEAD_BYTES - buf.len());
            buf.extend_from_slice(&chunk[..more]);
        }
        input.consume(if done { take + 1 } else { take });
        if done {
            ended = true;
            break;
        }
    }
    // An empty line still counts as a line (handled by the caller).
    if too_long {
        Ok((Line::TooLong(total, buf), ended))
    } else {
        Ok((Line::Ok(buf), ended))
    }
}

fn memchr_newline(b: &[u8]) -> Option<usize> {
    b.iter().position(|&c| c == b'\n')
}

/// Serve requests from `input` until end of input, one result line each.
/// Blank lines are skipped. Returns the number of requests answered.
pub fn serve(
    memory: &Memory,
    store: &mut dyn Store,
    input: &mut dyn BufRead,
    output: &mut dyn Write,
    max_line: usize,
    mut after_each: impl FnMut(&mut dyn Store),
) -> io::Result<u64> {
    let mut answered = 0u64;
    loop {
        let reply = match read_bounded(input, max_line)? {
            Line::Eof => return Ok(answered),
            Line::TooLong(n, head) => too_long_reply(n, max_line, &head),
            Line::Ok(line) => {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                handle_line(memory, store, &line)
            }
        };
        let mut text = reply.to_line();
        text.push('\n');
        output.write_all(text.as_bytes())?;
        output.flush()?;
        answered += 1;
        store.after_reply();
        after_each(store);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemStore;

    fn run(input: &str, max: usize) -> Vec<Value> {
        let memory = Memory::default();
        let mut store = MemStore::default();
        let mut out = Vec::new();
        serve(
            &memory,
            &mut store,
            &mut input.as_bytes(),
            &mut out,
            max,
            |_| {},
        )
        .unwrap();
        String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn tool_use_gets_its_id_back() {
        let out = run(
            r#"{"type":"tool_use","id":"toolu_1","name":"memory","input":{"command":"view","path":"/memories"}}"#,
            1 << 20,
        );
        assert_eq!(out.len(), 1);
        assert_eq!(out[0]["tool_use_id"], "toolu_1");
        assert_eq!(out[0]["type"], "tool_result");
        assert_eq!(out[0]["is_error"], false);
    }

    /// Round 38a: a line that is not UTF-8 is said to be so.
    #[test]
    fn a_line_that_is_not_utf8_is_said_to_be_so() {
        let memory = Memory::default();
        let mut store = MemStore::default();
        let reply = handle_line(
            &memory,
            &mut store,
            b"{\"command\":\"view\",\"path\":\"/memories/\xff\"}",
        );
        let ToolResult { content, is_error } = reply.result;
        assert!(is_error);
        let crate::memory::Content::Text(text) = content else {
            panic!("not text");
        };
        assert!(
            text.starts_with("Error: the request is not UTF-8 text (an invalid byte at offset 36)"),
            "{text}"
        );
    }

    #[test]
    fn strict_parse_refuses_repeated_keys_at_any_depth() {
        let dup = |t: &str| match parse_strict(t.as_bytes()) {
            Err(ParseError::DuplicateKey(k)) => k,
            other => panic!("{t}: {other:?}"),
        };
        assert_eq!(dup(r#"{"a":1,"a":1}"#), "a");
        assert_eq!(dup(r#"{"x":[{"b":{},"b":null}]}"#), "b");
        assert_eq!(dup(r#"[1,{"c":{"d":1,"d":2}}]"#), "d");
        // Equal after JSON unescaping counts as the same key.
        assert_eq!(dup(r#"{"command":1,"comm\u0061nd":2}"#), "command");
        let ok = parse_strict(br#"{"a":{"a":1},"b":[1,-2,3.5,"s",true,null]}"#).unwrap();
        assert_eq!(
            ok,
            serde_json::json!({"a":{"a":1},"b":[1,-2,3.5,"s",true,null]})
        );
        assert_eq!(
            parse_strict(b"18446744073709551615").unwrap(),
            serde_json::json!(u64::MAX)
        );
        // A key given twice in text that is not JSON past it is a
        // syntax error: the line is not JSON, so nothing in it is taken.
        let broken = br#"{"type":"tool_use","id":"t1","name":"m","name":"m","input":x}"#;
        assert!(matches!(parse_strict(broken), Err(ParseError::Syntax(_))));
        assert!(matches!(
            parse_strict(br#"{"a":1,"a":2} {}"#),
            Err(ParseError::Syntax(_))
        ));
        for bad in ["", "{", "{} {}", "{\"a\":}", "[1,]"] {
            assert!(
                matches!(parse_strict(bad.as_bytes()), Err(ParseError::Syntax(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_key_given_twice_inside_a_block_is_answered_to_its_id() {
        let out = run(
            concat!(
                r#"{"type":"tool_use","id":"toolu_A","name":"memory","input":{"command":"view","path":"/memories","path":"/memories/x"}}"#,
                "\n",
                r#"{"type":"tool_use","id":"toolu_B","name":"memory","name":"other","input":{}}"#,
                "\n",
                r#"{"type":"tool_use","id":"toolu_C","id":"toolu_D","name":"memory","input":{}}"#,
                "\n",
            ),
            1 << 20,
        );
        let ids: Vec<&Value> = out.iter().map(|o| &o["tool_use_id"]).collect();
        assert_eq!(ids, [&json!("toolu_A"), &json!("toolu_B"), &Value::Null]);
        assert!(out.iter().all(|o| o["is_error"] == true));
        assert!(
            out[0]["content"]
                .as_str()
                .unwrap()
                .contains("the key `path` twice")
        );
    }

    #[test]
    fn bare_command_has_null_id() {
        let out = run(r#"{"command":"view","path":"/memories"}"#, 1 << 20);
        assert!(out[0]["tool_use_id"].is_null());
    }

    #[test]
    fn garbage_lines_each_get_one_error_and_serving_goes_on() {
        let input = "not json\n[1,2]\n{\"command\":\"frobnicate\"}\n\n{\"type\":\"tool_use\",\"id\":\"x\",\"name\":\"other\",\"input\":{}}\n{\"command\":\"view\",\"path\":\"/memories\"}\n";
        let out = run(input, 1 << 20);
        assert_eq!(out.len(), 5);
        for v in &out[..4] {
            assert_eq!(v["is_error"], true, "{v}");
        }
        assert_eq!(out[4]["is_error"], false);
        assert!(
            out[0]["content"]
                .as_str()
                .unwrap()
                .contains("not valid JSON")
        );
        assert!(out[3]["content"].as_str().unwrap().contains("`other`"));
    }

    #[test]
    fn overlong_line_is_refused_and_the_next_line_is_served() {
        let long = format!(
            "{{\"command\":\"create\",\"path\":\"/memories/a\",\"file_text\":\"{}\"}}",
            "x".repeat(5000)
        );
        let input = format!("{long}\n{{\"command\":\"view\",\"path\":\"/memories\"}}\n");
        let out = run(&input, 1024);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0]["is_error"], true);
        assert!(
            out[0]["content"]
                .as_str()
                .unwrap()
                .contains("over this server's limit")
        );
        assert_eq!(out[1]["is_error"], false);
        assert!(!out[1]["content"].as_str().unwrap().contains("/memories/a"));
    }

    /// An over-long `tool_use` block is answered to its id when the id
    /// comes before its input, as the SDKs write it; otherwise, and for a
    /// bare command, the id is null.
    #[test]
    fn an_overlong_tool_use_block_is_answered_to_its_id() {
        let big = "x".repeat(9000);
        let input_part = format!(
            r#""input":{{"command":"create","path":"/memories/a","file_text":"{big}","nested":[{{"id":"no"}}]}}"#
        );
        let lines = [
            format!(r#"{{"id":"toolu_01\"q",{input_part},"name":"memory","type":"tool_use"}}"#),
            format!(
                r#" {{ "type" : "tool_use", "name":"memory" , "id" : "toolu_02", {input_part}}}"#
            ),
            format!(r#"{{"type":"tool_use",{input_part},"id":"toolu_03"}}"#),
            format!(r#"{{"type":"text","id":"toolu_04",{input_part}}}"#),
            format!(r#"{{"command":"create","path":"/memories/a","file_text":"{big}"}}"#),
            format!(r#"{{"id":{{"id":"toolu_05"}},{input_part}}}"#),
            format!(r#"{{"id":"toolu_06","command":"create","file_text":"{big}"}}"#),
            format!(r#"{{"id":"toolu_07","id":"toolu_08",{input_part}}}"#),
            format!(r#"{{"id":"toolu_09","type":"text",{input_part}}}"#),
            format!("\u{feff}{{\"id\":\"toolu_10\",{input_part}}}"),
        ];
        let text = lines.join("\n") + "\n";
        let out = run(&text, 4096);
        assert_eq!(out.len(), lines.len());
        let ids: Vec<&Value> = out.iter().map(|o| &o["tool_use_id"]).collect();
        assert_eq!(ids[0], "toolu_01\"q");
        assert_eq!(ids[1], "toolu_02");
        assert_eq!(ids[9], "toolu_10");
        assert!(ids[2..9].iter().all(|id| id.is_null()), "{ids:?}");
        assert!(out.iter().all(|o| o["is_error"] == true));
    }

    #[test]
    fn a_leading_byte_order_mark_is_skipped() {
        let out = run(
            "\u{feff}{\"command\":\"view\",\"path\":\"/memories\"}\n",
            1024,
        );
        assert_eq!(out[0]["is_error"], false, "{}", out[0]);
    }
}
