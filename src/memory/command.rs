//! The six commands of `memory_20250818`, as data.
//!
//! [`Command`] is the typed form of a `tool_use` input. It derives serde
//! (internally tagged by `command`) so other layers can write and read it,
//! but untrusted input goes through [`parse_command`], which checks every
//! field itself so that a bad request gets an error naming the command, the
//! field and the expected type, instead of serde's generic wording.
//!
//! Paths stay plain strings here: they are validated into
//! [`super::MemoryPath`] when the command runs, so a refused path gets its
//! own message naming the rule it broke. Unknown extra fields are ignored,
//! and `null` for an optional field (`view_range`, `new_str`) means absent.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::path::shown;

/// One memory command, as Claude sends it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum Command {
    /// Show a directory listing or a file with line numbers.
    View {
        path: String,
        /// `[start, end]`, 1-based and inclusive; `end = -1` for the end.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        view_range: Option<[i64; 2]>,
    },
    /// Create a file (refused when it exists, unless configured).
    Create { path: String, file_text: String },
    /// Replace the one occurrence of `old_str`; `new_str` absent deletes it.
    StrReplace {
        path: String,
        old_str: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        new_str: Option<String>,
    },
    /// Insert `insert_text` after line `insert_line` (0 = at the start).
    Insert {
        path: String,
        insert_line: i64,
        insert_text: String,
    },
    /// Delete a file or a directory with everything below it.
    Delete { path: String },
    /// Move a file or a directory; never overwrites.
    Rename { old_path: String, new_path: String },
}

/// The valid values of `command`, in the order the messages list them.
pub const COMMAND_NAMES: [&str; 6] = [
    "view",
    "create",
    "str_replace",
    "insert",
    "delete",
    "rename",
];

const VALID_LIST: &str = "`view`, `create`, `str_replace`, `insert`, `delete`, `rename`";

impl Command {
    /// The `command` value of this command.
    pub fn name(&self) -> &'static str {
        match self {
            Command::View { .. } => "view",
            Command::Create { .. } => "create",
            Command::StrReplace { .. } => "str_replace",
            Command::Insert { .. } => "insert",
            Command::Delete { .. } => "delete",
            Command::Rename { .. } => "rename",
        }
    }

    /// True for the commands that may change the store.
    pub fn is_mutation(&self) -> bool {
        !matches!(self, Command::View { .. })
    }
}

/// Reads one command from a `tool_use` input. The error is a complete
/// message for Claude, starting with `Error:`.
pub fn parse_command(input: &Value) -> Result<Command, String> {
    let obj = match input {
        Value::Object(obj) => obj,
        other => {
            return Err(format!(
                "Error: invalid input: expected a JSON object with a `command` field (one of {VALID_LIST}), got {}.",
                describe(other)
            ));
        }
    };
    let name = match obj.get("command") {
        None => {
            return Err(format!(
                "Error: invalid input: missing required field `command` (string, one of {VALID_LIST})."
            ));
        }
        Some(Value::String(name)) => name.as_str(),
        Some(other) => {
            return Err(format!(
                "Error: invalid input: field `command` must be a string (one of {VALID_LIST}), got {}.",
                describe(other)
            ));
        }
    };
    let f = Fields { obj, command: name };
    match name {
        "view" => Ok(Command::View {
            path: f.string("path")?,
            view_range: f.view_range()?,
        }),
        "create" => Ok(Command::Create {
            path: f.string("path")?,
            file_text: f.string("file_text")?,
        }),
        "str_replace" => Ok(Command::StrReplace {
            path: f.string("path")?,
            old_str: f.string("old_str")?,
            new_str: f.optional_string("new_str")?,
        }),
        "insert" => Ok(Command::Insert {
            path: f.string("path")?,
            insert_line: f.integer("insert_line")?,
            insert_text: f.string("insert_text")?,
        }),
        "delete" => Ok(Command::Delete {
            path: f.string("path")?,
        }),
        "rename" => Ok(Command::Rename {
            old_path: f.string("old_path")?,
            new_path: f.string("new_path")?,
        }),
        unknown => Err(format!(
            "Error: unknown command `{}`. Valid commands are: {VALID_LIST}.",
            short(unknown)
        )),
    }
}

/// The fields of one command object, with the command name for messages.
struct Fields<'a> {
    obj: &'a Map<String, Value>,
    command: &'a str,
}

impl Fields<'_> {
    fn missing(&self, field: &str, expected: &str) -> String {
        format!(
            "Error: invalid input for `{}`: missing required field `{field}` ({expected}).",
            self.command
        )
    }

    fn mistyped(&self, field: &str, expected: &str, got: &Value) -> String {
        format!(
            "Error: invalid input for `{}`: field `{field}` must be {expected}, got {}.",
            self.command,
            describe(got)
        )
    }

    fn out_of_range(&self, field: &str, n: &serde_json::Number) -> String {
        let what = match field {
            "insert_line" => "0 puts the text at the start of the file",
            _ => "end_line -1 means the end of the file",
        };
        format!(
            "Error: invalid input for `{}`: field `{field}`: {} is out of range (line numbers go up to 999,999; {what}).",
            self.command,
            number(n)
        )
    }

    fn string(&self, field: &str) -> Result<String, String> {
        match self.obj.get(field) {
            None => Err(self.missing(field, "string")),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(self.mistyped(field, "a string", other)),
        }
    }

    fn optional_string(&self, field: &str) -> Result<Option<String>, String> {
        match self.obj.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(self.mistyped(field, "a string (or absent)", other)),
        }
    }

    fn integer(&self, field: &str) -> Result<i64, String> {
        const EXPECTED: &str = "an integer (a line number, 0 for the start of the file)";
        match self.obj.get(field) {
            None => Err(self.missing(field, "integer")),
            Some(v @ Value::Number(n)) => match whole(n) {
                Whole::Int(i) => Ok(i),
                // A whole number, too big for a line: say that, not that
                // it is no integer.
                Whole::TooLarge => Err(self.out_of_range(field, n)),
                Whole::Fraction => Err(self.mistyped(field, EXPECTED, v)),
            },
            Some(other) => Err(self.mistyped(field, EXPECTED, other)),
        }
    }

    fn view_range(&self) -> Result<Option<[i64; 2]>, String> {
        const FIELD: &str = "view_range";
        const EXPECTED: &str = "an array of two integers [start_line, end_line] (1-based; end_line -1 for the end of the file)";
        match self.obj.get(FIELD) {
            None | Some(Value::Null) => Ok(None),
            Some(v @ Value::Array(items)) => match items.as_slice() {
                [Value::Number(a), Value::Number(b)] => match (whole(a), whole(b)) {
                    (Whole::Int(a), Whole::Int(b)) => Ok(Some([a, b])),
                    (Whole::Fraction, _) | (_, Whole::Fraction) => {
                        Err(self.mistyped_item(FIELD, EXPECTED, items))
                    }
                    // Whole numbers, one too big for a line number: say
                    // that, not that the array has the wrong shape.
                    (Whole::TooLarge, _) => Err(self.out_of_range(FIELD, a)),
                    (_, Whole::TooLarge) => Err(self.out_of_range(FIELD, b)),
                },
                [_, _] => Err(self.mistyped_item(FIELD, EXPECTED, items)),
                _ => Err(self.mistyped(FIELD, EXPECTED, v)),
            },
            Some(other) => Err(self.mistyped(FIELD, EXPECTED, other)),
        }
    }

    /// A pair with an item that is no whole number: which one, and what
    /// it is.
    fn mistyped_item(&self, field: &str, expected: &str, items: &[Value]) -> String {
        let whole =
            |v: &Value| matches!(v, Value::Number(n) if !matches!(whole(n), Whole::Fraction));
        let (which, item) = match items {
            [a, _] if !whole(a) => ("first", a),
            [_, b] => ("second", b),
            _ => return self.mistyped(field, expected, &Value::Array(items.to_vec())),
        };
        let what = match item {
            Value::Number(n) => format!("the number {n}, not a whole number"),
            other => describe(other),
        };
        format!(
            "Error: invalid input for `{}`: field `{field}` must be {expected}, got an array whose {which} item is {what}.",
            self.command
        )
    }
}

/// A JSON number as a line number.
enum Whole {
    Int(i64),
    /// A whole number past `i64` (`u64::MAX`, or a literal past 2^64
    /// that JSON parsing made a float).
    TooLarge,
    Fraction,
}

fn whole(n: &serde_json::Number) -> Whole {
    if let Some(i) = n.as_i64() {
        return Whole::Int(i);
    }
    if n.is_u64() {
        return Whole::TooLarge;
    }
    // A whole number written as a float (`2.0`, `1e3`, `-0`, which JSON
    // parsing makes the float -0.0) is that integer, as the SDK's own
    // tool (pydantic) and JavaScript clients (which cannot tell 2.0 from
    // 2) take it.
    match n.as_f64() {
        Some(f) if f.is_finite() && f.fract() == 0.0 => {
            if f.abs() < 9.2e18 {
                Whole::Int(f as i64)
            } else {
                Whole::TooLarge
            }
        }
        _ => Whole::Fraction,
    }
}

/// What a JSON value is, for messages ("got a number", "got [1, 2, 3]").
fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {}", number(n)),
        Value::String(_) => "a string".to_owned(),
        Value::Array(items) if items.len() == 1 => "an array of 1 item".to_owned(),
        Value::Array(items) => format!("an array of {} items", items.len()),
        Value::Object(_) => "an object".to_owned(),
    }
}

/// A JSON number as written for a person: a whole number that parsing
/// made a float (`1e20`, `18446744073709551616`) in digits, not `1e+20`.
fn number(n: &serde_json::Number) -> String {
    match n.as_f64() {
        Some(f) if !n.is_i64() && !n.is_u64() && f.is_finite() && f.fract() == 0.0 => {
            format!("{f:.0}")
        }
        _ => n.to_string(),
    }
}

/// An echo of untrusted text: escaped and cut to 64 characters.
fn short(s: &str) -> String {
    const MAX: usize = 64;
    let shown = shown(s);
    if shown.chars().count() <= MAX {
        shown
    } else {
        let cut: String = shown.chars().take(MAX).collect();
        format!("{cut}…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(v: Value) -> String {
        parse_command(&v).unwrap_err()
    }

    #[test]
    fn parses_every_command() {
        assert_eq!(
            parse_command(&json!({"command": "view", "path": "/memories"})),
            Ok(Command::View {
                path: "/memories".into(),
                view_range: None
            })
        );
        assert_eq!(
            parse_command(
                &json!({"command": "view", "path": "/memories/a", "view_range": [1, -1]})
            ),
            Ok(Command::View {
                path: "/memories/a".into(),
                view_range: Some([1, -1])
            })
        );
        assert_eq!(
            parse_command(&json!({"command": "view", "path": "/memories/a", "view_range": null})),
            Ok(Command::View {
                path: "/memories/a".into(),
                view_range: None
            })
        );
        assert_eq!(
            parse_command(&json!({"command": "create", "path": "/memories/a", "file_text": "x"})),
            Ok(Command::Create {
                path: "/memories/a".into(),
                file_text: "x".into()
            })
        );
        assert_eq!(
            parse_command(
                &json!({"command": "str_replace", "path": "/memories/a", "old_str": "x"})
            ),
            Ok(Command::StrReplace {
                path: "/memories/a".into(),
                old_str: "x".into(),
                new_str: None
            })
        );
        assert_eq!(
            parse_command(
                &json!({"command": "str_replace", "path": "/memories/a", "old_str": "x", "new_str": null})
            ),
            Ok(Command::StrReplace {
                path: "/memories/a".into(),
                old_str: "x".into(),
                new_str: None
            })
        );
        assert_eq!(
            parse_command(
                &json!({"command": "str_replace", "path": "/memories/a", "old_str": "x", "new_str": "y"})
            ),
            Ok(Command::StrReplace {
                path: "/memories/a".into(),
                old_str: "x".into(),
                new_str: Some("y".into())
            })
        );
        assert_eq!(
            parse_command(
                &json!({"command": "insert", "path": "/memories/a", "insert_line": -3, "insert_text": "t"})
            ),
            Ok(Command::Insert {
                path: "/memories/a".into(),
                insert_line: -3,
                insert_text: "t".into()
            })
        );
        assert_eq!(
            parse_command(&json!({"command": "delete", "path": "/memories/a"})),
            Ok(Command::Delete {
                path: "/memories/a".into()
            })
        );
        assert_eq!(
            parse_command(
                &json!({"command": "rename", "old_path": "/memories/a", "new_path": "/memories/b"})
            ),
            Ok(Command::Rename {
                old_path: "/memories/a".into(),
                new_path: "/memories/b".into()
            })
        );
    }

    #[test]
    fn extra_fields_are_ignored() {
        assert_eq!(
            parse_command(
                &json!({"command": "delete", "path": "/memories/a", "file_text": 3, "x": {}})
            ),
            Ok(Command::Delete {
                path: "/memories/a".into()
            })
        );
    }

    #[test]
    fn agrees_with_serde() {
        let inputs = [
            json!({"command": "view", "path": "/memories", "view_range": [2, 5]}),
            json!({"command": "create", "path": "/memories/a", "file_text": "x\n"}),
            json!({"command": "str_replace", "path": "/memories/a", "old_str": "x", "new_str": "y"}),
            json!({"command": "str_replace", "path": "/memories/a", "old_str": "x"}),
            json!({"command": "insert", "path": "/memories/a", "insert_line": 0, "insert_text": "t"}),
            json!({"command": "delete", "path": "/memories/a"}),
            json!({"command": "rename", "old_path": "/memories/a", "new_path": "/memories/b"}),
        ];
        for input in inputs {
            let ours = parse_command(&input).unwrap();
            let serde: Command = serde_json::from_value(input.clone()).unwrap();
            assert_eq!(ours, serde);
            assert_eq!(serde_json::to_value(&ours).unwrap(), input);
            assert_eq!(Some(ours.name()), input["command"].as_str());
        }
    }

    #[test]
    fn not_an_object() {
        assert_eq!(
            err(json!([1, 2])),
            "Error: invalid input: expected a JSON object with a `command` field (one of `view`, `create`, `str_replace`, `insert`, `delete`, `rename`), got an array of 2 items."
        );
        assert_eq!(
            err(json!("view")),
            "Error: invalid input: expected a JSON object with a `command` field (one of `view`, `create`, `str_replace`, `insert`, `delete`, `rename`), got a string."
        );
        assert!(err(json!(null)).ends_with("got null."));
    }

    #[test]
    fn missing_command() {
        assert_eq!(
            err(json!({"path": "/memories"})),
            "Error: invalid input: missing required field `command` (string, one of `view`, `create`, `str_replace`, `insert`, `delete`, `rename`)."
        );
    }

    #[test]
    fn mistyped_command() {
        assert_eq!(
            err(json!({"command": 1})),
            "Error: invalid input: field `command` must be a string (one of `view`, `create`, `str_replace`, `insert`, `delete`, `rename`), got the number 1."
        );
    }

    #[test]
    fn unknown_command_lists_the_valid_ones() {
        assert_eq!(
            err(json!({"command": "move", "path": "/memories"})),
            "Error: unknown command `move`. Valid commands are: `view`, `create`, `str_replace`, `insert`, `delete`, `rename`."
        );
        assert_eq!(
            err(json!({"command": "View"})),
            "Error: unknown command `View`. Valid commands are: `view`, `create`, `str_replace`, `insert`, `delete`, `rename`."
        );
        // Echoes are escaped and cut.
        let e = err(json!({"command": format!("\u{202e}{}", "x".repeat(200))}));
        assert!(e.starts_with("Error: unknown command `\\u{202e}xxx"), "{e}");
        assert!(e.contains("…`"), "{e}");
        assert!(e.len() < 200, "{e}");
    }

    #[test]
    fn missing_fields_are_named_with_the_command() {
        assert_eq!(
            err(json!({"command": "create", "path": "/memories/a"})),
            "Error: invalid input for `create`: missing required field `file_text` (string)."
        );
        assert_eq!(
            err(json!({"command": "view"})),
            "Error: invalid input for `view`: missing required field `path` (string)."
        );
        assert_eq!(
            err(json!({"command": "str_replace", "path": "/memories/a"})),
            "Error: invalid input for `str_replace`: missing required field `old_str` (string)."
        );
        assert_eq!(
            err(json!({"command": "insert", "path": "/memories/a", "insert_text": "x"})),
            "Error: invalid input for `insert`: missing required field `insert_line` (integer)."
        );
        assert_eq!(
            err(json!({"command": "insert", "path": "/memories/a", "insert_line": 1})),
            "Error: invalid input for `insert`: missing required field `insert_text` (string)."
        );
        assert_eq!(
            err(json!({"command": "delete"})),
            "Error: invalid input for `delete`: missing required field `path` (string)."
        );
        assert_eq!(
            err(json!({"command": "rename", "old_path": "/memories/a"})),
            "Error: invalid input for `rename`: missing required field `new_path` (string)."
        );
    }

    #[test]
    fn a_view_range_item_that_is_no_whole_number_is_named() {
        let e = err(json!({"command": "view", "path": "/memories", "view_range": [1.5, 2]}));
        assert!(
            e.ends_with("got an array whose first item is the number 1.5, not a whole number."),
            "{e}"
        );
        let e = err(json!({"command": "view", "path": "/memories", "view_range": [1, true]}));
        assert!(
            e.ends_with("got an array whose second item is the boolean true."),
            "{e}"
        );
    }

    #[test]
    fn mistyped_fields_name_the_expected_type() {
        assert_eq!(
            err(json!({"command": "create", "path": "/memories/a", "file_text": 12})),
            "Error: invalid input for `create`: field `file_text` must be a string, got the number 12."
        );
        assert_eq!(
            err(json!({"command": "view", "path": ["/memories"]})),
            "Error: invalid input for `view`: field `path` must be a string, got an array of 1 item."
        );
        assert_eq!(
            err(
                json!({"command": "insert", "path": "/memories/a", "insert_line": "2", "insert_text": "x"})
            ),
            "Error: invalid input for `insert`: field `insert_line` must be an integer (a line number, 0 for the start of the file), got a string."
        );
        assert_eq!(
            err(
                json!({"command": "insert", "path": "/memories/a", "insert_line": 1.5, "insert_text": "x"})
            ),
            "Error: invalid input for `insert`: field `insert_line` must be an integer (a line number, 0 for the start of the file), got the number 1.5."
        );
        assert_eq!(
            err(json!({"command": "view", "path": "/memories/a", "view_range": [1, 2, 3]})),
            "Error: invalid input for `view`: field `view_range` must be an array of two integers [start_line, end_line] (1-based; end_line -1 for the end of the file), got an array of 3 items."
        );
        assert!(
            err(json!({"command": "view", "path": "/memories/a", "view_range": "1-2"}))
                .ends_with("got a string.")
        );
        assert!(
            err(json!({"command": "view", "path": "/memories/a", "view_range": [1, "2"]}))
                .contains("field `view_range` must be an array of two integers")
        );
        assert!(
            err(json!({"command": "view", "path": "/memories/a", "view_range": [1.25, 2]}))
                .contains("field `view_range` must be an array of two integers")
        );
        // A whole number written as a float is that integer.
        assert!(matches!(
            parse_command(
                &json!({"command": "view", "path": "/memories/a", "view_range": [1.0, 2e0]})
            ),
            Ok(Command::View {
                view_range: Some([1, 2]),
                ..
            })
        ));
        assert_eq!(
            err(
                json!({"command": "str_replace", "path": "/memories/a", "old_str": "x", "new_str": false})
            ),
            "Error: invalid input for `str_replace`: field `new_str` must be a string (or absent), got the boolean false."
        );
        assert_eq!(
            err(json!({"command": "create", "path": null, "file_text": ""})),
            "Error: invalid input for `create`: field `path` must be a string, got null."
        );
    }

    #[test]
    fn huge_view_range_numbers_are_out_of_range_not_misshapen() {
        for range in [
            json!([1, u64::MAX]),
            json!([u64::MAX, 2]),
            json!([u64::MAX, u64::MAX]),
        ] {
            let e = err(json!({"command": "view", "path": "/memories/a", "view_range": range}));
            assert_eq!(
                e,
                "Error: invalid input for `view`: field `view_range`: 18446744073709551615 is out of range (line numbers go up to 999,999; end_line -1 means the end of the file).",
                "{range}"
            );
        }
        // A fraction is still the wrong type.
        let e =
            err(json!({"command": "view", "path": "/memories/a", "view_range": [u64::MAX, 1.5]}));
        assert!(e.contains("must be an array of two integers"), "{e}");
    }

    #[test]
    fn view_range_numbers_past_2_64_are_out_of_range_and_minus_zero_is_zero() {
        let line = |range: &str| {
            let v: Value = serde_json::from_str(&format!(
                r#"{{"command": "view", "path": "/memories/a", "view_range": {range}}}"#
            ))
            .unwrap();
            parse_command(&v)
        };
        for range in [
            "[1, 99999999999999999999999]",
            "[99999999999999999999999, 1]",
        ] {
            let e = line(range).unwrap_err();
            assert!(
                e.contains("is out of range (line numbers go up to 999,999"),
                "{range}: {e}"
            );
        }
        let Ok(Command::View { view_range, .. }) = line("[-0, -1]") else {
            panic!("[-0, -1] refused")
        };
        assert_eq!(view_range, Some([0, -1]));
        let v: Value = serde_json::from_str(
            r#"{"command": "insert", "path": "/memories/a", "insert_line": -0, "insert_text": "x"}"#,
        )
        .unwrap();
        assert!(matches!(
            parse_command(&v),
            Ok(Command::Insert { insert_line: 0, .. })
        ));
    }

    #[test]
    fn huge_integers_are_out_of_range_not_wrapped_nor_called_fractions() {
        let e = err(
            json!({"command": "insert", "path": "/memories/a", "insert_line": u64::MAX, "insert_text": "x"}),
        );
        assert_eq!(
            e,
            "Error: invalid input for `insert`: field `insert_line`: 18446744073709551615 is out of range (line numbers go up to 999,999; 0 puts the text at the start of the file)."
        );
        for (literal, shown) in [
            ("9223372036854775808", "9223372036854775808"),
            ("1e20", "100000000000000000000"),
            ("18446744073709551616", "18446744073709551616"),
        ] {
            let v: Value = serde_json::from_str(&format!(
                r#"{{"command": "insert", "path": "/memories/a", "insert_line": {literal}, "insert_text": "x"}}"#
            ))
            .unwrap();
            let e = parse_command(&v).unwrap_err();
            assert!(
                e.contains(&format!("`insert_line`: {shown} is out of range")),
                "{literal}: {e}"
            );
        }
        let v: Value = serde_json::from_str(
            r#"{"command": "view", "path": "/memories/a", "view_range": [1, 1e20]}"#,
        )
        .unwrap();
        assert!(
            parse_command(&v)
                .unwrap_err()
                .contains("100000000000000000000 is out of range")
        );
    }
}
