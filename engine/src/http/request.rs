//! The request an HTTP handler sends (docs/DESIGN.md, "HTTP handlers"): the payload as the body,
//! `Idempotency-Key`, the gateway's `Dedup-*` headers, the producer's headers on the allow-list,
//! the team's extra headers, and the Standard Webhooks signature.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use sha2::Sha256;

use crate::handler::HandlerInput;
use crate::message::Broker;

/// `Idempotency-Key`: the message id as an RFC 8941 sf-string.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// The consumer group.
pub const CONSUMER_GROUP: &str = "dedup-consumer-group";
/// The message type the handler was picked by.
pub const MESSAGE_TYPE: &str = "dedup-message-type";
/// The attempt number (1-based; calls not counted keep it).
pub const ATTEMPT: &str = "dedup-attempt";
/// Calls for this message id so far, this one included.
pub const DELIVERY_COUNT: &str = "dedup-delivery-count";
/// The status the previous call was answered with (absent on the first call, and after a call
/// that got no answer).
pub const PREVIOUS_STATUS: &str = "dedup-previous-status";
/// RabbitMQ: the exchange the message was published to.
pub const SOURCE_EXCHANGE: &str = "dedup-source-exchange";
/// RabbitMQ: its routing key.
pub const SOURCE_ROUTING_KEY: &str = "dedup-source-routing-key";
/// Kafka: the topic.
pub const SOURCE_TOPIC: &str = "dedup-source-topic";
/// Kafka: the partition.
pub const SOURCE_PARTITION: &str = "dedup-source-partition";
/// Kafka: the offset.
pub const SOURCE_OFFSET: &str = "dedup-source-offset";
/// Kafka: the record key.
pub const SOURCE_KEY: &str = "dedup-source-key";
/// Standard Webhooks: the message id.
pub const WEBHOOK_ID: &str = "webhook-id";
/// Standard Webhooks: seconds since the Unix epoch when the call was signed.
pub const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
/// Standard Webhooks: `v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">`.
pub const WEBHOOK_SIGNATURE: &str = "webhook-signature";

/// Whether a header name is the gateway's own: a team's extra or forwarded header may not set it.
pub(crate) fn reserved(name: &HeaderName) -> bool {
    let n = name.as_str();
    matches!(n, "content-type" | "content-length" | "host" | "transfer-encoding" | "connection" | IDEMPOTENCY_KEY)
        || n.starts_with("dedup-")
        || n.starts_with("webhook-")
}

/// The message id as the value of `Idempotency-Key`: an RFC 8941 sf-string (`"..."`, with `\`
/// and `"` escaped) when it is printable ASCII, as the IETF draft asks; otherwise an RFC 9651
/// Display String (`%"..."`, the UTF-8 bytes outside printable ASCII, `%` and `"` written
/// `%xx`), since an sf-string cannot carry them. Either way one id gives one key, and two ids two.
pub fn idempotency_key(id: &str) -> String {
    let printable = |b: u8| (0x20..=0x7e).contains(&b);
    if id.bytes().all(printable) {
        let mut out = String::with_capacity(id.len() + 2);
        out.push('"');
        for c in id.chars() {
            if matches!(c, '"' | '\\') {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('"');
        out
    } else {
        let mut out = String::with_capacity(id.len() * 3 + 3);
        out.push_str("%\"");
        for b in id.bytes() {
            if printable(b) && b != b'%' && b != b'"' {
                out.push(char::from(b));
            } else {
                out.push_str(&format!("%{b:02x}"));
            }
        }
        out.push('"');
        out
    }
}

/// A header value for gateway text (group, type, routing key, …): as it is when it is printable
/// ASCII, else with every byte outside it, and `%`, written `%XX`.
pub(crate) fn text_value(text: &str) -> HeaderValue {
    let printable = |b: u8| (0x20..=0x7e).contains(&b);
    let encoded = if text.bytes().all(printable) {
        text.to_owned()
    } else {
        text.bytes()
            .map(|b| if printable(b) && b != b'%' { char::from(b).to_string() } else { format!("%{b:02X}") })
            .collect()
    };
    HeaderValue::from_str(&encoded).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// `v1,<signature>` of Standard Webhooks: HMAC-SHA256 with `key` over `<id>.<timestamp>.<body>`,
/// base64.
pub fn webhook_signature(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", BASE64.encode(mac.finalize().into_bytes()))
}

/// The key of a Standard Webhooks secret: base64 after the optional `whsec_` prefix.
///
/// Errors: not base64, or empty (the message does not repeat the secret).
pub(crate) fn signing_key(secret: &str) -> Result<Vec<u8>, String> {
    let encoded = secret.strip_prefix("whsec_").unwrap_or(secret);
    match BASE64.decode(encoded) {
        Ok(key) if !key.is_empty() => Ok(key),
        Ok(_) => Err("signing_secret is empty".to_owned()),
        Err(_) => Err("signing_secret is not `whsec_` followed by base64".to_owned()),
    }
}

/// The gateway's headers of one call (not the team's extra ones, nor the signature).
pub(crate) fn gateway_headers(input: &HandlerInput<'_>, forward: &[HeaderName]) -> HeaderMap {
    let mut h = HeaderMap::new();
    let content_type = input.message.content_type.as_deref().unwrap_or("application/octet-stream");
    h.insert(CONTENT_TYPE, HeaderValue::from_str(content_type).unwrap_or_else(|_| text_value(content_type)));
    // Printable ASCII or a display string: always a valid header value.
    if let Ok(key) = HeaderValue::from_str(&idempotency_key(input.message_id.as_str())) {
        h.insert(IDEMPOTENCY_KEY, key);
    }
    h.insert(CONSUMER_GROUP, text_value(input.group.as_str()));
    h.insert(MESSAGE_TYPE, text_value(input.message_type));
    h.insert(ATTEMPT, HeaderValue::from(input.attempt));
    h.insert(DELIVERY_COUNT, HeaderValue::from(input.calls));
    if let Some(status) = input.previous_status {
        h.insert(PREVIOUS_STATUS, HeaderValue::from(status));
    }
    let source = &input.message.source;
    let mut put = |name: &'static str, value: Option<&str>| {
        if let Some(v) = value {
            h.insert(name, text_value(v));
        }
    };
    match input.message.broker {
        Broker::RabbitMq => {
            put(SOURCE_EXCHANGE, source.exchange.as_deref());
            put(SOURCE_ROUTING_KEY, source.routing_key.as_deref());
        }
        Broker::Kafka => {
            put(SOURCE_TOPIC, source.exchange.as_deref());
            put(SOURCE_PARTITION, source.queue.as_deref());
            put(SOURCE_KEY, source.routing_key.as_deref());
            if let Some(offset) = source.offset {
                h.insert(SOURCE_OFFSET, HeaderValue::from(offset));
            }
        }
    }
    for name in forward {
        let found = input.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name.as_str()));
        if let Some((_, value)) = found {
            let text = match value {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            h.insert(name.clone(), text_value(&text));
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_keys_are_sf_strings_or_display_strings() {
        assert_eq!(idempotency_key("ORDER.PAY.1:2"), r#""ORDER.PAY.1:2""#);
        assert_eq!(idempotency_key(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(idempotency_key("café 100%"), r#"%"caf%c3%a9 100%25""#);
        assert_ne!(idempotency_key("caf%c3%a9"), idempotency_key("café"), "no two ids share a key");
    }

    #[test]
    fn text_is_sent_as_it_is_or_percent_encoded() {
        assert_eq!(text_value("order.paid"), "order.paid");
        assert_eq!(text_value("zü%"), "z%C3%BC%25");
    }

    #[test]
    fn the_standard_webhooks_example_signs_as_the_spec_says() {
        // The example of the Standard Webhooks specification.
        let key = signing_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let signature = webhook_signature(&key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, br#"{"test": 2432232314}"#);
        assert_eq!(signature, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
        assert!(signing_key("whsec_!!").is_err());
    }
}
