//! The embedded consumer as operators run it: `dedup-console serve` processes against real
//! PostgreSQL, Redis and RabbitMQ — two processes on one queue, processes killed with SIGKILL
//! mid-handler, Redis stopped mid-run, PostgreSQL black-holed, restarted and its connections killed — and Kafka: a consumer group with a member killed and
//! restarted; a bulk requeue of 10 000 dead letters after a restart, then `verify`; two consumer
//! groups on two queues; a Spring-style producer typed by a header; an HTTP handler declared in the
//! configuration calling a service the test runs, and the Python example service behind it; the
//! exactly-once drill of HTTP handlers (5 000 messages, two processes, the service and one
//! process killed); cleanup schedules managed from the command line.

mod cleanup_cli;
mod conflicts_cli;
mod crashes;
mod database_outage;
mod database_restart;
mod demo;
mod exactly_once;
mod groups;
mod http;
mod http_drill;
mod http_service;
mod kafka;
mod mysql;
mod publish_cli;
mod requeue;
mod support;
mod user_token_cli;
