//! `ModelStream`: reads the response body, parses SSE and decodes provider events.

use std::collections::VecDeque;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures::{FutureExt as _, Stream, StreamExt};

use crate::connections::Slot;
use crate::sse::{SseEvent, SseParser};
use crate::types::StreamEvent;
use crate::{ModelError, Provider, anthropic, openai};

type ByteStream = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

/// The most bytes one streamed response may carry. Its text, call arguments and any line not
/// yet ended are held in memory, so a provider (or whoever answers in its place) streaming
/// without end is cut off here; a 32k-token answer is about 7 MiB of chunks.
const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

#[derive(Debug)]
pub(crate) enum Decoder {
    OpenAi(openai::Decoder),
    Anthropic(anthropic::Decoder),
}

impl Decoder {
    pub(crate) fn new(provider: Provider) -> Self {
        match provider {
            Provider::OpenAi => Self::OpenAi(openai::Decoder::default()),
            Provider::Anthropic => Self::Anthropic(anthropic::Decoder::default()),
        }
    }

    fn on_event(
        &mut self,
        event: &SseEvent,
        out: &mut VecDeque<StreamEvent>,
    ) -> Result<bool, ModelError> {
        match self {
            Self::OpenAi(decoder) => decoder.on_event(event, out),
            Self::Anthropic(decoder) => decoder.on_event(event, out),
        }
    }

    fn on_eof(&mut self, out: &mut VecDeque<StreamEvent>) -> Result<(), ModelError> {
        match self {
            Self::OpenAi(decoder) => decoder.on_eof(out),
            Self::Anthropic(decoder) => decoder.on_eof(out),
        }
    }
}

/// A streamed model response; ends with `StreamEvent::Done` or an error.
pub struct ModelStream {
    provider: Provider,
    url: String,
    body: ByteStream,
    parser: SseParser,
    decoder: Decoder,
    events: Vec<SseEvent>,
    pending: VecDeque<StreamEvent>,
    error: Option<ModelError>,
    idle_timeout: Duration,
    finished: bool,
    /// Bytes of the body read so far (at most [`MAX_RESPONSE_BYTES`]).
    received: usize,
    /// The call's place on its connection, given back with the stream.
    _slot: Slot,
}

impl std::fmt::Debug for ModelStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelStream")
            .field("provider", &self.provider)
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

impl ModelStream {
    pub(crate) fn new(
        provider: Provider,
        url: String,
        response: reqwest::Response,
        idle_timeout: Duration,
        slot: Slot,
    ) -> Self {
        Self {
            provider,
            url,
            body: Box::pin(response.bytes_stream()),
            parser: SseParser::default(),
            decoder: Decoder::new(provider),
            events: Vec::new(),
            pending: VecDeque::new(),
            error: None,
            idle_timeout,
            finished: false,
            received: 0,
            _slot: slot,
        }
    }

    /// Returns the next event, `None` after `Done` or after an error.
    ///
    /// # Errors
    /// `Stalled` when no bytes arrive within the request timeout, `Stream` for a provider error
    /// event, `Protocol` for a malformed or truncated stream, `Transport` when the connection drops.
    pub async fn next(&mut self) -> Option<Result<StreamEvent, ModelError>> {
        loop {
            if let Some(ready) = self.take_ready() {
                return ready;
            }
            match tokio::time::timeout(self.idle_timeout, self.body.next()).await {
                Err(_) => {
                    self.finished = true;
                    return Some(Err(ModelError::Stalled {
                        provider: self.provider,
                        timeout_ms: u64::try_from(self.idle_timeout.as_millis())
                            .unwrap_or(u64::MAX),
                    }));
                }
                Ok(chunk) => self.on_body(chunk),
            }
        }
    }

    /// Returns what [`ModelStream::next`] would without waiting: `None` when the next event has
    /// not arrived yet. Reads only bytes already there, so it arms no idle timer.
    pub fn next_ready(&mut self) -> Option<Option<Result<StreamEvent, ModelError>>> {
        loop {
            if let Some(ready) = self.take_ready() {
                return Some(ready);
            }
            let chunk = self.body.next().now_or_never()?;
            self.on_body(chunk);
        }
    }

    /// The answer already decided, if any: a decoded event, the error, or the end.
    fn take_ready(&mut self) -> Option<Option<Result<StreamEvent, ModelError>>> {
        if let Some(event) = self.pending.pop_front() {
            return Some(Some(Ok(event)));
        }
        if let Some(error) = self.error.take() {
            return Some(Some(Err(error)));
        }
        self.finished.then_some(None)
    }

    /// Takes in what the body yielded: bytes, a transport error, or its end.
    fn on_body(&mut self, chunk: Option<reqwest::Result<Bytes>>) {
        match chunk {
            Some(Err(err)) => {
                self.finished = true;
                self.error = Some(ModelError::transport(self.provider, &self.url, err));
            }
            Some(Ok(bytes)) => {
                self.received = self.received.saturating_add(bytes.len());
                if self.received > MAX_RESPONSE_BYTES {
                    self.finished = true;
                    self.error = Some(ModelError::Protocol {
                        provider: self.provider,
                        message: format!(
                            "the response passed {} MiB, the most one answer may carry",
                            MAX_RESPONSE_BYTES >> 20
                        ),
                    });
                    return;
                }
                self.parser.push(&bytes, &mut self.events);
                self.decode();
            }
            None => {
                self.parser.finish(&mut self.events);
                self.decode();
                if !self.finished {
                    self.finished = true;
                    if let Err(err) = self.decoder.on_eof(&mut self.pending) {
                        self.error = Some(err);
                    }
                }
            }
        }
    }

    /// Converts this into a `futures::Stream` of the same items.
    pub fn into_stream(self) -> impl Stream<Item = Result<StreamEvent, ModelError>> + Send {
        futures::stream::unfold(self, |mut stream| async move {
            let item = stream.next().await?;
            Some((item, stream))
        })
    }

    fn decode(&mut self) {
        for event in self.events.drain(..) {
            if self.finished {
                break; // bytes after the end marker are ignored
            }
            match self.decoder.on_event(&event, &mut self.pending) {
                Ok(done) => self.finished = done,
                Err(err) => {
                    self.finished = true;
                    self.error = Some(err);
                }
            }
        }
    }
}
