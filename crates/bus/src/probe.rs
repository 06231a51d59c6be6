//! Whether a service may read a stream's messages, asked once at start.

use std::time::Duration;

use async_nats::jetstream;
use tokio::time::Instant;

/// Whether this connection may read `stream` (`$JS.API.STREAM.MSG.GET` on it): asked for the
/// last message of `probe_subject`, a subject no message has, until the stream answers or
/// `patience` is over. A NATS user without the permission gets no answer at all, like a
/// stream in an election, hence the patience.
pub async fn stream_readable(
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
