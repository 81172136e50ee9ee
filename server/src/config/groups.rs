//! The consumer groups `serve` runs: `[consumer]` alone (one group, today's single-group
//! configuration), or each entry of `[[groups]]` laid over `[consumer]` (keys a group does not
//! set are `[consumer]`'s), bound to the order example's handlers by message type, and to HTTP
//! handlers calling a team's service (`[consumer.http."<TYPE>"]`, `[groups.http."<TYPE>"]`).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use anyhow::Context;
use dedup_engine::console::actions::Publishers;
use dedup_engine::http::{HttpHandler, HttpSettings};
use dedup_engine::kafka::KafkaSettings;
use dedup_engine::rabbitmq::RabbitSettings;
use dedup_engine::{Broker, Group, GroupSettings, GroupSource, HandlerRegistry, SourceFactory};
use dedup_example_orders::simulate::SimulatedGroup;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One consumer group as configured (`[consumer]`, and each `[[groups]]` entry over it).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct GroupConfig {
    /// Run the groups' workers inside `serve` (off: the console only). Default true. Only read
    /// from `[consumer]`.
    pub enabled: bool,
    /// The consumer group's name: its records are scoped to it. Default `order-service`.
    pub group: String,
    /// The message types of the order example this group handles (`ORDER.CREATE`,
    /// `ORDER.PAY`, `ORDER.NOTIFY`). Default: all of them — none when the group has `http`
    /// handlers.
    pub handlers: Option<Vec<String>>,
    /// HTTP handlers by message type (`[consumer.http."ORDER.PAID"]`, or
    /// `[groups.http."ORDER.PAID"]` after a `[[groups]]` entry): each message of the type is
    /// sent to a team's service ([`HttpSettings`]: `url`, `timeout_ms`, `headers`,
    /// `concurrency`, …). A `[[groups]]` entry does not inherit those of `[consumer]`.
    pub http: BTreeMap<String, HttpSettings>,
    /// The broker consumed from: `rabbitmq` (default) or `kafka`.
    pub source: Broker,
    /// Exchange, queue, binding keys, prefetch, dead letters (when `source = "rabbitmq"`); keys
    /// not given are the order example's ([`GroupConfig::default`]), not the engine's.
    #[serde(deserialize_with = "over_demo::rabbitmq")]
    pub rabbitmq: RabbitSettings,
    /// Brokers, Kafka group, topics, fetch limits, back-pressure (when `source = "kafka"`); keys
    /// not given are the order example's.
    #[serde(deserialize_with = "over_demo::kafka")]
    pub kafka: KafkaSettings,
    /// Attempts, lease, workers, back-off, ids, types.
    #[serde(flatten)]
    pub settings: GroupSettings,
    /// Keys none of the above knows (serde cannot deny unknown fields next to a flattened
    /// struct): [`GroupConfig::check_keys`] refuses them.
    #[serde(flatten)]
    unknown: std::collections::BTreeMap<String, Value>,
}

impl Default for GroupConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            group: "order-service".to_owned(),
            handlers: None,
            http: BTreeMap::new(),
            source: Broker::RabbitMq,
            // The order example's topology: the demo's defaults, not the engine's.
            rabbitmq: RabbitSettings {
                connection_name: "dedup-console".to_owned(),
                ..RabbitSettings::for_queue("orders.events", "orders.order-service", ["order.#"])
            },
            kafka: KafkaSettings { topics: vec!["orders.events".to_owned()], ..KafkaSettings::default() },
            settings: GroupSettings::default(),
            unknown: Default::default(),
        }
    }
}

impl GroupConfig {
    /// Refuses keys this configuration does not know, naming them and `place`.
    ///
    /// Errors: the unknown keys.
    pub fn check_keys(&self, place: &str) -> anyhow::Result<()> {
        if self.unknown.is_empty() {
            return Ok(());
        }
        let keys: Vec<&str> = self.unknown.keys().map(String::as_str).collect();
        anyhow::bail!("unknown key(s) in {place}: {}", keys.join(", "))
    }

    /// Whether the group runs handlers of the order example: those `handlers` names, or all of
    /// them when it names none and has no `http` handlers.
    pub fn uses_example(&self) -> bool {
        match &self.handlers {
            None => self.http.is_empty(),
            Some(types) => !types.is_empty(),
        }
    }

    /// The engine's group: its source at `amqp_url` (RabbitMQ) or its Kafka settings, its
    /// settings, the handlers of `example` it names, and its HTTP handlers.
    ///
    /// Errors: a handler type the example does not have; a type with both an example and an
    /// HTTP handler; HTTP settings that [`HttpHandler::new`] refuses (never with a secret).
    pub fn engine_group(&self, amqp_url: &str, example: &HandlerRegistry) -> anyhow::Result<Group> {
        let handlers = match &self.handlers {
            None if !self.uses_example() => HandlerRegistry::new(),
            None => example.clone(),
            Some(types) => {
                example.only(types).map_err(|e| anyhow::anyhow!("consumer group {:?}: handlers: {e}", self.group))?
            }
        };
        let mut group =
            Group::new(self.group.clone(), self.source(amqp_url)).settings(self.settings.clone()).handlers(&handlers);
        for (message_type, settings) in &self.http {
            anyhow::ensure!(
                handlers.get(message_type).is_none(),
                "consumer group {:?}: {message_type:?} has both an example handler and an HTTP handler",
                self.group
            );
            let handler = HttpHandler::new(settings)
                .with_context(|| format!("consumer group {:?}: http.{message_type:?}", self.group))?;
            group = group.http(message_type.clone(), handler);
        }
        Ok(group)
    }

    /// The group's source factory (it connects when first used).
    pub fn source_factory(&self, amqp_url: &str) -> Arc<dyn SourceFactory> {
        Group::new(self.group.clone(), self.source(amqp_url)).settings(self.settings.clone()).source_factory()
    }

    /// Where the group reads from.
    pub fn source(&self, amqp_url: &str) -> GroupSource {
        match self.source {
            Broker::RabbitMq => GroupSource::RabbitMq { url: amqp_url.to_owned(), settings: self.rabbitmq.clone() },
            Broker::Kafka => GroupSource::Kafka(self.kafka.clone()),
        }
    }

    /// Where the group's messages are published: the exchange (RabbitMQ) or its first topic.
    pub fn destination(&self) -> String {
        match self.source {
            Broker::RabbitMq => self.rabbitmq.exchange.clone(),
            Broker::Kafka => self.kafka.topics.first().cloned().unwrap_or_default(),
        }
    }

    /// Whether messages published to `destination` (an exchange or a topic) reach this group,
    /// and how the simulator sees it.
    pub fn simulated(&self, destination: &str) -> Option<SimulatedGroup> {
        let reached = match self.source {
            Broker::RabbitMq => self.rabbitmq.exchange == destination,
            Broker::Kafka => self.kafka.topics.iter().any(|t| t == destination),
        };
        let binding_keys = match self.source {
            Broker::RabbitMq => self.rabbitmq.binding_keys.clone(),
            Broker::Kafka => Vec::new(),
        };
        reached.then(|| SimulatedGroup { name: self.group.clone(), binding_keys })
    }
}

/// The `[[groups]]` entries as written, each laid over `[consumer]` by [`resolve`]. Printed
/// and serialised with their HTTP handlers as [`HttpSettings`] print them: header values and
/// signing secrets redacted (an entry that is not valid settings is not shown at all).
#[derive(Clone, Default, Deserialize)]
#[serde(transparent)]
pub struct GroupEntries(pub Vec<Value>);

impl GroupEntries {
    fn redacted(&self) -> Vec<Value> {
        let mut entries = self.0.clone();
        for entry in &mut entries {
            let handlers = entry.get_mut("http").and_then(Value::as_object_mut);
            for handler in handlers.into_iter().flat_map(|h| h.values_mut()) {
                *handler = serde_json::from_value::<HttpSettings>(handler.clone())
                    .ok()
                    .and_then(|settings| serde_json::to_value(settings).ok())
                    .unwrap_or_else(|| Value::String("[not valid HTTP handler settings]".to_owned()));
            }
        }
        entries
    }
}

impl std::fmt::Debug for GroupEntries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.redacted().fmt(f)
    }
}

impl Serialize for GroupEntries {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.redacted().serialize(serializer)
    }
}

/// The publishers of `groups` (operator commands republish through them without an engine).
pub fn publishers(groups: &[GroupConfig], amqp_url: &str) -> Publishers {
    let mut publishers = Publishers::default();
    for g in groups {
        publishers.add(&g.group, g.source_factory(amqp_url));
    }
    publishers
}

/// `[[groups]]` laid over `consumer`, or `consumer` alone when there is none; checked: names
/// unique, no two RabbitMQ groups on one queue, no two Kafka groups in one Kafka group.
///
/// Errors: an entry that is not a table, sets `enabled`, or does not make a valid group; a
/// clash between two groups. The message names the entry and the key.
pub fn resolve(consumer: &GroupConfig, groups: &[Value]) -> anyhow::Result<Vec<GroupConfig>> {
    consumer.check_keys("[consumer]")?;
    let resolved = if groups.is_empty() {
        vec![consumer.clone()]
    } else {
        let mut base = serde_json::to_value(consumer).context("the [consumer] settings do not serialise")?;
        // Each group declares its own HTTP handlers (and serialised secrets are redacted).
        if let Value::Object(fields) = &mut base {
            fields.remove("http");
        }
        groups
            .iter()
            .enumerate()
            .map(|(i, entry)| {
                let Value::Object(fields) = entry else {
                    anyhow::bail!("groups[{i}] must be a table of group settings");
                };
                anyhow::ensure!(
                    !fields.contains_key("enabled"),
                    "groups[{i}]: `enabled` is read from [consumer] only (it turns every group's workers on or off)"
                );
                anyhow::ensure!(fields.contains_key("group"), "groups[{i}]: give the group a name (`group = \"...\"`)");
                let mut merged = base.clone();
                merge(&mut merged, entry);
                let group = serde_json::from_value::<GroupConfig>(merged).with_context(|| format!("groups[{i}]"))?;
                group.check_keys(&format!("groups[{i}]"))?;
                Ok(group)
            })
            .collect::<anyhow::Result<Vec<_>>>()?
    };
    let (mut names, mut queues, mut kafka_groups) = (HashSet::new(), HashSet::new(), HashSet::new());
    for g in &resolved {
        anyhow::ensure!(names.insert(g.group.as_str()), "consumer group {:?} is declared twice", g.group);
        anyhow::ensure!(
            g.settings.max_attempts >= 1,
            "consumer group {:?}: max_attempts = {} allows no attempt; the first delivery is one (give 1 or more)",
            g.group,
            g.settings.max_attempts
        );
        match g.source {
            Broker::RabbitMq => anyhow::ensure!(
                queues.insert(g.rabbitmq.queue.as_str()),
                "consumer groups share the queue {:?}: give each its own `rabbitmq.queue` (on one queue they would \
                 take each other's messages)",
                g.rabbitmq.queue
            ),
            Broker::Kafka => {
                let id = g.kafka.group_id.clone().unwrap_or_else(|| g.group.clone());
                anyhow::ensure!(
                    kafka_groups.insert(id.clone()),
                    "consumer groups share the Kafka group {id:?}: give each its own `kafka.group_id`"
                );
            }
        }
    }
    Ok(resolved)
}

/// A partial `rabbitmq` or `kafka` table laid over the order example's defaults, key by key
/// (serde alone would fill the missing keys from the engine's defaults, which name no topology).
mod over_demo {
    use serde::de::{DeserializeOwned, Deserializer, Error};
    use serde::{Deserialize, Serialize};
    use serde_json::Value;

    use super::{GroupConfig, KafkaSettings, RabbitSettings};

    fn laid_over<'de, D: Deserializer<'de>, T: Serialize + DeserializeOwned>(default: &T, d: D) -> Result<T, D::Error> {
        let given = Value::deserialize(d)?;
        let mut value = serde_json::to_value(default).map_err(D::Error::custom)?;
        super::merge(&mut value, &given);
        serde_json::from_value(value).map_err(D::Error::custom)
    }

    pub fn rabbitmq<'de, D: Deserializer<'de>>(d: D) -> Result<RabbitSettings, D::Error> {
        laid_over(&GroupConfig::default().rabbitmq, d)
    }

    pub fn kafka<'de, D: Deserializer<'de>>(d: D) -> Result<KafkaSettings, D::Error> {
        laid_over(&GroupConfig::default().kafka, d)
    }
}

/// Lays `over` on `base`: tables merge key by key, anything else replaces.
fn merge(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                merge(b.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (b, o) => *b = o.clone(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_partial_rabbitmq_table_keeps_the_examples_other_keys() {
        let config: GroupConfig = serde_json::from_value(json!({"rabbitmq": {"queue": "q1"}})).unwrap();
        assert_eq!(config.rabbitmq.queue, "q1");
        assert_eq!(config.rabbitmq.exchange, "orders.events");
        assert_eq!(config.rabbitmq.binding_keys, ["order.#"]);
        let config: GroupConfig = serde_json::from_value(json!({"kafka": {"brokers": "b:1"}})).unwrap();
        assert_eq!(config.kafka.topics, ["orders.events"]);
    }

    #[test]
    fn groups_inherit_consumer_keys_they_do_not_set() {
        let mut consumer = GroupConfig::default();
        consumer.settings.max_attempts = 7;
        consumer.rabbitmq.exchange = "shop.events".into();
        let groups = [
            json!({"group": "order-service", "handlers": ["ORDER.CREATE", "ORDER.PAY"],
                   "rabbitmq": {"queue": "q.orders", "binding_keys": ["order.create", "order.pay"]}}),
            json!({"group": "notify-service", "handlers": ["ORDER.NOTIFY"], "lease_ms": 5000,
                   "rabbitmq": {"queue": "q.notify", "binding_keys": ["order.notify"]},
                   "types": {"from": ["header:__TypeId__", "id_prefix"]},
                   "ids": {"from": ["header:x-idempotency-key", "property"]}}),
        ];
        let resolved = resolve(&consumer, &groups).unwrap();
        assert_eq!(resolved.len(), 2);
        let notify = &resolved[1];
        assert_eq!(notify.group, "notify-service");
        assert_eq!(notify.settings.max_attempts, 7, "inherited");
        assert_eq!(notify.settings.lease_ms, 5000, "its own");
        assert_eq!(notify.rabbitmq.exchange, "shop.events", "a nested key inherited");
        assert_eq!(notify.rabbitmq.queue, "q.notify");
        assert_eq!(notify.settings.types.from[0].to_string(), "header:__TypeId__");
        let ids: Vec<String> = notify.settings.ids.from.iter().map(ToString::to_string).collect();
        assert_eq!(ids, ["header:x-idempotency-key", "property"], "its own id sources, in its order");
        assert_eq!(notify.settings.ids.max_payload_bytes, 1024 * 1024, "the rest of [consumer.ids]");
        assert_eq!(resolved[0].settings.ids, dedup_engine::IdPolicy::default());
        assert_eq!(resolved[0].settings.lease_ms, 30_000);
        assert_eq!(resolve(&consumer, &[]).unwrap()[0].group, "order-service", "[consumer] alone");
    }

    #[test]
    fn clashes_and_mistakes_are_named() {
        let consumer = GroupConfig::default();
        let same_queue = [json!({"group": "a"}), json!({"group": "b"})];
        let err = resolve(&consumer, &same_queue).unwrap_err().to_string();
        assert!(err.contains("share the queue"), "{err}");
        let twice =
            [json!({"group": "a", "rabbitmq": {"queue": "x"}}), json!({"group": "a", "rabbitmq": {"queue": "y"}})];
        assert!(resolve(&consumer, &twice).unwrap_err().to_string().contains("declared twice"));
        let typo = [json!({"group": "a", "max_atempts": 3})];
        let err = format!("{:#}", resolve(&consumer, &typo).unwrap_err());
        assert!(err.contains("groups[0]") && err.contains("max_atempts"), "{err}");
        let enabled = [json!({"group": "a", "enabled": false})];
        assert!(resolve(&consumer, &enabled).unwrap_err().to_string().contains("[consumer] only"));
        let unnamed = [json!({"rabbitmq": {"queue": "x"}})];
        assert!(resolve(&consumer, &unnamed).unwrap_err().to_string().contains("name"));
        let bad_source = [json!({"group": "a", "types": {"from": ["headers:x"]}})];
        let err = format!("{:#}", resolve(&consumer, &bad_source).unwrap_err());
        assert!(err.contains("headers:x"), "{err}");
        let old_ids = [json!({"group": "a", "ids": {"header": "x-id"}})];
        let err = format!("{:#}", resolve(&consumer, &old_ids).unwrap_err());
        assert!(err.contains("replaced by ids.from"), "{err}");
        let no_attempt = [json!({"group": "a", "max_attempts": 0})];
        let err = resolve(&consumer, &no_attempt).unwrap_err().to_string();
        assert!(err.contains("max_attempts = 0 allows no attempt"), "{err}");
    }
}
