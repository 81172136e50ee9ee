//! A bound on how deeply the AMQP header tables lapin parses can nest, applied to the bytes
//! RabbitMQ sends before lapin sees them, so that no thread needs a large stack.
//!
//! lapin's parser (amq-protocol) reads field tables and arrays recursively, one call chain per
//! level, and so do the `Clone` and `Drop` of the values it builds. A producer may nest header
//! tables as deep as a frame holds: about 18 000 levels in RabbitMQ's default `frame_max` of
//! 128 KiB (seven bytes a level). Parsing that takes about 220 MiB of stack in a debug build and
//! 40 MiB in a release build, on lapin's own I/O thread, which is spawned with the default
//! 2 MiB: the process aborts, and again at every restart while the message waits in the queue.
//!
//! So every connection the engine opens ([`connect`]) reads through [`BoundedStream`]: each
//! content-header frame (the one that carries a message's properties) is examined whole before
//! lapin gets it, iteratively, and a table or array nested deeper than [`MAX_PARSED_DEPTH`] is
//! turned into a byte array of the same length: its type tag `F` or `A` becomes `x`, so the
//! frame keeps its size and lapin takes that subtree as opaque bytes. Nothing is dropped (the
//! bytes are all there), other frames pass unexamined, and the bound is per connection, not
//! per process: no thread's stack size matters. The engine then finds the headers too deep
//! ([`super::amqp_values::MAX_HEADER_DEPTH`] is below this bound) and dead-letters the message
//! as poison (`HEADERS_TOO_DEEP`); see DESIGN.md, "Hostile header tables", for why here and
//! what lapin should do instead.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use async_rs::traits::Reactor;
use async_rs::util::RuntimeParts;
use async_rs::{Runtime, Tokio};
use futures::io::{AsyncRead, AsyncWrite};
use futures::{Stream, ready};
use lapin::uri::{AMQPScheme, AMQPUri};
use lapin::{AsyncTcpStream, Connection, ConnectionProperties};

use super::amqp_values::MAX_HEADER_DEPTH;

/// Deepest nesting of header tables and arrays lapin is given to parse (the headers table
/// itself is level 1). One level more than the engine keeps, so that a message nested deeper
/// than [`MAX_HEADER_DEPTH`] is still seen to be.
pub const MAX_PARSED_DEPTH: usize = MAX_HEADER_DEPTH + 1;

/// Largest content-header frame examined, in bytes. RabbitMQ never sends one larger than the
/// negotiated `frame_max` (128 KiB by default); a larger one fails the connection.
const MAX_HEADER_FRAME_BYTES: usize = 16 << 20;

/// AMQP frame type of a content header.
const FRAME_HEADER: u8 = 2;
/// Frame type, channel (2 bytes) and payload size (4 bytes).
const FRAME_PREFIX: usize = 7;
/// The frame-end octet after the payload.
const FRAME_END: usize = 1;
/// AMQP class id of `basic`, whose content headers carry `headers`.
const CLASS_BASIC: u16 = 60;

/// Connects to RabbitMQ at `url` with every content header bounded (see the module docs).
/// Must be called within a tokio runtime.
///
/// Errors: as [`Connection::connect`] (an invalid URL, the broker unreachable or refusing),
/// and an `amqps://` URL: the bound reads the socket's bytes, which TLS would encrypt, and TLS
/// is done inside lapin, below any stream the engine could wrap (the engine builds lapin without
/// a TLS backend anyway).
pub(crate) async fn connect(url: &str, properties: ConnectionProperties) -> lapin::Result<Connection> {
    let uri = plain_uri(url)?;
    let tokio = Tokio::current();
    let runtime = Runtime::new(RuntimeParts::new(tokio.clone(), BoundedReactor(tokio)));
    Connection::connector(
        uri,
        runtime,
        async |uri: AMQPUri, runtime: Runtime<Kit>| {
            let addresses: Vec<SocketAddr> =
                tokio::net::lookup_host((uri.authority.host.as_str(), uri.authority.port)).await?.collect();
            Ok(AsyncTcpStream::connect(&runtime, addresses).await?)
        },
        properties,
    )
    .await
}

/// `url` parsed, refused unless it is plain `amqp://` (see [`connect`]).
fn plain_uri(url: &str) -> io::Result<AMQPUri> {
    let uri: AMQPUri = url.parse().map_err(|e: String| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    if uri.scheme != AMQPScheme::AMQP {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "amqps:// is not supported: the engine bounds header nesting on the plain socket; \
             terminate TLS in front of the process (e.g. a local stunnel or sidecar) and connect with amqp://",
        ));
    }
    Ok(uri)
}

/// The runtime the engine's lapin connections run on: tokio, with [`BoundedStream`] sockets.
type Kit = RuntimeParts<Tokio, BoundedReactor>;

/// tokio's reactor, whose TCP streams are [`BoundedStream`]s.
#[derive(Debug, Clone)]
pub(crate) struct BoundedReactor(Tokio);

impl Reactor for BoundedReactor {
    type TcpStream = BoundedStream<<Tokio as Reactor>::TcpStream>;
    type Sleep = <Tokio as Reactor>::Sleep;

    // async-rs bounds `H` by its private `AsSysFd` (`AsFd + AsRawFd`): the same, spelled out.
    fn register<H: io::Read + io::Write + std::os::fd::AsFd + std::os::fd::AsRawFd + Send + 'static>(
        &self,
        socket: H,
    ) -> io::Result<impl AsyncRead + AsyncWrite + Send + Unpin + 'static> {
        self.0.register(socket)
    }

    fn sleep(&self, dur: Duration) -> Self::Sleep {
        self.0.sleep(dur)
    }

    fn interval(&self, dur: Duration) -> impl Stream<Item = Instant> + Send + 'static {
        self.0.interval(dur)
    }

    fn tcp_connect_addr(&self, addr: SocketAddr) -> impl Future<Output = io::Result<Self::TcpStream>> + Send + 'static {
        let connect = self.0.tcp_connect_addr(addr);
        async move { Ok(BoundedStream::new(connect.await?)) }
    }
}

/// A connection to RabbitMQ whose inbound content headers are bounded (module docs). Writes
/// pass through unchanged.
pub(crate) struct BoundedStream<S> {
    inner: S,
    inbound: Inbound,
}

impl<S> BoundedStream<S> {
    fn new(inner: S) -> Self {
        Self { inner, inbound: Inbound::default() }
    }
}

/// The inbound side's framing state.
#[derive(Debug, Default)]
struct Inbound {
    /// Bytes read from the broker and not yet handed on; the first `ready` are examined.
    buf: Vec<u8>,
    ready: usize,
    /// Bytes of the current frame beyond `buf` that need no examination (a frame that is not a
    /// content header).
    pass: usize,
    /// The broker answered with something that is not frames (its protocol header, refusing
    /// our version): everything passes.
    raw: bool,
}

impl Inbound {
    /// Marks as ready what can be handed on: whole frames (content headers bounded first) and
    /// the parts of other frames that arrived; stops at an incomplete frame prefix or content
    /// header.
    ///
    /// Errors: a content-header frame larger than [`MAX_HEADER_FRAME_BYTES`].
    fn examine(&mut self) -> io::Result<()> {
        loop {
            let rest = &mut self.buf[self.ready..];
            if rest.is_empty() {
                return Ok(());
            }
            if self.raw {
                self.ready = self.buf.len();
                return Ok(());
            }
            if self.pass > 0 {
                let n = self.pass.min(rest.len());
                self.ready += n;
                self.pass -= n;
                continue;
            }
            if rest[0] == b'A' {
                // "AMQP" and a version: no frame type starts with it.
                self.raw = true;
                continue;
            }
            let Some(size) = rest.get(3..FRAME_PREFIX) else { return Ok(()) };
            let size = u32::from_be_bytes(size.try_into().expect("four bytes")) as usize;
            let total = FRAME_PREFIX + size + FRAME_END;
            if rest[0] != FRAME_HEADER {
                self.pass = total;
                continue;
            }
            if total > MAX_HEADER_FRAME_BYTES {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("AMQP content header frame of {size} bytes (more than {MAX_HEADER_FRAME_BYTES})"),
                ));
            }
            let Some(frame) = rest.get_mut(..total) else { return Ok(()) };
            bound_content_header(&mut frame[FRAME_PREFIX..FRAME_PREFIX + size]);
            self.ready += total;
        }
    }

    /// Moves up to `dst.len()` ready bytes into `dst`; how many.
    fn take(&mut self, dst: &mut [u8]) -> usize {
        let n = self.ready.min(dst.len());
        dst[..n].copy_from_slice(&self.buf[..n]);
        self.buf.drain(..n);
        self.ready -= n;
        n
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for BoundedStream<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, dst: &mut [u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        loop {
            if this.inbound.ready > 0 || dst.is_empty() {
                return Poll::Ready(Ok(this.inbound.take(dst)));
            }
            let inbound = &mut this.inbound;
            if inbound.buf.is_empty() && (inbound.raw || inbound.pass > 0) {
                // The rest of a frame that needs no examination: straight through.
                let want = if inbound.raw { dst.len() } else { inbound.pass.min(dst.len()) };
                let n = ready!(Pin::new(&mut this.inner).poll_read(cx, &mut dst[..want]))?;
                if !inbound.raw {
                    inbound.pass -= n;
                }
                return Poll::Ready(Ok(n));
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = ready!(Pin::new(&mut this.inner).poll_read(cx, &mut chunk))?;
            if n == 0 {
                // The broker closed: hand on what came (lapin reports the incomplete frame).
                inbound.ready = inbound.buf.len();
                return Poll::Ready(Ok(inbound.take(dst)));
            }
            inbound.buf.extend_from_slice(&chunk[..n]);
            inbound.examine()?;
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for BoundedStream<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_close(cx)
    }
}

/// Bounds the `headers` table of a `basic` content header's payload in place: every table or
/// array below [`MAX_PARSED_DEPTH`] levels becomes a byte array of the same bytes, and every
/// short string (the properties' strings, the tables' field names) that is not UTF-8 gets its
/// invalid bytes replaced by [`NOT_UTF8`] (lapin refuses such a short string, failing the whole
/// connection, and RabbitMQ redelivers the message to the next one: it would stop the queue).
/// Returns whether it changed anything. A payload that does not parse is left as it is from the
/// first byte that does not (lapin refuses it there, before reaching anything deeper).
pub(crate) fn bound_content_header(payload: &mut [u8]) -> bool {
    // class id, weight, body size, then property flag words (bit 0: another word follows).
    if payload.get(..2).map(|c| u16::from_be_bytes([c[0], c[1]])) != Some(CLASS_BASIC) {
        return false;
    }
    let mut at = 12;
    let Some(flags) = read_u16(payload, at) else { return false };
    let mut word = flags;
    while word & 1 == 1 {
        at += 2;
        let Some(next) = read_u16(payload, at) else { return false };
        word = next;
    }
    at += 2;
    let mut changed = false;
    // The basic properties in order, by flag bit (AMQP 0-9-1, class basic).
    for bit in (2..16).rev().map(|b| 1u16 << b) {
        if flags & bit == 0 {
            continue;
        }
        let size = match bit {
            // headers
            0x2000 => {
                let Some(len) = read_u32(payload, at) else { return changed };
                let Some(table) = payload.get_mut(at + 4..at + 4 + len) else { return changed };
                changed |= bound_table(table);
                4 + len
            }
            // delivery mode, priority
            0x1000 | 0x0800 => 1,
            // timestamp
            0x0040 => 8,
            // content type, content encoding, correlation id, reply to, expiration, message id,
            // type, user id, app id, cluster id
            _ => match short_string(payload, at) {
                Some((len, changed_here)) => {
                    changed |= changed_here;
                    len
                }
                None => return changed,
            },
        };
        at += size;
    }
    changed
}

/// What stands in for each byte of a short string that is not UTF-8: SUB, the ASCII
/// substitute, a control character, so that a message id with it is refused as such
/// (`MessageId::parse`) and the message becomes a dead letter instead of a different id.
pub(crate) const NOT_UTF8: u8 = 0x1a;

/// The short string at `at` (length octet and bytes), its bytes that are not UTF-8 replaced
/// by [`NOT_UTF8`]; its size with the length octet and whether it changed. `None`: it runs past
/// the end.
fn short_string(bytes: &mut [u8], at: usize) -> Option<(usize, bool)> {
    let len = usize::from(*bytes.get(at)?);
    let text = bytes.get_mut(at + 1..at + 1 + len)?;
    Some((1 + len, replace_invalid_utf8(text)))
}

/// Replaces every byte of `bytes` that is not part of a valid UTF-8 sequence by [`NOT_UTF8`],
/// in place; whether any was.
fn replace_invalid_utf8(bytes: &mut [u8]) -> bool {
    let mut changed = false;
    let mut at = 0;
    while let Err(e) = std::str::from_utf8(&bytes[at..]) {
        let bad = at + e.valid_up_to();
        let end = e.error_len().map_or(bytes.len(), |n| bad + n);
        bytes[bad..end].fill(NOT_UTF8);
        changed = true;
        at = end;
    }
    changed
}

/// Bounds the entries of a field table (the bytes after its length) in place, iteratively;
/// whether anything changed.
fn bound_table(table: &mut [u8]) -> bool {
    // Open containers: where each ends, and whether it is a table (entries have names).
    let mut open: Vec<(usize, bool)> = vec![(table.len(), true)];
    let mut at = 0;
    let mut changed = false;
    while let Some(&(end, is_table)) = open.last() {
        if at >= end {
            if at > end {
                return changed; // an entry overran its container: lapin refuses it
            }
            open.pop();
            continue;
        }
        if is_table {
            let Some((name, changed_here)) = short_string(table, at) else { return changed };
            changed |= changed_here;
            at += name;
        }
        let Some(&tag) = table.get(at) else { return changed };
        at += 1;
        let fixed = match tag {
            b'V' => 0,
            b't' | b'b' | b'B' => 1,
            b's' | b'U' | b'u' => 2,
            b'I' | b'i' | b'f' => 4,
            b'D' => 5,
            b'l' | b'L' | b'd' | b'T' => 8,
            b'S' | b'x' => match read_u32(table, at) {
                Some(len) => 4 + len,
                None => return changed,
            },
            b'F' | b'A' => {
                let Some(len) = read_u32(table, at) else { return changed };
                if open.len() >= MAX_PARSED_DEPTH {
                    table[at - 1] = b'x';
                    changed = true;
                    4 + len
                } else {
                    open.push((at + 4 + len, tag == b'F'));
                    4
                }
            }
            _ => return changed, // an unknown type: lapin refuses it
        };
        at += fixed;
    }
    changed
}

fn read_u16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn read_u32(bytes: &[u8], at: usize) -> Option<usize> {
    Some(u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::amqp::{content_header, nested_table, wide_table};

    /// The nesting of the table lapin would parse out of a bounded `headers` table.
    fn parsed_depth(payload: &[u8]) -> usize {
        let mut input = payload.to_vec();
        bound_content_header(&mut input);
        // content header: 14 bytes, content-type "a/b" (4), then the table's length.
        let table = &input[14 + 4 + 4..];
        let mut depth = 1;
        let mut at = 0;
        // Each level of `nested_table` is one entry `n` holding the next level.
        while table.get(at + 2) == Some(&b'F') {
            depth += 1;
            at += 7;
        }
        depth
    }

    #[test]
    fn tables_nested_past_the_bound_become_byte_arrays_of_the_same_bytes() {
        let header = content_header(Some("a/b"), &nested_table(18_000), "M:1", 3);
        let mut bounded = header.clone();
        assert!(bound_content_header(&mut bounded));
        assert_eq!(bounded.len(), header.len(), "the frame keeps its size");
        assert_eq!(bounded.iter().zip(&header).filter(|(a, b)| a != b).count(), 1, "one tag changed");
        assert_eq!(parsed_depth(&header), MAX_PARSED_DEPTH);
    }

    #[test]
    fn tables_within_the_bound_and_wide_ones_are_left_alone() {
        for table in [nested_table(MAX_PARSED_DEPTH - 1), wide_table(10_000)] {
            let header = content_header(Some("a/b"), &table, "M:1", 3);
            let mut bounded = header.clone();
            assert!(!bound_content_header(&mut bounded));
            assert_eq!(bounded, header);
        }
    }

    #[test]
    fn arrays_count_as_levels_too() {
        // An array holding an array ... 100 deep, as the `headers` entry "a".
        let mut table = vec![1, b'a'];
        for level in 0..100u32 {
            table.push(b'A');
            table.extend_from_slice(&(5 * (99 - level)).to_be_bytes());
        }
        let mut header = content_header(None, &table, "M:1", 3);
        assert!(bound_content_header(&mut header));
        // No content type: the table's entries start at 18, the first array's tag at 20.
        let tags: Vec<u8> = (0..100).map(|level| header[20 + 5 * level]).collect();
        let kept = MAX_PARSED_DEPTH - 1; // below the headers table
        assert!(tags[..kept].iter().all(|t| *t == b'A'), "arrays kept: {tags:?}");
        assert_eq!(tags[kept], b'x', "the next one is bytes");
        assert!(tags[kept + 1..].iter().all(|t| *t == b'A'), "whose content is left as it was");
    }

    #[test]
    fn short_strings_that_are_not_utf8_get_substitutes_of_the_same_length() {
        // A header named 0xff 'k' and the message id "M:\xc3" (a cut two-byte sequence).
        let table = [2, 0xff, b'k', b't', 1];
        let header = content_header(Some("a/b"), &table, "M:0", 3);
        let mut bad = header.clone();
        let id_at = bad.len() - 3;
        bad[id_at + 2] = 0xc3;
        let mut bounded = bad.clone();
        assert!(bound_content_header(&mut bounded));
        assert_eq!(bounded.len(), bad.len());
        assert_eq!(&bounded[id_at..], b"M:\x1a", "the message id keeps its length, with a control character");
        let name_at = 14 + 4 + 4 + 1;
        assert_eq!(&bounded[name_at..name_at + 2], &[NOT_UTF8, b'k'], "the field name too");
        let mut good = content_header(Some("a/é"), &[2, b'k', b'k', b't', 1], "M:é", 3);
        assert!(!bound_content_header(&mut good), "valid UTF-8 is left alone");
    }

    #[test]
    fn only_plain_amqp_urls_are_taken() {
        assert!(plain_uri("amqp://guest:guest@127.0.0.1:5672/%2f").is_ok());
        let err = plain_uri("amqps://guest:guest@broker:5671/%2f").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::Unsupported);
        assert!(err.to_string().contains("amqps:// is not supported"), "{err}");
    }

    #[test]
    fn truncated_or_malformed_headers_do_not_panic() {
        let header = content_header(Some("a/b"), &nested_table(200), "M:1", 3);
        for cut in 0..header.len().min(400) {
            let mut part = header[..cut].to_vec();
            bound_content_header(&mut part);
        }
        let mut bad = header.clone();
        bad[30] = b'?';
        bound_content_header(&mut bad);
    }

    #[test]
    fn frames_split_anywhere_come_out_whole_and_bounded() {
        let header = content_header(Some("a/b"), &nested_table(1000), "M:1", 3);
        let mut stream = Vec::new();
        for (kind, payload) in [(1u8, vec![0u8; 20]), (FRAME_HEADER, header), (3, b"abc".to_vec())] {
            stream.push(kind);
            stream.extend_from_slice(&1u16.to_be_bytes());
            stream.extend_from_slice(&(payload.len() as u32).to_be_bytes());
            stream.extend_from_slice(&payload);
            stream.push(0xce);
        }
        let mut expected = stream.clone();
        bound_content_header(&mut expected[7 + 20 + 1 + 7..stream.len() - 8 - 3 - 1]);
        for piece in [1, 3, 7, 100, 5000] {
            let mut inbound = Inbound::default();
            let mut out = Vec::new();
            for chunk in stream.chunks(piece) {
                inbound.buf.extend_from_slice(chunk);
                inbound.examine().unwrap();
                let mut dst = vec![0u8; 64];
                loop {
                    let n = inbound.take(&mut dst);
                    if n == 0 {
                        break;
                    }
                    out.extend_from_slice(&dst[..n]);
                }
            }
            assert_eq!(out, expected, "chunks of {piece}");
        }
    }
}
