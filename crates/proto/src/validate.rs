//! Checks every service applies to an inbound message before acting on it.

use crate::v1::{InboundMessage, RunCommand};

/// Longest accepted session key, in bytes.
pub const MAX_SESSION_KEY_LEN: usize = 512;
/// Longest accepted message text, in bytes.
pub const MAX_TEXT_LEN: usize = 256 * 1024;
/// Longest accepted idempotency key, in bytes: it is stored under a unique index, whose rows
/// Postgres caps at about 2.7 KB, and travels in stream headers.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 256;
/// Longest accepted `channel`, `senderId` or `agentId`, in bytes: each is stored under a unique
/// index (sessions, pairing, per-user memory) and appears in subjects and metric labels.
pub const MAX_NAME_LEN: usize = 256;
/// Most bytes accepted in `metadata`, keys and values together: a message carries it to the
/// router, the runner and delivery, and NATS refuses a payload past 1 MiB.
pub const MAX_METADATA_LEN: usize = 64 * 1024;

use crate::kinds::QueueMode;

impl QueueMode {
    /// Parses an optional mode: an empty string is `None` (the session's or agent's default).
    ///
    /// # Errors
    /// [`ValidationError::QueueMode`] for any word that is not a mode.
    pub fn parse(word: &str) -> Result<Option<Self>, ValidationError> {
        if word.is_empty() {
            return Ok(None);
        }
        word.parse()
            .map(Some)
            .map_err(|_| ValidationError::QueueMode(word.to_owned()))
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
    /// `idempotencyKey` is longer than allowed.
    #[error("idempotencyKey is longer than {MAX_IDEMPOTENCY_KEY_LEN} bytes")]
    IdempotencyKeyTooLong,
    /// A name (`channel`, `senderId`, `agentId`) is longer than allowed.
    #[error("{0} is longer than {MAX_NAME_LEN} bytes")]
    NameTooLong(Field),
    /// `metadata` holds more than allowed.
    #[error("metadata holds more than {MAX_METADATA_LEN} bytes")]
    MetadataTooLarge,
    /// A text field holds a NUL byte, which Postgres text columns cannot store.
    #[error("{0} contains a NUL byte (U+0000), which cannot be stored")]
    Nul(Field),
}

/// A field of a message, named as on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// `sessionKey`.
    SessionKey,
    /// `text`.
    Text,
    /// `channel`.
    Channel,
    /// `senderId`.
    SenderId,
    /// `idempotencyKey`.
    IdempotencyKey,
    /// `agentId`.
    AgentId,
    /// A key or value of `metadata`.
    Metadata,
    /// `replySubject`.
    ReplySubject,
}

impl std::fmt::Display for Field {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Field::SessionKey => "sessionKey",
            Field::Text => "text",
            Field::Channel => "channel",
            Field::SenderId => "senderId",
            Field::IdempotencyKey => "idempotencyKey",
            Field::AgentId => "agentId",
            Field::Metadata => "metadata",
            Field::ReplySubject => "replySubject",
        })
    }
}

/// Refuses a NUL byte in `value`. A NUL is refused rather than stripped: the text reaches
/// Postgres (whose text columns cannot hold it) and the model, and silently changing what a
/// user sent would make the transcript disagree with the input.
///
/// # Errors
/// [`ValidationError::Nul`] naming `field`.
pub fn refuse_nul(field: Field, value: &str) -> Result<(), ValidationError> {
    // `<[u8]>::contains` on bytes is a memchr scan: cheap enough for every message.
    if value.as_bytes().contains(&0) {
        return Err(ValidationError::Nul(field));
    }
    Ok(())
}

/// Validates an inbound message and fills the channel from the subject when it is empty.
///
/// # Errors
/// The first [`ValidationError`] found.
pub fn validate_inbound(
    msg: &mut InboundMessage,
    subject_channel: &str,
) -> Result<(), ValidationError> {
    check_key_and_text(&msg.session_key, &msg.text)?;
    QueueMode::parse(&msg.queue_mode)?;
    refuse_nul(Field::SessionKey, &msg.session_key)?;
    refuse_nul(Field::Text, &msg.text)?;
    refuse_nul(Field::Channel, &msg.channel)?;
    refuse_nul(Field::SenderId, &msg.sender_id)?;
    refuse_nul(Field::IdempotencyKey, &msg.idempotency_key)?;
    refuse_nul(Field::AgentId, &msg.agent_id)?;
    refuse_nul(Field::ReplySubject, &msg.reply_subject)?;
    check_names(&msg.channel, &msg.sender_id, &msg.agent_id)?;
    check_key_and_metadata(&msg.idempotency_key, &msg.metadata)?;
    if msg.channel.is_empty() {
        msg.channel = subject_channel.to_owned();
    }
    Ok(())
}

/// Re-checks a run command at the runner's intake: the bus is not trusted to carry only what
/// the router let through, and a NUL reaching the transcript would fail every write of its run.
///
/// # Errors
/// The first [`ValidationError`] found.
pub fn validate_run_command(cmd: &RunCommand) -> Result<(), ValidationError> {
    check_key_and_text(&cmd.session_key, &cmd.text)?;
    QueueMode::parse(&cmd.queue_mode)?;
    refuse_nul(Field::SessionKey, &cmd.session_key)?;
    refuse_nul(Field::Text, &cmd.text)?;
    refuse_nul(Field::Channel, &cmd.channel)?;
    refuse_nul(Field::SenderId, &cmd.sender_id)?;
    refuse_nul(Field::IdempotencyKey, &cmd.idempotency_key)?;
    refuse_nul(Field::AgentId, &cmd.agent_id)?;
    refuse_nul(Field::ReplySubject, &cmd.reply_subject)?;
    check_names(&cmd.channel, &cmd.sender_id, &cmd.agent_id)?;
    check_key_and_metadata(&cmd.idempotency_key, &cmd.metadata)
}

/// The channel, sender and agent within [`MAX_NAME_LEN`].
fn check_names(channel: &str, sender_id: &str, agent_id: &str) -> Result<(), ValidationError> {
    for (field, value) in [
        (Field::Channel, channel),
        (Field::SenderId, sender_id),
        (Field::AgentId, agent_id),
    ] {
        if value.len() > MAX_NAME_LEN {
            return Err(ValidationError::NameTooLong(field));
        }
    }
    Ok(())
}

/// The idempotency key and metadata within their caps, and no NUL in the metadata.
fn check_key_and_metadata(
    idempotency_key: &str,
    metadata: &std::collections::HashMap<String, String>,
) -> Result<(), ValidationError> {
    if idempotency_key.len() > MAX_IDEMPOTENCY_KEY_LEN {
        return Err(ValidationError::IdempotencyKeyTooLong);
    }
    let mut size = 0;
    for (key, value) in metadata {
        refuse_nul(Field::Metadata, key)?;
        refuse_nul(Field::Metadata, value)?;
        size += key.len() + value.len();
    }
    if size > MAX_METADATA_LEN {
        return Err(ValidationError::MetadataTooLarge);
    }
    Ok(())
}

/// The rules every message to a session obeys, inbound or as a run command: a session key and
/// a text that are not blank, each within its cap.
fn check_key_and_text(session_key: &str, text: &str) -> Result<(), ValidationError> {
    if session_key.trim().is_empty() {
        return Err(ValidationError::MissingSessionKey);
    }
    if session_key.len() > MAX_SESSION_KEY_LEN {
        return Err(ValidationError::SessionKeyTooLong);
    }
    if text.trim().is_empty() {
        return Err(ValidationError::MissingText);
    }
    if text.len() > MAX_TEXT_LEN {
        return Err(ValidationError::TextTooLong);
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
    fn an_idempotency_key_or_metadata_past_its_cap_is_refused() {
        let mut m = msg("k", "hi");
        m.idempotency_key = "k".repeat(MAX_IDEMPOTENCY_KEY_LEN);
        validate_inbound(&mut m, "cli").unwrap();
        m.idempotency_key.push('k');
        assert_eq!(
            validate_inbound(&mut m, "cli"),
            Err(ValidationError::IdempotencyKeyTooLong)
        );
        let mut m = msg("k", "hi");
        m.metadata
            .insert("a".into(), "v".repeat(MAX_METADATA_LEN - 1));
        validate_inbound(&mut m, "cli").unwrap();
        m.metadata.insert("b".into(), String::new());
        assert_eq!(
            validate_inbound(&mut m, "cli"),
            Err(ValidationError::MetadataTooLarge)
        );
        let cmd = RunCommand {
            session_key: "k".into(),
            text: "hi".into(),
            metadata: m.metadata,
            ..Default::default()
        };
        assert_eq!(
            validate_run_command(&cmd),
            Err(ValidationError::MetadataTooLarge)
        );
    }

    #[test]
    fn a_channel_sender_or_agent_past_its_cap_is_refused_by_name() {
        let at_cap = "n".repeat(MAX_NAME_LEN);
        let mut m = msg("k", "hi");
        (m.channel, m.sender_id, m.agent_id) = (at_cap.clone(), at_cap.clone(), at_cap.clone());
        validate_inbound(&mut m, "cli").unwrap();
        let over = format!("{at_cap}n");
        for field in [Field::Channel, Field::SenderId, Field::AgentId] {
            let mut m = msg("k", "hi");
            let mut cmd = RunCommand {
                session_key: "k".into(),
                text: "hi".into(),
                ..Default::default()
            };
            match field {
                Field::Channel => (m.channel, cmd.channel) = (over.clone(), over.clone()),
                Field::SenderId => (m.sender_id, cmd.sender_id) = (over.clone(), over.clone()),
                _ => (m.agent_id, cmd.agent_id) = (over.clone(), over.clone()),
            }
            let refused = Err(ValidationError::NameTooLong(field));
            assert_eq!(validate_inbound(&mut m, "cli"), refused);
            assert_eq!(validate_run_command(&cmd), refused);
        }
    }

    #[test]
    fn channel_defaults_to_subject_token() {
        let mut m = msg("k", "hello");
        validate_inbound(&mut m, "cli").unwrap();
        assert_eq!(m.channel, "cli");
    }

    #[test]
    fn a_nul_is_refused_in_every_stored_field() {
        assert_eq!(
            validate_inbound(&mut msg("k", "a\0b"), "cli"),
            Err(ValidationError::Nul(Field::Text))
        );
        assert_eq!(
            validate_inbound(&mut msg("k\0", "hello"), "cli"),
            Err(ValidationError::Nul(Field::SessionKey))
        );
        let mut m = msg("k", "hello");
        m.metadata.insert("note".into(), "x\0".into());
        assert_eq!(
            validate_inbound(&mut m, "cli"),
            Err(ValidationError::Nul(Field::Metadata))
        );
        let mut m = msg("k", "hello");
        m.sender_id = "\0".into();
        assert_eq!(
            validate_inbound(&mut m, "cli"),
            Err(ValidationError::Nul(Field::SenderId))
        );
        assert!(
            ValidationError::Nul(Field::SessionKey)
                .to_string()
                .starts_with("sessionKey contains a NUL")
        );
    }

    #[test]
    fn a_run_command_with_a_nul_is_refused() {
        let mut cmd = RunCommand {
            session_key: "k".into(),
            text: "hello".into(),
            ..Default::default()
        };
        assert_eq!(validate_run_command(&cmd), Ok(()));
        cmd.text = "he\0llo".into();
        assert_eq!(
            validate_run_command(&cmd),
            Err(ValidationError::Nul(Field::Text))
        );
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
