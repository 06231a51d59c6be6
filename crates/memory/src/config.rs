//! The `[memory]` section of the merged configuration document.

use serde::Deserialize;

/// The memory service's view of the configuration document; other sections are other services'.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(default)]
pub struct MemoryConfig {
    /// The `[memory]` section.
    pub memory: MemorySettings,
}

agentloop_lifecycle::config_schema!(MemoryConfig);

/// Settings of the memory service (`AGENTLOOP_MEMORY__<KEY>`).
///
/// No `deny_unknown_fields`: clients read keys of their own in the same section
/// (`agentloop_lifecycle::MemoryEndpoint`); the loader refuses a key that neither reads.
/// `Debug` masks the database password.
#[derive(Clone, Deserialize)]
#[serde(default)]
pub struct MemorySettings {
    /// Address the gRPC server binds; port 0 picks a free one.
    pub listen: String,
    /// Address clients dial; unused by the server itself.
    pub url: String,
    /// Postgres URL; the database is created on start when it does not exist.
    pub database_url: String,
    /// Address of `/healthz`, `/readyz` and `/metrics`; empty means an ephemeral loopback port.
    pub admin_listen: String,
    /// Size of the Postgres connection pool; 0 means four per CPU core. Measured on 2 cores:
    /// 8 connections used 0.68 Postgres CPU-ms per run at 100 sessions, 32 used 1.04. Up to
    /// half of them are held between calls rather than given back, which spares sqlx's ping
    /// (one round trip) after each call. The run path's batches open one more per lane,
    /// outside this pool.
    pub max_connections: u32,
    /// Entries returned by `GetHistory` when the request's limit is 0.
    pub history_limit: u32,
    /// Run-path batches in Postgres at once. Enqueues and run ends that arrive while all lanes
    /// are busy share the next batch: one statement, one round trip and one commit for all of
    /// them. One lane made batches of 12 calls at 100 sessions where two made 3.5 (bench/HISTORY.md).
    pub batch_lanes: usize,
    /// Most calls in one batch.
    pub batch_max_calls: usize,
    /// Shared secret every gRPC call must present (`authorization: Bearer <secret>`); empty
    /// accepts every caller that can reach `listen`.
    pub secret: String,
    /// PEM certificate chain the gRPC port presents; with `tls_key_file` it turns TLS on.
    pub tls_cert_file: String,
    /// PEM private key of `tls_cert_file`.
    pub tls_key_file: String,
    /// Most pending (not yet consumed) inputs one session may hold; an input past it is refused
    /// with `queue_full` instead of stored. 0 means no cap.
    pub inbox_max_pending: u64,
    /// MiB of recently searched users' memories and vectors kept for hybrid search (0: none).
    pub vector_cache_mb: usize,
    /// How often live sessions, queued inputs, stuck sessions and pending approvals are read
    /// into gauges (one statement; it scans the sessions table): 0 never.
    pub gauges_interval_ms: u64,
    /// A session holding its lease with an input waiting longer than this is stuck
    /// (`agentloop_sessions_stuck`); longer than the longest run you allow.
    pub stuck_after_ms: u64,
}

impl Default for MemorySettings {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:50051".to_owned(),
            url: "http://127.0.0.1:50051".to_owned(),
            database_url: "postgres://postgres@127.0.0.1:5432/agentloop".to_owned(),
            admin_listen: String::new(),
            max_connections: 0,
            history_limit: 200,
            batch_lanes: 1,
            batch_max_calls: 64,
            secret: String::new(),
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
            inbox_max_pending: 1000,
            vector_cache_mb: 64,
            gauges_interval_ms: 15_000,
            stuck_after_ms: 900_000,
        }
    }
}

impl std::fmt::Debug for MemorySettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemorySettings")
            .field("listen", &self.listen)
            .field("url", &self.url)
            .field("database_url", &redact_url_password(&self.database_url))
            .field("admin_listen", &self.admin_listen)
            .field("max_connections", &self.max_connections)
            .field("history_limit", &self.history_limit)
            .field("batch_lanes", &self.batch_lanes)
            .field("batch_max_calls", &self.batch_max_calls)
            .field("inbox_max_pending", &self.inbox_max_pending)
            .field("vector_cache_mb", &self.vector_cache_mb)
            .field("gauges_interval_ms", &self.gauges_interval_ms)
            .field("stuck_after_ms", &self.stuck_after_ms)
            .field(
                "secret",
                &if self.secret.is_empty() {
                    ""
                } else {
                    "<redacted>"
                },
            )
            .field("tls_cert_file", &self.tls_cert_file)
            .field("tls_key_file", &self.tls_key_file)
            .finish()
    }
}

/// Masks the passwords of a URL, for logs: the one in its user info
/// (`postgres://user:***@host/db`) and the value of every `password` (or `sslpassword`) query
/// parameter (`?password=***`), which libpq-style URLs accept as well. A URL without either is
/// returned as is.
pub(crate) fn redact_url_password(url: &str) -> std::borrow::Cow<'_, str> {
    let userinfo_masked = redact_userinfo_password(url);
    match redact_query_passwords(&userinfo_masked) {
        Some(masked) => masked.into(),
        None => userinfo_masked,
    }
}

/// Masks the password of a URL's user info; a URL without one is returned as is.
fn redact_userinfo_password(url: &str) -> std::borrow::Cow<'_, str> {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.into();
    };
    let authority_end = url[scheme_end..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| scheme_end + i);
    // The last '@' ends the user info: a password may itself hold an unescaped '@'.
    let Some(at) = url[scheme_end..authority_end]
        .rfind('@')
        .map(|i| scheme_end + i)
    else {
        return url.into();
    };
    match url[scheme_end..at].find(':') {
        Some(colon) => format!("{}***{}", &url[..scheme_end + colon + 1], &url[at..]).into(),
        None => url.into(),
    }
}

/// The URL with the value of each password query parameter masked, or `None` when it has none.
/// The query starts at the first '?' and ends at a '#'.
fn redact_query_passwords(url: &str) -> Option<String> {
    let query_start = url.find('?')? + 1;
    let query_end = url[query_start..]
        .find('#')
        .map_or(url.len(), |i| query_start + i);
    let mut masked = false;
    let params: Vec<String> = url[query_start..query_end]
        .split('&')
        .map(|param| match param.split_once('=') {
            Some((key, _)) if is_password_key(key) => {
                masked = true;
                format!("{key}=***")
            }
            _ => param.to_owned(),
        })
        .collect();
    masked.then(|| {
        format!(
            "{}{}{}",
            &url[..query_start],
            params.join("&"),
            &url[query_end..]
        )
    })
}

/// Whether a query key names a password: compared percent-decoded and in any case, as the URL
/// parser that reads it decodes keys.
fn is_password_key(key: &str) -> bool {
    let bytes = key.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                decoded.push(byte);
                i += 3;
            }
            (byte, _) => {
                decoded.push(byte);
                i += 1;
            }
        }
    }
    decoded.eq_ignore_ascii_case(b"password") || decoded.eq_ignore_ascii_case(b"sslpassword")
}

impl MemorySettings {
    /// The pool size to use: `max_connections`, or four per core when it is 0. Few busy
    /// backends per core beat many: each extra one adds context switches and lock traffic.
    pub fn pool_size(&self) -> u32 {
        if self.max_connections > 0 {
            return self.max_connections;
        }
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get);
        u32::try_from(cores * 4).unwrap_or(u32::MAX).clamp(4, 64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_section_is_read_from_a_shared_document() {
        let env = [
            ("AGENTLOOP_MEMORY__LISTEN", "0.0.0.0:6000"),
            ("AGENTLOOP_MEMORY__HISTORY_LIMIT", "50"),
            ("AGENTLOOP_MEMORY__INBOX_MAX_PENDING", "5"),
            ("AGENTLOOP_MEMORY__TLS_CA_FILE", "read by clients only"),
            ("AGENTLOOP_TELEMETRY__LOG_LEVEL", "debug"),
            ("DATABASE_URL", "postgres://db/agentloop"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));

        let config: MemoryConfig = agentloop_lifecycle::load_config_from(None, env).unwrap();

        assert_eq!(config.memory.listen, "0.0.0.0:6000");
        assert_eq!(config.memory.history_limit, 50);
        assert_eq!(config.memory.inbox_max_pending, 5);
        assert_eq!(MemorySettings::default().inbox_max_pending, 1000);
        assert_eq!(config.memory.database_url, "postgres://db/agentloop");
        assert_eq!(config.memory.url, "http://127.0.0.1:50051");
        assert_eq!(config.memory.max_connections, 0);
        assert!(config.memory.pool_size() >= 4);
        assert!(config.memory.admin_listen.is_empty());

        let typo = [("AGENTLOOP_MEMORY__HISTORY_LIMT".to_owned(), "5".to_owned())];
        let err = agentloop_lifecycle::load_config_from::<MemoryConfig>(None, typo).unwrap_err();
        assert!(
            err.to_string()
                .contains("`AGENTLOOP_MEMORY__HISTORY_LIMIT`"),
            "{err}"
        );
    }

    #[test]
    fn the_database_password_never_shows_in_debug_or_logs() {
        let settings = MemorySettings {
            database_url: "postgres://agent:hunter2@db:5432/agentloop".to_owned(),
            ..MemorySettings::default()
        };
        let shown = format!("{settings:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(
            shown.contains("postgres://agent:***@db:5432/agentloop"),
            "{shown}"
        );
        assert_eq!(
            redact_url_password("postgres://u:p@ss@h/db?sslmode=require"),
            "postgres://u:***@h/db?sslmode=require"
        );
        for plain in [
            "postgres://postgres@127.0.0.1:5432/test",
            "postgres://db/x?sslmode=require&application_name=password",
            "postgres://db/x?passwords=x&user=password",
            "postgres://db/x",
            "not a url",
        ] {
            assert_eq!(redact_url_password(plain), plain);
        }
    }

    #[test]
    fn a_password_given_as_a_query_parameter_is_masked_too() {
        let settings = MemorySettings {
            database_url: "postgres://agent@db:5432/agentloop?sslmode=require&password=hunter2"
                .to_owned(),
            ..MemorySettings::default()
        };
        let shown = format!("{settings:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(
            shown.contains("postgres://agent@db:5432/agentloop?sslmode=require&password=***"),
            "{shown}"
        );
        for (url, masked) in [
            (
                "postgres://db/x?password=s3cret",
                "postgres://db/x?password=***",
            ),
            (
                "postgres://db/x?PASSWORD=s3cret&user=a#frag",
                "postgres://db/x?PASSWORD=***&user=a#frag",
            ),
            (
                "postgres://db/x?pass%77ord=s3cret",
                "postgres://db/x?pass%77ord=***",
            ),
            (
                "postgres://db/x?sslpassword=k&password=p&password=q",
                "postgres://db/x?sslpassword=***&password=***&password=***",
            ),
            // Both forms at once.
            (
                "postgres://u:p@ss@h/db?password=q",
                "postgres://u:***@h/db?password=***",
            ),
        ] {
            assert_eq!(redact_url_password(url), masked, "{url}");
        }
    }
}
