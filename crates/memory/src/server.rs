//! The memory server: binds the gRPC listener at once, connects to Postgres in the background
//! (creating the database and migrating it), and keeps readiness in step with the database.

use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use agentloop_lifecycle::{Health, Readiness};
use agentloop_proto::v1::session_service_server::SessionServiceServer;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions as _, Connection as _, PgConnection};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::error::Chain;
use crate::grpc::SessionApi;
use crate::store::{BatchCounters, BatchSettings, Store, error as store_error};
use crate::{MemoryConfig, MemoryError, MemorySettings};

/// The schema, embedded at build time from `crates/memory/migrations`.
static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// First retry delay after a failed connection; doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How often a ready server checks that Postgres still answers.
const HEALTH_INTERVAL: Duration = Duration::from_secs(2);
/// An RPC waits this long for a pooled connection before answering UNAVAILABLE.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// A bound memory server, not yet serving.
pub struct Memory {
    listener: TcpListener,
    /// The gRPC server builder, with TLS already set up when configured.
    server: tonic::transport::Server,
    local_addr: SocketAddr,
    config: MemoryConfig,
    health: Health,
    readiness: Readiness,
}

impl Memory {
    /// Binds the gRPC listener (port 0 allowed), loads the TLS certificate and key when
    /// configured and registers the `memory` readiness component; does not wait for Postgres.
    ///
    /// # Errors
    /// [`MemoryError::Bind`] when the address cannot be bound; [`MemoryError::TlsIncomplete`],
    /// [`MemoryError::TlsFile`] or [`MemoryError::Tls`] for TLS settings that cannot work.
    pub async fn bind(config: MemoryConfig, health: Health) -> Result<Memory, MemoryError> {
        // Before binding: a bad TLS setting should stop the start, not show at the first call.
        let server = grpc_server(&config.memory)?;
        let addr = config.memory.listen.clone();
        let bind_error = |source| MemoryError::Bind {
            addr: addr.clone(),
            source,
        };
        let listener = TcpListener::bind(&addr).await.map_err(bind_error)?;
        let local_addr = listener.local_addr().map_err(bind_error)?;
        let readiness = health.component("memory");
        Ok(Memory {
            listener,
            server,
            local_addr,
            config,
            health,
            readiness,
        })
    }

    /// Returns the bound gRPC address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves gRPC until `shutdown` is cancelled, then drains in-flight calls and closes the
    /// pool.
    ///
    /// Meanwhile it connects to Postgres with backoff (retrying until shutdown, readiness off,
    /// calls answered UNAVAILABLE), creates the database when missing, runs the migrations and
    /// turns readiness on. A later outage turns readiness off again; it never ends the server.
    ///
    /// # Errors
    /// [`MemoryError::DatabaseUrl`] for an unparsable URL, [`MemoryError::Migrate`] when the
    /// schema cannot be migrated (not for an unreachable server), [`MemoryError::Serve`] when
    /// the gRPC server fails.
    pub async fn serve(self, shutdown: CancellationToken) -> Result<(), MemoryError> {
        let Memory {
            listener,
            server,
            local_addr,
            config,
            health,
            readiness,
        } = self;
        let slot = Arc::new(OnceLock::new());
        let api = SessionApi::new(
            slot.clone(),
            &health,
            readiness.clone(),
            config.memory.history_limit,
            config.memory.inbox_max_pending,
        );
        // Whichever half fails first stops the other, so a fatal migration error does not
        // leave a server that can never become ready.
        let stop = shutdown.child_token();
        // tonic runs the TLS handshake on each connection this stream yields when TLS is set.
        let incoming = agentloop_telemetry::grpc_incoming(listener);
        let tls = !config.memory.tls_cert_file.is_empty();
        let secret = crate::auth::RequireSecret::new(&config.memory.secret);
        let grpc = {
            let stop = stop.clone();
            async move {
                tracing::info!(addr = %local_addr, tls, "memory grpc serving");
                let served = server
                    .trace_fn(agentloop_telemetry::grpc_server_span)
                    .add_service(SessionServiceServer::with_interceptor(api, secret))
                    .serve_with_incoming_shutdown(incoming, stop.clone().cancelled_owned())
                    .await
                    .map_err(MemoryError::Serve);
                stop.cancel();
                served
            }
        };
        let counters = BatchCounters {
            batches: health.counter(
                "agentloop_memory_batches_total",
                "Run-path batches sent to Postgres (one round trip and commit each).",
            ),
            items: health.counter(
                "agentloop_memory_batched_calls_total",
                "Enqueue and FinishRun calls carried by those batches.",
            ),
            fallbacks: health.counter(
                "agentloop_memory_batch_fallbacks_total",
                "Batches Postgres refused that ran again in parts (call by call, or as two halves).",
            ),
            combined: health.counter(
                "agentloop_memory_combined_batches_total",
                "Batches that carried enqueues and run ends together, as one statement.",
            ),
            sizes: Some(health.size_histogram_family(
                "agentloop_memory_batch_size",
                "Calls per run-path batch (enqueues and run ends in one round trip).",
            )),
        };
        let database = {
            let (slot, readiness, stop) = (slot.clone(), readiness.clone(), stop.clone());
            let gauges = crate::gauges::WaitingGauges::new(&health);
            async move {
                let supervised =
                    supervise_database(config, counters, gauges, slot, readiness, stop.clone())
                        .await;
                if supervised.is_err() {
                    stop.cancel();
                }
                supervised
            }
        };
        let (served, supervised) = tokio::join!(grpc, database);
        readiness.set(false);
        if let Some(store) = slot.get() {
            store.close().await;
        }
        tracing::info!("memory stopped");
        supervised.and(served)
    }
}

/// The gRPC server builder: plain, or serving TLS with `tls_cert_file` and `tls_key_file`.
fn grpc_server(settings: &MemorySettings) -> Result<tonic::transport::Server, MemoryError> {
    let server = tonic::transport::Server::builder();
    let (cert, key) = (&settings.tls_cert_file, &settings.tls_key_file);
    match (cert.is_empty(), key.is_empty()) {
        (true, true) => Ok(server),
        (false, true) => Err(MemoryError::TlsIncomplete {
            set: "tls_cert_file",
        }),
        (true, false) => Err(MemoryError::TlsIncomplete {
            set: "tls_key_file",
        }),
        (false, false) => {
            let read = |path: &String| {
                std::fs::read(path).map_err(|source| MemoryError::TlsFile {
                    path: path.clone(),
                    source,
                })
            };
            let identity = tonic::transport::Identity::from_pem(read(cert)?, read(key)?);
            server
                .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
                .map_err(|source| MemoryError::Tls {
                    cert: cert.clone(),
                    key: key.clone(),
                    source,
                })
        }
    }
}

/// Connects, migrates, publishes the store, then checks the database every few seconds until
/// `stop`.
async fn supervise_database(
    config: MemoryConfig,
    counters: BatchCounters,
    gauges: crate::gauges::WaitingGauges,
    slot: Arc<OnceLock<Store>>,
    readiness: Readiness,
    stop: CancellationToken,
) -> Result<(), MemoryError> {
    let mut options = PgConnectOptions::from_str(&config.memory.database_url)
        .map_err(MemoryError::DatabaseUrl)?
        // Connection chatter (every statement at info) would drown the service's own logs.
        .disable_statement_logging();
    if plain_on_loopback(&config.memory.database_url, options.get_host()) {
        options = options.ssl_mode(sqlx::postgres::PgSslMode::Disable);
    }
    let pool = PgPoolOptions::new()
        .max_connections(config.memory.pool_size())
        .acquire_timeout(ACQUIRE_TIMEOUT)
        // A ping before every checkout doubles the round trips of each call. A connection that
        // died with the server fails its next statement with an I/O error instead, which the
        // caller sees as UNAVAILABLE and retries, and the pool drops that connection.
        .test_before_acquire(false)
        .connect_lazy_with(options.clone());
    let Some(()) =
        prepare_database(&options, &pool, &stop, config.memory.inbox_max_pending).await?
    else {
        return Ok(());
    };
    let batching = BatchSettings {
        lanes: config.memory.batch_lanes,
        max_items: config.memory.batch_max_calls,
    };
    let store = Store::with_batching(pool, batching, &counters)
        .with_vector_cache(config.memory.vector_cache_mb.saturating_mul(1 << 20));
    let store = slot.get_or_init(|| store);
    readiness.set(true);
    if config.memory.gauges_interval_ms > 0 {
        tokio::spawn(crate::gauges::report(
            store.clone(),
            gauges,
            Duration::from_millis(config.memory.gauges_interval_ms),
            config.memory.stuck_after_ms,
            stop.clone(),
        ));
    }
    tracing::info!(
        database = %crate::config::redact_url_password(&config.memory.database_url),
        "memory ready: database connected and migrated"
    );

    let mut healthy = true;
    loop {
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            () = tokio::time::sleep(HEALTH_INTERVAL) => {}
        }
        let checked = match tokio::time::timeout(HEALTH_INTERVAL, store.ping()).await {
            Ok(checked) => checked,
            Err(_elapsed) => Err(MemoryError::Unavailable(sqlx::Error::PoolTimedOut)),
        };
        match checked {
            Ok(()) => {
                if !healthy {
                    tracing::info!("database reachable again; memory ready");
                }
                healthy = true;
                readiness.set(true);
            }
            Err(err) => {
                if healthy {
                    tracing::warn!(error = %Chain(&err), "database check failed; memory not ready");
                }
                healthy = false;
                readiness.set(false);
            }
        }
    }
}

/// Whether to talk to Postgres without TLS although the URL does not say so: a server on this
/// host (loopback or a Unix socket), where TLS only costs CPU on every call. Anywhere else, or
/// with `sslmode` in the URL, libpq's rule holds (TLS when the server offers it).
fn plain_on_loopback(url: &str, host: &str) -> bool {
    let chose = url
        .split_once('?')
        .is_some_and(|(_, query)| query.split('&').any(|p| p.starts_with("sslmode=")));
    !chose && (host.starts_with('/') || matches!(host, "127.0.0.1" | "::1" | "[::1]" | "localhost"))
}

/// Connects with backoff until the database exists and is migrated; `None` when `stop` came
/// first.
async fn prepare_database(
    options: &PgConnectOptions,
    pool: &PgPool,
    stop: &CancellationToken,
    inbox_max_pending: u64,
) -> Result<Option<()>, MemoryError> {
    let mut backoff = MIN_BACKOFF;
    loop {
        let attempt = tokio::select! {
            () = stop.cancelled() => return Ok(None),
            attempt = connect_and_migrate(options, pool, inbox_max_pending) => attempt,
        };
        match attempt {
            Ok(()) => return Ok(Some(())),
            Err(MemoryError::Migrate(err)) if !store_error::is_transient_migration(&err) => {
                return Err(MemoryError::Migrate(err));
            }
            Err(err @ MemoryError::Credentials(_)) => return Err(err),
            Err(err) => {
                tracing::warn!(
                    error = %Chain(&err),
                    retry_in_ms = u64::try_from(backoff.as_millis()).unwrap_or(u64::MAX),
                    "cannot reach the database yet; retrying",
                );
            }
        }
        tokio::select! {
            () = stop.cancelled() => return Ok(None),
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Checks that the server answers with one direct connection (creating the database on first
/// start), then migrates through the pool.
async fn connect_and_migrate(
    options: &PgConnectOptions,
    pool: &PgPool,
    inbox_max_pending: u64,
) -> Result<(), MemoryError> {
    // A direct connection fails fast and says why (refused, no such database); the pool would
    // retry until its acquire timeout and report only that.
    let probe = match PgConnection::connect_with(options).await {
        Err(err) if store_error::is_missing_database(&err) => {
            create_database(options).await?;
            PgConnection::connect_with(options).await
        }
        connected => connected,
    };
    let probe = probe.map_err(|err| {
        if store_error::is_refused_credentials(&err) {
            MemoryError::Credentials(err)
        } else {
            MemoryError::Unavailable(err)
        }
    })?;
    if let Err(err) = probe.close().await {
        tracing::debug!(error = %err, "closing the probe connection failed");
    }
    // Replicas starting together serialize on sqlx's migration advisory lock. Through the pool
    // rather than the probe: `run(&mut PgConnection)` trips rustc's higher-ranked `Send` check
    // once this future is spawned.
    MIGRATOR.run(pool).await.map_err(MemoryError::Migrate)?;
    // Written before the store is published: the inbox's trigger reads it on every enqueue.
    crate::store::write_inbox_max_pending(pool, inbox_max_pending)
        .await
        .map_err(MemoryError::Unavailable)
}

/// Creates the configured database through the `postgres` maintenance database, so a first
/// start on a laptop needs no manual step.
async fn create_database(options: &PgConnectOptions) -> Result<(), MemoryError> {
    let name = options.get_database().unwrap_or("postgres").to_owned();
    tracing::info!(database = %name, "database does not exist; creating it");
    let admin = options.clone().database("postgres");
    let mut conn = PgConnection::connect_with(&admin)
        .await
        .map_err(MemoryError::Unavailable)?;
    // CREATE DATABASE takes no bind parameters; the name is quoted as an identifier.
    let statement = format!("CREATE DATABASE {}", quote_identifier(&name));
    let created = sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
        .execute(&mut conn)
        .await;
    if let Err(err) = conn.close().await {
        tracing::debug!(error = %err, "closing the maintenance connection failed");
    }
    match created {
        Ok(_) => Ok(()),
        // Another replica created it between our connect and this statement.
        Err(err) if store_error::is_duplicate_database(&err) => Ok(()),
        Err(err) if store_error::is_transient(&err) => Err(MemoryError::Unavailable(err)),
        Err(err) => Err(MemoryError::Database(err)),
    }
}

/// Quotes a Postgres identifier: wraps it in double quotes and doubles the ones inside.
fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_local_server_without_a_chosen_sslmode_is_spoken_to_in_plain() {
        let local = "postgres://u@127.0.0.1:5432/db";
        assert!(plain_on_loopback(local, "127.0.0.1"));
        assert!(plain_on_loopback("postgres://u@localhost/db", "localhost"));
        assert!(plain_on_loopback("postgres:///db?host=/run/pg", "/run/pg"));
        assert!(!plain_on_loopback(
            "postgres://u@127.0.0.1/db?sslmode=require",
            "127.0.0.1"
        ));
        assert!(!plain_on_loopback(
            "postgres://u@db.internal/db",
            "db.internal"
        ));
    }

    #[test]
    fn identifiers_are_quoted_with_inner_quotes_doubled() {
        assert_eq!(quote_identifier("agentloop"), "\"agentloop\"");
        assert_eq!(quote_identifier("a\"b; DROP"), "\"a\"\"b; DROP\"");
    }

    #[test]
    fn tls_settings_that_cannot_work_are_refused_naming_what_is_wrong() {
        let only_cert = MemorySettings {
            tls_cert_file: "/etc/memory/tls.crt".to_owned(),
            ..MemorySettings::default()
        };
        let refused = grpc_server(&only_cert).unwrap_err();
        assert!(
            matches!(
                refused,
                MemoryError::TlsIncomplete {
                    set: "tls_cert_file"
                }
            ),
            "{refused:?}"
        );

        let missing = MemorySettings {
            tls_cert_file: "/nonexistent/tls.crt".to_owned(),
            tls_key_file: "/nonexistent/tls.key".to_owned(),
            ..MemorySettings::default()
        };
        let refused = grpc_server(&missing).unwrap_err();
        assert!(
            matches!(refused, MemoryError::TlsFile { .. }),
            "{refused:?}"
        );
        assert!(
            refused.to_string().contains("/nonexistent/tls.crt"),
            "{refused}"
        );

        assert!(grpc_server(&MemorySettings::default()).is_ok());
    }
}
