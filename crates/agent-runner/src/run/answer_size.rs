//! How much of an answer or a tool result the run keeps.

/// The most bytes of one answer's text the run keeps. The answer travels whole in one bus
/// message (NATS refuses a payload past `max_payload`, 1 MiB by default) and one memory call
/// (4 MiB); an answer past both would be lost on the way with nothing said. About 130,000 tokens
/// of English: no real answer comes near it.
pub(super) const MAX_ANSWER_BYTES: usize = 512 * 1024;

/// The most bytes of one tool result the run keeps. A result is stored in the transcript and
/// sent to the model again on every later turn; an MCP server may send 16 MiB, a remote tool up
/// to the bus's `max_payload`.
pub(super) const MAX_TOOL_RESULT_BYTES: usize = 256 * 1024;

/// The answer's `text` within [`MAX_ANSWER_BYTES`].
pub(super) fn fit(text: String) -> String {
    cut(text, MAX_ANSWER_BYTES, "answer")
}

/// A tool's result within [`MAX_TOOL_RESULT_BYTES`].
pub(super) fn fit_tool_result(text: String) -> String {
    cut(text, MAX_TOOL_RESULT_BYTES, "tool result")
}

/// `text` cut to `max` bytes on a character boundary, with a line saying what was cut.
fn cut(text: String, max: usize, what: &str) -> String {
    if text.len() <= max {
        return text;
    }
    let size = text.len();
    let mut kept = text;
    kept.truncate(kept.floor_char_boundary(max));
    kept.push_str(&format!(
        "\n\n[the {what} was cut here: it was {size} bytes, more than the {max} one {what} may hold]"
    ));
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_past_the_cap_is_cut_on_a_character_and_says_so() {
        assert_eq!(fit("short".to_owned()), "short");
        let long = "é".repeat(MAX_ANSWER_BYTES); // two bytes each
        let cut = fit(long);
        let (kept, note) = cut.split_once("\n\n[").unwrap();
        assert!(kept.len() <= MAX_ANSWER_BYTES && kept.chars().all(|c| c == 'é'));
        assert!(
            note.contains(&format!("{} bytes", 2 * MAX_ANSWER_BYTES)),
            "{note}"
        );
    }

    #[test]
    fn a_tool_result_past_its_cap_is_cut_and_says_so() {
        let exact = "x".repeat(MAX_TOOL_RESULT_BYTES);
        assert_eq!(fit_tool_result(exact.clone()), exact);
        let cut = fit_tool_result(format!("{exact}y"));
        let (kept, note) = cut.split_once("\n\n[").unwrap();
        assert_eq!(kept, exact, "the byte past the cap is gone");
        assert!(note.starts_with("the tool result was cut"), "{note}");
    }
}
