//! Whether a service may read a stream's messages, asked once at start.

use std::time::Duration;

use async_nats::jetstream;
use tokio::time::Instant;

use crate::{Bus, BusError, StreamKind};

impl Bus {
    /// The stream of `kind`, for a service whose `setting` (`runner.keep_order`, ...) reads it
    /// to keep a session's order: `None` when `keep` is off, or, with a warning that the
    /// setting is off, when this connection may not read it (every read would go unanswered).
    ///
    /// # Errors
    /// [`BusError::Admin`] when the stream cannot be opened.
    pub async fn readable_stream(
        &self,
        kind: StreamKind,
        keep: bool,
        setting: &str,
    ) -> Result<Option<jetstream::stream::Stream<()>>, BusError> {
        if !keep {
            return Ok(None);
        }
        let name = crate::stream_name(&self.config.prefix, kind);
        let stream = self.js.get_stream_no_info(&name).await;
        let stream = stream.map_err(|err| BusError::Admin {
            what: format!("open the stream {name}"),
            source: Box::new(err),
        })?;
        let patience = Duration::from_millis(self.config.ack_wait_ms.saturating_mul(2));
        let probe = self
            .subjects
            .stream_subjects(kind)
            .replace('>', "_order_probe");
        if stream_readable(&stream, &probe, patience).await {
            return Ok(Some(stream));
        }
        tracing::warn!(
            stream = %name,
            "{setting} is off: this connection cannot read the stream (does its NATS user have \
             $JS.API.STREAM.MSG.GET on it?); a session's messages taken through a lost \
             connection or by another replica may go after later ones"
        );
        Ok(None)
    }
}

/// Whether this connection may read `stream` (`$JS.API.STREAM.MSG.GET` on it): asked for the
/// last message of `probe_subject`, a subject no message has, until the stream answers or
/// `patience` is over. A NATS user without the permission gets no answer at all, like a
/// stream in an election, hence the patience.
async fn stream_readable(
    stream: &jetstream::stream::Stream<()>,
    probe_subject: &str,
    patience: Duration,
) -> bool {
    let deadline = Instant::now() + patience;
    loop {
        match stream.get_last_raw_message_by_subject(probe_subject).await {
            Ok(_) => return true,
            // Any answer of the stream's, a refusal included, says the request got through.
            Err(err)
                if matches!(
                    err.kind(),
                    jetstream::stream::LastRawMessageErrorKind::NoMessageFound
                        | jetstream::stream::LastRawMessageErrorKind::JetStream(_)
                ) =>
            {
                return true;
            }
            Err(err) if Instant::now() >= deadline => {
                tracing::warn!(stream = probe_subject, error = %err, "cannot read the stream");
                return false;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}
