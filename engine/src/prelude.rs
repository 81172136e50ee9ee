//! The names most embeddings use: `use dedup_engine::prelude::*;` (see the crate's example).
//!
//! The engine and its groups, the two handler traits with what they take and return, the lease
//! policy, where ids and types are found, the engine's schema, the health probes, the broker
//! settings of the features compiled in, and the `#[async_trait]` attribute the handler traits
//! need.

pub use crate::async_trait;
#[cfg(feature = "kafka")]
pub use crate::kafka::KafkaSettings;
#[cfg(feature = "rabbitmq")]
pub use crate::rabbitmq::RabbitSettings;
pub use crate::{
    Engine, Group, HandlerError, HandlerInput, HealthProbes, IdPolicy, IdSource, LeaseExpiryPolicy, LeaseGuard,
    LeasedHandler, Schema, TransactionalHandler, TypePolicy, TypeSource,
};
