//! Back-off between attempts (DESIGN.md, "Retries and dead letters": exponential, default 1 s
//! doubling to 5 min), instead of hot-looping with `nack(requeue=true)`.

use std::time::Duration;

/// Exponential back-off settings.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Backoff {
    /// Delay after the first failed attempt, in milliseconds. Default 1000.
    pub initial_ms: u64,
    /// Largest delay, in milliseconds. Default 300000 (5 min).
    pub max_ms: u64,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { initial_ms: 1000, max_ms: 300_000 }
    }
}

impl Backoff {
    /// Delay before attempt `attempt + 1`, after attempt number `attempt` (1-based) failed:
    /// `initial × 2^(attempt−1)`, capped at `max`.
    pub(crate) fn delay_after(&self, attempt: i32) -> Duration {
        let exponent = u32::try_from(attempt.saturating_sub(1)).unwrap_or(0).min(40);
        let ms = self.initial_ms.max(1).saturating_mul(1u64 << exponent).min(self.max_ms.max(self.initial_ms).max(1));
        Duration::from_millis(ms)
    }

    /// Every distinct delay the back-off produces, ascending: the retry queues a broker needs
    /// (one queue per delay, since a queue's TTL is fixed).
    #[cfg(any(feature = "rabbitmq", feature = "kafka"))]
    pub(crate) fn levels(&self) -> Vec<Duration> {
        let mut levels = Vec::new();
        for attempt in 1.. {
            let d = self.delay_after(attempt);
            if levels.last() == Some(&d) {
                break;
            }
            levels.push(d);
        }
        levels
    }

    /// The smallest level not shorter than `delay` (the largest level when none is).
    #[cfg(any(feature = "rabbitmq", feature = "kafka"))]
    pub(crate) fn level_for(&self, delay: Duration) -> Duration {
        let levels = self.levels();
        levels.iter().copied().find(|l| *l >= delay).or(levels.last().copied()).unwrap_or(delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_one_second_to_five_minutes() {
        let b = Backoff::default();
        let secs: Vec<u64> = (1..=11).map(|a| b.delay_after(a).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(b.levels().len(), 10);
        assert_eq!(b.level_for(Duration::from_millis(1500)), Duration::from_secs(2));
        assert_eq!(b.level_for(Duration::from_secs(3600)), Duration::from_secs(300));
        assert_eq!(b.level_for(Duration::ZERO), Duration::from_secs(1));
    }

    #[test]
    fn degenerate_settings_stay_sane() {
        let b = Backoff { initial_ms: 0, max_ms: 0 };
        assert_eq!(b.delay_after(1), Duration::from_millis(1));
        assert_eq!(b.levels(), vec![Duration::from_millis(1)]);
        assert_eq!(Backoff::default().delay_after(i32::MAX), Duration::from_secs(300));
        assert_eq!(Backoff::default().delay_after(-3), Duration::from_secs(1));
    }
}
