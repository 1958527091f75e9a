//! `/metrics`: Prometheus text with vLLM's meanings under a `tlaloc:` prefix.
//!
//! Gauges and token counters are read from the engine's snapshot at scrape time (the engine is
//! the one place that knows them); latency histograms are observed by the request handlers.
//! Labels are bounded: the only one is a finish reason.

use std::sync::Mutex;
use std::time::Duration;

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};
use tlaloc_runtime::EngineStats;

use crate::generate::ChoiceEnd;

/// The server's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    running: IntGauge,
    waiting: IntGauge,
    kv_usage: Gauge,
    kv_pages_used: IntGauge,
    kv_pages_total: IntGauge,
    prompt_tokens: IntCounter,
    generation_tokens: IntCounter,
    preemptions: IntCounter,
    decode_steps: IntCounter,
    decode_chained_steps: IntCounter,
    kv_pages_cached: IntGauge,
    prefix_queries: IntCounter,
    prefix_hits: IntCounter,
    prefix_lookups: IntCounter,
    prefix_lookup_hits: IntCounter,
    prefix_evictions: IntCounter,
    /// Engine totals already added to the counters (they only move forward by the difference).
    seen: Mutex<EngineStats>,
    finished: IntCounterVec,
    rejected: IntCounterVec,
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
}

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
];

fn register<T: prometheus::core::Collector + Clone + 'static>(registry: &Registry, c: T) -> T {
    registry
        .register(Box::new(c.clone()))
        .expect("metric names are unique and valid");
    c
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let r = Registry::new();
        let gauge =
            |name: &str, help: &str| register(&r, IntGauge::new(name, help).expect("valid gauge"));
        let counter = |name: &str, help: &str| {
            register(&r, IntCounter::new(name, help).expect("valid counter"))
        };
        let histogram = |name: &str, help: &str| {
            register(
                &r,
                Histogram::with_opts(
                    HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()),
                )
                .expect("valid histogram"),
            )
        };
        Metrics {
            running: gauge(
                "tlaloc:num_requests_running",
                "Sequences in the running batch.",
            ),
            waiting: gauge(
                "tlaloc:num_requests_waiting",
                "Sequences waiting to be admitted.",
            ),
            kv_usage: register(
                &r,
                Gauge::new(
                    "tlaloc:kv_cache_usage_perc",
                    "Fraction of K/V pages in use (1 means full).",
                )
                .expect("valid gauge"),
            ),
            kv_pages_used: gauge("tlaloc:kv_cache_pages_used", "K/V pages held by sequences."),
            kv_pages_total: gauge("tlaloc:kv_cache_pages_total", "K/V pages that can be held."),
            prompt_tokens: counter("tlaloc:prompt_tokens_total", "Prompt tokens accepted."),
            generation_tokens: counter("tlaloc:generation_tokens_total", "Tokens generated."),
            preemptions: counter(
                "tlaloc:num_preemptions_total",
                "Sequences preempted and recomputed.",
            ),
            decode_steps: counter("tlaloc:decode_steps_total", "Decode steps run."),
            decode_chained_steps: counter(
                "tlaloc:decode_chained_steps_total",
                "Decode steps chained on the device after another (no host round trip).",
            ),
            kv_pages_cached: gauge(
                "tlaloc:kv_cache_pages_cached",
                "K/V pages holding a cached prefix block (held by sequences or kept for reuse).",
            ),
            prefix_queries: counter(
                "tlaloc:prefix_cache_queries_total",
                "Prefix cache queries, in tokens looked up (vLLM's meaning).",
            ),
            prefix_hits: counter(
                "tlaloc:prefix_cache_hits_total",
                "Prefix cache hits, in tokens found cached and not prefilled (vLLM's meaning).",
            ),
            prefix_lookups: counter(
                "tlaloc:prefix_cache_lookups_total",
                "Prefix cache lookups: one per sequence prefilled from its start.",
            ),
            prefix_lookup_hits: counter(
                "tlaloc:prefix_cache_lookup_hits_total",
                "Prefix cache lookups that found at least one cached block.",
            ),
            prefix_evictions: counter(
                "tlaloc:prefix_cache_evictions_total",
                "Cached prefix blocks evicted to make room.",
            ),
            seen: Mutex::new(EngineStats::default()),
            finished: register(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        "tlaloc:request_success_total",
                        "Requests finished, by reason.",
                    ),
                    &["finished_reason"],
                )
                .expect("valid counter"),
            ),
            rejected: register(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        "tlaloc:request_rejected_total",
                        "Requests refused before generation, by HTTP status.",
                    ),
                    &["status"],
                )
                .expect("valid counter"),
            ),
            ttft: histogram(
                "tlaloc:time_to_first_token_seconds",
                "Request arrival until its first generated token.",
            ),
            itl: histogram(
                "tlaloc:inter_token_latency_seconds",
                "Time between two consecutive tokens of a sequence.",
            ),
            e2e: histogram(
                "tlaloc:e2e_request_latency_seconds",
                "Request arrival until its last token.",
            ),
            registry: r,
        }
    }

    /// Time to first token of one sequence.
    pub fn observe_ttft(&self, d: Duration) {
        self.ttft.observe(d.as_secs_f64());
    }

    /// Gap between two tokens of one sequence.
    pub fn observe_itl(&self, d: Duration) {
        self.itl.observe(d.as_secs_f64());
    }

    /// A finished sequence: how it ended (labelled `stop`, `length`, `abort` or `error`) and its
    /// whole time.
    pub fn observe_finished(&self, end: ChoiceEnd, total: Duration) {
        self.finished.with_label_values(&[end.label()]).inc();
        self.e2e.observe(total.as_secs_f64());
    }

    /// A request refused with `status`.
    pub fn observe_rejected(&self, status: u16) {
        let label = match status {
            400 => "400",
            401 => "401",
            413 => "413",
            429 => "429",
            503 => "503",
            s if s >= 500 => "5xx",
            _ => "4xx",
        };
        self.rejected.with_label_values(&[label]).inc();
    }

    /// The text exposition, with the engine's counts as of now.
    pub fn render(&self, stats: Option<EngineStats>) -> String {
        if let Some(s) = stats {
            self.running.set(s.running as i64);
            self.waiting.set(s.waiting as i64);
            self.kv_pages_used.set(s.kv_pages_used as i64);
            self.kv_pages_total.set(s.kv_pages_total as i64);
            self.kv_pages_cached.set(s.kv_pages_cached as i64);
            self.kv_usage.set(if s.kv_pages_total == 0 {
                0.0
            } else {
                s.kv_pages_used as f64 / s.kv_pages_total as f64
            });
            let mut seen = self.seen.lock().expect("metrics lock");
            self.prompt_tokens.inc_by(
                s.prompt_tokens_total
                    .saturating_sub(seen.prompt_tokens_total),
            );
            self.generation_tokens.inc_by(
                s.generation_tokens_total
                    .saturating_sub(seen.generation_tokens_total),
            );
            self.preemptions
                .inc_by(s.preemptions_total.saturating_sub(seen.preemptions_total));
            self.decode_steps
                .inc_by(s.steps.decode_steps.saturating_sub(seen.steps.decode_steps));
            self.decode_chained_steps.inc_by(
                s.steps
                    .decode_chained_steps
                    .saturating_sub(seen.steps.decode_chained_steps),
            );
            let (now, before) = (s.prefix_cache, seen.prefix_cache);
            let forward =
                |c: &IntCounter, now: u64, before: u64| c.inc_by(now.saturating_sub(before));
            forward(&self.prefix_queries, now.query_tokens, before.query_tokens);
            forward(&self.prefix_hits, now.hit_tokens, before.hit_tokens);
            forward(&self.prefix_lookups, now.queries, before.queries);
            forward(&self.prefix_lookup_hits, now.hits, before.hits);
            forward(&self.prefix_evictions, now.evictions, before.evictions);
            *seen = s;
        }
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding into memory");
        String::from_utf8(out).expect("the text format is UTF-8")
    }
}
