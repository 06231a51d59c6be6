//! The parts of a chat request the fake model reads, parsed without building the whole body:
//! a request carries the session's whole conversation, and the answer depends only on its last
//! user turn, so message contents stay raw JSON until the few that matter are read. Fields of
//! an unexpected type are read as absent, as a lenient server would.

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

/// A request body: any JSON value parses; the fields below are read when present.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Request<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stream: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stream_options: Option<&'a RawValue>,
    #[serde(borrow, default)]
    reasoning_effort: Option<&'a RawValue>,
    #[serde(borrow, default)]
    thinking: Option<&'a RawValue>,
    #[serde(borrow, default)]
    messages: Option<&'a RawValue>,
}

/// One message of the conversation, its content unparsed.
#[derive(Debug, Deserialize)]
pub(crate) struct Message<'a> {
    #[serde(borrow, default)]
    role: Option<&'a RawValue>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

impl<'a> Request<'a> {
    /// Parses `body`; `Err` only when it is not JSON at all.
    pub(crate) fn parse(body: &'a [u8]) -> Result<Self, serde_json::Error> {
        match serde_json::from_slice::<Self>(body) {
            Ok(request) => Ok(request),
            // Valid JSON that is not an object: nothing to read, as with an empty object.
            Err(err) => serde_json::from_slice::<serde::de::IgnoredAny>(body)
                .map(|_| Self::default())
                .map_err(|_| err),
        }
    }

    /// The `model` field, when it is a string.
    pub(crate) fn model(&self) -> Option<String> {
        string(self.model)
    }

    /// Whether `stream` is `true`.
    pub(crate) fn stream(&self) -> bool {
        is_true(self.stream)
    }

    /// Whether `stream_options.include_usage` is `true`.
    pub(crate) fn include_usage(&self) -> bool {
        #[derive(Deserialize)]
        struct Options<'b> {
            #[serde(borrow, default)]
            include_usage: Option<&'b RawValue>,
        }
        self.stream_options
            .and_then(|raw| serde_json::from_str::<Options<'_>>(raw.get()).ok())
            .is_some_and(|options| is_true(options.include_usage))
    }

    /// OpenAI's `reasoning_effort`, when it is a string.
    pub(crate) fn reasoning_effort(&self) -> Option<String> {
        string(self.reasoning_effort)
    }

    /// Anthropic's `thinking.budget_tokens`, when it is a whole number.
    pub(crate) fn thinking_budget(&self) -> Option<u64> {
        #[derive(Deserialize)]
        struct Thinking {
            #[serde(default)]
            budget_tokens: Option<Value>,
        }
        self.thinking
            .and_then(|raw| serde_json::from_str::<Thinking>(raw.get()).ok())
            .and_then(|thinking| thinking.budget_tokens)
            .and_then(|budget| budget.as_u64())
    }

    /// The conversation's messages (none when `messages` is not an array).
    pub(crate) fn messages(&self) -> Vec<Message<'a>> {
        self.messages
            .and_then(|raw| serde_json::from_str::<Vec<Message<'a>>>(raw.get()).ok())
            .unwrap_or_default()
    }
}

impl Message<'_> {
    /// The role, when it is a string.
    pub(crate) fn role(&self) -> Option<String> {
        string(self.role)
    }

    /// The content, parsed (`null` when absent).
    pub(crate) fn content(&self) -> Value {
        self.content
            .and_then(|raw| serde_json::from_str(raw.get()).ok())
            .unwrap_or(Value::Null)
    }
}

fn string(raw: Option<&RawValue>) -> Option<String> {
    raw.and_then(|raw| serde_json::from_str::<String>(raw.get()).ok())
}

fn is_true(raw: Option<&RawValue>) -> bool {
    raw.is_some_and(|raw| raw.get() == "true")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_of_the_wrong_type_read_as_absent_and_non_objects_as_empty() {
        let body = br#"{"model": 7, "stream": "yes", "stream_options": {"include_usage": true},
                        "reasoning_effort": "high", "thinking": {"budget_tokens": 2048},
                        "messages": [{"role": "user", "content": "hi \"there\""}]}"#;
        let request = Request::parse(body).unwrap();
        assert_eq!(request.model(), None);
        assert!(!request.stream());
        assert!(request.include_usage());
        assert_eq!(request.reasoning_effort().as_deref(), Some("high"));
        assert_eq!(request.thinking_budget(), Some(2048));
        let messages = request.messages();
        assert_eq!(messages[0].role().as_deref(), Some("user"));
        assert_eq!(messages[0].content(), Value::from("hi \"there\""));

        let empty = Request::parse(b"[1, 2]").unwrap();
        assert!(empty.messages().is_empty() && empty.model().is_none());
        assert!(Request::parse(b"{not json").is_err());
    }
}
