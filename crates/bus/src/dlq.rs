//! Reading and acting on the dead letters kept in the DLQ stream, for operators
//! (`agentloop dlq`): list them, show one, publish one again on its original subject, purge.
//! A dead letter's id is its sequence in the stream.

use std::time::SystemTime;

use async_nats::HeaderMap;
use async_nats::jetstream::message::PublishMessage as Publish;
use bytes::Bytes;

use crate::{
    Bus, BusError, HEADER_ERROR, HEADER_ORIGINAL_SUBJECT, HEADER_SERVICE, StreamKind, stream_name,
};

/// The header a retried message carries: the id of the dead letter it came from.
pub const HEADER_RETRY_OF: &str = "Agentloop-Retry-Of";

/// One dead letter.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    /// Its sequence in the DLQ stream.
    pub id: u64,
    /// The subject the message was on before it was dead-lettered.
    pub original_subject: String,
    /// The service that gave up on it.
    pub service: String,
    /// Why.
    pub reason: String,
    /// When it was dead-lettered.
    pub at: SystemTime,
    /// Its headers (the original's, plus the dead letter's own).
    pub headers: HeaderMap,
    /// The original payload.
    pub payload: Bytes,
}

fn admin(what: &str, err: impl std::error::Error + Send + Sync + 'static) -> BusError {
    BusError::Admin {
        what: what.to_owned(),
        source: Box::new(err),
    }
}

fn header(headers: &HeaderMap, name: &str) -> String {
    headers
        .get(name)
        .map(|v| v.as_str().to_owned())
        .unwrap_or_default()
}

impl Bus {
    async fn dlq_stream(&self) -> Result<async_nats::jetstream::stream::Stream, BusError> {
        let name = stream_name(&self.config.prefix, StreamKind::Dlq);
        self.js
            .get_stream(&name)
            .await
            .map_err(|e| admin("open the DLQ stream", e))
    }

    /// The dead letter `id`; `None` when there is none (never stored, retried or purged).
    ///
    /// # Errors
    /// [`BusError::Admin`] when the stream cannot be read.
    pub async fn dead_letter_by_id(&self, id: u64) -> Result<Option<DeadLetter>, BusError> {
        let stream = self.dlq_stream().await?;
        match stream.get_raw_message(id).await {
            Ok(raw) => {
                let headers = raw.headers.clone();
                Ok(Some(DeadLetter {
                    id,
                    original_subject: header(&headers, HEADER_ORIGINAL_SUBJECT),
                    service: header(&headers, HEADER_SERVICE),
                    reason: header(&headers, HEADER_ERROR),
                    at: SystemTime::from(raw.time),
                    headers,
                    payload: raw.payload,
                }))
            }
            Err(err)
                if err.kind()
                    == async_nats::jetstream::stream::RawMessageErrorKind::NoMessageFound =>
            {
                Ok(None)
            }
            Err(err) => Err(admin("read a dead letter", err)),
        }
    }

    /// The newest `limit` dead letters, newest first.
    ///
    /// # Errors
    /// [`BusError::Admin`] when the stream cannot be read.
    pub async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, BusError> {
        let mut stream = self.dlq_stream().await?;
        let state = stream
            .info()
            .await
            .map_err(|e| admin("read the DLQ stream's state", e))?
            .state
            .clone();
        let mut found = Vec::new();
        if state.messages == 0 {
            return Ok(found);
        }
        let mut seq = state.last_sequence;
        while seq >= state.first_sequence && found.len() < limit {
            if let Some(letter) = self.dead_letter_by_id(seq).await? {
                found.push(letter);
            }
            seq -= 1;
        }
        Ok(found)
    }

    /// Publishes dead letter `id` again on its original subject (its payload, or `payload`
    /// when given, with `content_type`), marked with [`HEADER_RETRY_OF`], and removes it from
    /// the DLQ once the original stream has it. Returns the subject, `None` when there is no
    /// such dead letter.
    ///
    /// # Errors
    /// [`BusError::Publish`] when the original stream does not take it (the dead letter
    /// stays), [`BusError::Admin`] when the DLQ cannot be read or updated.
    pub async fn retry_dead_letter(
        &self,
        id: u64,
        payload: Option<(Bytes, &str)>,
    ) -> Result<Option<String>, BusError> {
        let Some(letter) = self.dead_letter_by_id(id).await? else {
            return Ok(None);
        };
        if letter.original_subject.is_empty() {
            return Err(admin(
                "retry a dead letter",
                std::io::Error::other(format!("dead letter {id} names no original subject")),
            ));
        }
        let mut headers = HeaderMap::new();
        for (name, values) in letter.headers.iter() {
            let name_text = name.to_string();
            if [HEADER_ERROR, HEADER_ORIGINAL_SUBJECT, HEADER_SERVICE]
                .iter()
                .any(|h| h.eq_ignore_ascii_case(&name_text))
            {
                continue;
            }
            if payload.is_some() && name_text.eq_ignore_ascii_case("Content-Type") {
                continue;
            }
            for value in values {
                headers.append(name.clone(), value.clone());
            }
        }
        let body = match payload {
            Some((edited, content_type)) => {
                headers.insert("Content-Type", content_type);
                edited
            }
            None => letter.payload.clone(),
        };
        headers.insert(HEADER_RETRY_OF, id.to_string().as_str());
        let subject = letter.original_subject.clone();
        let publish = Publish::build().payload(body).headers(headers);
        self.send_confirmed(&subject, publish)
            .await
            .map_err(|e| BusError::Publish {
                subject: subject.clone(),
                source: Box::new(e),
            })?;
        let stream = self.dlq_stream().await?;
        stream
            .delete_message(id)
            .await
            .map_err(|e| admin("remove a retried dead letter", e))?;
        Ok(Some(subject))
    }

    /// Removes every dead letter; returns how many there were.
    ///
    /// # Errors
    /// [`BusError::Admin`] when the stream cannot be purged.
    pub async fn purge_dead_letters(&self) -> Result<u64, BusError> {
        let stream = self.dlq_stream().await?;
        let purged = stream
            .purge()
            .await
            .map_err(|e| admin("purge the DLQ stream", e))?;
        Ok(purged.purged)
    }
}
