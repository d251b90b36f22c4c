//! A command's answer, as it goes back to Claude in a `tool_result` block.

/// The content of a tool result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// Plain text (every result but image views).
    Text(String),
    /// An image file, returned as a base64 image content block.
    Image {
        /// `image/png` or `image/jpeg`.
        media_type: &'static str,
        /// Standard base64 with padding.
        data_base64: String,
    },
}

/// A command's answer: the content and whether it is an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolResult {
    pub content: Content,
    pub is_error: bool,
}

impl ToolResult {
    /// A successful text result.
    pub fn ok(text: impl Into<String>) -> Self {
        ToolResult {
            content: Content::Text(text.into()),
            is_error: false,
        }
    }

    /// An error text result (`is_error: true`).
    pub fn error(text: impl Into<String>) -> Self {
        ToolResult {
            content: Content::Text(text.into()),
            is_error: true,
        }
    }

    /// The text, when the content is text.
    pub fn text(&self) -> Option<&str> {
        match &self.content {
            Content::Text(t) => Some(t),
            Content::Image { .. } => None,
        }
    }
}
