//! What arrives for rmcp, screened first, for `memvault mcp` (stdio) and
//! `memvault server`'s `/mcp` (HTTP).
//!
//! rmcp drops a line it cannot parse without an answer, keeps the last of
//! a repeated key, and answers a `tools/call` whose params do not fit its
//! types (`arguments` twice, or a string) with "method not found", which
//! names nothing. So each message is screened before rmcp reads it:
//!
//! - a `tools/call` that `serve` would refuse (a key given twice, arguments
//!   that are not an object, text that is not valid JSON only because of a
//!   lone surrogate escape) reaches rmcp as the same call with empty
//!   arguments, and its id is marked: the call is answered with the tool
//!   error `serve` gives for that input, same text, `isError: true`;
//! - any other request with a key given twice (at any depth), and a
//!   `tools/call` whose own `method` is given twice, is an invalid request
//!   answered with its id; one whose `id` is given twice, with id null
//!   (which of the two to answer is not the server's guess); a line that
//!   is not JSON beside its repeated key, a parse error; a notification
//!   (no id) goes to rmcp as it is, never answered;
//! - on stdio, a line that is no JSON-RPC message at all is answered with
//!   a JSON-RPC parse error (id null), and a line over the limit with the
//!   error `serve` gives (as a tool error when it is a `tools/call` whose
//!   id can be read from its start), written between rmcp's own messages.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use serde_json::{Value, json};

use super::mcp::TOOL_NAME;
use crate::memory::parse_command;
use crate::protocol::{
    ParseError, duplicate_key_message, not_json_message, parse_strict, too_long_message,
};

/// What to do with one incoming message.
pub(crate) enum Screened {
    /// Hand it on as it is.
    Pass,
    /// A `tools/call` to answer with the tool error `message`: rmcp gets
    /// `clean` (the same call with empty arguments) in its place.
    Refuse {
        id: Value,
        clean: Vec<u8>,
        message: String,
    },
    /// Not a JSON-RPC message: the parser's error.
    Unparsable(String),
    /// A notification (a method, no id) that is not one rmcp can take:
    /// never answered on stdio (JSON-RPC answers no notification), a 400
    /// over HTTP; the reason.
    Drop(String),
    /// JSON, but not a JSON-RPC 2.0 message rmcp can take (another
    /// version, a batch, an id that is not a string or an integer, a
    /// `tools/call` without a tool name): answered with this error code
    /// and message, and the id when it can be read (else null), rather
    /// than rmcp's answer, which carries no id (a client waits for ever).
    Invalid {
        id: Value,
        code: i64,
        message: String,
    },
}

/// Why `msg` is not a JSON-RPC 2.0 message rmcp takes, if it is not: the
/// id to answer with, the error code and the message.
fn invalid(msg: &Value) -> Option<(Value, i64, String)> {
    let Some(obj) = msg.as_object() else {
        let what = if msg.is_array() {
            "a batch (an array); send one JSON-RPC message at a time"
        } else {
            "not a JSON object"
        };
        return Some((Value::Null, -32600, format!("Invalid request: {what}")));
    };
    let id = obj.get("id");
    // (A response's id past i64 passes: a response is never answered.)
    let good_id = id
        .is_none_or(|i| i.is_string() || i.is_i64() || (i.is_u64() && !obj.contains_key("method")));
    let answer_id = id.filter(|_| good_id).cloned().unwrap_or(Value::Null);
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Some((
            answer_id,
            -32600,
            "Invalid request: \"jsonrpc\" must be \"2.0\"".into(),
        ));
    }
    if let Some(big) = id.filter(|i| i.is_u64() && !i.is_i64() && obj.contains_key("method")) {
        // A JSON-RPC id, but past what rmcp takes: answered with it.
        return Some((
            big.clone(),
            -32600,
            "Invalid request: an integer \"id\" must be at most 9223372036854775807 (2^63 - 1); use a smaller one or a string".into(),
        ));
    }
    if !good_id {
        return Some((
            Value::Null,
            -32600,
            "Invalid request: \"id\" must be a string or an integer".into(),
        ));
    }
    // A request's params, and their `_meta`, are objects when given.
    let params = obj.get("params").filter(|_| obj.contains_key("method"));
    for (name, given) in [
        ("params", params),
        ("params._meta", msg.pointer("/params/_meta")),
    ] {
        if given.is_some_and(|v| !v.is_object() && !v.is_null()) {
            return Some((
                answer_id,
                -32602,
                format!("Invalid params: \"{name}\" must be an object"),
            ));
        }
    }
    match obj.get("method") {
        Some(Value::String(m)) if m == "tools/call" && id.is_some() => {
            let name = msg.pointer("/params/name").and_then(Value::as_str);
            if name.is_none() {
                return Some((
                    answer_id,
                    -32602,
                    format!(
                        "Invalid params: tools/call needs params.name, the tool's name (\"{TOOL_NAME}\"), and params.arguments, the command"
                    ),
                ));
            }
            None
        }
        Some(Value::String(_)) => None,
        Some(_) => Some((
            answer_id,
            -32600,
            "Invalid request: \"method\" must be a string".into(),
        )),
        // A response to a request of the server's.
        None if id.is_some() && (obj.contains_key("result") || obj.contains_key("error")) => None,
        None => Some((
            answer_id,
            -32600,
            "Invalid request: a request needs a \"method\"".into(),
        )),
    }
}

/// A message that passed every check above but that rmcp still cannot
/// read as an MCP message (its params do not fit the method's: rmcp would
/// answer it without an id): refused here, with its id (null for a
/// notification, as JSON-RPC answers an invalid request whose id it has
/// not). The message is not quoted back.
fn unfit(msg: &Value) -> Option<Screened> {
    use serde::Deserialize;
    // A response (no method) is never answered, whatever it holds.
    if msg.get("method").is_none() || rmcp::model::ClientJsonRpcMessage::deserialize(msg).is_ok() {
        return None;
    }
    let (code, message) = if msg.get("result").is_some() || msg.get("error").is_some() {
        (
            -32600,
            "Invalid request: a request carries no result or error",
        )
    } else {
        (
            -32602,
            "Invalid params: the params do not fit the method's (see the MCP schema)",
        )
    };
    Some(Screened::Invalid {
        id: msg.get("id").cloned().unwrap_or(Value::Null),
        code,
        message: message.into(),
    })
}

/// `refusal`, or a `Drop` with its message when `msg` is a notification.
fn notification_or(msg: &Value, refusal: Screened) -> Screened {
    let notification = msg.get("method").is_some_and(Value::is_string)
        && msg.as_object().is_some_and(|o| !o.contains_key("id"));
    match refusal {
        // Only params MCP does not take: a notification that is not
        // JSON-RPC 2.0 at all is answered (id null), as before.
        Screened::Invalid {
            message,
            code: -32602,
            ..
        } if notification => Screened::Drop(message),
        other => other,
    }
}

/// Screen one message's text (see the module docs).
pub(crate) fn screen(text: &[u8]) -> Screened {
    let (msg, message) = match parse_strict(text) {
        Ok(v) if invalid(&v).is_some() => {
            let (id, code, message) = invalid(&v).unwrap_or_default();
            return notification_or(&v, Screened::Invalid { id, code, message });
        }
        Ok(v) => match v.pointer("/params/arguments") {
            Some(a) if !a.is_object() && !a.is_null() => match parse_command(a) {
                Err(m) => (v, m),
                Ok(_) => return unfit(&v).map_or(Screened::Pass, |u| notification_or(&v, u)),
            },
            _ => return unfit(&v).map_or(Screened::Pass, |u| notification_or(&v, u)),
        },
        Err(ParseError::DuplicateKey(key)) => {
            // Not JSON at all beside its repeated key: a parse error, as
            // for any line that is not JSON (rmcp drops it unanswered).
            let v = match serde_json::from_slice::<Value>(text) {
                Ok(v) => v,
                Err(e) => return Screened::Unparsable(e.to_string()),
            };
            let top = top_level_keys(text).unwrap_or_default();
            let twice = |k: &str| top.iter().filter(|t| *t == k).count() > 1;
            if twice("id") {
                // Which of two ids to answer is not for the server to
                // guess: the answer carries neither, as for an id it
                // cannot read.
                return Screened::Invalid {
                    id: Value::Null,
                    code: -32600,
                    message: "Invalid request: \"id\" is given twice".into(),
                };
            }
            if is_call(&v) && !twice("method") {
                // A call `serve` would refuse: the tool's error.
                (v, duplicate_key_message(&key))
            } else if !top.iter().any(|k| k == "id") {
                // A notification is never answered: rmcp takes it as it
                // reads it.
                return Screened::Pass;
            } else {
                // Any other request with a key given twice (anywhere) is
                // not one rmcp may read as it likes (it answered without
                // an id): refused, with its id.
                return Screened::Invalid {
                    id: v
                        .get("id")
                        .filter(|i| i.is_string() || i.is_number())
                        .cloned()
                        .unwrap_or(Value::Null),
                    code: -32600,
                    message: format!("Invalid request: the key \"{key}\" is given twice"),
                };
            }
        }
        Err(ParseError::Syntax(e)) => {
            match serde_json::from_slice::<Value>(&lone_surrogates_replaced(text)) {
                Ok(v) if is_call(&v) => (v, not_json_message(&e)),
                _ => return Screened::Unparsable(e.to_string()),
            }
        }
    };
    let id = msg.get("id").filter(|i| i.is_string() || i.is_number());
    match id {
        Some(id) if is_call(&msg) => {
            let clean = json!({
                "jsonrpc": "2.0",
                "id": id,
                "method": "tools/call",
                "params": {"name": TOOL_NAME, "arguments": {}},
            });
            Screened::Refuse {
                id: id.clone(),
                clean: clean.to_string().into_bytes(),
                message,
            }
        }
        _ => Screened::Pass,
    }
}

/// The keys of `text`'s top-level object, in order, duplicates kept (its
/// values skipped unread); None if it is not one.
fn top_level_keys(text: &[u8]) -> Option<Vec<String>> {
    struct Keys;
    impl<'de> serde::de::Visitor<'de> for Keys {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            let mut keys = Vec::new();
            while let Some(k) = map.next_key::<String>()? {
                map.next_value::<serde::de::IgnoredAny>()?;
                keys.push(k);
            }
            Ok(keys)
        }
    }
    let mut de = serde_json::Deserializer::from_slice(text);
    serde::Deserializer::deserialize_map(&mut de, Keys).ok()
}

fn is_call(msg: &Value) -> bool {
    msg.get("method").and_then(Value::as_str) == Some("tools/call")
}

/// `text` with every `\u` escape of a lone UTF-16 surrogate (one not in a
/// high-low pair) replaced by `\ufffd`, which serde_json refuses and
/// `serve` answers as not valid JSON.
fn lone_surrogates_replaced(text: &[u8]) -> Vec<u8> {
    let unit = |at: usize| -> Option<u16> {
        if text.get(at) != Some(&b'\\') || text.get(at + 1) != Some(&b'u') {
            return None;
        }
        let hex = std::str::from_utf8(text.get(at + 2..at + 6)?).ok()?;
        u16::from_str_radix(hex, 16).ok()
    };
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if text[i] != b'\\' {
            out.push(text[i]);
            i += 1;
            continue;
        }
        match unit(i) {
            Some(0xd800..=0xdbff)
                if unit(i + 6).is_some_and(|l| (0xdc00..=0xdfff).contains(&l)) =>
            {
                out.extend_from_slice(&text[i..i + 12]);
                i += 12;
            }
            Some(0xd800..=0xdfff) => {
                out.extend_from_slice(b"\\ufffd");
                i += 6;
            }
            _ => {
                // Any other escape: the backslash and what it escapes.
                out.extend_from_slice(&text[i..(i + 2).min(text.len())]);
                i += 2;
            }
        }
    }
    out
}

/// The ids (as JSON text) of `tools/call` requests screened out, with the
/// tool error each is answered with.
#[derive(Clone, Default)]
pub(crate) struct Refusals(Arc<Mutex<HashMap<String, String>>>);

impl Refusals {
    /// At most this many are held (each is taken by its call).
    const MAX: usize = 1024;

    fn mark(&self, id: &Value, message: String) {
        let mut marks = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if marks.len() < Self::MAX {
            marks.insert(id.to_string(), message);
        }
    }

    /// The refusal for the call with this id, if it was screened out.
    pub(crate) fn take(&self, id: &rmcp::model::RequestId) -> Option<String> {
        let id = match id {
            rmcp::model::NumberOrString::Number(n) => n.to_string(),
            rmcp::model::NumberOrString::String(s) => Value::String(s.to_string()).to_string(),
        };
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id)
    }
}

/// stdout, shared by rmcp and the screen: rmcp's bytes go out a whole
/// line at a time, and a line the screen answers goes out between two of
/// rmcp's (never inside one).
#[derive(Clone, Default)]
pub(crate) struct Out(Arc<Mutex<OutState>>);

#[derive(Default)]
struct OutState {
    /// rmcp's bytes after its last complete line.
    partial: Vec<u8>,
    /// The screen's answers waiting for rmcp to finish its line.
    queued: VecDeque<Vec<u8>>,
}

impl Out {
    /// Write one JSON-RPC message of the screen's (a line).
    fn answer(&self, msg: &Value) {
        let mut line = msg.to_string().into_bytes();
        line.push(b'\n');
        let mut st = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if st.partial.is_empty() {
            let mut out = std::io::stdout().lock();
            // A reader that went away ends the session through rmcp's
            // own write.
            let _ = out.write_all(&line).and_then(|()| out.flush());
        } else {
            st.queued.push_back(line);
        }
    }
}

impl tokio::io::AsyncWrite for Out {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let mut st = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        st.partial.extend_from_slice(buf);
        let mut out = std::io::stdout().lock();
        while let Some(end) = st.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = st.partial.drain(..=end).collect();
            out.write_all(&line)?;
            while let Some(q) = st.queued.pop_front() {
                out.write_all(&q)?;
            }
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(std::io::stdout().lock().flush())
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.poll_flush(cx)
    }
}

/// Bytes of an over-long line kept to read its id and method from.
const PREFIX: usize = 64 << 10;

/// stdin as rmcp reads it: whole lines, each screened (see the module
/// docs); a line over `max` bytes is answered here and never handed on.
pub(crate) struct Gate<R> {
    inner: R,
    max: usize,
    refusals: Refusals,
    out: Out,
    /// The line being read.
    line: Vec<u8>,
    /// Bytes of the current line past the limit (0: within it).
    over: usize,
    /// Bytes ready for rmcp.
    ready: Vec<u8>,
    eof: bool,
    /// Whether a request has been handed on: rmcp ends the session when
    /// the first message it reads is a notification or a response, so
    /// those are dropped until then (JSON-RPC answers neither).
    asked: bool,
}

impl<R> Gate<R> {
    pub(crate) fn new(inner: R, max: usize, refusals: Refusals, out: Out) -> Self {
        Gate {
            inner,
            max,
            refusals,
            out,
            line: Vec::new(),
            over: 0,
            ready: Vec::new(),
            eof: false,
            asked: false,
        }
    }

    fn take(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let (part, ends) = match bytes.iter().position(|&b| b == b'\n') {
                Some(i) => (&bytes[..i], true),
                None => (bytes, false),
            };
            if self.over > 0 || self.line.len() + part.len() > self.max {
                let keep = PREFIX.saturating_sub(self.line.len()).min(part.len());
                self.line.extend_from_slice(&part[..keep]);
                self.over += part.len() - keep;
            } else {
                self.line.extend_from_slice(part);
            }
            if ends {
                self.end_line();
                bytes = &bytes[part.len() + 1..];
            } else {
                bytes = &[];
            }
        }
    }

    fn end_line(&mut self) {
        let line = std::mem::take(&mut self.line);
        let over = std::mem::replace(&mut self.over, 0);
        if over > 0 {
            self.answer_too_long(&line, line.len() + over);
            return;
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            self.ready.extend_from_slice(&line);
            self.ready.push(b'\n');
            return;
        }
        let screened = screen(&line);
        if !self.asked && matches!(screened, Screened::Pass | Screened::Refuse { .. }) {
            match id_and_method(&line) {
                (Some(_), Some(_)) => self.asked = true,
                _ => {
                    eprintln!(
                        "memvault: a notification or response before the client's first request was dropped"
                    );
                    return;
                }
            }
        }
        match screened {
            Screened::Pass => self.ready.extend_from_slice(&line),
            Screened::Refuse { id, clean, message } => {
                self.refusals.mark(&id, message);
                self.ready.extend_from_slice(&clean);
            }
            Screened::Unparsable(detail) => {
                self.out.answer(&json!({
                    "jsonrpc": "2.0",
                    "id": null,
                    "error": {"code": -32700, "message": format!("Parse error: the message is not valid JSON ({detail})")},
                }));
                return;
            }
            Screened::Drop(_) => {
                eprintln!("memvault: a notification whose params MCP does not take was dropped");
                return;
            }
            Screened::Invalid { id, code, message } => {
                self.out.answer(&json!({
                    "jsonrpc": "2.0",
                    "id": id,
                    "error": {"code": code, "message": message},
                }));
                return;
            }
        }
        self.ready.push(b'\n');
    }

    /// A line of `n` bytes over the limit: `serve`'s error, as a tool
    /// error when its start shows a `tools/call` and its id.
    fn answer_too_long(&self, start: &[u8], n: usize) {
        let (id, method) = id_and_method(start);
        let text = too_long_message(n, self.max);
        let msg = match (&id, method.as_deref()) {
            (Some(id), Some("tools/call")) => json!({
                "jsonrpc": "2.0",
                "id": id,
                "result": {"content": [{"type": "text", "text": text}], "isError": true},
            }),
            _ => json!({
                "jsonrpc": "2.0",
                "id": id.unwrap_or(Value::Null),
                "error": {"code": -32600, "message": text.trim_start_matches("Error: ")},
            }),
        };
        self.out.answer(&msg);
    }
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Gate<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        while this.ready.is_empty() && !this.eof {
            let mut chunk = [0u8; 16 << 10];
            let mut rb = tokio::io::ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) if rb.filled().is_empty() => {
                    this.eof = true;
                    // A last line without its newline is screened and
                    // handed on as a whole line (rmcp's reader drops an
                    // unterminated one), or answered as too long.
                    if !this.line.is_empty() || this.over > 0 {
                        this.end_line();
                    }
                }
                Poll::Ready(Ok(())) => {
                    let filled = rb.filled().to_vec();
                    this.take(&filled);
                }
            }
        }
        let n = this.ready.len().min(buf.remaining());
        buf.put_slice(&this.ready[..n]);
        this.ready.drain(..n);
        Poll::Ready(Ok(()))
    }
}

/// The top-level `id` and `method` of a JSON object from the start of its
/// text (the rest may be cut off): each value skipped without being parsed
/// whole; None for what is not found before the text ends.
fn id_and_method(text: &[u8]) -> (Option<Value>, Option<String>) {
    let mut id = None;
    let mut method = None;
    let mut i = skip_ws(text, 0);
    if text.get(i) != Some(&b'{') {
        return (None, None);
    }
    i += 1;
    loop {
        i = skip_ws(text, i);
        let Some(key_end) = string_end(text, i) else {
            break;
        };
        let key = serde_json::from_slice::<String>(&text[i..key_end]).ok();
        i = skip_ws(text, key_end);
        if text.get(i) != Some(&b':') {
            break;
        }
        i = skip_ws(text, i + 1);
        let Some(value_end) = value_end(text, i) else {
            break;
        };
        let value = serde_json::from_slice::<Value>(&text[i..value_end]).ok();
        match key.as_deref() {
            Some("id") => id = value.filter(|v| v.is_string() || v.is_number()),
            Some("method") => method = value.and_then(|v| v.as_str().map(str::to_string)),
            _ => {}
        }
        i = skip_ws(text, value_end);
        if text.get(i) != Some(&b',') {
            break;
        }
        i += 1;
    }
    (id, method)
}

fn skip_ws(text: &[u8], mut i: usize) -> usize {
    while text.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    i
}

/// The end (exclusive) of the JSON string starting at `i`.
fn string_end(text: &[u8], i: usize) -> Option<usize> {
    if text.get(i) != Some(&b'"') {
        return None;
    }
    let mut k = i + 1;
    while k < text.len() {
        match text[k] {
            b'\\' => k += 2,
            b'"' => return Some(k + 1),
            _ => k += 1,
        }
    }
    None
}

/// The end (exclusive) of the JSON value starting at `i`.
fn value_end(text: &[u8], i: usize) -> Option<usize> {
    match text.get(i)? {
        b'"' => string_end(text, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut k = i;
            while k < text.len() {
                match text[k] {
                    b'"' => {
                        k = string_end(text, k)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(k + 1);
                        }
                    }
                    _ => {}
                }
                k += 1;
            }
            None
        }
        _ => {
            let mut k = i;
            while k < text.len()
                && !matches!(text[k], b',' | b'}' | b']')
                && !text[k].is_ascii_whitespace()
            {
                k += 1;
            }
            (k < text.len()).then_some(k)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(text: &str) -> (Value, String) {
        match screen(text.as_bytes()) {
            Screened::Refuse { id, clean, message } => {
                let c: Value = serde_json::from_slice(&clean).unwrap();
                assert_eq!(c["params"]["arguments"], json!({}));
                assert_eq!(c["id"], id);
                (id, message)
            }
            _ => panic!("not refused: {text}"),
        }
    }

    #[test]
    fn a_message_with_two_ids_is_answered_with_neither() {
        for text in [
            r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/call","params":{"name":"memory","arguments":{"command":"view","path":"/memories"}}}"#,
            r#"{"jsonrpc":"2.0","id":"a","method":"tools/list","id":"b"}"#,
            r#"{"jsonrpc":"2.0","id":null,"id":3,"method":"ping"}"#,
        ] {
            match screen(text.as_bytes()) {
                Screened::Invalid { id, code, message } => {
                    assert_eq!((id, code), (Value::Null, -32600));
                    assert!(message.contains("\"id\" is given twice"), "{message}");
                }
                _ => panic!("not refused as invalid: {text}"),
            }
        }
    }

    /// Round 38a: what passed every other check but rmcp cannot read is
    /// refused with its id; a notification of that kind is dropped.
    #[test]
    fn messages_rmcp_cannot_read_keep_their_id_and_notifications_go_unanswered() {
        for (text, want) in [
            (
                r#"{"jsonrpc":"2.0","id":5,"method":"ping","params":"x"}"#,
                json!(5),
            ),
            (
                r#"{"jsonrpc":"2.0","id":"a","method":"tools/list","params":[1]}"#,
                json!("a"),
            ),
            (
                r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"memory","arguments":{},"_meta":1}}"#,
                json!(6),
            ),
            (
                r#"{"jsonrpc":"2.0","id":18446744073709551615,"method":"ping"}"#,
                json!(u64::MAX),
            ),
        ] {
            match screen(text.as_bytes()) {
                Screened::Invalid { id, .. } => assert_eq!(id, want, "{text}"),
                _ => panic!("not refused with its id: {text}"),
            }
        }
        assert!(matches!(
            screen(br#"{"jsonrpc":"2.0","method":"notifications/initialized","params":"x"}"#),
            Screened::Drop(_)
        ));
        assert!(matches!(
            screen(br#"{"jsonrpc":"2.0","id":8,"method":"ping"}"#),
            Screened::Pass
        ));
        // A response is never answered, whatever its id; a notification
        // that is not JSON-RPC 2.0 is answered (id null), as before; a
        // request carrying a result is an invalid request.
        assert!(matches!(
            screen(br#"{"jsonrpc":"2.0","id":18446744073709551615,"result":{}}"#),
            Screened::Pass
        ));
        assert!(matches!(
            screen(br#"{"jsonrpc":"1.0","method":"x"}"#),
            Screened::Invalid { code: -32600, .. }
        ));
        assert!(matches!(
            screen(br#"{"jsonrpc":"2.0","id":9,"method":"ping","result":{}}"#),
            Screened::Invalid { code: -32600, .. }
        ));
    }

    /// A line that is not JSON is a parse error though it also repeats a
    /// key; a notification with a repeated key is not answered.
    #[test]
    fn broken_json_with_a_repeated_key_is_a_parse_error_and_notifications_pass() {
        for text in [
            r#"{"jsonrpc":"2.0","id":41,"method":"ping","params":{"a":1,"a":2}"#,
            r#"{"jsonrpc":"2.0","id":42,"id":43,"method":"ping""#,
            r#"{"jsonrpc":"2.0","id":44,"method":"ping","params":{"a":1,"a":2,"b":tru}}"#,
            r#"{"jsonrpc":"2.0","id":45,"method":"ping","params":{"a":1,"a":2}} trailing"#,
        ] {
            assert!(
                matches!(screen(text.as_bytes()), Screened::Unparsable(_)),
                "{text}"
            );
        }
        assert!(matches!(
            screen(br#"{"jsonrpc":"2.0","method":"notifications/initialized","method":"x"}"#),
            Screened::Pass
        ));
    }

    /// A key given twice below the top level, `id` included, is not two
    /// ids: a call is the tool's error with its id; any other message, or
    /// one with a top-level key twice, is refused with its id (rmcp
    /// answered those with no id at all).
    #[test]
    fn a_key_given_twice_elsewhere_is_answered_with_the_messages_id() {
        let (id, m) = refused(
            r#"{"jsonrpc":"2.0","id":40,"method":"tools/call","params":{"name":"memory","arguments":{"command":"view","path":"/memories","id":1,"id":2}}}"#,
        );
        assert_eq!(id, json!(40));
        assert!(m.contains("`id`"), "{m}");
        let (id, _) = refused(
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"id":8,"id":9,"name":"memory","arguments":{"command":"view","path":"/memories"}}}"#,
        );
        assert_eq!(id, json!(7));
        for (text, want, key) in [
            (
                r#"{"jsonrpc":"2.0","id":43,"method":"ping","params":{"id":1,"id":2}}"#,
                json!(43),
                "id",
            ),
            (
                r#"{"jsonrpc":"2.0","id":17,"method":"ping","method":"tools/list"}"#,
                json!(17),
                "method",
            ),
            (
                r#"{"jsonrpc":"2.0","jsonrpc":"2.0","id":"x","method":"ping"}"#,
                json!("x"),
                "jsonrpc",
            ),
            (
                r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","method":"tools/call","params":{"name":"memory","arguments":{}}}"#,
                json!(5),
                "method",
            ),
        ] {
            match screen(text.as_bytes()) {
                Screened::Invalid { id, code, message } => {
                    assert_eq!((id, code), (want, -32600), "{text}");
                    assert!(
                        message.contains(&format!("\"{key}\" is given twice")),
                        "{message}"
                    );
                }
                _ => panic!("not refused as invalid: {text}"),
            }
        }
    }

    #[test]
    fn calls_serve_would_refuse_are_marked_with_serves_text() {
        let (id, m) = refused(
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"memory","arguments":{"command":"view"},"arguments":{"command":"delete","path":"/memories"}}}"#,
        );
        assert_eq!(id, json!(7));
        assert!(m.contains("`arguments`") || m.contains("a key"), "{m}");
        let (_, m) = refused(
            r#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"memory","arguments":"view"}}"#,
        );
        assert!(m.contains("got a string"), "{m}");
        let (_, m) = refused(
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"memory","arguments":{"command":"view","path":"/memories/\ud800"}}}"#,
        );
        assert!(m.contains("not valid JSON"), "{m}");
        // A paired surrogate is valid JSON: handed on.
        assert!(matches!(
            screen(r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"memory","arguments":{"command":"view","path":"/memories/\ud83d\ude00"}}}"#.as_bytes()),
            Screened::Pass
        ));
        assert!(matches!(screen(b"not json"), Screened::Unparsable(_)));
        assert!(matches!(
            screen(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#),
            Screened::Pass
        ));
    }

    #[test]
    fn id_and_method_are_read_from_a_cut_start() {
        let text = br#"{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"memory","arguments":{"command":"create","file_text":"aaaa"#;
        assert_eq!(
            id_and_method(text),
            (Some(json!(42)), Some("tools/call".into()))
        );
        let text = br#"{"params":{"x":[1,{"y":"}"}]},"id":"q","method":"tools/call""#;
        assert_eq!(
            id_and_method(text),
            (Some(json!("q")), Some("tools/call".into()))
        );
        assert_eq!(id_and_method(br#"{"params":{"a":"#), (None, None));
    }
}
