//! Replies to chat apps (`[channels.<name>]`): chunked to the app's length limit, each piece
//! remembered once posted, so a retry after a later piece failed does not post the earlier
//! ones again; rate limits waited out as the app asks; a refusal for good told apart.

use std::sync::Mutex;
use std::time::Duration;

use agentloop_channels::{
    ChannelsConfig, chunk, meta,
    telegram::{self, SendError, Target},
};
use agentloop_proto::v1::OutboundMessage;

use crate::failure::Failure;
use crate::recent::Recent;

/// Calls of one piece at most (the first and the retries after a `retry_after`).
const ATTEMPTS: u32 = 3;

/// The chat apps delivery posts to.
pub(crate) struct Apps {
    telegram: Option<TelegramOut>,
}

struct TelegramOut {
    client: telegram::Client,
    max_retry_after: Duration,
}

impl Apps {
    /// The apps `config` turns on.
    pub(crate) fn new(config: &ChannelsConfig) -> Result<Self, reqwest::Error> {
        let telegram = if config.telegram.sends() {
            Some(TelegramOut {
                client: telegram::Client::new(&config.telegram)?,
                max_retry_after: Duration::from_millis(config.telegram.max_retry_after_ms),
            })
        } else {
            None
        };
        Ok(Self { telegram })
    }

    /// Posts `outbound` to its chat app; `None` when its channel is no app configured here.
    /// `ledger`: the reply's delivery id, under which posted pieces are remembered.
    pub(crate) async fn deliver(
        &self,
        outbound: &OutboundMessage,
        ledger: Option<&str>,
        recent: &Mutex<Recent>,
    ) -> Option<Result<(), Failure>> {
        match outbound.channel.as_str() {
            telegram::CHANNEL => {
                let app = self.telegram.as_ref()?;
                Some(app.deliver(outbound, ledger, recent).await)
            }
            _ => None,
        }
    }
}

impl TelegramOut {
    async fn deliver(
        &self,
        outbound: &OutboundMessage,
        ledger: Option<&str>,
        recent: &Mutex<Recent>,
    ) -> Result<(), Failure> {
        let Some(chat) = outbound.metadata.get(meta::CHAT) else {
            return Err(Failure::Permanent(
                "a telegram reply without a chat: its message did not come through the Telegram webhook".to_owned(),
            ));
        };
        let target = Target {
            chat: chat.clone(),
            thread: outbound.metadata.get(meta::THREAD).cloned(),
            // In a group, the answer quotes the message it answers.
            reply_to: outbound
                .metadata
                .contains_key(meta::GROUP)
                .then(|| outbound.metadata.get(meta::MESSAGE).cloned())
                .flatten(),
        };
        for (i, piece) in chunk(&outbound.text, telegram::MAX_MESSAGE)
            .iter()
            .enumerate()
        {
            let key = ledger.map(|id| format!("{id}#{i}"));
            if let Some(key) = &key
                && recent.lock().is_ok_and(|r| r.contains(key))
            {
                continue;
            }
            self.send(&target, piece).await?;
            if let Some(key) = key
                && let Ok(mut recent) = recent.lock()
            {
                recent.insert(key);
            }
        }
        Ok(())
    }

    /// Sends one piece, waiting out what a `429` asks for (up to `max_retry_after`).
    async fn send(&self, target: &Target, text: &str) -> Result<(), Failure> {
        let mut attempt = 1;
        loop {
            match self.client.send_message(target, text).await {
                Ok(()) => return Ok(()),
                Err(SendError::Permanent(reason)) => return Err(Failure::Permanent(reason)),
                Err(SendError::Transient {
                    reason,
                    retry_after,
                }) => {
                    let wait = retry_after.filter(|d| *d <= self.max_retry_after);
                    match wait {
                        Some(wait) if attempt < ATTEMPTS => {
                            tracing::info!(%reason, retry_after_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX), "telegram asks to wait; posting again after it");
                            tokio::time::sleep(wait).await;
                            attempt += 1;
                        }
                        _ => return Err(Failure::Transient(reason)),
                    }
                }
            }
        }
    }
}
