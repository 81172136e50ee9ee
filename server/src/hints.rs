//! How to start each local service on the Debian machines `dedup-console` is set up on
//! (`scripts/setup`, `/work/shared/SERVICES.md`): added to start-up errors and to `/readyz`. The
//! engine names a service that is down; what to run about it is this binary's to say.

use dedup_engine::{Service, Unreachable};

/// How to check and start `service` here.
pub fn start_hint(service: Service) -> Option<&'static str> {
    Some(match service {
        Service::PostgreSql => {
            "check with `pg_isready -h 127.0.0.1`; start with \
             `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start`"
        }
        Service::MySql => {
            "check with `mariadb-admin -h 127.0.0.1 -u root ping`; start with `scripts/services` (MariaDB)"
        }
        Service::Redis => {
            "check with `redis-cli -h 127.0.0.1 ping`; start with \
             `redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save \"\" --appendonly no`"
        }
        Service::RabbitMq => "check with `rabbitmq-diagnostics -q ping`; start with `rabbitmq-server -detached`",
        Service::Kafka => {
            "check with `scripts/kafka-broker status`; start the local test broker with `scripts/kafka-broker`"
        }
    })
}

/// `error` with how to start its service.
pub fn with_hint(error: Unreachable) -> anyhow::Error {
    match start_hint(error.service) {
        Some(hint) => anyhow::anyhow!("{error}. {hint}"),
        None => error.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreachable_service_is_told_how_to_start() {
        let err = Unreachable::new(Service::PostgreSql, "postgres://a:pw@127.0.0.1:1/x", anyhow::anyhow!("refused"));
        let text = with_hint(err).to_string();
        assert!(text.starts_with("PostgreSQL is unreachable at postgres://a:***@127.0.0.1:1/x: refused. "), "{text}");
        assert!(text.contains("pg_ctlcluster"), "{text}");
    }
}
