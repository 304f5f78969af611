//! Server-sent events in, one [`Inferred`] out. The SSE grammar itself (LF or CRLF, comments,
//! multi-line data, `event:` names) is `eventsource-stream`'s job; this module only feeds a style's
//! [`Assembler`] and turns transport failures into [`ProviderError`]s.

use bytes::{Bytes, BytesMut};
use eventsource_stream::Eventsource;
use futures::{Stream, StreamExt};

use super::{Assembler, Endpoint, ProviderError, body};
use crate::vocab::Inferred;

/// Reads a streamed HTTP response to its end, or to `ep`'s `max_response_bytes`. A failure to
/// read reads as it would for a whole body ([`super::body_failure`]): the same fault is the same
/// error, streamed or not.
pub async fn assemble(
    response: reqwest::Response,
    assembler: Box<dyn Assembler>,
    on_text: &mut (dyn FnMut(&str) + Send),
    ep: &Endpoint,
) -> Result<Inferred, ProviderError> {
    let bytes = body::stream(response, ep.max_response_bytes)
        .map(|chunk| chunk.map_err(|e| super::body_failure(e, ep)));
    assemble_stream(bytes, assembler, on_text).await
}

/// The same over any byte stream (a transport failure already a [`ProviderError`]): used by the
/// fixture tests and the benchmarks on recorded bytes.
pub async fn assemble_stream<S, B>(
    bytes: S,
    mut assembler: Box<dyn Assembler>,
    on_text: &mut (dyn FnMut(&str) + Send),
) -> Result<Inferred, ProviderError>
where
    S: Stream<Item = Result<B, ProviderError>> + Unpin,
    B: AsRef<[u8]>,
{
    let mut events = whole_lines(bytes).eventsource();
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => {
                if event.data.is_empty() {
                    continue;
                }
                assembler.event(&event.event, &event.data, &mut |t| on_text(t))?;
            }
            Err(eventsource_stream::EventStreamError::Transport(e)) => return Err(e),
            Err(e) => return Err(ProviderError::Parse(format!("bad SSE: {e}"))),
        }
    }
    assembler.finish()
}

/// The same bytes, each chunk cut after its last line break: what follows waits for the chunk
/// that ends its line. `eventsource-stream` parses its buffer from the start again whenever a
/// chunk leaves a line unfinished, so one long `data:` line, arriving in network-sized chunks,
/// cost time quadratic in its length (a 2 MB line took 14 s, and an endless one was never read far
/// enough to reach `max_response_bytes`). Given whole lines it reads each byte once.
fn whole_lines<S, B>(bytes: S) -> impl Stream<Item = Result<Bytes, ProviderError>> + Unpin
where
    S: Stream<Item = Result<B, ProviderError>> + Unpin,
    B: AsRef<[u8]>,
{
    // The state: the stream, the unfinished line, and whether the stream has ended.
    let state = (bytes, BytesMut::new(), false);
    Box::pin(futures::stream::unfold(
        state,
        |(mut bytes, mut unfinished, ended)| async move {
            if ended {
                return None;
            }
            loop {
                match bytes.next().await {
                    Some(Ok(chunk)) => {
                        let chunk = chunk.as_ref();
                        let Some(end) = chunk.iter().rposition(|b| matches!(b, b'\n' | b'\r'))
                        else {
                            unfinished.extend_from_slice(chunk);
                            continue;
                        };
                        unfinished.extend_from_slice(&chunk[..=end]);
                        let lines = unfinished.split().freeze();
                        unfinished.extend_from_slice(&chunk[end + 1..]);
                        return Some((Ok(lines), (bytes, unfinished, false)));
                    }
                    Some(Err(e)) => return Some((Err(e), (bytes, unfinished, true))),
                    None if unfinished.is_empty() => return None,
                    None => {
                        let rest = unfinished.split().freeze();
                        return Some((Ok(rest), (bytes, unfinished, true)));
                    }
                }
            }
        },
    ))
}

/// Assembles recorded SSE bytes synchronously, returning the result and the text deltas seen.
pub fn assemble_bytes(
    bytes: &[u8],
    assembler: Box<dyn Assembler>,
) -> (Result<Inferred, ProviderError>, Vec<String>) {
    let mut deltas = Vec::new();
    let chunks = futures::stream::iter([Ok::<_, ProviderError>(bytes.to_vec())]);
    let result = futures::executor::block_on(assemble_stream(chunks, assembler, &mut |t: &str| {
        deltas.push(t.to_string())
    }));
    (result, deltas)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chunks as they come from the network, cut anywhere.
    fn chunks(parts: &[&str]) -> Vec<Result<Vec<u8>, ProviderError>> {
        parts.iter().map(|p| Ok(p.as_bytes().to_vec())).collect()
    }

    fn passed_on(parts: &[&str]) -> Vec<String> {
        let lines = whole_lines(futures::stream::iter(chunks(parts)));
        futures::executor::block_on(lines.collect::<Vec<_>>())
            .into_iter()
            .map(|c| String::from_utf8(c.unwrap().to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn a_line_cut_across_chunks_is_passed_on_once_whole() {
        // A long line in many chunks: nothing is passed on until its line break, then all of it
        // at once, so the parser behind sees each byte once.
        let mut parts = vec!["data: {\"a\":1}\n\ndata: "];
        parts.extend(std::iter::repeat_n("x", 1000));
        parts.push("\n\nda");
        parts.push("ta: y\r");
        parts.push("\n\r\ntail");
        let out = passed_on(&parts);
        let long = format!("data: {}\n\n", "x".repeat(1000));
        assert_eq!(
            out,
            vec![
                "data: {\"a\":1}\n\n".to_string(),
                long,
                "data: y\r".to_string(),
                "\n\r\n".to_string(),
                "tail".to_string(),
            ]
        );
    }

    #[test]
    fn events_split_anywhere_read_as_events_sent_whole() {
        // Every way of cutting a stream in two gives the same events as the stream in one piece.
        let stream = "event: a\ndata: 1\n\n: comment\r\ndata: 2\r\ndata: 3\r\n\r\ndata: {\"k\": \"\u{e9}\"}\n\n";
        let events = |parts: Vec<Result<Vec<u8>, ProviderError>>| {
            let events = whole_lines(futures::stream::iter(parts)).eventsource();
            futures::executor::block_on(events.collect::<Vec<_>>())
                .into_iter()
                .map(|e| {
                    let e = e.unwrap();
                    (e.event, e.data)
                })
                .collect::<Vec<_>>()
        };
        let whole = events(chunks(&[stream]));
        assert_eq!(whole.len(), 3, "{whole:?}");
        assert_eq!(whole[1].1, "2\n3");
        let bytes = stream.as_bytes();
        for cut in 1..bytes.len() {
            let parts = vec![Ok(bytes[..cut].to_vec()), Ok(bytes[cut..].to_vec())];
            assert_eq!(events(parts), whole, "cut at byte {cut}");
        }
    }
}
