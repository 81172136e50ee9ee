//! Text formats shared by the pages and the server's service layer: times, counts, sizes,
//! ratios, durations. Plain functions (no component), so both sides may use them.

/// An RFC 3339 UTC time as `YYYY-MM-DD HH:MM:SS` (the zone is UTC throughout the console).
pub fn short_time(rfc3339: &str) -> String {
    rfc3339.trim_end_matches('Z').replacen('T', " ", 1)
}

/// An optional time, `—` when absent.
pub fn opt_time(t: Option<&str>) -> String {
    t.map(short_time).unwrap_or_else(|| "—".to_owned())
}

/// A count with thin-space thousands separators: `12 345 678`.
pub fn count(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push('\u{2009}');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

/// A byte size in the largest unit that keeps the number at least 1 (B, KiB, MiB, GiB).
pub fn bytes(n: i64) -> String {
    let mut value = n as f64;
    for unit in ["B", "KiB", "MiB", "GiB"] {
        if value.abs() < 1024.0 || unit == "GiB" {
            return if unit == "B" { format!("{n} B") } else { format!("{value:.1} {unit}") };
        }
        value /= 1024.0;
    }
    unreachable!("the loop returns at GiB")
}

/// A ratio 0–1 as a percentage with one decimal.
pub fn percent(ratio: f64) -> String {
    format!("{:.1} %", ratio * 100.0)
}

/// Seconds as `2d 3h`, `4h 5m`, `6m 7s` or `8s`, the second unit left out when zero (`20m`).
pub fn duration(secs: i64) -> String {
    let s = secs.max(0);
    let (big, small) = match (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60) {
        (d, h, _, _) if d > 0 => ((d, "d"), (h, "h")),
        (_, h, m, _) if h > 0 => ((h, "h"), (m, "m")),
        (_, _, m, sec) if m > 0 => ((m, "m"), (sec, "s")),
        (_, _, _, sec) => return format!("{sec}s"),
    };
    if small.0 == 0 { format!("{}{}", big.0, big.1) } else { format!("{}{} {}{}", big.0, big.1, small.0, small.1) }
}

/// Milliseconds as a duration (`850 ms` below a second).
pub fn millis(ms: i64) -> String {
    if ms < 1000 { format!("{ms} ms") } else { duration(ms / 1000) }
}

/// What a handler's pause state means (`handler_pauses.state`), for tables and cards.
pub fn pause_state_label(state: &str) -> &'static str {
    match state {
        "running" => "running",
        "breaker" => "paused: circuit breaker",
        "gone" => "paused: 410 Gone",
        "operator" => "paused by an operator",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_read_well() {
        assert_eq!(short_time("2026-11-30T11:30:10Z"), "2026-11-30 11:30:10");
        assert_eq!(count(12_345_678), "12\u{2009}345\u{2009}678");
        assert_eq!(count(-5), "-5");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 * 1024 * 1024), "3.0 MiB");
        assert_eq!(duration(90_061), "1d 1h");
        assert_eq!(duration(65), "1m 5s");
        assert_eq!(duration(1200), "20m");
        assert_eq!(millis(850), "850 ms");
        assert_eq!(percent(0.1234), "12.3 %");
    }
}
