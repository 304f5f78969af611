//! One program served over stdin and stdout (what a `claude_desktop_config.json` or `.mcp.json`
//! entry runs): stdout carries only protocol messages, logs go to stderr. It ends when stdin
//! closes, on SIGINT or SIGTERM, or when the program stops. A client that does not read its
//! answers is not read from either ([`super::paced`]).

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::Arc;

use rmcp::ServiceExt;
use rmcp::transport::async_rw::AsyncRwTransport;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::signal::unix::{SignalKind, signal};

use super::call::Caller;
use super::handler::{Offer, One, Server};
use super::paced::Paced;

/// How long the end of a session waits for the answers of the calls it cut to be written.
const DRAIN: std::time::Duration = std::time::Duration::from_secs(3);

/// Why serving ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// The client closed stdin (or the transport failed).
    Closed,
    /// An answer could not be written: the client closed its end of stdout, or it broke.
    Unwritable,
    /// SIGINT or SIGTERM.
    Signal(&'static str),
    /// The program stopped: its reason.
    Stopped(String),
}

pub type Reader = Box<dyn AsyncRead + Send + Unpin>;
pub type Writer = Box<dyn AsyncWrite + Send + Unpin>;

fn is_fifo(f: &File) -> bool {
    use std::os::unix::fs::FileTypeExt;
    f.metadata().is_ok_and(|m| m.file_type().is_fifo())
}

/// A descriptor of our own for `fd` (closing it leaves `fd` open).
fn dup(fd: i32) -> std::io::Result<File> {
    // SAFETY: dup returns a new descriptor we own, or -1.
    let new = unsafe { libc::dup(fd) };
    if new < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `new` is a fresh descriptor nobody else holds.
    Ok(unsafe { File::from_raw_fd(new) })
}

/// The protocol's streams: stdin, and stdout moved to a descriptor of its own while fd 1 is
/// pointed at stderr, so nothing else the process writes (a script's `print`) reaches the
/// client. Pipes (how clients start servers) are read and written without blocking threads, so
/// the end of a session does not wait on a read that never returns.
pub fn protocol_streams() -> std::io::Result<(Reader, Writer)> {
    let input = dup(std::io::stdin().as_raw_fd())?;
    let output = dup(std::io::stdout().as_raw_fd())?;
    // SAFETY: dup2 onto fd 1 replaces it atomically; std's stdout writes to fd 1 from now on.
    if unsafe { libc::dup2(2, 1) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let reader: Reader = if is_fifo(&input) {
        Box::new(tokio::net::unix::pipe::Receiver::from_file(input)?)
    } else {
        Box::new(tokio::fs::File::from_std(input))
    };
    let writer: Writer = if is_fifo(&output) {
        Box::new(tokio::net::unix::pipe::Sender::from_file(output)?)
    } else {
        Box::new(tokio::fs::File::from_std(output))
    };
    Ok((reader, writer))
}

/// The protocol's output, telling when a write to it fails: the client closed its end of our
/// stdout (or it broke), so nothing more it is sent can reach it. rmcp drops the answer and
/// goes on; the session ends instead, as when stdin closes.
struct Watched {
    inner: Writer,
    broken: Arc<tokio::sync::Notify>,
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        self.tell(polled)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_flush(cx);
        self.tell(polled)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl Watched {
    fn tell<T>(
        &self,
        polled: std::task::Poll<std::io::Result<T>>,
    ) -> std::task::Poll<std::io::Result<T>> {
        if let std::task::Poll::Ready(Err(e)) = &polled {
            tracing::info!("the MCP client's end of stdout is gone: {e}");
            self.broken.notify_one();
        }
        polled
    }
}

/// The client's messages, with a line past [`crate::mcp::child::MAX_MESSAGE`] said on stderr:
/// rmcp drops such a message and reads on, so its request gets no answer, and nothing said why.
struct LineWatch {
    inner: Reader,
    /// Bytes read since the last newline.
    since_newline: usize,
    /// The line being read was said to be too long.
    said: bool,
}

impl AsyncRead for LineWatch {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if let std::task::Poll::Ready(Ok(())) = polled {
            let read = &buf.filled()[before..];
            match read.iter().rposition(|&b| b == b'\n') {
                Some(at) => {
                    let first = read.iter().position(|&b| b == b'\n').unwrap_or(at);
                    self.check(first);
                    self.since_newline = read.len() - at - 1;
                    self.said = false;
                }
                None => {
                    self.since_newline = self.since_newline.saturating_add(read.len());
                }
            }
            self.check(0);
        }
        polled
    }
}

impl LineWatch {
    /// Says so once if the line read so far, and `more` bytes of it, pass the limit.
    fn check(&mut self, more: usize) {
        let limit = crate::mcp::child::MAX_MESSAGE;
        if !self.said && self.since_newline.saturating_add(more) > limit {
            self.said = true;
            tracing::error!(
                "the MCP client sent a message of more than {} MiB, more than colony reads: it \
                 is dropped, and a request in it gets no answer",
                limit >> 20
            );
        }
    }
}

/// Serves `offer` on `streams` (from [`protocol_streams`], taken before the program starts)
/// until one of [`Ended`] happens.
pub async fn serve(offer: Offer, name: &str, streams: (Reader, Writer)) -> Result<Ended, String> {
    let broken = Arc::new(tokio::sync::Notify::new());
    let (input, output) = streams;
    let input: Reader = Box::new(LineWatch {
        inner: input,
        since_newline: 0,
        said: false,
    });
    let output: Writer = Box::new(Watched {
        inner: output,
        broken: broken.clone(),
    });
    let transport = Paced::new(AsyncRwTransport::new_server(input, output));
    let route = offer.route.clone();
    // Heard from the start: a program still starting ends on a signal as one serving does.
    let mut int = crate::signals::sigint().map_err(|e| e.to_string())?;
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    // A program that offers nothing serves empty lists: said once it has started, on stderr,
    // where the person who forgot `exportable = true` looks.
    let told = {
        let offer = offer.clone();
        tokio::spawn(async move {
            offer.ready().await;
            // A program whose main chunk failed (stopped, never ready) says why itself;
            // "exports nothing" before its error pointed at the wrong fix.
            let failed = !offer.exports.is_ready() && offer.route.stop_reason().is_some();
            if offer.exports.is_empty() && !failed {
                tracing::warn!(
                    "{} exports nothing: a client lists no tools (mark a tool `exportable = \
                     true`, a resident `export = true`, or offer `mcp.resource` / `mcp.prompt`)",
                    offer.program
                );
            }
        })
    };
    // `initialize` is answered at once, while the program starts; a list waits for what it
    // exports once started (`Server::offers`, at most `READY_WAIT`).
    let started = offer.clone();
    let server = Server::new(Arc::new(One(offer)), Caller("stdio".into()), name);
    let ending = server.ending();
    let serving = async {
        match server.serve(transport).await {
            Ok(running) => {
                let token = running.cancellation_token();
                // Pinned out here, not made inside the select: `waiting` owns the service,
                // and dropping it cancels every call at once, before `ending` says why (a cut
                // call answered "cancelled by the client").
                let waiting = running.waiting();
                tokio::pin!(waiting);
                let ended = tokio::select! {
                    _ = &mut waiting => Ended::Closed,
                    () = broken.notified() => Ended::Unwritable,
                    _ = int.recv() => Ended::Signal("SIGINT"),
                    _ = term.recv() => Ended::Signal("SIGTERM"),
                    reason = route.stopped() => Ended::Stopped(reason),
                };
                let why = match &ended {
                    Ended::Closed | Ended::Unwritable => None,
                    Ended::Signal(s) => Some(format!("cancelled: colony is ending ({s})")),
                    Ended::Stopped(r) => Some(format!("cancelled: the program stopped ({r})")),
                };
                *ending.lock().unwrap_or_else(|e| e.into_inner()) = why;
                token.cancel();
                // rmcp writes the answers of the calls just cut before its loop ends (at most
                // two seconds); returning at once let the process exit before they were sent.
                // Bounded: a client that reads nothing more must not hold colony open.
                if ended != Ended::Closed {
                    let _ = tokio::time::timeout(DRAIN, waiting).await;
                }
                Ok(ended)
            }
            // The client went away before (or while) it said hello.
            Err(e) => {
                tracing::info!("the MCP session did not start: {e}");
                Ok(Ended::Closed)
            }
        }
    };
    let ended = serving.await;
    // Once the program is ready the warning is due (a client may have listed and left at
    // once: aborting lost it); before, there is nothing to say yet.
    if futures::FutureExt::now_or_never(started.ready()).is_some() {
        let _ = told.await;
    } else {
        told.abort();
    }
    ended
}
