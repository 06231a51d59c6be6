//! `[bus]` settings, including how to authenticate to NATS.

use crate::BusError;

/// How to reach NATS and how the streams are laid out (`[bus]`, `AGENTLOOP_BUS__*`, `NATS_URL`).
///
/// At most one way to authenticate is used: `creds_file`, else `nkey_seed_file`, else
/// `user`/`password`, else none (or credentials in the URL).
#[derive(Clone, serde::Deserialize)]
#[serde(default)]
pub struct BusConfig {
    /// NATS server URL, or several seed URLs of one cluster separated by commas
    /// (`nats://a:4222,nats://b:4222`).
    pub url: String,
    /// Seed URLs as a TOML list; used instead of `url` when not empty.
    pub urls: Vec<String>,
    /// A NATS `.creds` file (user JWT and nkey seed), as issued by an operator.
    pub creds_file: String,
    /// A file holding an nkey user seed (`SU...`).
    pub nkey_seed_file: String,
    /// User name of a server-configured user, with `password`.
    pub user: String,
    /// Password of `user`; redacted in `Debug`.
    pub password: String,
    /// Subject under which this client's request replies arrive (`<inbox_prefix>.<id>`); empty
    /// means `_INBOX`. Give each service its own (`_INBOX.router`) so server permissions can keep
    /// one service from reading another's replies and pulled messages.
    pub inbox_prefix: String,
    /// PEM file of the CA that signed the server's certificate; turns TLS on.
    pub tls_ca_file: String,
    /// PEM client certificate, for servers that verify clients (`tls_key_file` too).
    pub tls_cert_file: String,
    /// PEM private key of `tls_cert_file`.
    pub tls_key_file: String,
    /// Refuse to talk to the server without TLS.
    pub tls_required: bool,
    /// Subject prefix; two stacks with different prefixes share one server.
    pub prefix: String,
    /// Connection timeout.
    pub connect_timeout_ms: u64,
    /// How long a JetStream request (a publish's acknowledgement, a stream or consumer call)
    /// waits for its answer before it is retried. Short, because a request that reached a node
    /// as it died is never answered, and every second of it is a second of paused replies.
    pub request_timeout_ms: u64,
    /// How long the connection may hear nothing from its server before a PING is sent; three
    /// unanswered in a row end it, and the client moves to another seed. A node cut off by a
    /// partition sends no reset, so this is what notices it: about three intervals.
    pub ping_interval_ms: u64,
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
    /// How run and inbox events are written: `proto` (compact, the default) or `json`, which
    /// a person reads with `nats sub` as it is. Readers take either.
    pub events_encoding: EventsEncoding,
    /// Most bytes of events kept; the oldest go first.
    pub events_max_bytes: i64,
    /// Most bytes of unprocessed work each work stream (inbound, runs, outbound) holds; past
    /// it a publish is refused, never is accepted work dropped.
    pub work_max_bytes: i64,
    /// Most bytes of dead letters kept; the oldest go first.
    pub dlq_max_bytes: i64,
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
    /// Whether the router and delivery publish every message in and reply out on
    /// `<prefix>.inbox.<channel>` (the inbox view); two more NATS messages per run.
    pub inbox_events: bool,
}

impl Default for BusConfig {
    fn default() -> Self {
        Self {
            url: "nats://127.0.0.1:4222".to_owned(),
            urls: Vec::new(),
            creds_file: String::new(),
            nkey_seed_file: String::new(),
            user: String::new(),
            password: String::new(),
            inbox_prefix: String::new(),
            tls_ca_file: String::new(),
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
            tls_required: false,
            prefix: "agentloop".to_owned(),
            connect_timeout_ms: 2_000,
            request_timeout_ms: 2_000,
            // async-nats's default of 60 s left a service on a partitioned node for 2-3 min.
            ping_interval_ms: 2_000,
            // A JetStream leader election takes 4-9 s (nats-server's Raft election timeout).
            publish_retry_ms: 30_000,
            replicas: 1,
            work_max_age_secs: 7 * 24 * 3600,
            events_max_age_secs: 3600,
            events_in_memory: true,
            events_encoding: EventsEncoding::Proto,
            events_max_bytes: 256 * 1024 * 1024,
            // JetStream reserves a stream's max_bytes on disk when it creates the stream, so the
            // defaults stay modest: 1 GiB in all, which a server with 1.4 GB free can reserve.
            work_max_bytes: 256 * 1024 * 1024,
            dlq_max_bytes: 256 * 1024 * 1024,
            dlq_max_age_secs: 14 * 24 * 3600,
            duplicate_window_secs: 120,
            ack_wait_ms: 30_000,
            ack_gather_ms: 20,
            max_deliver: 10,
            max_ack_pending: 1024,
            inbox_events: true,
        }
    }
}

impl std::fmt::Debug for BusConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redacted = |secret: &str| if secret.is_empty() { "" } else { "<redacted>" };
        f.debug_struct("BusConfig")
            .field("url", &self.display_urls())
            .field("creds_file", &self.creds_file)
            .field("nkey_seed_file", &self.nkey_seed_file)
            .field("user", &self.user)
            .field("password", &redacted(&self.password))
            .field("inbox_prefix", &self.inbox_prefix)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_cert_file", &self.tls_cert_file)
            .field("tls_key_file", &self.tls_key_file)
            .field("tls_required", &self.tls_required)
            .field("prefix", &self.prefix)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("request_timeout_ms", &self.request_timeout_ms)
            .field("ping_interval_ms", &self.ping_interval_ms)
            .field("publish_retry_ms", &self.publish_retry_ms)
            .field("replicas", &self.replicas)
            .field("work_max_age_secs", &self.work_max_age_secs)
            .field("events_max_age_secs", &self.events_max_age_secs)
            .field("events_in_memory", &self.events_in_memory)
            .field("events_max_bytes", &self.events_max_bytes)
            .field("work_max_bytes", &self.work_max_bytes)
            .field("dlq_max_bytes", &self.dlq_max_bytes)
            .field("dlq_max_age_secs", &self.dlq_max_age_secs)
            .field("duplicate_window_secs", &self.duplicate_window_secs)
            .field("ack_wait_ms", &self.ack_wait_ms)
            .field("ack_gather_ms", &self.ack_gather_ms)
            .field("max_deliver", &self.max_deliver)
            .field("max_ack_pending", &self.max_ack_pending)
            .field("inbox_events", &self.inbox_events)
            .finish()
    }
}

/// Hides the password of a `nats://user:password@host` URL, so a URL can be logged.
#[must_use]
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
    let Some((credentials, host)) = authority.rsplit_once('@') else {
        return url.to_owned();
    };
    let user = credentials.split_once(':').map_or(credentials, |(u, _)| u);
    let path = if path.is_empty() {
        String::new()
    } else {
        format!("/{path}")
    };
    format!("{scheme}://{user}:<redacted>@{host}{path}")
}

impl BusConfig {
    /// The seed URLs to connect to: `urls` when set, else `url` split at commas.
    ///
    /// # Errors
    /// [`BusError::InvalidUrl`] naming the first URL that does not parse.
    pub fn server_addrs(&self) -> Result<Vec<async_nats::ServerAddr>, BusError> {
        let seeds = self.seeds();
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

    /// The configured seed URLs, trimmed: `urls` when set, else `url` split at commas.
    fn seeds(&self) -> Vec<&str> {
        let listed: Vec<&str> = if self.urls.is_empty() {
            self.url.split(',').collect()
        } else {
            self.urls.iter().map(String::as_str).collect()
        };
        listed
            .into_iter()
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .collect()
    }

    /// The configured URLs for logs and errors, with any passwords in them masked.
    #[must_use]
    pub fn display_urls(&self) -> String {
        self.seeds()
            .into_iter()
            .map(redact_url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Returns connect options carrying this config's credentials, TLS and inbox prefix.
    ///
    /// # Errors
    /// [`BusError::Credentials`] when a credentials file cannot be read, or when the client
    /// certificate comes without its key.
    pub async fn connect_options(&self) -> Result<async_nats::ConnectOptions, BusError> {
        let mut options = async_nats::ConnectOptions::new();
        if !self.creds_file.is_empty() {
            options = options
                .credentials_file(&self.creds_file)
                .await
                .map_err(|source| BusError::Credentials {
                    path: self.creds_file.clone(),
                    source,
                })?;
        } else if !self.nkey_seed_file.is_empty() {
            let seed = std::fs::read_to_string(&self.nkey_seed_file).map_err(|source| {
                BusError::Credentials {
                    path: self.nkey_seed_file.clone(),
                    source,
                }
            })?;
            options = options.nkey(seed.trim().to_owned());
        } else if !self.user.is_empty() {
            options = options.user_and_password(self.user.clone(), self.password.clone());
        }
        if !self.inbox_prefix.is_empty() {
            options = options.custom_inbox_prefix(&self.inbox_prefix);
        }
        if !self.tls_ca_file.is_empty() {
            options = options.add_root_certificates(self.tls_ca_file.clone().into());
        }
        match (self.tls_cert_file.is_empty(), self.tls_key_file.is_empty()) {
            (false, false) => {
                options = options.add_client_certificate(
                    self.tls_cert_file.clone().into(),
                    self.tls_key_file.clone().into(),
                );
            }
            (true, true) => {}
            // Half a client identity would be silently dropped and the server would refuse
            // the connection with a less helpful message.
            _ => {
                return Err(BusError::Credentials {
                    path: format!("{}{}", self.tls_cert_file, self.tls_key_file),
                    source: std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        "bus.tls_cert_file and bus.tls_key_file must be set together",
                    ),
                });
            }
        }
        Ok(options.require_tls(self.tls_required || !self.tls_ca_file.is_empty()))
    }

    /// Returns whether `subject` may receive a caller's answer: under `<prefix>.reply.` or
    /// `_INBOX.`, and a plain subject (no wildcard, no blank). Anything else, such as an inbound
    /// subject, would let a message feed its own answer back in as a new message.
    #[must_use]
    pub fn allows_reply_subject(&self, subject: &str) -> bool {
        let prefix = self.prefix.trim_end_matches('.');
        let rest = subject.strip_prefix("_INBOX.").or_else(|| {
            subject
                .strip_prefix(prefix)
                .and_then(|s| s.strip_prefix(".reply."))
        });
        rest.is_some_and(|rest| {
            !rest.is_empty()
                && rest.split('.').all(|token| {
                    !token.is_empty()
                        && token
                            .chars()
                            .all(|c| !c.is_whitespace() && c != '*' && c != '>')
                })
        })
    }

    /// How often a message still being worked on is reported in progress: a third of
    /// `ack_wait_ms`, so a report lost or late still comes before the deadline.
    #[must_use]
    pub fn progress_every(&self) -> std::time::Duration {
        std::time::Duration::from_millis((self.ack_wait_ms / 3).max(1))
    }

    /// How long acks are gathered: `ack_gather_ms`, capped at a tenth of `ack_wait_ms` so that a
    /// gathered ack never arrives after the server has given the message to someone else.
    #[must_use]
    pub fn ack_gather(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.ack_gather_ms.min(self.ack_wait_ms / 10))
    }
}

/// How events are written on the bus (`bus.events_encoding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventsEncoding {
    /// Binary protobuf.
    #[default]
    Proto,
    /// Proto3 canonical JSON, readable as it is.
    Json,
}

impl EventsEncoding {
    /// The wire encoding it means.
    pub fn encoding(self) -> agentloop_proto::Encoding {
        match self {
            Self::Proto => agentloop_proto::Encoding::Proto,
            Self::Json => agentloop_proto::Encoding::Json,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_password_and_url_credentials() {
        let config = BusConfig {
            url: "nats://router:hunter2@nats:4222".to_owned(),
            user: "router".to_owned(),
            password: "s3cret-pass".to_owned(),
            ..Default::default()
        };
        let text = format!("{config:?}");
        assert!(!text.contains("s3cret-pass"), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.contains("router"), "{text}");
    }

    #[tokio::test]
    async fn a_missing_credentials_file_is_named() {
        let config = BusConfig {
            creds_file: "/nonexistent/router.creds".to_owned(),
            ..Default::default()
        };
        let err = config.connect_options().await.unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/router.creds"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_client_certificate_without_its_key_is_refused() {
        let config = BusConfig {
            tls_cert_file: "/etc/agentloop/client.pem".to_owned(),
            ..Default::default()
        };
        assert!(matches!(
            config.connect_options().await,
            Err(BusError::Credentials { .. })
        ));
    }

    #[test]
    fn only_reply_and_inbox_subjects_may_receive_answers() {
        let config = BusConfig::default();
        assert!(config.allows_reply_subject("agentloop.reply.abc"));
        assert!(config.allows_reply_subject("_INBOX.gateway.x1"));
        for forged in [
            "agentloop.inbound.cli",
            "agentloop.run.s1",
            "agentloop.reply.",
            "agentloop.reply.>",
            "_INBOX.*",
            "_INBOX",
            "other.reply.x",
            "agentloop.replyx.y",
            "_INBOX.a..b",
            "_INBOX.a b",
        ] {
            assert!(!config.allows_reply_subject(forged), "{forged}");
        }
    }

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
        assert!(text.contains("nats://u:<redacted>@b:notaport"), "{text}");
        assert!(!text.contains(":pw@"), "{text}");
    }

    #[test]
    fn urls_without_credentials_are_left_alone() {
        assert_eq!(redact_url("nats://nats:4222"), "nats://nats:4222");
        assert_eq!(
            redact_url("tls://a:b@n1:4222/x"),
            "tls://a:<redacted>@n1:4222/x"
        );
    }
}
