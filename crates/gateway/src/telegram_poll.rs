//! Telegram by long polling (`channels.telegram.poll`): `getUpdates` in a loop, each message
//! published as the webhook publishes it, and the offset moved past an update only once its
//! message is stored, so a gateway that stops loses nothing (Telegram hands unconfirmed updates
//! out again, and a repeat is one message).

use std::time::Duration;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use agentloop_bus::Bus;
use agentloop_channels::{SendError, TelegramConfig, telegram};
use agentloop_lifecycle::Backoff;

use crate::webhooks::{Published, keep, publish_inbound};

/// Waits after a failed poll or an unstored message: 1 s doubling to 30 s.
const AGAIN: Backoff = Backoff::new(1_000, 30_000, u32::MAX);

/// The longest `retry_after` of Telegram's waited out before polling again: a longer one (a
/// fault, or a server that is not Telegram) would stop polling for as long as it says.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// Polls until `shutdown`, or until Telegram refuses the bot for good (a bad token).
pub(crate) async fn run(bus: Bus, config: TelegramConfig, shutdown: CancellationToken) {
    let client = match telegram::Client::new(&config) {
        Ok(client) => client,
        Err(err) => {
            tracing::error!(error = %err, "telegram polling cannot start");
            return;
        }
    };
    let wait = Duration::from_secs(config.poll_timeout_s);
    let mut offset = 0;
    let mut failures = 0;
    tracing::info!("taking telegram messages in by long polling");
    loop {
        let polled = tokio::select! {
            () = shutdown.cancelled() => return,
            polled = client.get_updates(offset, wait) => polled,
        };
        let updates = match polled {
            Ok(updates) => {
                failures = 0;
                updates
            }
            Err(err) => {
                let lasting = matches!(&err, SendError::Permanent(reason) if reason.starts_with("401") || reason.starts_with("404"));
                if lasting {
                    tracing::error!(error = %err, "telegram refuses the bot token; polling stops (check channels.telegram.bot_token)");
                    return;
                }
                failures += 1;
                if sleep_or_stop(pause(&err, failures), &shutdown).await {
                    return;
                }
                continue;
            }
        };
        for (id, raw) in updates {
            let body = Bytes::from(raw);
            match telegram::parse_update(&body) {
                Ok(Some(inbound)) => loop {
                    let published = publish_inbound(
                        &bus,
                        inbound.clone(),
                        &config.agent_id,
                        config.stream_edit_ms,
                        body.clone(),
                    )
                    .await;
                    match published {
                        Published::Accepted | Published::Refused(_) => break,
                        Published::NotStored(reason) => {
                            // Not confirmed to Telegram either: tried again until stored.
                            tracing::warn!(%reason, "a telegram message was not stored; trying again");
                            failures += 1;
                            if sleep_or_stop(again(failures), &shutdown).await {
                                return;
                            }
                        }
                    }
                },
                Ok(None) => {}
                Err(err) => {
                    keep(&bus, telegram::CHANNEL, body, err.to_string()).await;
                }
            }
            offset = id + 1;
        }
    }
}

/// The wait after a failed poll, the `failures`th in a row, said in the log: the
/// `retry_after` Telegram asks for, at most [`MAX_RETRY_AFTER`], else [`again`].
fn pause(err: &SendError, failures: u32) -> Duration {
    match err {
        SendError::Transient {
            retry_after: Some(asked),
            ..
        } => {
            let wait = (*asked).min(MAX_RETRY_AFTER);
            if wait < *asked {
                tracing::warn!(error = %err, asked_s = asked.as_secs(), wait_s = wait.as_secs(), "telegram asks to wait longer than polling waits; polling again after {}s", wait.as_secs());
            } else {
                tracing::warn!(error = %err, wait_s = wait.as_secs(), "telegram asks to wait; polling again after {}s", wait.as_secs());
            }
            wait
        }
        // A 409 (a webhook is set, or another poller runs) is said loudly.
        SendError::Permanent(reason) if reason.starts_with("409") => {
            tracing::error!(error = %err, "telegram polling refused; a webhook set for the bot or a second poller is the usual cause (deleteWebhook, or poll on one gateway only)");
            again(failures)
        }
        SendError::Permanent(_) => {
            tracing::error!(error = %err, "telegram polling refused; polling again (check channels.telegram.api_base)");
            again(failures)
        }
        SendError::Transient { .. } => {
            tracing::warn!(error = %err, "telegram polling failed; polling again");
            again(failures)
        }
    }
}

/// The wait after `failures` failures in a row (never used up: polling goes on while the
/// gateway runs, each wait at most 30 s).
fn again(failures: u32) -> Duration {
    AGAIN
        .delay(failures.saturating_sub(1))
        .unwrap_or(Duration::from_secs(30))
}

/// Sleeps `pause`; true when `shutdown` came first.
async fn sleep_or_stop(pause: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        () = shutdown.cancelled() => true,
        () = tokio::time::sleep(pause) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_retry_after_is_cut_to_the_cap() {
        let asked = |seconds| SendError::Transient {
            reason: "429 Too Many Requests".to_owned(),
            retry_after: Some(Duration::from_secs(seconds)),
        };
        assert_eq!(pause(&asked(86_400), 1), MAX_RETRY_AFTER);
        assert_eq!(pause(&asked(u64::MAX), 7), MAX_RETRY_AFTER);
        assert_eq!(pause(&asked(300), 1), Duration::from_secs(300));
        assert_eq!(pause(&asked(3), 1), Duration::from_secs(3));
        let failed = SendError::Transient {
            reason: "502 Bad Gateway".to_owned(),
            retry_after: None,
        };
        assert_eq!(pause(&failed, 1), Duration::from_secs(1));
        assert_eq!(
            pause(&SendError::Permanent("409 Conflict".to_owned()), 100),
            Duration::from_secs(30)
        );
    }
}
