//! AMQP frames built by hand, and a publisher that sends them: for messages no client library
//! would serialise without a huge stack (header tables nested thousands of levels deep), which a
//! hostile producer can still send.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The entries of a `headers` table nested `depth` levels deep (the table itself is level 1):
/// each level one entry `n` holding the next table, the innermost one entry `leaf` = true.
/// Built in one pass (seven bytes a level), not recursively.
pub fn nested_table(depth: usize) -> Vec<u8> {
    let leaf = [4, b'l', b'e', b'a', b'f', b't', 1];
    let levels = depth.saturating_sub(1);
    let mut bytes = Vec::with_capacity(levels * 7 + leaf.len());
    for level in 0..levels {
        let inside = (levels - level - 1) * 7 + leaf.len();
        bytes.extend_from_slice(&[1, b'n', b'F']);
        bytes.extend_from_slice(&u32::try_from(inside).expect("fits a frame").to_be_bytes());
    }
    bytes.extend_from_slice(&leaf);
    bytes
}

/// The entries of a flat `headers` table of `entries` booleans named `k0`, `k1`, ...
pub fn wide_table(entries: usize) -> Vec<u8> {
    let mut bytes = Vec::new();
    for i in 0..entries {
        let name = format!("k{i}");
        bytes.push(u8::try_from(name.len()).expect("short name"));
        bytes.extend_from_slice(name.as_bytes());
        bytes.extend_from_slice(&[b't', 1]);
    }
    bytes
}

/// The payload of a `basic` content header: `content_type` (if any), `headers` (the entries of
/// the table), delivery mode 2 (persistent) and `message_id`, for a body of `body_size` bytes.
pub fn content_header(content_type: Option<&str>, headers: &[u8], message_id: &str, body_size: u64) -> Vec<u8> {
    let mut flags: u16 = 0x2000 | 0x1000 | 0x0080;
    let mut properties = Vec::new();
    if let Some(ct) = content_type {
        flags |= 0x8000;
        short_string(&mut properties, ct);
    }
    properties.extend_from_slice(&u32::try_from(headers.len()).expect("fits a frame").to_be_bytes());
    properties.extend_from_slice(headers);
    properties.push(2);
    short_string(&mut properties, message_id);
    let mut payload = Vec::with_capacity(14 + properties.len());
    payload.extend_from_slice(&60u16.to_be_bytes());
    payload.extend_from_slice(&0u16.to_be_bytes());
    payload.extend_from_slice(&body_size.to_be_bytes());
    payload.extend_from_slice(&flags.to_be_bytes());
    payload.extend_from_slice(&properties);
    payload
}

fn short_string(out: &mut Vec<u8>, s: &str) {
    out.push(u8::try_from(s.len()).expect("a short string"));
    out.extend_from_slice(s.as_bytes());
}

fn method(class: u16, method: u16, arguments: &[u8]) -> Vec<u8> {
    let mut payload = Vec::with_capacity(4 + arguments.len());
    payload.extend_from_slice(&class.to_be_bytes());
    payload.extend_from_slice(&method.to_be_bytes());
    payload.extend_from_slice(arguments);
    payload
}

/// A message with a hand-built `headers` table, as a producer would publish it.
#[derive(Debug, Clone)]
pub struct RawMessage<'a> {
    /// Exchange to publish to.
    pub exchange: &'a str,
    /// Its routing key.
    pub routing_key: &'a str,
    /// The AMQP `message_id` property.
    pub message_id: &'a str,
    /// The entries of the `headers` table ([`nested_table`], [`wide_table`]).
    pub headers: &'a [u8],
    /// The body (sent as `application/json`).
    pub body: &'a [u8],
}

/// A blocking AMQP 0-9-1 connection that speaks just enough of the protocol to publish
/// [`RawMessage`]s with publisher confirms.
struct RawConnection {
    stream: TcpStream,
    frame_max: usize,
}

impl RawConnection {
    fn open(url: &str) -> std::io::Result<Self> {
        let url = url::Url::parse(url).map_err(std::io::Error::other)?;
        let host = url.host_str().unwrap_or("127.0.0.1");
        let stream = TcpStream::connect((host, url.port().unwrap_or(5672)))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut conn = Self { stream, frame_max: 4096 };
        conn.stream.write_all(b"AMQP\x00\x00\x09\x01")?;
        conn.expect(0, (10, 10))?; // connection.start
        let mut start_ok = vec![0, 0, 0, 0]; // no client properties
        short_string(&mut start_ok, "PLAIN");
        let user = urlencoding_decode(url.username());
        let password = urlencoding_decode(url.password().unwrap_or_default());
        let response = format!("\0{user}\0{password}");
        start_ok.extend_from_slice(&u32::try_from(response.len()).expect("short").to_be_bytes());
        start_ok.extend_from_slice(response.as_bytes());
        short_string(&mut start_ok, "en_US");
        conn.send(1, 0, &method(10, 11, &start_ok))?;
        let tune = conn.expect(0, (10, 30))?;
        let frame_max = u32::from_be_bytes(tune[2..6].try_into().expect("tune"));
        conn.frame_max = frame_max as usize;
        conn.send(1, 0, &method(10, 31, &[&tune[..6], &[0, 0][..]].concat()))?; // no heartbeats
        let mut open = Vec::new();
        let vhost = urlencoding_decode(url.path().trim_start_matches('/'));
        short_string(&mut open, if vhost.is_empty() { "/" } else { &vhost });
        open.extend_from_slice(&[0, 0]);
        conn.send(1, 0, &method(10, 40, &open))?;
        conn.expect(0, (10, 41))?;
        conn.send(1, 1, &method(20, 10, &[0]))?;
        conn.expect(1, (20, 11))?;
        conn.send(1, 1, &method(85, 10, &[0]))?; // confirm.select
        conn.expect(1, (85, 11))?;
        Ok(conn)
    }

    fn send(&mut self, kind: u8, channel: u16, payload: &[u8]) -> std::io::Result<()> {
        let mut frame = Vec::with_capacity(8 + payload.len());
        frame.push(kind);
        frame.extend_from_slice(&channel.to_be_bytes());
        frame.extend_from_slice(&u32::try_from(payload.len()).expect("a frame").to_be_bytes());
        frame.extend_from_slice(payload);
        frame.push(0xce);
        self.stream.write_all(&frame)
    }

    /// Reads the next method frame and checks it is `(class, method)` on `channel`; returns its
    /// arguments. A `close` from the broker is an error with its reply text.
    fn expect(&mut self, channel: u16, (class, id): (u16, u16)) -> std::io::Result<Vec<u8>> {
        loop {
            let mut prefix = [0u8; 7];
            self.stream.read_exact(&mut prefix)?;
            let size = u32::from_be_bytes(prefix[3..7].try_into().expect("four bytes")) as usize;
            let mut payload = vec![0u8; size + 1];
            self.stream.read_exact(&mut payload)?;
            payload.pop();
            if prefix[0] == 8 {
                continue; // heartbeat
            }
            let got = (u16::from_be_bytes([payload[0], payload[1]]), u16::from_be_bytes([payload[2], payload[3]]));
            if matches!(got, (10, 50) | (20, 40)) {
                let text_len = usize::from(payload[6]);
                let text = String::from_utf8_lossy(&payload[7..7 + text_len]).into_owned();
                return Err(std::io::Error::other(format!("the broker closed: {text}")));
            }
            let on = u16::from_be_bytes([prefix[1], prefix[2]]);
            if prefix[0] != 1 || on != channel || got != (class, id) {
                return Err(std::io::Error::other(format!("expected {class}.{id} on {channel}, got {got:?} on {on}")));
            }
            return Ok(payload.split_off(4));
        }
    }

    fn publish(&mut self, message: &RawMessage<'_>) -> std::io::Result<()> {
        let mut publish = vec![0, 0];
        short_string(&mut publish, message.exchange);
        short_string(&mut publish, message.routing_key);
        publish.push(0);
        self.send(1, 1, &method(60, 40, &publish))?;
        let header =
            content_header(Some("application/json"), message.headers, message.message_id, message.body.len() as u64);
        if header.len() + 8 > self.frame_max {
            return Err(std::io::Error::other(format!(
                "a content header of {} bytes does not fit frame_max {}",
                header.len(),
                self.frame_max
            )));
        }
        self.send(2, 1, &header)?;
        // A body larger than a frame goes in several (frame type, channel, size and end: 8 bytes).
        for part in message.body.chunks(self.frame_max - 8) {
            self.send(3, 1, part)?;
        }
        self.expect(1, (60, 80)).map(|_| ()) // basic.ack: confirmed
    }

    fn close(mut self) -> std::io::Result<()> {
        let mut close = 200u16.to_be_bytes().to_vec();
        short_string(&mut close, "done");
        close.extend_from_slice(&[0, 0, 0, 0]);
        self.send(1, 0, &method(10, 50, &close))?;
        self.expect(0, (10, 51)).map(|_| ())
    }
}

/// `%xx` escapes of a URL part decoded (`%2f` → `/`).
fn urlencoding_decode(s: &str) -> String {
    url::form_urlencoded::parse(format!("x={}", s.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

/// Publishes `messages` to the RabbitMQ at `url` (guest credentials and vhost from the URL)
/// over a hand-driven connection, each confirmed by the broker; runs on a blocking thread.
///
/// Errors: the broker refused a step or a message, or a header does not fit its `frame_max`.
pub async fn publish_raw(url: &str, messages: &[RawMessage<'_>]) -> std::io::Result<()> {
    let url = url.to_owned();
    /// A [`RawMessage`] that owns its parts, for the blocking thread.
    struct Owned([String; 3], [Vec<u8>; 2]);
    let owned: Vec<Owned> = messages
        .iter()
        .map(|m| {
            let names = [m.exchange, m.routing_key, m.message_id].map(str::to_owned);
            Owned(names, [m.headers.to_vec(), m.body.to_vec()])
        })
        .collect();
    tokio::task::spawn_blocking(move || {
        let mut conn = RawConnection::open(&url)?;
        for Owned([exchange, routing_key, message_id], [headers, body]) in &owned {
            conn.publish(&RawMessage { exchange, routing_key, message_id, headers, body })?;
        }
        conn.close()
    })
    .await
    .map_err(std::io::Error::other)?
}
