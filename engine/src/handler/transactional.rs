//! Transactional handlers: [`TransactionalHandler`], typed by the database whose transaction
//! they write in, and [`AnyTransactionalHandler`], the same handler as the engine keeps it
//! whatever its database (docs/research/store-seam.md, "The typed transaction for handlers").

use std::any::Any;
use std::marker::PhantomData;

use async_trait::async_trait;
use sqlx::{Database, Postgres};

use super::{HandlerError, HandlerInput};

/// A handler whose effects live in the dedup store's database: it runs inside the transaction
/// that claimed the record, and the record is marked `succeeded` in the same transaction.
///
/// It may run more than once for one attempt: after a deadlock or serialization failure, and
/// when its batch's transaction is rolled back because another message of it failed (the batch
/// then runs again with a savepoint per message). Only the run that commits counts, so its
/// effects must live in `tx` alone.
///
/// `DB` is the database the engine runs on, PostgreSQL unless said otherwise: `impl
/// TransactionalHandler for X` gets a `&mut PgConnection`. A handler for another database
/// names it (`impl TransactionalHandler<sqlx::MySql> for X`, `tx: &mut MySqlConnection`) and is
/// registered with [`crate::Group::transactional_on`]; one type may implement both. The engine
/// refuses to start with a handler of another database than its own
/// ([`crate::EngineError::HandlerDatabase`]). So far the engine runs on PostgreSQL only: a
/// MySQL handler is refused until the MySQL store lands (issue 25).
#[async_trait]
pub trait TransactionalHandler<DB: Database = Postgres>: Send + Sync + 'static {
    /// Applies the message's business changes on `tx`. Returning an error rolls them back.
    async fn handle(&self, input: &HandlerInput<'_>, tx: &mut DB::Connection) -> Result<(), HandlerError>;

    /// Most messages [`TransactionalHandler::handle_batch`] takes in one call; 1 (the default):
    /// the pipeline calls [`TransactionalHandler::handle`] once per message. A handler that can
    /// write many messages' business rows in one statement (`INSERT … SELECT * FROM unnest($1,
    /// $2)`) says how many it takes, and saves a round trip per message. 0 counts as 1. A run
    /// is also bounded by the delivery batch (the group's batch size) and 500 per transaction.
    fn max_batch(&self) -> usize {
        1
    }

    /// Applies the business changes of several claimed messages of this handler's type on `tx`,
    /// as [`TransactionalHandler::handle`] would one after the other, in `inputs`' order (the
    /// batch's lock order: [`TransactionalHandler::lock_key`], then the message id). A call takes
    /// a run of consecutive messages of this handler in that order. Called only when
    /// [`TransactionalHandler::max_batch`] is above 1, with at most that many inputs, and only in
    /// a batch's optimistic transaction (DESIGN.md, "Batch handlers"): an error rolls the whole
    /// transaction back, and its messages run again one by one through `handle`, each in a
    /// savepoint, so a failure is pinned on its own message and the others commit. Its effects
    /// must therefore live in `tx` alone, as `handle`'s do. The default calls `handle` for each
    /// input in turn.
    async fn handle_batch(&self, inputs: &[HandlerInput<'_>], tx: &mut DB::Connection) -> Result<(), HandlerError> {
        for input in inputs {
            self.handle(input, tx).await?;
        }
        Ok(())
    }

    /// The shared business row this message will lock, if any (e.g. the SKU whose stock it
    /// reserves, the card whose balance it debits). A batch runs its messages ordered by this
    /// key, so concurrent batches lock hot rows in one order and wait for each other instead of
    /// deadlocking. Without it, workers whose batches touch the same rows deadlock, and each
    /// deadlock that persists through the in-transaction retries costs the message an attempt
    /// ([`HandlerError::is_transient`]).
    ///
    /// ```
    /// # use dedup_engine::prelude::*;
    /// # use dedup_engine::sqlx::PgConnection;
    /// struct RedeemGiftCard; // debits `cards.balance`: many messages per card
    ///
    /// #[async_trait]
    /// impl TransactionalHandler for RedeemGiftCard {
    ///     async fn handle(&self, input: &HandlerInput<'_>, tx: &mut PgConnection) -> Result<(), HandlerError> {
    ///         # let _ = (input, tx);
    ///         // UPDATE cards SET balance = balance - $2 WHERE card_no = $1 …
    ///         Ok(())
    ///     }
    ///
    ///     fn lock_key(&self, input: &HandlerInput<'_>) -> Option<String> {
    ///         input.str_field("cardNo").ok().map(|card| format!("card:{card}"))
    ///     }
    /// }
    /// ```
    fn lock_key(&self, _input: &HandlerInput<'_>) -> Option<String> {
        None
    }
}

/// A shared handler is a handler: `Arc<dyn TransactionalHandler>` (a table of handlers) goes
/// into [`crate::Handler::Transactional`] as `Arc::new(shared)`.
#[async_trait]
impl<DB: Database, T: TransactionalHandler<DB> + ?Sized> TransactionalHandler<DB> for std::sync::Arc<T> {
    async fn handle(&self, input: &HandlerInput<'_>, tx: &mut DB::Connection) -> Result<(), HandlerError> {
        (**self).handle(input, tx).await
    }

    fn max_batch(&self) -> usize {
        (**self).max_batch()
    }

    async fn handle_batch(&self, inputs: &[HandlerInput<'_>], tx: &mut DB::Connection) -> Result<(), HandlerError> {
        (**self).handle_batch(inputs, tx).await
    }

    fn lock_key(&self, input: &HandlerInput<'_>) -> Option<String> {
        (**self).lock_key(input)
    }
}

/// A [`TransactionalHandler`] of any database, as a group keeps it ([`crate::Handler::Transactional`]):
/// every `TransactionalHandler` (of PostgreSQL) is one, so `Handler::Transactional(Arc::new(h))`
/// takes it as is, and [`crate::Group::transactional_on`] makes one of a handler of another
/// database. Sealed: only the engine implements it.
#[async_trait]
pub trait AnyTransactionalHandler: sealed::Sealed + Send + Sync + 'static {
    /// The name of the database whose transaction the handler writes in (sqlx's
    /// `Database::NAME`: `"PostgreSQL"`, `"MySQL"`).
    fn database(&self) -> &'static str;

    /// [`TransactionalHandler::max_batch`] (named apart, so that a handler with both traits in
    /// scope still calls its own `max_batch` unambiguously).
    fn max_batch_any(&self) -> usize;

    /// [`TransactionalHandler::lock_key`] (named apart, as `max_batch_any`).
    fn lock_key_any(&self, input: &HandlerInput<'_>) -> Option<String>;

    /// [`TransactionalHandler::handle`] on `tx`, the connection of the handler's database (a
    /// `PgConnection`, a `MySqlConnection`). Another database's connection is a permanent
    /// `HANDLER_DATABASE` error, which the engine's start-up check rules out.
    async fn handle_any(&self, input: &HandlerInput<'_>, tx: &mut (dyn Any + Send)) -> Result<(), HandlerError>;

    /// [`TransactionalHandler::handle_batch`] on `tx`, as [`AnyTransactionalHandler::handle_any`].
    async fn handle_batch_any(
        &self,
        inputs: &[HandlerInput<'_>],
        tx: &mut (dyn Any + Send),
    ) -> Result<(), HandlerError>;
}

mod sealed {
    pub trait Sealed {}
    impl<H: super::TransactionalHandler> Sealed for H {}
    impl<DB: super::Database, H: super::TransactionalHandler<DB>> Sealed for super::OnDatabase<DB, H> {}
}

/// `tx` as `DB`'s connection, or the error a handler of another database gets.
fn connection<DB: Database>(tx: &mut (dyn Any + Send)) -> Result<&mut DB::Connection, HandlerError> {
    tx.downcast_mut::<DB::Connection>().ok_or_else(|| {
        HandlerError::permanent("HANDLER_DATABASE", format!("a handler written for {} got another database's transaction", DB::NAME))
    })
}

#[async_trait]
impl<H: TransactionalHandler> AnyTransactionalHandler for H {
    fn database(&self) -> &'static str {
        Postgres::NAME
    }

    fn max_batch_any(&self) -> usize {
        self.max_batch()
    }

    fn lock_key_any(&self, input: &HandlerInput<'_>) -> Option<String> {
        self.lock_key(input)
    }

    async fn handle_any(&self, input: &HandlerInput<'_>, tx: &mut (dyn Any + Send)) -> Result<(), HandlerError> {
        self.handle(input, connection::<Postgres>(tx)?).await
    }

    async fn handle_batch_any(
        &self,
        inputs: &[HandlerInput<'_>],
        tx: &mut (dyn Any + Send),
    ) -> Result<(), HandlerError> {
        self.handle_batch(inputs, connection::<Postgres>(tx)?).await
    }
}

/// A handler of database `DB`, as [`crate::Group::transactional_on`] registers it.
pub(crate) struct OnDatabase<DB, H>(H, PhantomData<fn() -> DB>);

impl<DB: Database, H: TransactionalHandler<DB>> OnDatabase<DB, H> {
    pub(crate) fn new(handler: H) -> Self {
        Self(handler, PhantomData)
    }
}

#[async_trait]
impl<DB: Database, H: TransactionalHandler<DB>> AnyTransactionalHandler for OnDatabase<DB, H> {
    fn database(&self) -> &'static str {
        DB::NAME
    }

    fn max_batch_any(&self) -> usize {
        self.0.max_batch()
    }

    fn lock_key_any(&self, input: &HandlerInput<'_>) -> Option<String> {
        self.0.lock_key(input)
    }

    async fn handle_any(&self, input: &HandlerInput<'_>, tx: &mut (dyn Any + Send)) -> Result<(), HandlerError> {
        self.0.handle(input, connection::<DB>(tx)?).await
    }

    async fn handle_batch_any(
        &self,
        inputs: &[HandlerInput<'_>],
        tx: &mut (dyn Any + Send),
    ) -> Result<(), HandlerError> {
        self.0.handle_batch(inputs, connection::<DB>(tx)?).await
    }
}
