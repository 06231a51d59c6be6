//! The burst phase: every message of every session published at once, as users' bursts
//! arrive (queued as follow-ups), then all replies awaited; the closed loop in
//! [`crate::phases::drive`] instead waits for each reply before a session's next message.

use std::time::{Duration, Instant};

use crate::client::LoadClient;
use crate::phases::{Load, PhaseResult};

/// The queue mode a burst's messages carry: each queued message becomes a run of its own.
const QUEUE_MODE: &str = "followup";

/// Publishes `load.sessions` × `load.per_session` messages without waiting, then waits up to
/// `load.max_duration` for their replies; the elapsed time runs from the first publish to the
/// last reply.
///
/// # Errors
/// Never for lost messages (they are counted); kept fallible like [`crate::phases::drive`].
pub async fn drive(client: &LoadClient, load: &Load) -> anyhow::Result<PhaseResult> {
    drive_spread(client, load, Duration::ZERO).await
}

/// As [`drive`], with the publishes spread evenly over `spread` (an open loop at a steady
/// rate) instead of all at once.
///
/// # Errors
/// As [`drive`].
pub async fn drive_spread(
    client: &LoadClient,
    load: &Load,
    spread: Duration,
) -> anyhow::Result<PhaseResult> {
    let total = (load.sessions * load.per_session).max(1) as u32;
    let mut result = PhaseResult {
        name: load.name.clone(),
        concurrency: load.sessions,
        runners: 1,
        ..Default::default()
    };
    let start = Instant::now();
    let mut pending = Vec::with_capacity(load.sessions * load.per_session);
    // A session's messages go out back to back, as one user's burst does.
    for session in 0..load.sessions {
        let key = format!("bench:{}:{session}", load.name);
        for m in 0..load.per_session {
            if !spread.is_zero() {
                let i = u32::try_from(result.sent).unwrap_or(u32::MAX);
                tokio::time::sleep_until(tokio::time::Instant::from_std(
                    start + spread * i / total,
                ))
                .await;
            }
            let tag = format!("{}-{session}-{m}", load.name);
            result.sent += 1;
            match client.publish_burst(&key, &tag, QUEUE_MODE).await {
                Ok(sent) => pending.push((Instant::now(), sent)),
                Err(err) => {
                    result.lost += 1;
                    result.first_error.get_or_insert_with(|| format!("{err:#}"));
                }
            }
        }
    }
    let deadline = tokio::time::Instant::from_std(start + load.max_duration);
    let mut last_reply = start;
    for (sent, (ack, reply)) in pending {
        match tokio::time::timeout_at(deadline, async { tokio::join!(ack.into_future(), reply) })
            .await
        {
            Ok((Ok(_), Ok(done))) if done.text_ok => {
                result.ok += 1;
                result.totals.push(done.total);
                last_reply = last_reply.max(sent + done.total);
            }
            Ok((Ok(_), Ok(_))) => result.wrong += 1,
            Ok((Err(err), _)) => {
                result.lost += 1;
                result
                    .first_error
                    .get_or_insert_with(|| format!("inbound not stored: {err:#}"));
            }
            Ok((_, Err(_))) => {
                result.lost += 1;
                result
                    .first_error
                    .get_or_insert_with(|| "reply watcher gone".to_owned());
            }
            Err(_) => {
                result.lost += 1;
                result.first_error.get_or_insert_with(|| {
                    format!("no reply within {} s", load.max_duration.as_secs())
                });
            }
        }
    }
    client.clear_burst();
    result.elapsed = last_reply
        .duration_since(start)
        .max(Duration::from_micros(1));
    Ok(result)
}
