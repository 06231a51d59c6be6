//! Splitting a reply a chat app would refuse as too long.

/// Splits `text` into pieces of at most `max` UTF-16 code units (how Telegram and Slack count),
/// cutting at the last paragraph break that fits, else a line break, else a sentence end, else
/// a space, else anywhere between characters. Pieces are trimmed; none is empty.
pub fn chunk(text: &str, max: usize) -> Vec<String> {
    let max = max.max(1);
    let mut pieces = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        if units(rest) <= max {
            pieces.push(rest.to_owned());
            break;
        }
        let fits = prefix_within(rest, max);
        let window = &rest[..fits];
        let cut = ["\n\n", "\n", ". ", "! ", "? ", " "]
            .iter()
            .find_map(|sep| {
                window
                    .rfind(sep)
                    .filter(|&at| at > 0)
                    .map(|at| at + sep.len())
            })
            .unwrap_or(fits);
        let (piece, tail) = rest.split_at(cut);
        let piece = piece.trim();
        if !piece.is_empty() {
            pieces.push(piece.to_owned());
        }
        rest = tail.trim_start();
    }
    pieces
}

fn units(text: &str) -> usize {
    text.encode_utf16().count()
}

/// The byte length of the longest prefix of `text` within `max` UTF-16 units (at least one
/// character, so a cut always advances).
fn prefix_within(text: &str, max: usize) -> usize {
    let mut used = 0;
    for (at, ch) in text.char_indices() {
        used += ch.len_utf16();
        if used > max {
            return if at == 0 { ch.len_utf8() } else { at };
        }
    }
    text.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_text_is_one_piece() {
        assert_eq!(chunk("  hello  ", 10), vec!["hello"]);
        assert!(chunk("   ", 10).is_empty());
    }

    #[test]
    fn cuts_prefer_paragraphs_then_sentences_then_words() {
        let text = "First para.\n\nSecond one is here. And more";
        assert_eq!(
            chunk(text, 20),
            vec!["First para.", "Second one is here.", "And more"]
        );
        assert_eq!(chunk("aaa bbb ccc", 8), vec!["aaa bbb", "ccc"]);
    }

    #[test]
    fn every_piece_fits_and_nothing_is_lost() {
        let text = "word ".repeat(3000) + &"x".repeat(9000);
        let pieces = chunk(&text, 4096);
        assert!(pieces.iter().all(|p| p.encode_utf16().count() <= 4096));
        let joined: String = pieces.concat();
        let squeezed: String = text.split_whitespace().collect();
        assert_eq!(joined.split_whitespace().collect::<String>(), squeezed);
    }

    #[test]
    fn characters_outside_the_basic_plane_count_twice_and_are_never_split() {
        let text = "😀".repeat(5);
        let pieces = chunk(&text, 4);
        assert_eq!(pieces, vec!["😀😀", "😀😀", "😀"]);
    }
}
