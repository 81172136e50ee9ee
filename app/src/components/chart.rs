//! A small time chart in plain SVG (no chart library): bars or a line over evenly spaced
//! buckets, with the largest value and the first and last bucket labelled, and a tooltip per
//! bucket.

use leptos::prelude::*;

/// How the values are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChartKind {
    /// One bar per bucket (counts per interval).
    Bars,
    /// A line through the buckets that have a value (levels over time).
    Line,
}

const WIDTH: f64 = 600.0;
const HEIGHT: f64 = 150.0;
const TOP: f64 = 8.0;

/// One bucket: its label (time) and value, `None` when unknown.
pub type ChartPoint = (String, Option<f64>);

/// A chart of `points`; `format` renders a value for labels and tooltips.
#[component]
pub fn TimeChart(
    /// Accessible name of the chart.
    #[prop(into)]
    title: String,
    points: Vec<ChartPoint>,
    kind: ChartKind,
    format: fn(f64) -> String,
) -> impl IntoView {
    let max = points.iter().filter_map(|p| p.1).fold(0.0_f64, f64::max);
    let scale = if max > 0.0 { (HEIGHT - TOP) / max } else { 0.0 };
    let step = WIDTH / points.len().max(1) as f64;
    let y = move |v: f64| HEIGHT - v * scale;
    let marks = match kind {
        ChartKind::Bars => points
            .iter()
            .enumerate()
            .map(|(i, (label, v))| {
                let v = v.unwrap_or(0.0);
                let tip = format!("{label}: {}", format(v));
                view! {
                    <rect
                        class="bar"
                        x=format!("{:.1}", i as f64 * step + step * 0.1)
                        y=format!("{:.1}", y(v))
                        width=format!("{:.1}", step * 0.8)
                        height=format!("{:.1}", HEIGHT - y(v))
                    >
                        <title>{tip}</title>
                    </rect>
                }
            })
            .collect_view()
            .into_any(),
        ChartKind::Line => {
            let path: Vec<String> = points
                .iter()
                .enumerate()
                .filter_map(|(i, (_, v))| v.map(|v| format!("{:.1},{:.1}", i as f64 * step + step / 2.0, y(v))))
                .collect();
            view! { <polyline class="line" points=path.join(" ") /> }.into_any()
        }
    };
    let first = points.first().map(|p| p.0.clone()).unwrap_or_default();
    let last = points.last().map(|p| p.0.clone()).unwrap_or_default();
    let empty = max <= 0.0;
    view! {
        <figure class="chart">
            <svg viewBox=format!("0 0 {WIDTH} {HEIGHT}") role="img" aria-label=title.clone()>
                <line class="axis" x1="0" y1=HEIGHT x2=WIDTH y2=HEIGHT />
                {marks}
            </svg>
            <figcaption class="chart-legend muted small">
                <span>{first}</span>
                <span>
                    {if empty { "no data yet".to_owned() } else { format!("max {}", format(max)) }}
                </span>
                <span>{last}</span>
            </figcaption>
        </figure>
    }
}
