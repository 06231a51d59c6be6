//! Chat-app channels: what their webhooks send (parsed into one normalized [`Inbound`]), the
//! session key a conversation maps to, and the calls that post replies to them. The gateway
//! takes webhooks in through this crate and delivery posts replies through it; neither knows an
//! app's wire format.
//!
//! Configured under `[channels.<name>]`; a channel without its secrets is off.

mod chunk;
mod config;
mod http;
mod signed;
pub mod slack;
pub mod telegram;
pub mod webhook;

pub use chunk::chunk;
pub use config::{
    Access, ChannelsConfig, DmPolicy, Secret, SlackConfig, TelegramConfig, WebhookConfig,
};
pub use signed::REPLAY_WINDOW;

use std::collections::HashMap;

use agentloop_proto::v1::InboundMessage;

/// Metadata keys an inbound message carries so its reply finds its way back (the runner copies
/// a command's metadata onto its reply).
pub mod meta {
    /// The chat (Telegram `chat.id`).
    pub const CHAT: &str = "channel.chat";
    /// The platform's id of the message replied to.
    pub const MESSAGE: &str = "channel.message";
    /// The thread or forum topic, when there is one.
    pub const THREAD: &str = "channel.thread";
    /// Set when the conversation is a group (replies quote the message they answer).
    pub const GROUP: &str = "channel.group";
}

/// Why a chat app did not take a reply.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// Try again: rate limited (after `retry_after`), the app failing, or the network.
    #[error("{reason}")]
    Transient {
        /// What the app or the network said.
        reason: String,
        /// How long the app asked to wait (Telegram's `retry_after`, Slack's `Retry-After`).
        retry_after: Option<std::time::Duration>,
    },
    /// Trying again cannot help (chat not found, bot blocked, bad token).
    #[error("{0}")]
    Permanent(String),
}

/// Whether a conversation is one person or many.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conversation {
    /// A direct message with one person.
    Direct,
    /// A group, supergroup or channel.
    Group,
}

/// A message from a chat app, in terms every channel shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inbound {
    /// The channel's name (`telegram`, `webhook-<name>`).
    pub channel: String,
    /// Direct or group.
    pub conversation: Conversation,
    /// The chat: the person for a direct message, the group otherwise.
    pub chat: String,
    /// The thread or topic inside the chat, when there is one.
    pub thread: Option<String>,
    /// The platform's id of this message, unique within its chat.
    pub message_id: String,
    /// Who wrote it.
    pub sender: String,
    /// What they wrote.
    pub text: String,
}

impl Inbound {
    /// The session this message belongs to, OpenClaw's way:
    /// `agent:<agent>:<channel>:direct:<peer>` or `agent:<agent>:<channel>:group:<chat>`, with
    /// `:thread:<thread>` appended inside a thread.
    pub fn session_key(&self, agent: &str) -> String {
        let kind = match self.conversation {
            Conversation::Direct => "direct",
            Conversation::Group => "group",
        };
        let mut key = format!("agent:{agent}:{}:{kind}:{}", self.channel, self.chat);
        if let Some(thread) = &self.thread {
            key.push_str(":thread:");
            key.push_str(thread);
        }
        key
    }

    /// The key that makes a redelivered webhook one message: the platform's message id within
    /// its chat, the same on every gateway replica.
    pub fn idempotency_key(&self) -> String {
        format!("{}:{}:{}", self.channel, self.chat, self.message_id)
    }

    /// The InboundMessage for `agent`, carrying what the reply needs to find its chat.
    pub fn into_message(self, agent: &str) -> InboundMessage {
        let mut metadata = HashMap::new();
        metadata.insert(meta::CHAT.to_owned(), self.chat.clone());
        metadata.insert(meta::MESSAGE.to_owned(), self.message_id.clone());
        if let Some(thread) = &self.thread {
            metadata.insert(meta::THREAD.to_owned(), thread.clone());
        }
        if self.conversation == Conversation::Group {
            metadata.insert(meta::GROUP.to_owned(), "true".to_owned());
        }
        InboundMessage {
            session_key: self.session_key(agent),
            idempotency_key: self.idempotency_key(),
            channel: self.channel.clone(),
            sender_id: self.sender,
            text: self.text,
            agent_id: agent.to_owned(),
            metadata,
            received_at: Some(agentloop_proto::now()),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inbound(conversation: Conversation, thread: Option<&str>) -> Inbound {
        Inbound {
            channel: "telegram".to_owned(),
            conversation,
            chat: "42".into(),
            thread: thread.map(str::to_owned),
            message_id: "7".into(),
            sender: "42".into(),
            text: "hi".into(),
        }
    }

    #[test]
    fn session_keys_follow_openclaws_shape() {
        assert_eq!(
            inbound(Conversation::Direct, None).session_key("main"),
            "agent:main:telegram:direct:42"
        );
        assert_eq!(
            inbound(Conversation::Group, Some("3")).session_key("ops"),
            "agent:ops:telegram:group:42:thread:3"
        );
    }

    #[test]
    fn the_message_carries_its_way_back() {
        let msg = inbound(Conversation::Group, Some("3")).into_message("main");
        assert_eq!(msg.idempotency_key, "telegram:42:7");
        assert_eq!(msg.metadata[meta::CHAT], "42");
        assert_eq!(msg.metadata[meta::MESSAGE], "7");
        assert_eq!(msg.metadata[meta::THREAD], "3");
        assert_eq!(msg.metadata[meta::GROUP], "true");
        assert_eq!(msg.channel, "telegram");
    }
}
