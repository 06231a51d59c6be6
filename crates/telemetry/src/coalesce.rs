//! gRPC connections that send what one turn of the runtime wrote as one TCP segment.
//!
//! HTTP/2 as hyper drives it writes a unary call in pieces, each flushed as soon as it is
//! encoded: a request's HEADERS, then its DATA once the connection task has granted the new
//! stream send capacity; a response's HEADERS and DATA, then its trailers. Each flush was a
//! segment of its own, and each segment woke the peer, which could do nothing with a request
//! without its message or a response without its `grpc-status`. [`CoalescingIo`] holds
//! written bytes until the writer flushes twice: the first flush only yields, so the tasks
//! already woken (the body pipe with its new capacity) add their frames first.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes held past this are written without waiting for the flush.
const HOLD_LIMIT: usize = 64 * 1024;

/// A stream whose writes are held until a flush that comes after one yield of the task.
#[derive(Debug)]
pub struct CoalescingIo<T> {
    inner: T,
    held: Vec<u8>,
    /// How much of `held` has reached `inner`.
    written: usize,
    /// The writer's task has yielded once since bytes were first held.
    yielded: bool,
}

impl<T> CoalescingIo<T> {
    /// Wraps `inner`.
    pub fn new(inner: T) -> Self {
        Self {
            inner,
            held: Vec::new(),
            written: 0,
            yielded: false,
        }
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }
}

impl<T: AsyncWrite + Unpin> CoalescingIo<T> {
    /// Writes every held byte to the inner stream.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.held.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.held[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.held.clear();
        self.written = 0;
        self.yielded = false;
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for CoalescingIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for CoalescingIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.held.len() >= HOLD_LIMIT {
            ready!(this.poll_drain(cx))?;
        }
        let mut n = 0;
        for buf in bufs {
            this.held.extend_from_slice(buf);
            n += buf.len();
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.held.is_empty() && !this.yielded {
            // Other tasks woken meanwhile run before this one is polled again.
            this.yielded = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for CoalescingIo<tokio::net::TcpStream> {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::{TcpListener, TcpStream};

    /// A wrapped client end and the plain server end of one loopback connection.
    async fn connected() -> (CoalescingIo<TcpStream>, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (CoalescingIo::new(client), server)
    }

    #[tokio::test]
    async fn writes_reach_the_peer_in_one_piece_only_at_the_second_flush() {
        let (mut io, mut server) = connected().await;

        io.write_all(b"headers|").await.unwrap();
        // The first flush yields: nothing has left yet.
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(Pin::new(&mut io).poll_flush(&mut cx).is_pending());
        let mut probe = [0u8; 64];
        let early = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            server.read(&mut probe),
        )
        .await;
        assert!(early.is_err(), "bytes left before the second flush");

        io.write_all(b"data").await.unwrap();
        io.flush().await.unwrap();
        let mut got = vec![0u8; b"headers|data".len()];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(got, b"headers|data");
    }

    #[tokio::test]
    async fn large_writes_go_out_without_waiting_for_a_flush() {
        let (mut io, mut server) = connected().await;

        let block = vec![7u8; HOLD_LIMIT];
        io.write_all(&block).await.unwrap();
        // Past the limit, the next write sends what is held first.
        io.write_all(b"x").await.unwrap();
        let mut got = vec![0u8; HOLD_LIMIT];
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            server.read_exact(&mut got),
        )
        .await
        .expect("the held bytes were not sent before the flush")
        .unwrap();
        assert_eq!(got, block);
        io.shutdown().await.unwrap();
        let mut rest = Vec::new();
        server.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"x");
    }
}
