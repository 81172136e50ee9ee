//! The handlers' pause rows (`handler_pauses`) on PostgreSQL: [`PauseBook`] for
//! [`crate::pause`].

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::PgStore;
use crate::store::roles::{PauseBook, PauseBooks, PauseRow};
#[cfg(feature = "http")]
use crate::store::roles::EnginePause;

/// The statements, with the engine's schema, on the store's pool.
struct PgPauseBook {
    pool: PgPool,
    register: String,
    read: String,
    probe: String,
    #[cfg(feature = "http")]
    pause: String,
    #[cfg(feature = "http")]
    resume: String,
}

/// Registers the group's handlers (`$1` group, `$2` types, `$3` kinds) as `running` unless they
/// have a row.
const REGISTER_SQL: &str = "
INSERT INTO {s}.handler_pauses (consumer_group, message_type, kind)
SELECT $1, t, k FROM unnest($2::text[], $3::text[]) AS u(t, k)
ON CONFLICT (consumer_group, message_type) DO UPDATE SET kind = EXCLUDED.kind, seen_at = now()";

/// The group's paused handlers (served by the primary key; one row per handler).
const READ_SQL: &str = "
SELECT message_type, state, probe_at FROM {s}.handler_pauses WHERE consumer_group = $1 AND state <> 'running'";

/// Takes the probe of a breaker-paused handler when it is due (`$3` the probe interval in ms):
/// one process wins it.
const PROBE_SQL: &str = "
UPDATE {s}.handler_pauses SET probe_at = now() + $3 * interval '1 millisecond'
WHERE consumer_group = $1 AND message_type = $2 AND state = 'breaker' AND (probe_at IS NULL OR probe_at <= now())
RETURNING probe_at";

#[cfg(feature = "http")]
/// The engine pauses a handler (`$3` `breaker` or `gone`; `$4`..`$6` the failure; `$7` the
/// probe interval in ms): from `running` or `breaker`, or again in the same state (the last
/// failure is updated, `since` kept). An operator's pause, or a 410's, is not overridden by the
/// breaker. A failed probe keeps the probe time the probe set.
const PAUSE_SQL: &str = "
INSERT INTO {s}.handler_pauses AS p (consumer_group, message_type, state, changed_by, reason, error_class,
                                     http_status, failed_at, probe_at)
VALUES ($1, $2, $3, 'engine', $4, $5, $6, now(),
        CASE WHEN $3 = 'breaker' THEN now() + $7 * interval '1 millisecond' END)
ON CONFLICT (consumer_group, message_type) DO UPDATE SET
    state = EXCLUDED.state,
    since = CASE WHEN p.state = EXCLUDED.state THEN p.since ELSE now() END,
    changed_by = 'engine', reason = EXCLUDED.reason, error_class = EXCLUDED.error_class,
    http_status = EXCLUDED.http_status, failed_at = now(),
    probe_at = CASE WHEN p.state = 'breaker' AND EXCLUDED.state = 'breaker' THEN p.probe_at ELSE EXCLUDED.probe_at END,
    version = p.version + CASE WHEN p.state = EXCLUDED.state THEN 0 ELSE 1 END
WHERE p.state IN ('running', 'breaker') OR p.state = EXCLUDED.state
RETURNING state, probe_at";

#[cfg(feature = "http")]
/// A probe succeeded: `breaker` → `running` (an operator's pause is left alone).
const RESUME_SQL: &str = "
UPDATE {s}.handler_pauses SET state = 'running', since = now(), changed_by = 'engine',
       reason = 'a probe succeeded', probe_at = NULL, version = version + 1
WHERE consumer_group = $1 AND message_type = $2 AND state = 'breaker'";

impl PauseBooks for PgStore {
    fn pause_book(&self) -> std::sync::Arc<dyn PauseBook> {
        std::sync::Arc::new(PgPauseBook {
            pool: self.pool.clone(),
            register: self.render(REGISTER_SQL),
            read: self.render(READ_SQL),
            probe: self.render(PROBE_SQL),
            #[cfg(feature = "http")]
            pause: self.render(PAUSE_SQL),
            #[cfg(feature = "http")]
            resume: self.render(RESUME_SQL),
        })
    }
}

#[async_trait]
impl PauseBook for PgPauseBook {
    async fn register(&self, group: &str, handlers: &[(String, &'static str)]) -> Result<(), sqlx::Error> {
        let (types, kinds): (Vec<&str>, Vec<&str>) = handlers.iter().map(|(t, k)| (t.as_str(), *k)).unzip();
        sqlx::query(&self.register).bind(group).bind(types).bind(kinds).execute(&self.pool).await?;
        Ok(())
    }

    async fn paused(&self, group: &str) -> Result<Vec<PauseRow>, sqlx::Error> {
        sqlx::query_as(&self.read).bind(group).fetch_all(&self.pool).await
    }

    async fn take_probe(
        &self,
        group: &str,
        message_type: &str,
        interval_ms: i64,
    ) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
        sqlx::query_scalar(&self.probe).bind(group).bind(message_type).bind(interval_ms).fetch_optional(&self.pool).await
    }

    #[cfg(feature = "http")]
    async fn pause(&self, p: &EnginePause<'_>) -> Result<Option<(String, Option<DateTime<Utc>>)>, sqlx::Error> {
        sqlx::query_as(&self.pause)
            .bind(p.group)
            .bind(p.message_type)
            .bind(p.state)
            .bind(crate::db::storable::text(p.reason))
            .bind(crate::db::storable::text(p.error_class))
            .bind(p.http_status)
            .bind(p.probe_interval_ms)
            .fetch_optional(&self.pool)
            .await
    }

    #[cfg(feature = "http")]
    async fn resume_after_probe(&self, group: &str, message_type: &str) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(&self.resume).bind(group).bind(message_type).execute(&self.pool).await?.rows_affected();
        Ok(done == 1)
    }
}
