//! A private Postgres server for tests that stop and restart the database: the shared server
//! on :5432 serves every other test in parallel, so it must never be the one restarted.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

/// Returns the directory of the Postgres server binaries: `$PG_BIN_DIR`, else the Debian
/// PG 15 package's.
pub fn postgres_bin_dir() -> PathBuf {
    std::env::var_os("PG_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/postgresql/15/bin"))
}

/// A Postgres server of this test alone, on a free loopback port with trust auth; stopped and
/// its data removed on drop.
pub struct PrivatePostgres {
    dir: PathBuf,
    port: u16,
    running: bool,
}

impl PrivatePostgres {
    /// Creates a cluster in a fresh directory and starts it.
    ///
    /// # Errors
    /// When the binaries are missing or the server does not start.
    pub fn start() -> anyhow::Result<Self> {
        let dir =
            std::env::temp_dir().join(format!("agentloop-pg-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir)?;
        let mut server = Self {
            dir,
            port: crate::free_port()?,
            running: false,
        };
        // initdb refuses to run as root: the cluster belongs to `postgres` then.
        if running_as_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&server.dir)
                .status()
                .context("failed to run chown")?;
            if !status.success() {
                bail!("chown of {} to postgres failed", server.dir.display());
            }
        }
        let output = server
            .pg_command("initdb")
            .args([
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-sync",
                "-D",
            ])
            .arg(server.data_dir())
            .output()
            .context("failed to run initdb")?;
        if !output.status.success() {
            bail!("initdb failed: {}", String::from_utf8_lossy(&output.stderr));
        }
        server.start_again()?;
        Ok(server)
    }

    /// Returns the URL of database `name` on this server (created by whoever connects first,
    /// e.g. the memory service).
    pub fn url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// Returns the port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops the server at once, like a crash (`pg_ctl stop -m immediate`).
    ///
    /// # Errors
    /// When `pg_ctl` fails.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        let output = self
            .pg_command("pg_ctl")
            .args(["stop", "-m", "immediate", "-w", "-t", "20", "-D"])
            .arg(self.data_dir())
            .output()
            .context("failed to run pg_ctl stop")?;
        self.running = false;
        if !output.status.success() {
            bail!(
                "pg_ctl stop failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(())
    }

    /// Starts the server again on the same port and data.
    ///
    /// # Errors
    /// When the server does not start within 30 s.
    pub fn start_again(&mut self) -> anyhow::Result<()> {
        // fsync=off survives a crash of the server process (the OS keeps the pages); it would
        // not survive the machine's. A transaction committed without waiting for the flush
        // (enqueues, stored answers) reaches the OS only when a later synchronous commit or
        // the WAL writer writes it: the writer waits as long as it may (10 s), so an immediate
        // stop loses every such commit no synchronous one covered yet, as a crash at worst would.
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200 \
             -c wal_writer_delay=10000",
            self.port,
            self.dir.display()
        );
        let output = self
            .pg_command("pg_ctl")
            .args(["start", "-w", "-t", "30", "-o", &options, "-l"])
            .arg(self.dir.join("server.log"))
            .arg("-D")
            .arg(self.data_dir())
            .output()
            .context("failed to run pg_ctl start")?;
        if !output.status.success() {
            let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
            bail!(
                "pg_ctl start failed: {}\n{log}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        self.running = true;
        // `pg_ctl -w` waits for the socket; a TCP connect proves the loopback listener too.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if Instant::now() > deadline {
                bail!("postgres did not listen on {} in time", self.port);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn pg_command(&self, tool: &str) -> Command {
        let bin = postgres_bin_dir().join(tool);
        let mut command = if running_as_root() {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(bin);
            command
        } else {
            Command::new(bin)
        };
        command.current_dir(Path::new("/")).stdin(Stdio::null());
        command
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        if self.running {
            let _ = self.stop();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}
