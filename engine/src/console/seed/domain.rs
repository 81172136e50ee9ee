//! What seeded records are made of ([`SeedDomain`]): the consumer groups, message types,
//! handler errors and payloads of the host's own domain. The engine knows none of its own.

use crate::record::HandlerMode;

/// The domain seeded records are drawn from. Shares are weights on any positive scale; a
/// record's group, type and (for failed and dead records) error are drawn independently.
///
/// [`SeedDomain::new`] makes one from names alone (even shares, transactional handlers, two
/// generic errors, a payload holding the message id); set the fields for a realistic one (the
/// order example's `seed::order_domain` does).
#[derive(Debug, Clone)]
pub struct SeedDomain {
    /// Consumer groups. Not empty.
    pub groups: Vec<SeedGroup>,
    /// Message types. Not empty.
    pub message_types: Vec<SeedType>,
    /// Handler errors of failed and dead records (not poison), drawn evenly. Not empty.
    pub errors: Vec<SeedError>,
    /// The RabbitMQ exchange records came from (their routing key is their type, lowercased).
    pub exchange: String,
    /// The payload of a record that keeps one (every record not `succeeded` but the binary
    /// poison), as JSON.
    pub payload: fn(&SeedMessage<'_>) -> serde_json::Value,
}

/// A consumer group of a [`SeedDomain`].
#[derive(Debug, Clone, PartialEq)]
pub struct SeedGroup {
    /// Its name.
    pub name: String,
    /// Its share of the records.
    pub share: f64,
    /// The queue its records came from.
    pub queue: String,
}

/// A message type of a [`SeedDomain`].
#[derive(Debug, Clone, PartialEq)]
pub struct SeedType {
    /// The type (`<entity>.<event>`): message ids are `<type>.<14-digit number>:1`.
    pub name: String,
    /// Its share of the records.
    pub share: f64,
    /// Its handler's mode (records stuck in `processing` are all leased).
    pub mode: HandlerMode,
}

/// A handler error of a [`SeedDomain`], as a handler would give it
/// ([`crate::handler::HandlerError`]): stored as the record's `error_class`, and `last_error`
/// `<class>: <detail>`.
#[derive(Debug, Clone)]
pub struct SeedError {
    /// The class (the dead-letter grouping key).
    pub class: String,
    /// The detail of the record numbered by the argument (the number in its message id).
    pub detail: fn(i64) -> String,
}

/// A seeded message, as [`SeedDomain::payload`] sees it.
#[derive(Debug, Clone, Copy)]
pub struct SeedMessage<'a> {
    /// The record's number (unique; also in its message id).
    pub number: i64,
    /// Its message id.
    pub message_id: &'a str,
    /// Its message type.
    pub message_type: &'a str,
    /// Its consumer group.
    pub group: &'a str,
}

impl SeedDomain {
    /// Groups and message types of these names, in even shares, with transactional handlers;
    /// queues named after their group, exchange `seed.events`; errors `TIMEOUT` and
    /// `UNAVAILABLE`; payloads `{"messageId": …, "n": <number>}`.
    pub fn new(groups: &[&str], message_types: &[&str]) -> Self {
        Self {
            groups: groups
                .iter()
                .map(|name| SeedGroup { name: (*name).to_owned(), share: 1.0, queue: (*name).to_owned() })
                .collect(),
            message_types: message_types
                .iter()
                .map(|name| SeedType { name: (*name).to_owned(), share: 1.0, mode: HandlerMode::Transactional })
                .collect(),
            errors: vec![
                SeedError {
                    class: "TIMEOUT".to_owned(),
                    detail: |n| format!("no answer within {} ms", 1000 * (1 + n % 5)),
                },
                SeedError {
                    class: "UNAVAILABLE".to_owned(),
                    detail: |n| format!("downstream answered 503 to request {n}"),
                },
            ],
            exchange: "seed.events".to_owned(),
            payload: |m| serde_json::json!({ "messageId": m.message_id, "n": m.number }),
        }
    }

    /// What is wrong with the domain, if anything (an empty list, a share not positive).
    pub(super) fn check(&self) -> Result<(), String> {
        if self.groups.is_empty() || self.message_types.is_empty() || self.errors.is_empty() {
            return Err("the seed domain needs at least one group, message type and error".to_owned());
        }
        let shares = self.groups.iter().map(|g| g.share).chain(self.message_types.iter().map(|t| t.share));
        if shares.into_iter().any(|s| !(s.is_finite() && s > 0.0)) {
            return Err("the seed domain's shares must be positive".to_owned());
        }
        Ok(())
    }
}

/// Picks an index by its share: `r` in `[0, 1)` falls into the cumulative shares.
#[derive(Debug)]
pub(super) struct Shares(Vec<f64>);

impl Shares {
    pub(super) fn new(shares: impl Iterator<Item = f64>) -> Self {
        let shares: Vec<f64> = shares.collect();
        let total: f64 = shares.iter().sum();
        let mut sum = 0.0;
        Self(
            shares
                .iter()
                .map(|s| {
                    sum += s / total;
                    sum
                })
                .collect(),
        )
    }

    /// The index `r` falls on.
    pub(super) fn pick(&self, r: f64) -> usize {
        self.0.iter().position(|bound| r < *bound).unwrap_or(self.0.len() - 1)
    }
}
