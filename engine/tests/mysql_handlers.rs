//! Transactional handlers of MySQL (issue 25, "Handlers for both databases"): written against
//! `&mut MySqlConnection`, kept by the engine like any other handler, run on a MySQL
//! transaction, and refused at start by an engine that runs on PostgreSQL. One type may be a
//! handler of both databases.

use std::sync::Arc;

use dedup_engine::prelude::*;
use dedup_engine::rabbitmq::RabbitSettings;
use dedup_engine::store::conformance::delivery;
use dedup_engine::testing::mysql::TestMySqlDatabase;
use dedup_engine::testing::{admin_url, amqp_url};
use dedup_engine::{AnyTransactionalHandler, EngineError, Handler};
use dedup_engine::{ConsumerGroup, MessageId};
use sqlx::{Connection, MySql, MySqlConnection, PgConnection};

/// Writes the message id into `effects`, on MySQL and on PostgreSQL alike.
struct RecordEffect;

#[async_trait]
impl TransactionalHandler<MySql> for RecordEffect {
    async fn handle(&self, input: &HandlerInput<'_>, tx: &mut MySqlConnection) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO effects (message_id) VALUES (?)").bind(input.message_id.as_str()).execute(tx).await?;
        Ok(())
    }

    fn max_batch(&self) -> usize {
        7
    }
}

#[async_trait]
impl TransactionalHandler for RecordEffect {
    async fn handle(&self, input: &HandlerInput<'_>, tx: &mut PgConnection) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO effects (message_id) VALUES ($1)").bind(input.message_id.as_str()).execute(tx).await?;
        Ok(())
    }
}

fn on_mysql() -> Arc<dyn AnyTransactionalHandler> {
    match Handler::transactional_on::<MySql, _>(RecordEffect) {
        Handler::Transactional(handler) => handler,
        Handler::Leased { .. } => unreachable!("a transactional handler"),
    }
}

#[tokio::test]
async fn a_mysql_handler_writes_in_the_mysql_transaction_and_refuses_another_databases() {
    let db = TestMySqlDatabase::create().await;
    sqlx::query("CREATE TABLE effects (message_id VARCHAR(64) NOT NULL)").execute(&db.pool).await.unwrap();
    let handler = on_mysql();
    assert_eq!((handler.database(), handler.max_batch_any()), ("MySQL", 7));

    let group = ConsumerGroup::parse("orders").unwrap();
    let (first, second) = (MessageId::parse("A-1").unwrap(), MessageId::parse("A-2").unwrap());
    let message = delivery("A-1", r#"{"orderNo":"A-1"}"#);
    let input = |message_id| HandlerInput {
        group: &group,
        message_id,
        message_type: "ORDER.PAY",
        json: None,
        payload: &message.payload,
        headers: &message.headers,
        attempt: 1,
        calls: 1,
        previous_status: None,
        message: &message,
    };
    let mut tx = db.pool.begin().await.unwrap();
    handler.handle_any(&input(&first), &mut *tx).await.unwrap();
    handler.handle_batch_any(&[input(&second)], &mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    let written: Vec<String> =
        sqlx::query_scalar("SELECT message_id FROM effects ORDER BY message_id").fetch_all(&db.pool).await.unwrap();
    assert_eq!(written, ["A-1", "A-2"]);

    // Given a PostgreSQL connection, it fails by name and writes nothing.
    let mut pg = PgConnection::connect(&admin_url()).await.unwrap();
    let error = handler.handle_any(&input(&first), &mut pg).await.unwrap_err();
    assert_eq!(error.class(), "HANDLER_DATABASE");
    assert!(error.is_permanent());
}

#[tokio::test]
async fn an_engine_on_postgresql_refuses_a_mysql_handler_at_start_and_takes_the_same_type_as_its_own() {
    let pool = sqlx::PgPool::connect_lazy(&admin_url()).unwrap();
    let group =
        Group::rabbitmq("orders", amqp_url(), RabbitSettings::for_queue("orders.events", "orders", ["order.#"]))
            .transactional_on::<MySql, _>("ORDER.PAY", RecordEffect);
    let refused = Engine::builder(pool).group(group).start().await.err();
    match refused {
        Some(EngineError::HandlerDatabase { name, message_type, handler_database, engine_database }) => {
            assert_eq!((name.as_str(), message_type.as_str()), ("orders", "ORDER.PAY"));
            assert_eq!((handler_database, engine_database), ("MySQL", "PostgreSQL"));
        }
        other => panic!("expected HandlerDatabase, got {other:?}"),
    }

    // Registered as a PostgreSQL handler (the trait's default database), the same type is one;
    // so is a shared one from a table of handlers.
    let mut registry = dedup_engine::HandlerRegistry::new();
    registry.register("ORDER.PAY", Handler::Transactional(Arc::new(RecordEffect)));
    let shared: Arc<dyn TransactionalHandler> = Arc::new(PostgresOnly);
    registry.register("ORDER.SHIP", Handler::Transactional(Arc::new(shared)));
    for message_type in ["ORDER.PAY", "ORDER.SHIP"] {
        let Some(Handler::Transactional(handler)) = registry.get(message_type) else { panic!("registered") };
        assert_eq!(handler.database(), "PostgreSQL");
    }
    assert_eq!(
        registry.get("ORDER.SHIP").map(|h| matches!(h, Handler::Transactional(h) if h.max_batch_any() == 3)),
        Some(true)
    );
    // With the engine's traits in scope, a handler's own methods are called as before.
    assert_eq!(PostgresOnly.max_batch(), 3);
}

/// A PostgreSQL handler only.
struct PostgresOnly;

#[async_trait]
impl TransactionalHandler for PostgresOnly {
    async fn handle(&self, _input: &HandlerInput<'_>, _tx: &mut PgConnection) -> Result<(), HandlerError> {
        Ok(())
    }

    fn max_batch(&self) -> usize {
        3
    }
}
