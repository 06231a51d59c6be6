//! Replies to chat apps (`[channels.<name>]`): chunked to the app's length limit, each piece
//! remembered once posted, so a retry after a later piece failed does not post the earlier
//! ones again; rate limits waited out as the app asks; a refusal for good told apart.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use agentloop_channels::{ChannelsConfig, SendError, chunk, meta, slack, telegram, webhook};
use agentloop_proto::v1::OutboundMessage;

use crate::failure::Failure;
use crate::recent::{Recent, delivery_key};

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

    /// Where `outbound` goes: `None` for a channel that is no app configured here, an error
    /// for an app's reply that names no chat (its message did not come through the app).
    fn destination<'a>(
        &'a self,
        outbound: &'a OutboundMessage,
    ) -> Option<Result<Destination<'a>, Failure>> {
        let channel = outbound.channel.as_str();
        let (app, max_wait) = match channel {
            telegram::CHANNEL => self.telegram.as_ref().map(|(c, w)| (App::Telegram(c), *w)),
            slack::CHANNEL => self.slack.as_ref().map(|(c, w)| (App::Slack(c), *w)),
            _ => self
                .webhooks
                .get(channel)
                .map(|(c, w)| (App::Webhook(c), *w)),
        }?;
        let meta = |key: &str| outbound.metadata.get(key).map(String::as_str);
        let Some(chat) = meta(meta::CHAT) else {
            return Some(Err(Failure::Permanent(format!(
                "a {channel} reply without a chat: its message did not come through the {channel} endpoint"
            ))));
        };
        let group = outbound.metadata.contains_key(meta::GROUP);
        Some(Ok(Destination {
            app,
            max_wait,
            chat,
            thread: meta(meta::THREAD),
            message: meta(meta::MESSAGE),
            group,
            outbound,
        }))
    }

    /// Posts `outbound` to its chat app; `None` when its channel is no app configured here.
    /// Posted pieces are remembered in `recent` under the reply's delivery key.
    pub(crate) async fn deliver(
        &self,
        outbound: &OutboundMessage,
        recent: &Mutex<Recent>,
    ) -> Option<Result<(), Failure>> {
        let to = match self.destination(outbound)? {
            Ok(to) => to,
            Err(failure) => return Some(Err(failure)),
        };
        let by_tool = outbound
            .metadata
            .contains_key(agentloop_proto::SENT_BY_TOOL);
        if !outbound.r#final && !by_tool {
            self.progress(&to).await;
            return Some(Ok(()));
        }
        // Forgotten only once the final reply is posted: a retry edits the same message. A
        // message the tool sent is its own, never the one the reply is written into.
        let streamed = self
            .streamed
            .lock()
            .ok()
            .and_then(|s| s.get(&outbound.run_id).cloned())
            .filter(|_| !by_tool);
        let pieces = match to.app {
            App::Webhook(_) => vec![outbound.text.clone()],
            _ => chunk(&outbound.text, to.max_len()),
        };
        let ledger = delivery_key(outbound);
        let posted = post_pieces(
            to.channel(),
            &pieces,
            ledger.as_deref(),
            recent,
            to.max_wait,
            |i, piece| {
                let to = &to;
                let streamed = streamed.as_deref();
                async move {
                    match (i, streamed) {
                        // The message shown while the reply was written becomes its first piece;
                        // gone for good (the user deleted it), the piece is posted anew.
                        (0, Some(id)) => match to.edit(id, piece).await {
                            Err(SendError::Permanent(reason)) => {
                                tracing::info!(channel = to.channel(), %reason, "the message shown while the reply was written cannot be edited; posting the reply instead");
                                to.post(piece).await.map(drop)
                            }
                            edited => edited,
                        },
                        _ => to.post(piece).await.map(drop),
                    }
                }
            },
        )
        .await;
        if posted.is_ok()
            && streamed.is_some()
            && let Ok(mut streamed) = self.streamed.lock()
        {
            streamed.remove(&outbound.run_id);
        }
        Some(posted)
    }

    /// Shows the reply so far: the first progress of a run posts a message, later ones edit
    /// it. Never an error: a lost progress is superseded by the next one or by the final reply.
    async fn progress(&self, to: &Destination<'_>) {
        if matches!(to.app, App::Webhook(_)) {
            // A webhook gets the final reply only.
            return;
        }
        let run = &to.outbound.run_id;
        // While it is written, the first piece is shown; the final reply adds the rest.
        let Some(shown) = chunk(&to.outbound.text, to.max_len()).into_iter().next() else {
            return;
        };
        let known = self.streamed.lock().ok().and_then(|s| s.get(run).cloned());
        let posted = match known {
            Some(id) => to.edit(&id, &shown).await.map(|()| id),
            None => to.post(&shown).await,
        };
        match posted {
            Ok(id) if !id.is_empty() => {
                if let Ok(mut streamed) = self.streamed.lock() {
                    if streamed.len() >= STREAMED_CAPACITY {
                        streamed.clear();
                    }
                    streamed.insert(run.clone(), id);
                }
            }
            Ok(_) => {}
            Err(err) => {
                tracing::info!(channel = to.channel(), run_id = %run, error = %err, "the reply so far was not shown; the final one follows");
            }
        }
    }
}

/// The app a reply goes to, with its client.
enum App<'a> {
    Telegram(&'a telegram::Client),
    Slack(&'a slack::Client),
    Webhook(&'a webhook::Client),
}

/// Where one reply goes, read once from the metadata its inbound message carried.
struct Destination<'a> {
    app: App<'a>,
    max_wait: Duration,
    chat: &'a str,
    thread: Option<&'a str>,
    /// The platform's id of the message answered.
    message: Option<&'a str>,
    group: bool,
    outbound: &'a OutboundMessage,
}

impl Destination<'_> {
    fn channel(&self) -> &str {
        &self.outbound.channel
    }

    fn max_len(&self) -> usize {
        match self.app {
            App::Telegram(_) => telegram::MAX_MESSAGE,
            App::Slack(_) => slack::MAX_MESSAGE,
            App::Webhook(_) => usize::MAX,
        }
    }

    /// Posts `text` as a new message and returns its id (empty for a webhook).
    async fn post(&self, text: &str) -> Result<String, SendError> {
        match self.app {
            App::Telegram(client) => {
                let target = telegram::Target {
                    chat: self.chat.to_owned(),
                    thread: self.thread.map(str::to_owned),
                    // In a group, the answer quotes the message it answers.
                    reply_to: self.message.filter(|_| self.group).map(str::to_owned),
                };
                client.send_message(&target, text).await
            }
            App::Slack(client) => {
                // In a channel, the answer goes in the thread of the message it answers.
                let thread = self.thread.or(self.message.filter(|_| self.group));
                client.post_message(self.chat, thread, text).await
            }
            App::Webhook(client) => {
                let out = self.outbound;
                let reply = webhook::Reply {
                    chat: self.chat,
                    thread: self.thread,
                    reply_to: self.message,
                    text,
                    error: &out.error,
                    run_id: &out.run_id,
                    session_key: &out.session_key,
                };
                client
                    .post(&reply, unix_now())
                    .await
                    .map(|()| String::new())
            }
        }
    }

    /// Replaces the text of the message `id` posted before.
    async fn edit(&self, id: &str, text: &str) -> Result<(), SendError> {
        match self.app {
            App::Telegram(client) => client.edit_message_text(self.chat, id, text).await,
            App::Slack(client) => client.update(self.chat, id, text).await,
            // Never streamed (see `progress`), so never edited.
            App::Webhook(_) => self.post(text).await.map(drop),
        }
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
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
