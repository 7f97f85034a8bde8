//! The server's accepted connections, bounded. tonic serves every connection it is
//! given for as long as the peer keeps it open, and a TCP peer that connects and says
//! nothing is never asked to: the TLS handshake has tonic's timeout, but a plaintext
//! connection waits for its HTTP/2 preface for ever, and keepalive pings begin only
//! after it. So:
//!
//! - at most `max_connections` are served at once; beyond that, connections wait in the
//!   kernel's accept queue until one closes (nothing is refused, nothing spins);
//! - a connection must send its first [`PREFACE_BYTES`] within `handshake_timeout_ms`
//!   (HTTP/2's 24-byte client preface, or the larger TLS ClientHello, which every client
//!   sends at once), or it is closed; after that, tonic's TLS handshake timeout and the
//!   HTTP/2 keepalive pings take over;
//! - an accept that fails for want of resources (`EMFILE` once the descriptor limit is
//!   reached, `ENFILE`, `ENOBUFS`, `ENOMEM`) is retried after [`ACCEPT_BACKOFF`], with a
//!   warning at most once a minute and a count in `marshal_accept_errors_total`: tonic
//!   polls the listener again at once after an error, so a server at its descriptor
//!   limit spun a core, saying nothing above trace level. An error about one connection
//!   (the peer gave up before the accept) is passed over at once.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tokio_stream::Stream;
use tokio_util::sync::PollSemaphore;
use tonic::transport::server::{Connected, TcpConnectInfo, TcpIncoming};

/// Bytes a client sends before it waits for anything: HTTP/2's client preface
/// (`PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`); a TLS ClientHello is longer.
pub const PREFACE_BYTES: usize = 24;

/// How long the listener rests after an accept failed for want of resources.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The shortest time between two warnings about failing accepts.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// `incoming`, at most `max` connections at a time, each closed unless it sends
/// [`PREFACE_BYTES`] within `preface_within`.
pub struct Bounded<S = TcpIncoming> {
    incoming: S,
    permits: PollSemaphore,
    permit: Option<OwnedSemaphorePermit>,
    preface_within: Duration,
    /// After an accept failed for want of resources: when the listener is polled again.
    backoff: Option<Pin<Box<Sleep>>>,
    accept_errors: Option<prometheus_client::metrics::counter::Counter>,
    /// When the last warning was given, and the failures since.
    warned_at: Option<tokio::time::Instant>,
    unwarned: u64,
}

impl<S> Bounded<S> {
    pub fn new(incoming: S, max: usize, preface_within: Duration) -> Self {
        Bounded {
            incoming,
            permits: PollSemaphore::new(Arc::new(Semaphore::new(max.max(1)))),
            permit: None,
            preface_within,
            backoff: None,
            accept_errors: None,
            warned_at: None,
            unwarned: 0,
        }
    }

    /// Counts failed accepts in `counter` (`marshal_accept_errors_total`).
    pub fn counting_errors(self, counter: prometheus_client::metrics::counter::Counter) -> Self {
        Bounded {
            accept_errors: Some(counter),
            ..self
        }
    }

    /// Counts a failed accept and warns, at most once per [`WARN_EVERY`].
    fn note_accept_error(&mut self, error: &io::Error) {
        if let Some(c) = &self.accept_errors {
            c.inc();
        }
        self.unwarned += 1;
        let now = tokio::time::Instant::now();
        if self.warned_at.is_none_or(|at| now - at >= WARN_EVERY) {
            tracing::warn!(%error, failures = self.unwarned, retry_ms = ACCEPT_BACKOFF.as_millis() as u64, "cannot accept connections (at the open-file limit? raise `ulimit -n` or LimitNOFILE above max_connections); retrying");
            self.warned_at = Some(now);
            self.unwarned = 0;
        }
    }
}

/// An accept error about one connection (its peer gave up before the accept), after
/// which the next accept may well succeed.
fn about_one_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
    )
}

impl<S> Stream for Bounded<S>
where
    S: Stream<Item = io::Result<TcpStream>> + Unpin,
{
    type Item = io::Result<Counted>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(backoff) = &mut this.backoff {
            ready!(backoff.as_mut().poll(cx));
            this.backoff = None;
        }
        // A free place first: at the limit the listener is not polled, so the kernel
        // queues new connections instead of us accepting and dropping them.
        if this.permit.is_none() {
            match ready!(this.permits.poll_acquire(cx)) {
                Some(p) => this.permit = Some(p),
                None => return Poll::Ready(None),
            }
        }
        loop {
            match ready!(Pin::new(&mut this.incoming).poll_next(cx)) {
                Some(Ok(io)) => {
                    let permit = this.permit.take().expect("acquired above");
                    return Poll::Ready(Some(Ok(Counted::new(io, permit, this.preface_within))));
                }
                Some(Err(e)) if about_one_connection(&e) => {}
                Some(Err(e)) => {
                    this.note_accept_error(&e);
                    let mut backoff = Box::pin(tokio::time::sleep(ACCEPT_BACKOFF));
                    if backoff.as_mut().poll(cx).is_pending() {
                        this.backoff = Some(backoff);
                        return Poll::Pending;
                    }
                }
                None => return Poll::Ready(None),
            }
        }
    }
}

/// An accepted connection holding its place among `max_connections` until it closes.
pub struct Counted {
    io: TcpStream,
    _place: OwnedSemaphorePermit,
    /// Until [`PREFACE_BYTES`] arrived: when the connection is closed otherwise.
    preface_deadline: Option<Pin<Box<Sleep>>>,
    read: usize,
}

impl Counted {
    fn new(io: TcpStream, place: OwnedSemaphorePermit, preface_within: Duration) -> Self {
        Counted {
            io,
            _place: place,
            preface_deadline: Some(Box::pin(tokio::time::sleep(preface_within))),
            read: 0,
        }
    }
}

impl Connected for Counted {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.io.connect_info()
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(deadline) = &mut this.preface_deadline
            && deadline.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the peer sent no protocol preface within handshake_timeout_ms",
            )));
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if this.preface_deadline.is_some() && matches!(read, Poll::Ready(Ok(()))) {
            this.read += buf.filled().len() - before;
            if this.read >= PREFACE_BYTES {
                this.preface_deadline = None;
            }
        }
        read
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio_stream::StreamExt as _;

    async fn listen(
        max: usize,
        preface_within: Duration,
    ) -> (Bounded<TcpIncoming>, std::net::SocketAddr) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        (
            Bounded::new(TcpIncoming::from(listener), max, preface_within),
            addr,
        )
    }

    #[tokio::test]
    async fn a_silent_connection_is_closed_and_one_that_speaks_is_not() {
        let (mut incoming, addr) = listen(8, Duration::from_millis(200)).await;
        let _silent = TcpStream::connect(addr).await.unwrap();
        let mut speaking = TcpStream::connect(addr).await.unwrap();
        let mut silent_side = incoming.next().await.unwrap().unwrap();
        let mut speaking_side = incoming.next().await.unwrap().unwrap();
        speaking
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(speaking_side.read(&mut buf).await.unwrap(), PREFACE_BYTES);
        let err = silent_side.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        // Past the deadline, the one that spoke may stay quiet as long as it likes.
        let quiet = tokio::time::timeout(Duration::from_millis(400), speaking_side.read(&mut buf));
        assert!(
            quiet.await.is_err(),
            "a connection past its preface was cut off"
        );
        speaking.write_all(b"x").await.unwrap();
        assert_eq!(speaking_side.read(&mut buf).await.unwrap(), 1);
    }

    /// A listener whose every accept fails with `error()`, counting the tries.
    fn failing(
        error: fn() -> io::Error,
    ) -> (
        impl Stream<Item = io::Result<TcpStream>> + Unpin,
        Arc<std::sync::atomic::AtomicUsize>,
    ) {
        let tries = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = tries.clone();
        let stream = tokio_stream::iter(std::iter::repeat_with(move || {
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Err(error())
        }));
        (stream, tries)
    }

    #[tokio::test]
    async fn at_the_open_file_limit_accepts_are_retried_every_backoff_not_in_a_spin() {
        // EMFILE, as `accept` fails once the descriptor limit is reached.
        let (listener, tries) = failing(|| io::Error::from_raw_os_error(24));
        let counter = prometheus_client::metrics::counter::Counter::<u64>::default();
        let mut incoming =
            Bounded::new(listener, 8, Duration::from_secs(10)).counting_errors(counter.clone());
        let waited = tokio::time::timeout(ACCEPT_BACKOFF * 10, incoming.next()).await;
        assert!(waited.is_err(), "an accept error was handed to tonic");
        let tries = tries.load(std::sync::atomic::Ordering::Relaxed);
        // One at once, then one per backoff, about 11 (a busy machine's timers fire
        // late, so fewer); a spin makes millions.
        assert!((2..=12).contains(&tries), "{tries} accepts in 10 backoffs");
        assert_eq!(counter.get(), tries as u64);
    }

    #[tokio::test]
    async fn an_accept_error_about_one_connection_is_passed_over_at_once() {
        let (aborted, tries) = failing(|| io::ErrorKind::ConnectionAborted.into());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // Two aborted accepts, then a real connection.
        let incoming = aborted.take(2).chain(TcpIncoming::from(listener));
        let counter = prometheus_client::metrics::counter::Counter::<u64>::default();
        let mut incoming =
            Bounded::new(incoming, 8, Duration::from_secs(10)).counting_errors(counter.clone());
        let _client = TcpStream::connect(addr).await.unwrap();
        let next = tokio::time::timeout(Duration::from_secs(5), incoming.next()).await;
        assert!(
            matches!(next, Ok(Some(Ok(_)))),
            "no connection after aborted accepts"
        );
        assert_eq!(tries.load(std::sync::atomic::Ordering::Relaxed), 2);
        // Neither was backed off (nor counted as a resource failure).
        assert_eq!(counter.get(), 0);
    }

    #[tokio::test]
    async fn beyond_the_limit_connections_wait_until_one_closes() {
        let (mut incoming, addr) = listen(1, Duration::from_secs(60)).await;
        let _first = TcpStream::connect(addr).await.unwrap();
        let _second = TcpStream::connect(addr).await.unwrap();
        let served = incoming.next().await.unwrap().unwrap();
        let waiting = tokio::time::timeout(Duration::from_millis(300), incoming.next()).await;
        assert!(
            waiting.is_err(),
            "a second connection was served beyond the limit"
        );
        drop(served);
        let next = tokio::time::timeout(Duration::from_secs(5), incoming.next()).await;
        assert!(
            matches!(next, Ok(Some(Ok(_)))),
            "the waiting connection was not served"
        );
    }
}
