//! Message sources: where deliveries come from and how their dispositions are carried out.
//!
//! The engine core never acknowledges anything itself: the pipeline returns a
//! [`Disposition`](crate::pipeline::Disposition) per delivery, and the source applies it in its
//! broker's terms — RabbitMQ acks, delayed retry queues and a dead-letter queue; Kafka (next)
//! offset commits that never pass an unfinished record, a retry topic and a dead-letter topic.
//! One [`Source`] belongs to one worker; a [`SourceFactory`] opens them and reopens them after a
//! connection loss.

pub mod amqp_values;
pub mod rabbitmq;

use std::time::Duration;

use async_trait::async_trait;

use crate::message::InboundMessage;
use crate::pipeline::Disposition;

/// Errors of a source.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The connection or channel is gone; open a new source (after a back-off).
    #[error("broker connection lost: {0}")]
    Disconnected(String),
    /// The broker refused an operation (bad topology, permissions).
    #[error("broker error: {0}")]
    Broker(String),
}

/// One worker's stream of deliveries.
#[async_trait]
pub trait Source: Send {
    /// Waits for the next batch: at least one delivery, at most `max`, gathering for at most
    /// `linger` after the first arrived. `Ok(None)` when the source was stopped (shutdown). The
    /// batch must be settled with [`Source::settle`] before the next call.
    async fn next_batch(&mut self, max: usize, linger: Duration) -> Result<Option<&[InboundMessage]>, SourceError>;

    /// Carries out one disposition per delivery of the last batch, in order: retry and
    /// dead-letter copies are published (and confirmed) before their originals are
    /// acknowledged.
    async fn settle(&mut self, dispositions: &[Disposition]) -> Result<(), SourceError>;

    /// Stops taking deliveries (cancels the subscription); deliveries not yet taken go back to
    /// the broker.
    async fn stop(&mut self);
}

/// Opens sources for workers.
#[async_trait]
pub trait SourceFactory: Send + Sync + 'static {
    /// Opens the source of worker number `worker` (0-based), connecting if needed.
    async fn open(&self, worker: usize) -> Result<Box<dyn Source>, SourceError>;

    /// Messages waiting in the source (queue depth or consumer lag), if known.
    async fn depth(&self) -> Option<u64>;

    /// Whether the broker connection is up.
    fn connected(&self) -> bool;

    /// Closes the connection (after the workers have stopped).
    async fn close(&self);
}
