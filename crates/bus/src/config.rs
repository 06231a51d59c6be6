//! `[bus]` settings.

use crate::BusError;

/// How to reach NATS and how the streams are laid out (`[bus]`, `AGENTLOOP_BUS__*`, `NATS_URL`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(default)]
pub struct BusConfig {
    /// NATS server URL, or several seed URLs of one cluster separated by commas
    /// (`nats://a:4222,nats://b:4222`).
    pub url: String,
    /// Seed URLs as a TOML list; used instead of `url` when not empty.
    pub urls: Vec<String>,
    /// Subject prefix; two stacks with different prefixes share one server.
    pub prefix: String,
    /// Connection timeout.
    pub connect_timeout_ms: u64,
    /// How long a JetStream request (a publish's acknowledgement, a stream or consumer call)
    /// waits for its answer before it is retried. Short, because a request that reached a node
    /// as it died is never answered, and every second of it is a second of paused replies.
    pub request_timeout_ms: u64,
    /// How long a publish to a stream is retried while the stream cannot store it (no leader
    /// during a cluster election, a server restarting) before the caller is told it failed.
    pub publish_retry_ms: u64,
    /// Stream replicas (1 on a laptop, 3 in a cluster).
    pub replicas: usize,
    /// How long unprocessed work (inbound, runs, outbound) is kept.
    pub work_max_age_secs: u64,
    /// How long run events are kept for replay.
    pub events_max_age_secs: u64,
    /// Keep the EVENTS stream in memory (a server restart forgets events, not transcripts).
    pub events_in_memory: bool,
    /// Most bytes of events kept; the oldest go first.
    pub events_max_bytes: i64,
    /// How long dead letters are kept.
    pub dlq_max_age_secs: u64,
    /// JetStream dedup window for `Nats-Msg-Id`.
    pub duplicate_window_secs: u64,
    /// How long a consumer waits for an ack before redelivering.
    pub ack_wait_ms: u64,
    /// How long the router and delivery gather acks of handled messages before sending them
    /// together (see [`crate::Acks`]); kept well below `ack_wait_ms`.
    pub ack_gather_ms: u64,
    /// Deliveries before a message is given up on.
    pub max_deliver: i64,
    /// Unacknowledged messages a durable consumer hands out at once.
    pub max_ack_pending: i64,
}

impl Default for BusConfig {
    fn default() -> Self {
        Self {
            url: "nats://127.0.0.1:4222".to_owned(),
            urls: Vec::new(),
            prefix: "agentloop".to_owned(),
            connect_timeout_ms: 2_000,
            request_timeout_ms: 2_000,
            // A JetStream leader election takes 1-6 s; a restarted single server a few more.
            publish_retry_ms: 30_000,
            replicas: 1,
            work_max_age_secs: 7 * 24 * 3600,
            events_max_age_secs: 3600,
            events_in_memory: true,
            events_max_bytes: 256 * 1024 * 1024,
            dlq_max_age_secs: 14 * 24 * 3600,
            duplicate_window_secs: 120,
            ack_wait_ms: 30_000,
            ack_gather_ms: 20,
            max_deliver: 10,
            max_ack_pending: 1024,
        }
    }
}

impl BusConfig {
    /// The seed URLs to connect to: `urls` when set, else `url` split at commas.
    ///
    /// # Errors
    /// [`BusError::InvalidUrl`] naming the first URL that does not parse.
    pub fn server_addrs(&self) -> Result<Vec<async_nats::ServerAddr>, BusError> {
        let listed: Vec<&str> = if self.urls.is_empty() {
            self.url.split(',').collect()
        } else {
            self.urls.iter().map(String::as_str).collect()
        };
        let seeds: Vec<&str> = listed
            .iter()
            .map(|u| u.trim())
            .filter(|u| !u.is_empty())
            .collect();
        if seeds.is_empty() {
            return Err(BusError::InvalidUrl {
                url: String::new(),
                reason: "no NATS URL configured".to_owned(),
            });
        }
        seeds
            .into_iter()
            .map(|seed| {
                seed.parse::<async_nats::ServerAddr>()
                    .map_err(|e| BusError::InvalidUrl {
                        url: redact_url(seed),
                        reason: e.to_string(),
                    })
            })
            .collect()
    }

    /// The configured URLs for logs and errors, with any credentials in them masked.
    #[must_use]
    pub fn display_urls(&self) -> String {
        let listed: Vec<&str> = if self.urls.is_empty() {
            self.url.split(',').collect()
        } else {
            self.urls.iter().map(String::as_str).collect()
        };
        listed
            .iter()
            .map(|u| redact_url(u.trim()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// How long acks are gathered: `ack_gather_ms`, capped at a tenth of `ack_wait_ms` so that a
    /// gathered ack never arrives after the server has given the message to someone else.
    #[must_use]
    pub fn ack_gather(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.ack_gather_ms.min(self.ack_wait_ms / 10))
    }
}

/// Masks the user-info part of a URL (`nats://user:secret@host` → `nats://***@host`), so a
/// URL can be logged.
#[must_use]
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return match url.rsplit_once('@') {
            Some((_, host)) => format!("***@{host}"),
            None => url.to_owned(),
        };
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://***@{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comma_separated_seed_urls_are_each_a_server() {
        let config = BusConfig {
            url: "nats://a:4222, nats://b:4223,nats://c:4224".to_owned(),
            ..BusConfig::default()
        };
        let addrs = config.server_addrs().expect("three seeds parse");
        let hosts: Vec<String> = addrs
            .iter()
            .map(|a| format!("{}:{}", a.host(), a.port()))
            .collect();
        assert_eq!(hosts, ["a:4222", "b:4223", "c:4224"]);
    }

    #[test]
    fn a_toml_list_of_urls_wins_over_url() {
        let config = BusConfig {
            url: "nats://ignored:1".to_owned(),
            urls: vec!["nats://x:4222".to_owned(), "nats://y:4222".to_owned()],
            ..BusConfig::default()
        };
        assert_eq!(config.server_addrs().expect("parse").len(), 2);
    }

    #[test]
    fn a_bad_seed_is_named_in_the_error_without_its_password() {
        let config = BusConfig {
            url: "nats://a:4222,nats://u:pw@b:notaport".to_owned(),
            ..BusConfig::default()
        };
        let err = config.server_addrs().expect_err("a bad port is refused");
        let text = err.to_string();
        assert!(text.contains("nats://***@b:notaport"), "{text}");
        assert!(!text.contains("pw"), "{text}");
    }

    #[test]
    fn credentials_in_urls_are_masked() {
        assert_eq!(
            redact_url("nats://u:secret@host:4222"),
            "nats://***@host:4222"
        );
        assert_eq!(
            redact_url("postgres://u:p@db/x?a=b@c"),
            "postgres://***@db/x?a=b@c"
        );
        assert_eq!(redact_url("nats://host:4222"), "nats://host:4222");
        assert_eq!(redact_url("tls://tok@host"), "tls://***@host");
    }
}
