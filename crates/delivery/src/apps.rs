//! Replies to chat apps (`[channels.<name>]`): chunked to the app's length limit, each piece
//! remembered once posted, so a retry after a later piece failed does not post the earlier
//! ones again; rate limits waited out as the app asks; a refusal for good told apart.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use std::collections::HashMap;

use agentloop_channels::{ChannelsConfig, SendError, chunk, meta, slack, telegram, webhook};
use agentloop_proto::v1::OutboundMessage;

use crate::failure::Failure;
use crate::recent::Recent;

/// Calls of one piece at most (the first and the retries after a `retry_after`).
const ATTEMPTS: u32 = 3;

/// The chat apps delivery posts to.
pub(crate) struct Apps {
    telegram: Option<(telegram::Client, Duration)>,
    slack: Option<(slack::Client, Duration)>,
    /// By channel name (`webhook-<name>`), the webhooks with a reply URL.
    webhooks: HashMap<String, (webhook::Client, Duration)>,
    /// By run, the app message edited in place while its reply is written. Kept by the replica
    /// that posted it: a later piece handled by another replica posts a message of its own.
    streamed: Mutex<HashMap<String, String>>,
}

/// Runs whose streamed message is remembered at most (the map starts over beyond).
const STREAMED_CAPACITY: usize = 10_000;

impl Apps {
    /// The apps `config` turns on.
    pub(crate) fn new(config: &ChannelsConfig) -> Result<Self, reqwest::Error> {
        let wait = Duration::from_millis;
        Ok(Self {
            telegram: match config.telegram.sends() {
                true => Some((
                    telegram::Client::new(&config.telegram)?,
                    wait(config.telegram.max_retry_after_ms),
                )),
                false => None,
            },
            slack: match config.slack.sends() {
                true => Some((
                    slack::Client::new(&config.slack)?,
                    wait(config.slack.max_retry_after_ms),
                )),
                false => None,
            },
            webhooks: config
                .webhook
                .iter()
                .filter(|(_, hook)| !hook.url.is_empty())
                .map(|(name, hook)| {
                    let client = webhook::Client::new(
                        &hook.url,
                        hook.secret.expose(),
                        wait(hook.request_timeout_ms),
                    )?;
                    Ok((
                        webhook::channel(name),
                        (client, wait(hook.max_retry_after_ms)),
                    ))
                })
                .collect::<Result<_, reqwest::Error>>()?,
            streamed: Mutex::default(),
        })
    }

    /// Posts `outbound` to its chat app; `None` when its channel is no app configured here.
    /// `ledger`: the reply's delivery id, under which posted pieces are remembered.
    pub(crate) async fn deliver(
        &self,
        outbound: &OutboundMessage,
        ledger: Option<&str>,
        recent: &Mutex<Recent>,
    ) -> Option<Result<(), Failure>> {
        let channel = outbound.channel.as_str();
        if !outbound.r#final {
            return self.progress(outbound).await;
        }
        // Forgotten only once the final reply is posted: a retry edits the same message.
        let streamed = self
            .streamed
            .lock()
            .ok()
            .and_then(|s| s.get(&outbound.run_id).cloned());
        let streamed = streamed.as_deref();
        let chat = outbound.metadata.get(meta::CHAT);
        let group = outbound.metadata.contains_key(meta::GROUP);
        let thread = outbound.metadata.get(meta::THREAD);
        let message = outbound.metadata.get(meta::MESSAGE);
        let posted = match channel {
            telegram::CHANNEL => {
                let (client, max_wait) = self.telegram.as_ref()?;
                let Some(chat) = chat else {
                    return Some(Err(no_chat(channel)));
                };
                let target = telegram::Target {
                    chat: chat.clone(),
                    thread: thread.cloned(),
                    // In a group, the answer quotes the message it answers.
                    reply_to: message.filter(|_| group).cloned(),
                };
                let pieces = chunk(&outbound.text, telegram::MAX_MESSAGE);
                let target = &target;
                post_pieces(
                    channel,
                    &pieces,
                    ledger,
                    recent,
                    *max_wait,
                    |i, piece| async move {
                        match (i, streamed) {
                            // The message shown while the reply was written becomes its first piece.
                            (0, Some(id)) => {
                                client.edit_message_text(&target.chat, id, piece).await
                            }
                            _ => client.send_message(target, piece).await.map(drop),
                        }
                    },
                )
                .await
            }
            slack::CHANNEL => {
                let (client, max_wait) = self.slack.as_ref()?;
                let Some(chat) = chat else {
                    return Some(Err(no_chat(channel)));
                };
                // In a channel, the answer goes in the thread of the message it answers.
                let thread = thread.or(message.filter(|_| group)).map(String::as_str);
                let pieces = chunk(&outbound.text, slack::MAX_MESSAGE);
                post_pieces(
                    channel,
                    &pieces,
                    ledger,
                    recent,
                    *max_wait,
                    |i, piece| async move {
                        match (i, streamed) {
                            (0, Some(ts)) => client.update(chat, ts, piece).await,
                            _ => client.post_message(chat, thread, piece).await.map(drop),
                        }
                    },
                )
                .await
            }
            _ => {
                let (client, max_wait) = self.webhooks.get(channel)?;
                let Some(chat) = chat else {
                    return Some(Err(no_chat(channel)));
                };
                let reply = webhook::Reply {
                    chat,
                    thread: thread.map(String::as_str),
                    reply_to: message.map(String::as_str),
                    text: &outbound.text,
                    error: &outbound.error,
                    run_id: &outbound.run_id,
                    session_key: &outbound.session_key,
                };
                let whole = [outbound.text.clone()];
                post_pieces(channel, &whole, ledger, recent, *max_wait, |_, _| {
                    client.post(&reply, unix_now())
                })
                .await
            }
        };
        if posted.is_ok()
            && let Ok(mut streamed) = self.streamed.lock()
        {
            streamed.remove(&outbound.run_id);
        }
        Some(posted)
    }
}

impl Apps {
    /// Shows the reply so far: the first progress of a run posts a message, later ones edit
    /// it. `None` for a channel that is no app configured here. Never an error: a lost
    /// progress is superseded by the next one or by the final reply.
    async fn progress(&self, outbound: &OutboundMessage) -> Option<Result<(), Failure>> {
        let channel = outbound.channel.as_str();
        let chat = outbound.metadata.get(meta::CHAT)?;
        let thread = outbound.metadata.get(meta::THREAD);
        let group = outbound.metadata.contains_key(meta::GROUP);
        let message = outbound.metadata.get(meta::MESSAGE);
        let max = match channel {
            telegram::CHANNEL => telegram::MAX_MESSAGE,
            slack::CHANNEL => slack::MAX_MESSAGE,
            _ => return self.webhooks.get(channel).map(|_| Ok(())),
        };
        // While it is written, the first piece is shown; the final reply adds the rest.
        let shown = chunk(&outbound.text, max).into_iter().next()?;
        let known = self
            .streamed
            .lock()
            .ok()
            .and_then(|s| s.get(&outbound.run_id).cloned());
        let posted = match (channel, known) {
            (telegram::CHANNEL, known) => {
                let (client, _) = self.telegram.as_ref()?;
                match known {
                    Some(id) => client
                        .edit_message_text(chat, &id, &shown)
                        .await
                        .map(|()| id),
                    None => {
                        let target = telegram::Target {
                            chat: chat.clone(),
                            thread: thread.cloned(),
                            reply_to: message.filter(|_| group).cloned(),
                        };
                        client.send_message(&target, &shown).await
                    }
                }
            }
            (_, known) => {
                let (client, _) = self.slack.as_ref()?;
                match known {
                    Some(ts) => client.update(chat, &ts, &shown).await.map(|()| ts),
                    None => {
                        let thread = thread.or(message.filter(|_| group)).map(String::as_str);
                        client.post_message(chat, thread, &shown).await
                    }
                }
            }
        };
        match posted {
            Ok(id) if !id.is_empty() => {
                if let Ok(mut streamed) = self.streamed.lock() {
                    if streamed.len() >= STREAMED_CAPACITY {
                        streamed.clear();
                    }
                    streamed.insert(outbound.run_id.clone(), id);
                }
            }
            Ok(_) => {}
            Err(err) => {
                tracing::info!(channel, run_id = %outbound.run_id, error = %err, "the reply so far was not shown; the final one follows");
            }
        }
        Some(Ok(()))
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn no_chat(channel: &str) -> Failure {
    Failure::Permanent(format!(
        "a {channel} reply without a chat: its message did not come through the {channel} endpoint"
    ))
}

/// Posts each piece not posted before, in order, remembering each once the app took it.
async fn post_pieces<'a, F, Fut>(
    channel: &str,
    pieces: &'a [String],
    ledger: Option<&str>,
    recent: &Mutex<Recent>,
    max_wait: Duration,
    mut send: F,
) -> Result<(), Failure>
where
    F: FnMut(usize, &'a str) -> Fut,
    Fut: Future<Output = Result<(), SendError>>,
{
    for (i, piece) in pieces.iter().enumerate() {
        let key = ledger.map(|id| format!("{id}#{i}"));
        if let Some(key) = &key
            && recent.lock().is_ok_and(|r| r.contains(key))
        {
            continue;
        }
        let mut attempt = 1;
        loop {
            match send(i, piece).await {
                Ok(()) => break,
                Err(SendError::Permanent(reason)) => {
                    return Err(Failure::Permanent(format!("{channel}: {reason}")));
                }
                Err(SendError::Transient {
                    reason,
                    retry_after,
                }) => match retry_after.filter(|d| *d <= max_wait) {
                    Some(wait) if attempt < ATTEMPTS => {
                        tracing::info!(channel, %reason, retry_after_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX), "the app asks to wait; posting again after it");
                        tokio::time::sleep(wait).await;
                        attempt += 1;
                    }
                    _ => return Err(Failure::Transient(format!("{channel}: {reason}"))),
                },
            }
        }
        if let Some(key) = key
            && let Ok(mut recent) = recent.lock()
        {
            recent.insert(key);
        }
    }
    Ok(())
}
