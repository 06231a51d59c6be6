//! The frames the gateway sends on `/ws`: responses (`res`), events and the close, built by the
//! method handlers and written by the connection.

use serde_json::{Value, json};

use crate::RequestError;

/// A frame for the connection's writer.
#[derive(Debug)]
pub(crate) enum Outgoing {
    /// A response frame, sent as is.
    Frame(Value),
    /// An event; the writer numbers it.
    Event {
        /// The event name (`agent`, `chat`).
        event: &'static str,
        /// Its payload.
        payload: Value,
    },
    /// An event sent outside the numbered sequence (`connect.challenge`).
    Unnumbered {
        /// The event name.
        event: &'static str,
        /// Its payload.
        payload: Value,
    },
    /// Closes the connection with a code and reason.
    Close(u16, String),
}

/// Returns a success response frame.
pub(crate) fn ok(id: &Value, payload: Value) -> Outgoing {
    Outgoing::Frame(json!({"type": "res", "id": id, "ok": true, "payload": payload}))
}

/// Returns an error response frame.
pub(crate) fn err(id: &Value, error: &RequestError) -> Outgoing {
    let mut body =
        json!({"code": error.code(), "message": error.to_string(), "retryable": error.retryable()});
    if let Some(details) = error.details() {
        body["details"] = details;
    }
    Outgoing::Frame(json!({"type": "res", "id": id, "ok": false, "error": body}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_frames_carry_code_message_and_the_request_id() {
        let Outgoing::Frame(frame) = err(&json!("7"), &RequestError::NotConnected) else {
            panic!("not a frame");
        };
        assert_eq!(frame["id"], "7");
        assert_eq!(frame["ok"], false);
        assert_eq!(frame["error"]["code"], "NOT_CONNECTED");
        assert_eq!(frame["error"]["message"], "call connect first");
    }
}
