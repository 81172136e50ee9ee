//! The embedded consumer as operators run it: `dedup-console serve` processes against real
//! PostgreSQL, Redis and RabbitMQ — two processes on one queue, processes killed with SIGKILL
//! mid-handler, Redis stopped mid-run — and Kafka: a consumer group with a member killed and
//! restarted.

mod crashes;
mod exactly_once;
mod kafka;
mod support;
