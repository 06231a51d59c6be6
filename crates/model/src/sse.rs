//! A small incremental server-sent events parser: lines may be split across network chunks.

use std::borrow::Cow;

/// One dispatched SSE event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SseEvent {
    /// The `event:` field, when present.
    pub event: Option<String>,
    /// The `data:` lines, joined with `\n`.
    pub data: String,
}

/// Incremental parser; feed it chunks, it yields complete events.
#[derive(Debug, Default)]
pub(crate) struct SseParser {
    /// Bytes of a line not yet terminated.
    partial: Vec<u8>,
    event: Option<String>,
    data: String,
    has_data: bool,
}

impl SseParser {
    /// Feeds one chunk; complete events are appended to `out`.
    pub(crate) fn push(&mut self, mut chunk: &[u8], out: &mut Vec<SseEvent>) {
        // Every byte of a model's stream passes here: the line ends are found by `memchr`, which
        // looks at a word at a time instead of a byte.
        while let Some(newline) = memchr::memchr(b'\n', chunk) {
            let (line, rest) = chunk.split_at(newline);
            chunk = &rest[1..];
            if self.partial.is_empty() {
                self.line(line, out);
            } else {
                // Take the buffer out so `line` can borrow `self` mutably.
                let mut partial = std::mem::take(&mut self.partial);
                partial.extend_from_slice(line);
                self.line(&partial, out);
                partial.clear();
                self.partial = partial;
            }
        }
        self.partial.extend_from_slice(chunk);
    }

    /// Flushes a final event not followed by a blank line (servers that close early).
    pub(crate) fn finish(&mut self, out: &mut Vec<SseEvent>) {
        if !self.partial.is_empty() {
            let partial = std::mem::take(&mut self.partial);
            self.line(&partial, out);
        }
        self.dispatch(out);
    }

    fn line(&mut self, line: &[u8], out: &mut Vec<SseEvent>) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if line[0] == b':' {
            return; // a comment, used as keep-alive
        }
        // Valid text (all of it, in practice) is checked by the word-at-a-time ASCII path.
        let line = match std::str::from_utf8(line) {
            Ok(text) => Cow::Borrowed(text),
            Err(_) => String::from_utf8_lossy(line),
        };
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line.as_ref(), ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.event = Some(value.to_owned()),
            _ => {} // id, retry and unknown fields do not matter here
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        if self.has_data {
            out.push(SseEvent {
                event: self.event.take(),
                data: std::mem::take(&mut self.data),
            });
        }
        self.event = None;
        self.has_data = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_in_pieces(input: &[u8], size: usize) -> Vec<SseEvent> {
        let mut parser = SseParser::default();
        let mut out = Vec::new();
        for chunk in input.chunks(size) {
            parser.push(chunk, &mut out);
        }
        parser.finish(&mut out);
        out
    }

    #[test]
    fn events_survive_any_chunking_and_crlf() {
        let input = b": keep-alive\r\nevent: message_start\r\ndata: {\"a\":1}\r\n\r\ndata: one\ndata: two\n\ndata:[DONE]";
        for size in 1..input.len() {
            let events = parse_in_pieces(input, size);
            assert_eq!(
                events,
                vec![
                    SseEvent {
                        event: Some("message_start".into()),
                        data: "{\"a\":1}".into()
                    },
                    SseEvent {
                        event: None,
                        data: "one\ntwo".into()
                    },
                    SseEvent {
                        event: None,
                        data: "[DONE]".into()
                    },
                ],
                "chunk size {size}"
            );
        }
    }

    #[test]
    fn multibyte_text_split_anywhere_survives_and_invalid_bytes_are_replaced() {
        let input = "data: caf\u{e9} \u{1f600}\n\n".as_bytes();
        for size in 1..input.len() {
            assert_eq!(
                parse_in_pieces(input, size)[0].data,
                "caf\u{e9} \u{1f600}",
                "chunk size {size}"
            );
        }
        let events = parse_in_pieces(b"data: a\xffb\n\n", 4);
        assert_eq!(events[0].data, "a\u{fffd}b");
    }
}
