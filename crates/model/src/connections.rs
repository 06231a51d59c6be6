//! The HTTP clients model calls go out on.
//!
//! HTTP/1.1 (the default): one client, whose pool opens a connection per call in flight (a
//! streamed answer holds its connection until its last byte). HTTP/2 (`models.http2_streams`
//! above 0): calls share connections, at most that many streams each. A reqwest client keeps
//! one HTTP/2 connection per host and queues the streams past the server's limit on it, so
//! each connection here is a client of its own, and a call that finds every one of them full
//! opens another rather than waiting behind the others.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::ModelError;

/// Where a call goes out.
#[derive(Debug)]
pub(crate) enum Connections {
    /// One connection per call in flight.
    Http1(reqwest::Client),
    /// Shared connections, at most `streams` calls on each.
    Http2 {
        connect_timeout: Duration,
        streams: usize,
        clients: Mutex<Vec<Arc<Shared>>>,
    },
}

/// A client of one HTTP/2 connection (per host) and the calls on it now.
#[derive(Debug)]
pub(crate) struct Shared {
    client: reqwest::Client,
    calls: AtomicUsize,
}

/// A call's place on a connection: given back when dropped (the answer read to its end, or
/// given up).
#[derive(Debug)]
pub(crate) struct Slot(Option<Arc<Shared>>);

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(shared) = &self.0 {
            shared.calls.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Connections {
    /// HTTP/1.1 when `http2_streams` is 0, else HTTP/2 with at most that many calls on a
    /// connection.
    ///
    /// # Errors
    /// `Client` when the HTTP client cannot be built.
    pub(crate) fn new(connect_timeout: Duration, http2_streams: u32) -> Result<Self, ModelError> {
        if http2_streams == 0 {
            return Ok(Self::Http1(client(connect_timeout, false)?));
        }
        Ok(Self::Http2 {
            connect_timeout,
            streams: usize::try_from(http2_streams).unwrap_or(usize::MAX),
            clients: Mutex::new(Vec::new()),
        })
    }

    /// The client for the next call, and its slot, which the call holds to its end.
    ///
    /// # Errors
    /// `Client` when a client for a new connection cannot be built.
    pub(crate) fn take(&self) -> Result<(reqwest::Client, Slot), ModelError> {
        let (connect_timeout, streams, clients) = match self {
            Self::Http1(client) => return Ok((client.clone(), Slot(None))),
            Self::Http2 {
                connect_timeout,
                streams,
                clients,
            } => (*connect_timeout, *streams, clients),
        };
        let mut clients = clients.lock().unwrap_or_else(PoisonError::into_inner);
        // The first with room: calls pack onto as few connections as they fit on.
        let shared = match clients
            .iter()
            .find(|shared| shared.calls.load(Ordering::Relaxed) < streams)
        {
            Some(shared) => shared.clone(),
            None => {
                let shared = Arc::new(Shared {
                    client: client(connect_timeout, true)?,
                    calls: AtomicUsize::new(0),
                });
                clients.push(shared.clone());
                shared
            }
        };
        shared.calls.fetch_add(1, Ordering::Relaxed);
        Ok((shared.client.clone(), Slot(Some(shared))))
    }
}

/// A client speaking HTTP/1.1, or HTTP/2 only (also over plain `http://`, by prior knowledge).
fn client(connect_timeout: Duration, http2: bool) -> Result<reqwest::Client, ModelError> {
    // No overall reqwest timeout: it would cut long streams. Timeouts are applied per wait.
    let builder = reqwest::Client::builder()
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true);
    let builder = if http2 {
        builder.http2_prior_knowledge()
    } else {
        builder.http1_only()
    };
    builder.build().map_err(ModelError::Client)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_fill_a_connection_before_another_opens_and_a_freed_stream_is_used_again() {
        let connections = Connections::new(Duration::from_secs(1), 2).unwrap();
        let Connections::Http2 { clients, .. } = &connections else {
            panic!("HTTP/2 asked for");
        };
        let count = || clients.lock().unwrap().len();
        let first = connections.take().unwrap().1;
        let second = connections.take().unwrap().1;
        assert_eq!(count(), 1, "two calls fit on one connection");
        let third = connections.take().unwrap().1;
        assert_eq!(count(), 2, "the third opens a second");
        drop(second);
        let fourth = connections.take().unwrap().1;
        assert_eq!(count(), 2, "the first connection's freed stream is taken");
        assert!(Arc::ptr_eq(
            first.0.as_ref().unwrap(),
            fourth.0.as_ref().unwrap()
        ));
        drop((first, third, fourth));
        assert!(
            clients
                .lock()
                .unwrap()
                .iter()
                .all(|shared| shared.calls.load(Ordering::Relaxed) == 0)
        );
    }

    #[test]
    fn http1_calls_share_one_client_and_hold_no_slot() {
        let connections = Connections::new(Duration::from_secs(1), 0).unwrap();
        let (_, slot) = connections.take().unwrap();
        assert!(slot.0.is_none());
        assert!(matches!(connections, Connections::Http1(_)));
    }
}
