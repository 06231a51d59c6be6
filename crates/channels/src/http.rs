//! What the chat-app clients share on the wire: an HTTP client that never follows a redirect
//! (a receiver answering 3xx could otherwise bounce a signed reply, or the bot token, to an
//! address of its choosing, an internal one included), and answers read up to a cap, so a
//! misbehaving server cannot make a channel buffer without end.

use std::time::Duration;

use crate::SendError;

/// The largest answer read to a send or an edit (Telegram and Slack answer a few KiB).
pub(crate) const SEND_ANSWER_CAP: usize = 1 << 20;

/// The largest answer read to a `getUpdates` (at most 100 updates).
pub(crate) const POLL_ANSWER_CAP: usize = 16 << 20;

/// An HTTP client for a chat app: `timeout` per request, HTTP/1.1, no redirects followed.
///
/// HTTP/1.1 as before reqwest's `http2` feature came in for model calls: a connection per send
/// in flight, never sends queued behind one connection's stream limit.
pub(crate) fn client(timeout: Duration) -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .timeout(timeout)
        .http1_only()
        .redirect(reqwest::redirect::Policy::none())
        .build()
}

/// The reason given for a 3xx answer, which is never followed.
pub(crate) fn redirect_refused(status: u16) -> String {
    format!("HTTP {status}: a redirect, not followed")
}

/// Why an answer could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum ReadError {
    /// Longer than the cap (by its `Content-Length`, or once read that far).
    #[error("the answer is larger than {cap} bytes; refused")]
    TooLarge {
        /// The cap, in bytes.
        cap: usize,
    },
    /// The connection failed while reading.
    #[error("{0}")]
    Network(String),
}

/// An answer's body gathered chunk by chunk, refused once past its cap.
#[derive(Debug)]
pub(crate) struct Capped {
    cap: usize,
    body: Vec<u8>,
}

impl Capped {
    /// Starts gathering an answer announced as `content_length` bytes (when it says), at most
    /// `cap` bytes.
    ///
    /// # Errors
    /// [`ReadError::TooLarge`] when the announced length is past the cap: nothing is read.
    pub(crate) fn new(content_length: Option<u64>, cap: usize) -> Result<Self, ReadError> {
        let announced = match content_length {
            Some(length) if length > cap as u64 => return Err(ReadError::TooLarge { cap }),
            // The announced length is a hint for the buffer, never more than the cap.
            Some(length) => usize::try_from(length).unwrap_or(cap),
            None => 0,
        };
        Ok(Self {
            cap,
            body: Vec::with_capacity(announced.min(64 << 10)),
        })
    }

    /// Adds `chunk`.
    ///
    /// # Errors
    /// [`ReadError::TooLarge`] when the body would pass the cap (a length announced falsely,
    /// or none announced).
    pub(crate) fn push(&mut self, chunk: &[u8]) -> Result<(), ReadError> {
        if chunk.len() > self.cap - self.body.len() {
            return Err(ReadError::TooLarge { cap: self.cap });
        }
        self.body.extend_from_slice(chunk);
        Ok(())
    }

    /// The body gathered.
    pub(crate) fn finish(self) -> Vec<u8> {
        self.body
    }
}

/// Reads `response`'s body, at most `cap` bytes.
///
/// # Errors
/// [`ReadError::TooLarge`] past the cap (the rest is not read), [`ReadError::Network`] when the
/// connection fails (without the URL, which may hold a token).
pub(crate) async fn read_capped(
    mut response: reqwest::Response,
    cap: usize,
) -> Result<Vec<u8>, ReadError> {
    let mut body = Capped::new(response.content_length(), cap)?;
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|err| ReadError::Network(err.without_url().to_string()))?
    {
        body.push(&chunk)?;
    }
    Ok(body.finish())
}

/// Reads a chat app's answer to a request that got `status`, as [`read_capped`] does, with a
/// failure told as a send's: a redirect (never followed) and an answer past the cap will not
/// pass, a dropped connection may.
///
/// # Errors
/// The [`SendError`] of the send.
pub(crate) async fn read_answer(
    response: reqwest::Response,
    status: u16,
    cap: usize,
) -> Result<Vec<u8>, SendError> {
    if (300..400).contains(&status) {
        return Err(SendError::Permanent(redirect_refused(status)));
    }
    read_capped(response, cap).await.map_err(|err| match err {
        ReadError::Network(reason) => SendError::Transient {
            reason,
            retry_after: None,
        },
        err @ ReadError::TooLarge { .. } => SendError::Permanent(format!("HTTP {status}: {err}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_announced_length_past_the_cap_is_refused_before_reading() {
        assert_eq!(
            Capped::new(Some(11), 10).unwrap_err(),
            ReadError::TooLarge { cap: 10 }
        );
        assert!(Capped::new(Some(10), 10).is_ok());
        assert!(Capped::new(Some(u64::MAX), 10).is_err());
    }

    #[test]
    fn a_body_up_to_the_cap_is_read_whole() {
        for announced in [Some(11), None] {
            let mut body = Capped::new(announced, 11).unwrap();
            body.push(b"{\"ok\":").unwrap();
            body.push(b"").unwrap();
            body.push(b"true}").unwrap();
            assert_eq!(body.finish(), b"{\"ok\":true}");
        }
    }

    #[test]
    fn chunks_past_the_cap_are_refused_whatever_was_announced() {
        // Announced short, sent long; and sent long without a length (chunked).
        for announced in [Some(4), None] {
            let mut body = Capped::new(announced, 8).unwrap();
            body.push(b"1234").unwrap();
            body.push(b"5678").unwrap();
            assert_eq!(body.push(b"9"), Err(ReadError::TooLarge { cap: 8 }));
        }
        let mut body = Capped::new(None, 8).unwrap();
        assert_eq!(body.push(&[0; 9]), Err(ReadError::TooLarge { cap: 8 }));
    }

    #[test]
    fn the_refusal_says_what_the_cap_is() {
        assert_eq!(
            ReadError::TooLarge {
                cap: SEND_ANSWER_CAP
            }
            .to_string(),
            "the answer is larger than 1048576 bytes; refused"
        );
    }

    #[test]
    fn a_redirect_is_named_as_such() {
        assert_eq!(redirect_refused(307), "HTTP 307: a redirect, not followed");
    }
}
