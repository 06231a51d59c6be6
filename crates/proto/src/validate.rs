//! Checks every service applies to an inbound message before acting on it.

use crate::v1::InboundMessage;

/// Longest accepted session key, in bytes.
pub const MAX_SESSION_KEY_LEN: usize = 512;
/// Longest accepted message text, in bytes.
pub const MAX_TEXT_LEN: usize = 256 * 1024;

/// What to do with a message that arrives while its session is running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueMode {
    /// Inject at the next safe point of the live run.
    Steer,
    /// Run after the live run ends.
    #[default]
    Followup,
    /// Merge queued messages into one follow-up.
    Collect,
    /// Abort the live run, then run this message.
    Interrupt,
}

impl QueueMode {
    /// Parses the lowercase word of DESIGN.md; an empty string is `None`.
    ///
    /// # Errors
    /// [`ValidationError::QueueMode`] for any other word.
    pub fn parse(word: &str) -> Result<Option<Self>, ValidationError> {
        match word {
            "" => Ok(None),
            "steer" => Ok(Some(QueueMode::Steer)),
            "followup" => Ok(Some(QueueMode::Followup)),
            "collect" => Ok(Some(QueueMode::Collect)),
            "interrupt" => Ok(Some(QueueMode::Interrupt)),
            other => Err(ValidationError::QueueMode(other.to_owned())),
        }
    }

    /// Returns the lowercase word for this mode.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueMode::Steer => "steer",
            QueueMode::Followup => "followup",
            QueueMode::Collect => "collect",
            QueueMode::Interrupt => "interrupt",
        }
    }
}

/// Why a message was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    /// `sessionKey` is empty.
    #[error("sessionKey is required")]
    MissingSessionKey,
    /// `text` is empty.
    #[error("text is required")]
    MissingText,
    /// `sessionKey` is longer than allowed.
    #[error("sessionKey is longer than {MAX_SESSION_KEY_LEN} bytes")]
    SessionKeyTooLong,
    /// `text` is longer than allowed.
    #[error("text is longer than {MAX_TEXT_LEN} bytes")]
    TextTooLong,
    /// `queueMode` is not one of the known words.
    #[error("queueMode {0:?} is not one of steer, followup, collect, interrupt")]
    QueueMode(String),
}

/// Validates an inbound message and fills the channel from the subject when it is empty.
///
/// # Errors
/// The first [`ValidationError`] found.
pub fn validate_inbound(
    msg: &mut InboundMessage,
    subject_channel: &str,
) -> Result<(), ValidationError> {
    if msg.session_key.trim().is_empty() {
        return Err(ValidationError::MissingSessionKey);
    }
    if msg.session_key.len() > MAX_SESSION_KEY_LEN {
        return Err(ValidationError::SessionKeyTooLong);
    }
    if msg.text.trim().is_empty() {
        return Err(ValidationError::MissingText);
    }
    if msg.text.len() > MAX_TEXT_LEN {
        return Err(ValidationError::TextTooLong);
    }
    QueueMode::parse(&msg.queue_mode)?;
    if msg.channel.is_empty() {
        msg.channel = subject_channel.to_owned();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(key: &str, text: &str) -> InboundMessage {
        InboundMessage {
            session_key: key.into(),
            text: text.into(),
            ..Default::default()
        }
    }

    #[test]
    fn missing_text_is_refused() {
        assert_eq!(
            validate_inbound(&mut msg("k", " "), "cli"),
            Err(ValidationError::MissingText)
        );
        assert_eq!(
            validate_inbound(&mut msg("", "x"), "cli"),
            Err(ValidationError::MissingSessionKey)
        );
    }

    #[test]
    fn channel_defaults_to_subject_token() {
        let mut m = msg("k", "hello");
        validate_inbound(&mut m, "cli").unwrap();
        assert_eq!(m.channel, "cli");
    }

    #[test]
    fn unknown_queue_mode_is_refused() {
        let mut m = msg("k", "hello");
        m.queue_mode = "later".into();
        assert!(matches!(
            validate_inbound(&mut m, "cli"),
            Err(ValidationError::QueueMode(_))
        ));
    }
}
