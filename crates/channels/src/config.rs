//! `[channels.<name>]`: read by the gateway (webhooks in) and by delivery (replies out).

use std::fmt;

pub use agentloop_proto::DmPolicy;

/// A secret setting; `Debug` never shows it, so configs and errors can be logged.
#[derive(Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Returns the secret itself, for comparing and sending only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether it is unset.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self(value.to_owned())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() { "\"\"" } else { "\"***\"" })
    }
}

/// `[channels]`
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default)]
pub struct ChannelsConfig {
    /// `[channels.telegram]`
    pub telegram: TelegramConfig,
    /// `[channels.slack]`
    pub slack: SlackConfig,
    /// `[channels.webhook.<name>]`: generic signed webhooks.
    pub webhook: std::collections::BTreeMap<String, WebhookConfig>,
}

/// Who may write on a channel's direct messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access<'a> {
    /// The channel's policy.
    pub policy: DmPolicy,
    /// Senders let in whatever the policy (except `disabled`).
    pub allow_from: &'a [String],
}

impl Access<'_> {
    /// Whether `sender` is let in by configuration alone (no pairing looked up).
    pub fn admits(&self, sender: &str) -> bool {
        match self.policy {
            DmPolicy::Open => true,
            DmPolicy::Disabled => false,
            DmPolicy::Pairing | DmPolicy::Allowlist => self.allow_from.iter().any(|s| s == sender),
        }
    }
}

impl ChannelsConfig {
    /// The direct-message policy of the chat-app channel named `channel` (`telegram`, `slack`,
    /// `webhook-<name>`); `None` for the others (the gateway's own clients, the bus), whose
    /// callers are authenticated where they connect.
    pub fn access(&self, channel: &str) -> Option<Access<'_>> {
        let (policy, allow_from) = match channel {
            crate::telegram::CHANNEL => (self.telegram.dm_policy, &self.telegram.allow_from),
            crate::slack::CHANNEL => (self.slack.dm_policy, &self.slack.allow_from),
            _ => {
                let hook = self
                    .webhook
                    .get(channel.strip_prefix(crate::webhook::CHANNEL_PREFIX)?)?;
                (hook.dm_policy, &hook.allow_from)
            }
        };
        Some(Access { policy, allow_from })
    }

    /// Checks what the types cannot: each webhook's name is a subject token and its secret set.
    ///
    /// # Errors
    /// The first problem, naming the setting.
    pub fn validate(&self) -> Result<(), String> {
        for (name, hook) in &self.webhook {
            if !crate::webhook::valid_name(name) {
                return Err(format!(
                    "channels.webhook.{name}: a webhook name is 1 to 32 of a-z, 0-9 and _"
                ));
            }
            if hook.secret.is_empty() {
                return Err(format!(
                    "channels.webhook.{name}.secret is required: requests and replies are signed with it"
                ));
            }
        }
        Ok(())
    }
}

/// `[channels.webhook.<name>]`: a program of your own sending messages in and taking replies.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(default)]
pub struct WebhookConfig {
    /// The HMAC-SHA256 key both directions are signed with.
    pub secret: Secret,
    /// Where replies are POSTed; empty: they go on `<prefix>.deliver.webhook-<name>.<session>`.
    pub url: String,
    /// The agent that answers.
    pub agent_id: String,
    /// Longest `Retry-After` waited out in place.
    pub max_retry_after_ms: u64,
    /// Timeout of one POST.
    pub request_timeout_ms: u64,
    /// Who may write (`open` by default: requests are signed by a program of your own).
    pub dm_policy: DmPolicy,
    /// Senders always let in, whatever the policy (except `disabled`).
    #[serde(deserialize_with = "agentloop_lifecycle::list_or_commas")]
    pub allow_from: Vec<String>,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            secret: Secret::default(),
            url: String::new(),
            agent_id: "main".to_owned(),
            max_retry_after_ms: 30_000,
            request_timeout_ms: 10_000,
            dm_policy: DmPolicy::Open,
            allow_from: Vec::new(),
        }
    }
}

/// `[channels.slack]`: a Slack app with a bot user.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(default)]
pub struct SlackConfig {
    /// The bot user's OAuth token (`xoxb-…`); replies are off without it.
    pub bot_token: Secret,
    /// The app's signing secret; the Events API endpoint refuses every request without it.
    pub signing_secret: Secret,
    /// The Web API's address (tests point it at a fake).
    pub api_base: String,
    /// The agent that answers the app's conversations.
    pub agent_id: String,
    /// Longest `Retry-After` waited out in place.
    pub max_retry_after_ms: u64,
    /// Timeout of one Web API call.
    pub request_timeout_ms: u64,
    /// As `channels.telegram.stream_edit_ms`, with `chat.update`.
    pub stream_edit_ms: u64,
    /// Who may write in direct messages (`pairing` by default).
    pub dm_policy: DmPolicy,
    /// Senders (user ids) always let in, whatever the policy (except `disabled`).
    #[serde(deserialize_with = "agentloop_lifecycle::list_or_commas")]
    pub allow_from: Vec<String>,
}

impl Default for SlackConfig {
    fn default() -> Self {
        Self {
            bot_token: Secret::default(),
            signing_secret: Secret::default(),
            api_base: "https://slack.com".to_owned(),
            agent_id: "main".to_owned(),
            max_retry_after_ms: 30_000,
            request_timeout_ms: 10_000,
            stream_edit_ms: 1_000,
            dm_policy: DmPolicy::Pairing,
            allow_from: Vec::new(),
        }
    }
}

impl SlackConfig {
    /// Whether the Events API endpoint is served (a signing secret is set).
    pub fn receives(&self) -> bool {
        !self.signing_secret.is_empty()
    }

    /// Whether replies are posted (a token is set).
    pub fn sends(&self) -> bool {
        !self.bot_token.is_empty()
    }
}

/// `[channels.telegram]`: a Telegram bot.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(default)]
pub struct TelegramConfig {
    /// The bot's token from @BotFather; replies are off without it.
    pub bot_token: Secret,
    /// What Telegram sends in `X-Telegram-Bot-Api-Secret-Token` (the `secret_token` given to
    /// `setWebhook`); the webhook refuses every request without it.
    pub webhook_secret: Secret,
    /// The Bot API's address (tests point it at a fake).
    pub api_base: String,
    /// The agent that answers the bot's chats.
    pub agent_id: String,
    /// Longest wait a `429 retry_after` is honoured in place before the reply is handed back
    /// for a later delivery.
    pub max_retry_after_ms: u64,
    /// Timeout of one Bot API call.
    pub request_timeout_ms: u64,
    /// While a reply is written, its message is edited in place at most this often
    /// (milliseconds); `0`: only the final reply is posted.
    pub stream_edit_ms: u64,
    /// Takes messages in by long polling (`getUpdates`) instead of the webhook: no public
    /// address needed. One gateway replica only (Telegram serves one poller per bot).
    pub poll: bool,
    /// How long one `getUpdates` waits for a message (seconds).
    pub poll_timeout_s: u64,
    /// Who may write in private chats (`pairing` by default: an unknown sender gets a code
    /// for an operator to approve, and nothing else).
    pub dm_policy: DmPolicy,
    /// Senders (Telegram user ids) always let in, whatever the policy (except `disabled`).
    #[serde(deserialize_with = "agentloop_lifecycle::list_or_commas")]
    pub allow_from: Vec<String>,
}

impl Default for TelegramConfig {
    fn default() -> Self {
        Self {
            bot_token: Secret::default(),
            webhook_secret: Secret::default(),
            api_base: "https://api.telegram.org".to_owned(),
            agent_id: "main".to_owned(),
            max_retry_after_ms: 30_000,
            request_timeout_ms: 10_000,
            stream_edit_ms: 1_000,
            poll: false,
            poll_timeout_s: 25,
            dm_policy: DmPolicy::Pairing,
            allow_from: Vec::new(),
        }
    }
}

impl TelegramConfig {
    /// Whether the gateway long-polls for messages (polling asked for and a token set).
    pub fn polls(&self) -> bool {
        self.poll && self.sends()
    }

    /// Whether the webhook is served (a secret is set).
    pub fn receives(&self) -> bool {
        !self.webhook_secret.is_empty()
    }

    /// Whether replies are posted (a token is set).
    pub fn sends(&self) -> bool {
        !self.bot_token.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_webhook_needs_a_token_name_and_a_secret() {
        let mut config = ChannelsConfig::default();
        config.webhook.insert(
            "crm".into(),
            WebhookConfig {
                secret: "k".into(),
                ..Default::default()
            },
        );
        assert_eq!(config.validate(), Ok(()));
        config
            .webhook
            .insert("a.b".into(), WebhookConfig::default());
        assert!(
            config
                .validate()
                .unwrap_err()
                .contains("channels.webhook.a.b")
        );
        config.webhook.remove("a.b");
        config
            .webhook
            .insert("nokey".into(), WebhookConfig::default());
        assert!(
            config
                .validate()
                .unwrap_err()
                .contains("channels.webhook.nokey.secret")
        );
    }

    #[test]
    fn secrets_never_show_in_debug_output() {
        let secret = Secret::from("hunter2");
        assert_eq!(format!("{secret:?}"), "\"***\"");
    }
}
