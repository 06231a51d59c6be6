//! Pieces shared by both protocols: the reply context, SSE framing and chunking.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

/// Per-request values a rendered reply needs.
#[derive(Debug, Clone)]
pub(crate) struct ReplyContext {
    pub id: u64,
    pub model: String,
    pub input_tokens: u64,
    pub include_usage: bool,
}

/// Returns a JSON response with `status`.
pub(crate) fn json_response(status: StatusCode, body: &serde_json::Value) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body.to_string(),
    )
        .into_response()
}

/// Returns one SSE frame: an optional `event:` line and one `data:` line.
pub(crate) fn sse_frame(event: Option<&str>, data: &str) -> Bytes {
    let mut frame = String::with_capacity(data.len() + 32);
    if let Some(event) = event {
        frame.push_str("event: ");
        frame.push_str(event);
        frame.push('\n');
    }
    frame.push_str("data: ");
    frame.push_str(data);
    frame.push_str("\n\n");
    Bytes::from(frame)
}

/// Returns a `text/event-stream` response sending `frames`, `chunk_delay` apart.
pub(crate) fn sse_response(frames: Vec<Bytes>, chunk_delay: Duration) -> Response {
    let body = if chunk_delay.is_zero() {
        Body::from_stream(futures::stream::iter(
            frames.into_iter().map(Ok::<_, Infallible>),
        ))
    } else {
        let stream = futures::stream::unfold(
            (frames.into_iter(), true),
            move |(mut frames, first)| async move {
                let frame = frames.next()?;
                if !first {
                    tokio::time::sleep(chunk_delay).await;
                }
                Some((Ok::<_, Infallible>(frame), (frames, false)))
            },
        );
        Body::from_stream(stream)
    };
    (
        StatusCode::OK,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        body,
    )
        .into_response()
}

/// Splits text into word pieces that keep their trailing whitespace.
pub(crate) fn text_pieces(text: &str) -> impl Iterator<Item = &str> {
    text.split_inclusive(char::is_whitespace)
}

/// Splits tool arguments into about three pieces on char boundaries.
pub(crate) fn argument_pieces(arguments: &str) -> Vec<&str> {
    let target = arguments.len().div_ceil(3).max(1);
    let mut pieces = Vec::with_capacity(4);
    let mut start = 0;
    while start < arguments.len() {
        let mut end = (start + target).min(arguments.len());
        while !arguments.is_char_boundary(end) {
            end += 1;
        }
        pieces.push(&arguments[start..end]);
        start = end;
    }
    pieces
}

/// Returns the current Unix time in seconds.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_concatenate_back_to_the_input() {
        let text = "echo: hello  wide wörld";
        assert_eq!(text_pieces(text).collect::<String>(), text);
        assert!(text_pieces(text).count() > 2);
        let args = r#"{"q":"wörld","n":1}"#;
        let pieces = argument_pieces(args);
        assert!(pieces.len() >= 2);
        assert_eq!(pieces.concat(), args);
    }
}
