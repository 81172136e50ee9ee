//! One worker's [`Source`] on the group member's queue.
//!
//! Settling a batch is per record: a retry copy goes to the retry topic of its delay, a
//! dead-letter copy to `<topic>.DLT` (both keyed like the original and awaited), and then the
//! record is finished — which lets its partition's committable offset move past it once every
//! record before it is finished too. This holds while the partition is being revoked (the
//! revocation waits for the records workers hold, then commits): only a record settled after
//! the revocation is over sends no copy, since the commit stopped before it. A record to judge
//! again goes back to the queue, unfinished, so no commit passes it meanwhile.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::join_all;
use tracing::field::Empty;

use super::KafkaSettings;
use super::delivery::{Delivered, RETRY_DUE_HEADER, RecordMeta, copy_headers};
use super::member::Shared;
use super::publish::KafkaPublisher;
use crate::message::InboundMessage;
use crate::pipeline::Disposition;
use crate::retry::Backoff;
use crate::source::{DEAD_LETTER_REASON_HEADER, PublishFailed, Source, SourceError, publish_dead_letter};

/// One worker's view of the group member.
pub(super) struct KafkaSource {
    shared: Arc<Shared>,
    publisher: KafkaPublisher,
    settings: KafkaSettings,
    group_id: String,
    backoff: Backoff,
    batch: Vec<InboundMessage>,
    held: Vec<RecordMeta>,
    stopped: bool,
}

impl KafkaSource {
    pub fn new(
        shared: Arc<Shared>,
        publisher: KafkaPublisher,
        settings: KafkaSettings,
        group_id: String,
        backoff: Backoff,
    ) -> Self {
        Self { shared, publisher, settings, group_id, backoff, batch: Vec::new(), held: Vec::new(), stopped: false }
    }

    /// Adds a record to the batch unless it went stale in the queue.
    fn take(&mut self, delivered: Delivered) {
        let m = &delivered.meta;
        if self.shared.offsets().take(&m.tp, m.offset, m.epoch) {
            self.batch.push(delivered.message);
            self.held.push(delivered.meta);
        }
    }

    /// The topic the original of this record was published to.
    fn origin_topic<'a>(message: &'a InboundMessage, meta: &'a RecordMeta) -> &'a str {
        message.source.exchange.as_deref().unwrap_or(&meta.tp.topic)
    }

    async fn publish_retry(&self, index: usize, delay: Duration) -> Result<(), PublishFailed> {
        let (message, meta) = (&self.batch[index], &self.held[index]);
        let topic =
            self.settings.retry_topic(Self::origin_topic(message, meta), &self.group_id, self.backoff.level_for(delay));
        let due = chrono::Utc::now().timestamp_millis() + i64::try_from(delay.as_millis()).unwrap_or(i64::MAX / 2);
        let headers = copy_headers(meta, &message.source, &[(RETRY_DUE_HEADER, due.to_string())]);
        self.publisher.send(&topic, meta.key.as_deref(), &message.payload, headers).await.map(|_| ())
    }

    async fn publish_dead_letter(&self, index: usize, reason: &str) {
        let (message, meta) = (&self.batch[index], &self.held[index]);
        let origin = Self::origin_topic(message, meta);
        let topic = KafkaSettings::dead_letter_topic(origin);
        let reason: String = reason.chars().take(1000).collect();
        let what = format!(
            "Kafka record {origin}/{}@{}",
            message.source.queue.as_deref().unwrap_or_default(),
            message.source.offset.unwrap_or_default()
        );
        publish_dead_letter(self.settings.dead_letter_publish_attempts, &what, || {
            let headers = copy_headers(meta, &message.source, &[(DEAD_LETTER_REASON_HEADER, reason.clone())]);
            self.publisher.send(&topic, meta.key.as_deref(), &message.payload, headers)
        })
        .await;
    }

    /// Publishes what `disposition` needs; true when the record must be judged again.
    async fn carry_out(&self, index: usize, disposition: &Disposition) -> bool {
        match disposition {
            Disposition::Ack(_) => false,
            Disposition::Redeliver => true,
            // A held delivery goes the retry path too: its offset may then be committed, so
            // nothing of it stays in memory, and the partition's other records keep flowing.
            Disposition::Retry { delay } | Disposition::Held { delay } => {
                let meta = &self.held[index];
                if !self.shared.offsets().is_current(&meta.tp, meta.epoch) {
                    // Revoked meanwhile, unfinished: the revocation committed no further than
                    // this record, so the next owner fetches the original again.
                    return false;
                }
                // Also while its partition is being revoked: finishing the record lets the
                // revocation's commit pass it, so the copy must be acknowledged first.
                match self.publish_retry(index, *delay).await {
                    Ok(()) => false,
                    Err(e) => {
                        // Without an acknowledged copy the original stays unfinished.
                        tracing::warn!(error = %e, "retry copy not published; judging the record again");
                        true
                    }
                }
            }
            Disposition::DeadLetter { reason } => {
                self.publish_dead_letter(index, reason).await;
                false
            }
        }
    }
}

#[async_trait]
impl Source for KafkaSource {
    /// Cancel-safe: records taken by a call that was cancelled (a timeout around it) stay in
    /// the batch and are returned by the next call, so none is left unsettled.
    async fn next_batch(&mut self, max: usize, linger: Duration) -> Result<Option<&[InboundMessage]>, SourceError> {
        if self.stopped {
            return Ok(None);
        }
        let gone = || SourceError::Disconnected("the Kafka consumer stopped".to_owned());
        let shared = self.shared.clone();
        let mut queue = tokio::select! {
            queue = shared.queue_rx.lock() => queue,
            () = shared.stopped.cancelled() => return Err(gone()),
        };
        while self.batch.is_empty() {
            let next = tokio::select! {
                next = queue.recv() => next,
                () = shared.stopped.cancelled() => None,
            };
            self.take(next.ok_or_else(gone)?);
        }
        let deadline = tokio::time::Instant::now() + linger;
        while self.batch.len() < max.max(1) {
            match tokio::time::timeout_at(deadline, queue.recv()).await {
                Ok(Some(delivered)) => self.take(delivered),
                Ok(None) | Err(_) => break,
            }
        }
        Ok(Some(&self.batch))
    }

    /// In a `DEBUG` span `settle`: `count` records, the `retry_copies` and
    /// `dead_letter_copies` to publish, then how many were `finished` (their offsets may be
    /// committed) and `requeued` (to be judged again). The commit itself is the member's
    /// (`commit_offsets`).
    #[tracing::instrument(
        level = "debug",
        name = "settle",
        skip_all,
        fields(
            broker = "kafka",
            count = dispositions.len(),
            retry_copies = dispositions.iter().filter(|d| matches!(d, Disposition::Retry { .. } | Disposition::Held { .. })).count(),
            dead_letter_copies = dispositions.iter().filter(|d| matches!(d, Disposition::DeadLetter { .. })).count(),
            finished = Empty,
            requeued = Empty,
        )
    )]
    async fn settle(&mut self, dispositions: &[Disposition]) -> Result<(), SourceError> {
        debug_assert_eq!(dispositions.len(), self.batch.len());
        let again = join_all(dispositions.iter().enumerate().map(|(i, d)| self.carry_out(i, d))).await;
        let span = tracing::Span::current();
        span.record("finished", again.iter().filter(|a| !**a).count());
        let mut requeued = Vec::new();
        let mut offsets = self.shared.offsets();
        for ((message, meta), again) in self.batch.iter().zip(&self.held).zip(again) {
            if !again {
                offsets.finish(&meta.tp, meta.offset, meta.epoch);
            } else if offsets.requeue(&meta.tp, meta.offset, meta.epoch) {
                let message = InboundMessage { redelivered: true, ..message.clone() };
                requeued.push(Delivered { message, meta: meta.clone() });
            }
        }
        drop(offsets);
        span.record("requeued", requeued.len());
        self.batch.clear();
        self.held.clear();
        for delivered in requeued {
            let _ = self.shared.queue_tx.send(delivered);
        }
        Ok(())
    }

    /// Stops this worker only: records it took and did not settle (a batch abandoned at
    /// shutdown) go back to the queue for the others; the member itself stops with the
    /// connector.
    async fn stop(&mut self) {
        self.stopped = true;
        let mut offsets = self.shared.offsets();
        let mut returned = Vec::new();
        for (message, meta) in self.batch.drain(..).zip(self.held.drain(..)) {
            if offsets.requeue(&meta.tp, meta.offset, meta.epoch) {
                returned.push(Delivered { message, meta });
            }
        }
        drop(offsets);
        for delivered in returned {
            let _ = self.shared.queue_tx.send(delivered);
        }
    }
}
