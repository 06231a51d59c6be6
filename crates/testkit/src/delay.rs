//! A TCP proxy that delays every byte it carries, each way, by a base latency plus or minus a
//! random jitter: a slow link for the processes whose connections go through it. Used where
//! the kernel has no `netem` qdisc (this machine's has none). Bytes keep their order, as TCP
//! would deliver them over a link that delays and reorders packets.

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// A running proxy; stops accepting and drops its connections on drop.
pub struct DelayProxy {
    addr: String,
    task: tokio::task::JoinHandle<()>,
}

/// How a [`DelayProxy`] delays: one way, `base` ± `jitter`, uniformly.
#[derive(Debug, Clone, Copy)]
pub struct Latency {
    /// The mean one-way delay.
    pub base: Duration,
    /// The most a delay departs from `base`.
    pub jitter: Duration,
}

impl DelayProxy {
    /// Listens on `listen_ip` (a free port) and forwards each connection to `target`.
    ///
    /// # Errors
    /// When it cannot listen.
    pub async fn start(listen_ip: &str, target: &str, latency: Latency) -> anyhow::Result<Self> {
        let listener = TcpListener::bind((listen_ip, 0)).await?;
        let addr = listener.local_addr()?.to_string();
        let target = target.to_owned();
        let task = tokio::spawn(async move {
            let mut seed = u64::from_le_bytes(
                uuid::Uuid::new_v4().as_bytes()[..8]
                    .try_into()
                    .unwrap_or([7; 8]),
            ) | 1;
            while let Ok((client, _)) = listener.accept().await {
                seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                let target = target.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&target).await {
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        let (cr, cw) = client.into_split();
                        let (sr, sw) = server.into_split();
                        tokio::join!(
                            pipe(cr, sw, latency, seed),
                            pipe(sr, cw, latency, seed ^ 0x9e37_79b9)
                        );
                    }
                });
            }
        });
        Ok(Self { addr, task })
    }

    /// Returns `host:port` to connect to instead of the target.
    pub fn addr(&self) -> &str {
        &self.addr
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to`, each chunk written once its delay has passed and never before the
/// chunk read before it.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    latency: Latency,
    mut seed: u64,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader = async move {
        let mut buf = vec![0_u8; 16 * 1024];
        let mut last = Instant::now();
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let due = (Instant::now() + delay(latency, seed)).max(last);
            last = due;
            if tx.send((due, buf[..n].to_vec())).is_err() {
                break;
            }
        }
    };
    let writer = async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}

/// One delay drawn from `random`: `base - jitter ..= base + jitter`.
fn delay(latency: Latency, random: u64) -> Duration {
    let span = latency.jitter.as_micros() as u64 * 2;
    let offset = if span == 0 { 0 } else { random % (span + 1) };
    (latency.base + Duration::from_micros(offset)).saturating_sub(latency.jitter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_stay_within_the_jitter_of_the_base() {
        let latency = Latency {
            base: Duration::from_millis(200),
            jitter: Duration::from_millis(100),
        };
        let mut seed = 12_345_u64;
        let mut seen = Vec::new();
        for _ in 0..1000 {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            seen.push(delay(latency, seed));
        }
        assert!(seen.iter().all(|d| *d >= Duration::from_millis(100)));
        assert!(seen.iter().all(|d| *d <= Duration::from_millis(300)));
        assert!(seen.iter().any(|d| *d < Duration::from_millis(150)));
        assert!(seen.iter().any(|d| *d > Duration::from_millis(250)));
    }

    #[tokio::test]
    async fn bytes_arrive_in_order_and_late() {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = echo.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut s, _) = echo.accept().await.unwrap();
            let mut buf = [0_u8; 64];
            while let Ok(n) = s.read(&mut buf).await {
                if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        });
        let latency = Latency {
            base: Duration::from_millis(50),
            jitter: Duration::from_millis(20),
        };
        let proxy = DelayProxy::start("127.0.0.1", &target, latency)
            .await
            .unwrap();
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        let started = Instant::now();
        for chunk in [b"one ".as_slice(), b"two ", b"three"] {
            client.write_all(chunk).await.unwrap();
        }
        let mut got = Vec::new();
        while got.len() < 13 {
            let mut buf = [0_u8; 64];
            let n = client.read(&mut buf).await.unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, b"one two three");
        // There and back: at least twice the smallest one-way delay.
        assert!(started.elapsed() >= Duration::from_millis(60));
    }
}
