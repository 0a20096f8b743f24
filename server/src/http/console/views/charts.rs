//! `GET /ui/charts`: issuances per hour or day by cluster and role, and
//! denials by reason, drawn here as SVG from the store's counts
//! ([`crate::audit::store::AuditStore::chart`]), past buckets kept.

use std::collections::{BTreeMap, BTreeSet};

use axum::extract::Query;
use axum::response::Response;
use maud::{Markup, html};
use serde::Deserialize;
use serde_json::json;

use super::common::Look;
use crate::audit::store::{AuditStore, ChartCounts, ChartWindow, StoreError};
use crate::http::console::page;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ChartQuery {
    pub since: String,
    /// `hour` or `day` (default).
    pub by: String,
}

/// Chart counts of whole past buckets, kept: the trail is append-only, so
/// an hour or a day that has ended keeps its counts (a record is committed
/// within seconds of its time; a bucket is kept only once it ended a
/// minute ago). The bucket in progress is counted at each view.
#[derive(Debug, Default)]
pub struct ChartCache {
    past: std::sync::Mutex<PastCounts>,
}

/// By (hourly, first bucket, cutoff), in Unix seconds: issued and denied.
type PastCounts = BTreeMap<(bool, i64, i64), (ChartCounts, ChartCounts)>;

/// Past windows kept at most; the cache starts over when full.
const CHART_CACHE: usize = 32;

impl ChartCache {
    /// The counts from the bucket holding `since` up to `now`.
    async fn counts(
        &self,
        store: &AuditStore,
        since: time::OffsetDateTime,
        now: time::OffsetDateTime,
        hourly: bool,
    ) -> Result<(ChartCounts, ChartCounts), StoreError> {
        let floor = |t: time::OffsetDateTime| {
            let t = t.to_offset(time::UtcOffset::UTC);
            let t = t.replace_time(
                time::Time::from_hms(if hourly { t.hour() } else { 0 }, 0, 0).unwrap_or(time::Time::MIDNIGHT),
            );
            t.unix_timestamp()
        };
        let from = floor(since);
        let cutoff = floor(now - time::Duration::minutes(1)).max(from);
        let at = |seconds: i64| time::OffsetDateTime::from_unix_timestamp(seconds).unwrap_or(since);
        let key = (hourly, from, cutoff);
        let cached = self.lock().get(&key).cloned();
        let (mut issued, mut denied) = match cached {
            Some(past) => past,
            None => {
                let past = store
                    .chart(&ChartWindow {
                        since: at(from),
                        until: at(cutoff),
                        hourly,
                    })
                    .await?;
                let mut kept = self.lock();
                if kept.len() >= CHART_CACHE {
                    kept.clear();
                }
                kept.insert(key, past.clone());
                past
            }
        };
        let far = now + time::Duration::days(1);
        let (live_issued, live_denied) = store
            .chart(&ChartWindow {
                since: at(cutoff),
                until: far,
                hourly,
            })
            .await?;
        issued.extend(live_issued);
        let mut reasons: BTreeMap<String, i64> = BTreeMap::new();
        for (_, reason, n) in denied.drain(..).chain(live_denied) {
            *reasons.entry(reason).or_default() += n;
        }
        let mut denied: ChartCounts = reasons.into_iter().map(|(r, n)| (String::new(), r, n)).collect();
        denied.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.1.cmp(&b.1)));
        Ok((issued, denied))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PastCounts> {
        self.past.lock().unwrap_or_else(|e| e.into_inner())
    }
}

const PALETTE: [&str; 8] = [
    "#0b5cad", "#1a7f37", "#bf8700", "#8250df", "#cf222e", "#1b7c83", "#6e7781", "#bc4c00",
];

/// The longest window the charts draw per hour, and per day: beyond them
/// a chart is unreadable and its counting costs the server for nothing.
pub const CHART_HOURS_MAX: time::Duration = time::Duration::days(14);
pub const CHART_DAYS_MAX: time::Duration = time::Duration::days(400);

/// The segments of a bucket's bar (its series and counts), stacked up from
/// `base`: series, count, top and height.
fn stack<'a>(segments: &[(&'a str, i64)], base: f64, scale: f64) -> Vec<(&'a str, i64, f64, f64)> {
    let mut top = base;
    segments
        .iter()
        .map(|(s, n)| {
            let h = *n as f64 * scale;
            top -= h;
            (*s, *n, top, h)
        })
        .collect()
}

/// Stacked bars, one per bucket, one colour per series, as inline SVG.
fn bar_chart(counts: &ChartCounts) -> Markup {
    // Grouped once: each bar reads its own segments, not every count.
    let mut by_bucket: BTreeMap<&str, Vec<(&str, i64)>> = BTreeMap::new();
    for (b, s, n) in counts {
        by_bucket.entry(b.as_str()).or_default().push((s.as_str(), *n));
    }
    let buckets: Vec<(&str, &Vec<(&str, i64)>)> = by_bucket.iter().map(|(b, v)| (*b, v)).collect();
    let series: BTreeSet<&str> = counts.iter().map(|(_, s, _)| s.as_str()).collect();
    let colour = |s: &str| PALETTE[series.iter().position(|x| *x == s).unwrap_or(0) % PALETTE.len()];
    let mut totals: BTreeMap<&str, i64> = BTreeMap::new();
    for (b, _, n) in counts {
        *totals.entry(b.as_str()).or_default() += n;
    }
    let max = totals.values().copied().max().unwrap_or(1).max(1) as f64;
    let (width, height, left, bottom) = (960.0_f64, 260.0_f64, 48.0_f64, 40.0_f64);
    let slot = (width - left) / buckets.len().max(1) as f64;
    let bar = (slot * 0.8).max(1.0);
    let scale = (height - bottom - 10.0) / max;
    let label_every = (buckets.len() / 12).max(1);
    html! {
        svg xmlns="http://www.w3.org/2000/svg" viewBox={ "0 0 " (width) " " (height) } width=(width) height=(height) role="img" {
            line x1=(left) y1=(height - bottom) x2=(width) y2=(height - bottom) stroke="#57606a" {}
            text x="4" y="14" font-size="11" fill="#57606a" { (max as i64) }
            text x="4" y=(height - bottom) font-size="11" fill="#57606a" { "0" }
            @for (i, (bucket, segments)) in buckets.iter().enumerate() {
                @let x = left + i as f64 * slot + (slot - bar) / 2.0;
                @for (s, n, top, h) in stack(segments, height - bottom, scale) {
                    rect x=(format!("{x:.1}")) y=(format!("{top:.1}")) width=(format!("{bar:.1}")) height=(format!("{h:.1}")) fill=(colour(s)) {
                        title { (bucket) " " (s) ": " (n) }
                    }
                }
                @if i % label_every == 0 {
                    text x=(format!("{x:.1}")) y=(height - bottom + 14.0) font-size="10" fill="#57606a" { (bucket) }
                }
            }
        }
        p.legend {
            @for s in &series {
                svg xmlns="http://www.w3.org/2000/svg" width="10" height="10" { rect width="10" height="10" fill=(colour(s)) {} }
                " " (s) " "
            }
        }
    }
}

/// `GET /ui/charts`: issuances per hour or day by cluster and role, and
/// denials by reason, drawn here as SVG.
pub async fn charts(look: Look, Query(q): Query<ChartQuery>) -> Response {
    let app = &look.app;
    let hourly = q.by == "hour";
    let since_text = if q.since.trim().is_empty() {
        if hourly { "2d" } else { "30d" }.to_owned()
    } else {
        q.since.trim().to_owned()
    };
    let Some(since) = crate::http::audit::parse_when(&since_text, app.clock.now()) else {
        return look.invalid(
            "Charts",
            "`since` is not an RFC 3339 time or a duration back from now",
        );
    };
    let (longest, per) = if hourly {
        (CHART_HOURS_MAX, "hour")
    } else {
        (CHART_DAYS_MAX, "day")
    };
    if app.clock.now() - since > longest {
        return look.invalid(
            "Charts",
            &format!(
                "a chart per {per} covers at most {} days: choose a later `since`",
                longest.whole_days()
            ),
        );
    }
    let details = json!({"action": "list", "view": "charts", "filter": {"since": since_text, "by": if hourly { "hour" } else { "day" }}});
    if let Err(page) = look.record("charts", details).await {
        return page;
    }
    let (issued, denied) = match look
        .console
        .charts
        .counts(app.audit.store(), since, app.clock.now(), hourly)
        .await
    {
        Ok(counts) => counts,
        Err(_) => return page::unavailable(),
    };
    let max_denied = denied.iter().map(|(_, _, n)| *n).max().unwrap_or(1).max(1) as f64;
    let body = html! {
        form.filters method="get" action="/ui/charts" {
            label { "From" input type="text" name="since" value=(since_text); }
            label { "Per" select name="by" { option value="day" selected[!hourly] { "day" } option value="hour" selected[hourly] { "hour" } } }
            button type="submit" { "Draw" }
        }
        h2 { "Certificates issued per " (if hourly { "hour" } else { "day" }) ", by cluster and role" }
        div.chart { @if issued.is_empty() { p.muted { "None in this window." } } @else { (bar_chart(&issued)) } }
        h2 { "Denials by reason" }
        div.chart {
            @if denied.is_empty() { p.muted { "None in this window." } }
            @else {
                svg xmlns="http://www.w3.org/2000/svg" viewBox={ "0 0 960 " (denied.len() * 24 + 8) } width="960" height=(denied.len() * 24 + 8) role="img" {
                    @for (i, (_, reason, n)) in denied.iter().enumerate() {
                        @let w = (*n as f64 / max_denied) * 600.0;
                        text x="4" y=(i * 24 + 18) font-size="12" fill="#1b1f24" { (reason) }
                        rect x="220" y=(i * 24 + 6) width=(format!("{:.1}", w.max(1.0))) height="16" fill="#cf222e" { title { (reason) ": " (n) } }
                        text x=(format!("{:.1}", 226.0 + w)) y=(i * 24 + 18) font-size="12" fill="#1b1f24" { (n) }
                    }
                }
            }
        }
    };
    look.show("Charts", body)
}
