//! How much of an answer the run keeps.

/// The most bytes of one answer's text the run keeps. The answer travels whole in one bus
/// message (NATS refuses a payload past `max_payload`, 1 MiB by default) and one memory call
/// (4 MiB); an answer past both would be lost on the way with nothing said. About 130,000 tokens
/// of English: no real answer comes near it.
pub(super) const MAX_ANSWER_BYTES: usize = 512 * 1024;

/// `text` cut to [`MAX_ANSWER_BYTES`] on a character boundary, with a line saying so.
pub(super) fn fit(text: String) -> String {
    if text.len() <= MAX_ANSWER_BYTES {
        return text;
    }
    let size = text.len();
    let mut kept = text;
    kept.truncate(kept.floor_char_boundary(MAX_ANSWER_BYTES));
    kept.push_str(&format!(
        "\n\n[the answer was cut here: it was {size} bytes, more than the {MAX_ANSWER_BYTES} one answer may hold]"
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
}
