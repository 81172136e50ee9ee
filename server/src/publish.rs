//! `dedup-console publish`: one message, as a team's producer would send it, to where a configured
//! consumer group reads from — for trying a configuration (an HTTP handler's service, a type
//! policy) without writing a producer. `--copies` sends the same message id again, as a producer
//! retrying after a lost confirm.

use anyhow::Context;
use clap::Args;
use dedup_engine::Broker;
use dedup_engine::{IdSource, MessageId, Outbound};

use crate::config::Settings;

/// `publish` options.
#[derive(Debug, Args)]
pub struct PublishArgs {
    /// The consumer group whose exchange (RabbitMQ) or first topic (Kafka) the message goes to;
    /// the first configured group when omitted.
    #[arg(long)]
    pub group: Option<String>,
    /// The business message id (checked as the consumer checks it: not empty, at most 512
    /// bytes, no control characters). RabbitMQ: the AMQP `message_id` property, or past its
    /// 255 bytes the `x-message-id` header; Kafka: the group's id header (the first `header:` of
    /// its `ids.from`, default `x-message-id`).
    #[arg(long, value_parser = parse_message_id)]
    pub message_id: String,
    /// RabbitMQ routing key (Kafka ignores it).
    #[arg(long, default_value = "")]
    pub routing_key: String,
    /// Kafka record key, which picks the partition (RabbitMQ ignores it).
    #[arg(long)]
    pub key: Option<String>,
    /// A broker header `NAME=VALUE` (a string); repeatable.
    #[arg(long = "header", value_name = "NAME=VALUE", value_parser = parse_header)]
    pub headers: Vec<(String, String)>,
    /// The AMQP `type` property (RabbitMQ; a group reads it with `types.from = ["type_property"]`).
    #[arg(long = "type")]
    pub type_property: Option<String>,
    /// The content type of the body.
    #[arg(long, default_value = "application/json")]
    pub content_type: String,
    /// How many times to publish it: more than 1 sends duplicates of one message id.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub copies: u32,
    /// The body; `-` reads it from standard input.
    pub body: String,
}

fn parse_message_id(text: &str) -> Result<String, String> {
    MessageId::parse(text).map(|id| id.as_str().to_owned()).map_err(|e| e.to_string())
}

/// The id header a message id too long for the AMQP property travels in (the engine's
/// RabbitMQ publisher's choice).
const LONG_ID_HEADER: &str = "x-message-id";

fn parse_header(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, value)) if !name.trim().is_empty() => Ok((name.trim().to_owned(), value.to_owned())),
        _ => Err(format!("expected NAME=VALUE, got {text:?}")),
    }
}

/// Publishes the message `args` describe `args.copies` times, each confirmed by the broker, and
/// prints where it went.
///
/// Errors: no such group; the body cannot be read from standard input; the broker cannot be
/// reached or refuses a copy (e.g. `unroutable` when no queue is bound for the routing key yet:
/// start `serve` first, it declares the group's queue and bindings).
pub async fn run_publish(settings: &Settings, args: PublishArgs) -> anyhow::Result<()> {
    let groups = settings.consumer_groups()?;
    let group = match &args.group {
        Some(name) => groups.iter().find(|g| &g.group == name).with_context(|| {
            let names: Vec<&str> = groups.iter().map(|g| g.group.as_str()).collect();
            format!("no consumer group {name:?} is configured (groups: {})", names.join(", "))
        })?,
        None => groups.first().context("no consumer group is configured")?,
    };
    let long_id_unread = group.source == Broker::RabbitMq
        && args.message_id.len() > 255
        && !group.settings.ids.from.contains(&IdSource::Header(LONG_ID_HEADER.to_owned()));
    anyhow::ensure!(
        !long_id_unread,
        "a message id of {} bytes does not fit the AMQP message_id property (255 bytes) and goes in the \
         {LONG_ID_HEADER} header, which group {:?}'s ids.from does not read: the consumer would find no id",
        args.message_id.len(),
        group.group
    );
    let body = if args.body == "-" {
        let mut body = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut body).context("reading the body from stdin")?;
        body
    } else {
        args.body.into_bytes()
    };
    let headers: serde_json::Map<String, serde_json::Value> =
        args.headers.into_iter().map(|(name, value)| (name, serde_json::Value::String(value))).collect();
    let destination = group.destination();
    let source = group.source_factory(settings.amqp_url.expose());
    let message = Outbound {
        destination: &destination,
        routing_key: &args.routing_key,
        key: args.key.as_deref(),
        message_id: Some(&args.message_id),
        payload: &body,
        headers: &headers,
        content_type: Some(&args.content_type),
        type_property: args.type_property.as_deref(),
    };
    let result = async {
        let publisher = source.open_publisher().await?;
        let mut published = Ok(());
        for _ in 0..args.copies {
            published = publisher.publish(message).await;
            if published.is_err() {
                break;
            }
        }
        publisher.close().await;
        anyhow::Ok(published?)
    }
    .await;
    source.close().await;
    result.with_context(|| format!("publishing to {destination:?}"))?;
    let place = match group.source {
        Broker::RabbitMq => format!("exchange {destination:?}, routing key {:?}", args.routing_key),
        Broker::Kafka => format!("topic {destination:?}"),
    };
    println!(
        "published {} ({} cop{}) to {place} for consumer group {:?}",
        args.message_id,
        args.copies,
        if args.copies == 1 { "y" } else { "ies" },
        group.group
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_header;

    #[test]
    fn headers_are_name_equals_value() {
        assert_eq!(parse_header("traceparent=00-ab=cd").unwrap(), ("traceparent".into(), "00-ab=cd".into()));
        assert!(parse_header("novalue").is_err());
        assert!(parse_header("=x").is_err());
    }
}
