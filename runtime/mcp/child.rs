//! A stdio server's process as a transport: rmcp's `TokioChildProcess` (the same spawn, the
//! same shutdown: stdin closed, 3 s, SIGTERM, 3 s, kill; killed when dropped), with the
//! server's stdout read through a line limit of colony's own.
//!
//! rmcp drops a message longer than its 16 MiB line limit, says so only in its log, and reads
//! on: the call that message answered waited for its timeout (two minutes by default) and said
//! "no answer". Here a message past [`MAX_MESSAGE`] ends the connection instead, so every call
//! waiting on it ends at once, with the reason ([`Seen::cut`]); the session starts the server again
//! on next use. And the session learns whether a message stands half read
//! ([`Seen::stalled_in_a_message`]). Hand-written because rmcp's `TokioChildProcess` lets neither the limit be set
//! nor a reader be put in front of the child's stdout.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::Future;
use process_wrap::tokio::{ChildWrapper, CommandWrap};
use rmcp::RoleClient;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::transport::async_rw::AsyncRwTransport;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::process::{ChildStderr, ChildStdin, ChildStdout};

/// The longest message a stdio server may send: the MCP SDK's own limit, and the streamable
/// HTTP client's for an event.
pub const MAX_MESSAGE: usize = rmcp::transport::async_rw::DEFAULT_MAX_LINE_LENGTH;

/// How long each step of the shutdown waits for the server to exit.
const EXIT_PATIENCE: Duration = Duration::from_secs(3);

/// How often a connection waiting for the server's next message looks whether the server's
/// process has exited: a process it started (a wrapper's helper, a browser) may hold its stdout
/// open, and the exit alone ended nothing: its calls waited for their timeouts.
const EXIT_CHECK: Duration = Duration::from_secs(1);

/// What the reader of a server's stdout has seen, shared with the session for its errors and
/// timeouts; cleared when a new connection starts.
pub type Reading = Arc<Mutex<Seen>>;

#[derive(Default)]
pub struct Seen {
    /// Why colony ended the connection itself (a message past the limit), for the errors of
    /// the calls it ends.
    pub cut: Option<String>,
    /// When the last read ended inside a message (a line begun, its newline not read yet).
    pub half_line_since: Option<std::time::Instant>,
}

impl Seen {
    /// Whether a message has stood half read for `at_least`: a server that stopped in the
    /// middle of one. Its next message would be read as the rest of this one, and lost.
    pub fn stalled_in_a_message(&self, at_least: Duration) -> bool {
        self.half_line_since
            .is_some_and(|since| since.elapsed() >= at_least)
    }
}

/// A stdio server's process and the transport over its stdin and stdout.
pub struct Child {
    process: Cleanup,
    transport: AsyncRwTransport<RoleClient, Limited<ChildStdout>, ChildStdin>,
    /// The connection ended from the server's side (its stdout closed, a message past the
    /// limit, its process exited): the calls it ends must not wait for the server to exit.
    lost: bool,
}

/// The process, killed (with its group) when dropped before it exited, once it has had
/// [`LINGER`] to exit by itself.
struct Cleanup(Option<Box<dyn ChildWrapper>>);

/// How long a dropped server may take to exit by itself. A server that fails as it starts
/// often closes its stdout and then writes why on stderr: killed at once, it never did, and
/// the connection's error said it ended "saying nothing". Its stdin is closed by then, which
/// ends a server that is well; whatever is left when colony exits is ended with the rest
/// (`server_group::end_all`).
const LINGER: Duration = Duration::from_secs(1);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(mut process) = self.0.take() {
            tokio::spawn(async move {
                let gone = matches!(
                    tokio::time::timeout(LINGER, process.wait()).await,
                    Ok(Ok(_)) | Ok(Err(_))
                );
                if !gone {
                    end(process).await;
                }
            });
        }
    }
}

/// Ends a server's process (and its group) for good: `kill`, not `start_kill`, so it is
/// reaped and no zombie is left. One already gone is fine.
async fn end(mut process: Box<dyn ChildWrapper>) {
    if let Err(e) = Box::into_pin(process.kill()).await
        && e.raw_os_error() != Some(libc::ESRCH)
    {
        tracing::warn!(target: "colony::mcp", "cannot end a stdio server: {e}");
    }
}

impl Child {
    /// Starts `command` with piped stdin, stdout and stderr: the transport, and the server's
    /// stderr to read. A message past [`MAX_MESSAGE`] ends the connection, its reason in
    /// `reading`.
    pub fn spawn(
        mut command: CommandWrap,
        server: &str,
        reading: Reading,
    ) -> std::io::Result<(Child, Option<ChildStderr>)> {
        use std::process::Stdio;
        command
            .command_mut()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut process = command.spawn()?;
        let inner = process.inner_mut();
        let (Some(stdin), Some(stdout)) = (inner.stdin().take(), inner.stdout().take()) else {
            return Err(std::io::Error::other(
                "the server's stdin or stdout is missing",
            ));
        };
        let stderr = inner.stderr().take();
        let stdout = Limited {
            inner: stdout,
            since_newline: 0,
            over: false,
            server: server.to_string(),
            reading,
        };
        // The limit is ours (`Limited`), before rmcp's would drop the message and read on.
        let transport = AsyncRwTransport::new(stdout, stdin).with_max_line_length(usize::MAX);
        Ok((
            Child {
                process: Cleanup(Some(process)),
                transport,
                lost: false,
            },
            stderr,
        ))
    }

    /// The server's process id.
    pub fn id(&self) -> Option<u32> {
        self.process.0.as_ref()?.id()
    }

    /// MCP's stdio shutdown: close the server's stdin and wait for it to exit; then SIGTERM
    /// its group and wait; then kill it. A connection the server's side ended does this
    /// without holding up the calls it ends (they fail at once, the waits go on meanwhile);
    /// one colony closes (`mcp.close`, the program's end) waits, so a server that is told its
    /// stdin closed has the time to finish.
    async fn shut_down(&mut self) -> std::io::Result<()> {
        let Some(mut process) = self.process.0.take() else {
            return Ok(());
        };
        let closed = self.transport.close().await;
        let ending = async move {
            if exited(&mut process).await {
                return;
            }
            match process.signal(libc::SIGTERM) {
                Ok(()) if exited(&mut process).await => return,
                Ok(()) => {}
                Err(e) => tracing::warn!(target: "colony::mcp",
                    "cannot send SIGTERM to a stdio server: {e}"),
            }
            end(process).await;
        };
        match self.lost {
            true => drop(tokio::spawn(ending)),
            false => ending.await,
        }
        closed
    }
}

/// Whether `process` exits within [`EXIT_PATIENCE`].
async fn exited(process: &mut Box<dyn ChildWrapper>) -> bool {
    matches!(
        tokio::time::timeout(EXIT_PATIENCE, process.wait()).await,
        Ok(Ok(_)) | Ok(Err(_))
    )
}

impl Transport<RoleClient> for Child {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.transport.send(item)
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
        let (transport, process, lost) = (&mut self.transport, &mut self.process, &mut self.lost);
        async move {
            // Read cancellation-safely (rmcp's reader keeps a partial line across calls), and
            // meanwhile look whether the server's process has exited.
            let received = transport.receive();
            tokio::pin!(received);
            let mut check = tokio::time::interval(EXIT_CHECK);
            check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    message = &mut received => {
                        *lost |= message.is_none();
                        return message;
                    }
                    _ = check.tick() => {
                        let gone = process
                            .0
                            .as_mut()
                            .is_some_and(|p| matches!(p.try_wait(), Ok(Some(_))));
                        if gone {
                            tracing::warn!(target: "colony::mcp",
                                "a stdio server exited while a process it started still holds its \
                                 stdout: the connection is closed");
                            *lost = true;
                            return None;
                        }
                    }
                }
            }
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.shut_down()
    }
}

/// A server's stdout that ends (reads as closed) once a line grows past [`MAX_MESSAGE`].
struct Limited<R> {
    inner: R,
    /// Bytes read since the last newline.
    since_newline: usize,
    /// The limit was passed: nothing more is read.
    over: bool,
    server: String,
    reading: Reading,
}

impl<R: AsyncRead + Unpin> AsyncRead for Limited<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.over {
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if !matches!(polled, Poll::Ready(Ok(()))) {
            return polled;
        }
        let read = &buf.filled()[before..];
        // The line this read goes on with, up to its newline if it has one (a line wholly
        // inside one read is no longer than the read, far below the limit).
        let going_on = match read.iter().position(|&b| b == b'\n') {
            Some(at) => self.since_newline.saturating_add(at),
            None => self.since_newline.saturating_add(read.len()),
        };
        self.since_newline = match read.iter().rposition(|&b| b == b'\n') {
            Some(at) => read.len() - at - 1,
            None => going_on,
        };
        if !read.is_empty() {
            let half = self.since_newline > 0;
            let mut seen = self.reading.lock().unwrap_or_else(|e| e.into_inner());
            seen.half_line_since = half.then(std::time::Instant::now);
        }
        if going_on > MAX_MESSAGE {
            let reason = format!(
                "the server sent a message of more than {} MiB, more than colony reads (it is \
                 started again on next use)",
                MAX_MESSAGE >> 20
            );
            tracing::error!(target: "colony::mcp", server = %self.server, "{reason}");
            self.reading.lock().unwrap_or_else(|e| e.into_inner()).cut = Some(reason);
            self.over = true;
            buf.set_filled(before);
        }
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn limited(bytes: Vec<u8>) -> (Limited<std::io::Cursor<Vec<u8>>>, Reading) {
        let cut = Reading::default();
        let reader = Limited {
            inner: std::io::Cursor::new(bytes),
            since_newline: 0,
            over: false,
            server: "big".into(),
            reading: cut.clone(),
        };
        (reader, cut)
    }

    #[tokio::test]
    async fn lines_within_the_limit_pass_and_a_longer_one_ends_the_stream() {
        let mut bytes = b"{\"a\":1}\n".to_vec();
        bytes.extend(std::iter::repeat_n(b'x', MAX_MESSAGE - 1));
        bytes.push(b'\n');
        let whole = bytes.len();
        let (mut reader, cut) = limited(bytes);
        let mut out = Vec::new();
        reader.read_to_end(&mut out).await.unwrap();
        assert_eq!(out.len(), whole, "a line of the limit's length passes");
        assert!(cut.lock().unwrap().cut.is_none());

        let mut bytes = b"{\"a\":1}\n".to_vec();
        bytes.extend(std::iter::repeat_n(b'x', MAX_MESSAGE + 10));
        bytes.extend(b"\n{\"b\":2}\n");
        let (mut reader, cut) = limited(bytes);
        let mut out = Vec::new();
        reader.read_to_end(&mut out).await.unwrap();
        assert!(out.len() <= MAX_MESSAGE + 8, "read {} bytes", out.len());
        assert!(!out.ends_with(b"{\"b\":2}\n"), "nothing after the cut");
        let reason = cut.lock().unwrap().cut.clone().expect("the reason");
        assert!(
            reason.contains("the server sent a message of more than 16 MiB"),
            "{reason}"
        );
    }
}
