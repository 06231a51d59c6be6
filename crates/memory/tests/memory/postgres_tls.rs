//! Memory against a Postgres that speaks TLS only: a second server of the local Postgres
//! installation, started for this test with a certificate from a test CA, refusing plain TCP.
//! `sslmode=verify-full` with the CA works; a wrong password stops memory with that said, not
//! retried as "database down".

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use agentloop_memory::{MemoryError, MemorySettings};
use agentloop_proto::v1 as pb;

use crate::grpc::Running;

const PASSWORD: &str = "tls-test-secret";

/// The directory of the installed Postgres server binaries (`initdb`, `pg_ctl`).
fn pg_bin() -> PathBuf {
    let root = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<PathBuf> = std::fs::read_dir(root)
        .expect("a Debian Postgres installation under /usr/lib/postgresql")
        .filter_map(Result::ok)
        .map(|e| e.path().join("bin"))
        .filter(|bin| bin.join("initdb").exists())
        .collect();
    versions.sort();
    versions.pop().expect("initdb")
}

fn as_postgres(program: &Path, args: &[&str]) {
    let status = Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .arg(program)
        .args(args)
        .status()
        .expect("runuser");
    assert!(status.success(), "{} {args:?} failed", program.display());
}

/// A Postgres server with TLS only, stopped on drop.
struct TlsPostgres {
    dir: PathBuf,
    port: u16,
}

impl TlsPostgres {
    fn start() -> TlsPostgres {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_nanos();
        let dir =
            std::env::temp_dir().join(format!("agentloop-pgtls-{}-{nanos}", std::process::id()));
        let certs = dir.join("certs");
        std::fs::create_dir_all(&certs).expect("temp dir");
        agentloop_testkit::certs::make_ca(&certs, "ca");
        agentloop_testkit::certs::make_server_certificate(&certs);
        std::fs::write(dir.join("pw"), PASSWORD).expect("password file");
        let status = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(&dir)
            .status()
            .expect("chown");
        assert!(status.success());
        let bin = pg_bin();
        let data = dir.join("data");
        let data_arg = data.to_string_lossy().into_owned();
        let pwfile = format!("--pwfile={}", dir.join("pw").display());
        as_postgres(
            &bin.join("initdb"),
            &[
                "-D",
                &data_arg,
                "-U",
                "postgres",
                "-A",
                "scram-sha-256",
                &pwfile,
                "--no-sync",
            ],
        );
        for file in ["server.pem", "server.key"] {
            std::fs::copy(certs.join(file), data.join(file))
                .expect("certificate into the data dir");
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let conf = format!(
            "port = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\nssl = on\nssl_cert_file = 'server.pem'\nssl_key_file = 'server.key'\nfsync = off\n",
            dir.display()
        );
        let mut postgresql = std::fs::read_to_string(data.join("postgresql.conf")).expect("conf");
        postgresql.push_str(&conf);
        std::fs::write(data.join("postgresql.conf"), postgresql).expect("conf");
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all scram-sha-256\nhostssl all all 127.0.0.1/32 scram-sha-256\nhostnossl all all 127.0.0.1/32 reject\n",
        )
        .expect("hba");
        let status = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(&data)
            .status()
            .expect("chown");
        assert!(status.success());
        let status = Command::new("chmod")
            .arg("600")
            .arg(data.join("server.key"))
            .status()
            .expect("chmod");
        assert!(status.success());
        let log = format!("{}/log", dir.display());
        as_postgres(
            &bin.join("pg_ctl"),
            &["-D", &data_arg, "-l", &log, "-w", "start"],
        );
        TlsPostgres { dir, port }
    }

    fn url(&self, password: &str, tls: &str) -> String {
        format!(
            "postgres://postgres:{password}@127.0.0.1:{}/agentloop_tls?{tls}",
            self.port
        )
    }

    fn verify_full(&self) -> String {
        format!(
            "sslmode=verify-full&sslrootcert={}",
            self.dir.join("certs/ca.pem").display()
        )
    }
}

impl Drop for TlsPostgres {
    fn drop(&mut self) {
        let data = self.dir.join("data").to_string_lossy().into_owned();
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(pg_bin().join("pg_ctl"))
            .args(["-D", &data, "-m", "immediate", "stop"])
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test]
async fn memory_uses_postgres_over_verified_tls_and_a_wrong_password_is_reported_as_such() {
    // Arrange: a Postgres refusing every connection without TLS
    let postgres = TlsPostgres::start();
    let plain = sqlx::PgPool::connect(&postgres.url(PASSWORD, "sslmode=disable")).await;
    assert!(plain.is_err(), "the server took a connection without TLS");

    // Act: memory with sslmode=verify-full and the CA that signed the server's certificate
    let server = Running::start_with(MemorySettings {
        database_url: postgres.url(PASSWORD, &postgres.verify_full()),
        ..MemorySettings::default()
    })
    .await;
    server.wait_ready().await;
    let session = server
        .client
        .clone()
        .resolve_session(pb::ResolveSessionRequest {
            session_key: "over-tls".to_owned(),
            ..Default::default()
        })
        .await
        .expect("memory answers from the TLS database")
        .into_inner();
    server.stop().await;

    // Assert: the session is in that database, read back over TLS
    let pool = sqlx::PgPool::connect(&postgres.url(PASSWORD, &postgres.verify_full()))
        .await
        .expect("verify-full connects");
    let stored: String = sqlx::query_scalar("SELECT key FROM sessions WHERE id = $1::uuid")
        .bind(&session.id)
        .fetch_one(&pool)
        .await
        .expect("the session row");
    assert_eq!(stored, "over-tls");
    let tls: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(&pool)
        .await
        .expect("pg_stat_ssl");
    assert!(tls);
    pool.close().await;

    // A wrong password ends memory's start with that reason, at once.
    let wrong = Running::start_with(MemorySettings {
        database_url: postgres.url("not-the-password", "sslmode=require"),
        ..MemorySettings::default()
    })
    .await;
    let ended = tokio::time::timeout(Duration::from_secs(10), wrong.finished())
        .await
        .expect("memory stops instead of retrying");
    let err = ended.expect_err("a refused password is an error");
    assert!(matches!(err, MemoryError::Credentials(_)), "{err:?}");
    assert!(
        err.to_string().contains("refused memory's credentials"),
        "{err}"
    );
}
