//! Micro-benchmark of the pure part of TB.TAKE: argument and stored-number
//! parsing, the bucket arithmetic, and formatting the stored token count.
//!
//! It uses the core crate as any user would.
//!
//! Run with `cargo bench -p redis-tb-core`; the numbers guard against
//! regressions, the absolute values depend on the machine.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};

use redis_tb_core::args;
use redis_tb_core::bucket::{self, Limit, State};
use redis_tb_core::number::{self, Sign};

const NOW_MS: i64 = 1_700_000_000_000;

fn parsing(c: &mut Criterion) {
    let mut group = c.benchmark_group("parse");
    // What a TB.TAKE call parses: three arguments, then the two stored fields.
    for text in ["20", "2.5", "1000000000", "0.001"] {
        group.bench_function(format!("argument {text}"), |b| {
            b.iter(|| number::parse_decimal(black_box(text.as_bytes()), Sign::Forbidden))
        });
    }
    for text in ["98.01246", "0.30000000000000004", "1700000000000"] {
        group.bench_function(format!("stored {text}"), |b| {
            b.iter(|| number::parse_decimal(black_box(text.as_bytes()), Sign::Allowed))
        });
    }
    group.bench_function("request 20 5 1", |b| {
        b.iter(|| {
            args::parse_request(
                black_box(b"20"),
                black_box(b"5"),
                Some(black_box(b"1".as_slice())),
            )
        })
    });
    group.finish();
}

fn arithmetic(c: &mut Criterion) {
    let mut group = c.benchmark_group("take");
    let limit = Limit {
        capacity: 20.0,
        refill_per_sec: 5.0,
    };
    let half_full = Some(State {
        tokens: 9.5,
        last_refill_ms: (NOW_MS - 1234) as f64,
    });
    let empty = Some(State {
        tokens: 0.0,
        last_refill_ms: NOW_MS as f64,
    });
    group.bench_function("allowed", |b| {
        b.iter(|| {
            bucket::take(
                black_box(half_full),
                &limit,
                black_box(1.0),
                black_box(NOW_MS),
            )
        })
    });
    group.bench_function("denied", |b| {
        b.iter(|| bucket::take(black_box(empty), &limit, black_box(1.0), black_box(NOW_MS)))
    });
    group.bench_function("new bucket", |b| {
        b.iter(|| bucket::take(black_box(None), &limit, black_box(1.0), black_box(NOW_MS)))
    });
    group.finish();
}

fn formatting(c: &mut Criterion) {
    let mut group = c.benchmark_group("format");
    for value in [19.0, 98.01246, 0.1 + 0.2, 1e300] {
        group.bench_function(format!("tokens {value:?}"), |b| {
            b.iter(|| number::format_tokens(black_box(value)))
        });
    }
    group.finish();
}

/// Everything pure one allowed TB.TAKE does, end to end.
fn whole_call(c: &mut Criterion) {
    c.bench_function("pure part of one TB.TAKE", |b| {
        b.iter(|| {
            let request = args::parse_request(
                black_box(b"20"),
                black_box(b"5"),
                Some(black_box(b"1".as_slice())),
            )
            .ok()?;
            let state = State {
                tokens: number::parse_decimal(black_box(b"9.5"), Sign::Allowed)?,
                last_refill_ms: number::parse_decimal(black_box(b"1699999998766"), Sign::Allowed)?,
            };
            let outcome = bucket::take(Some(state), &request.limit, request.n, NOW_MS);
            outcome
                .write
                .map(|written| number::format_tokens(written.tokens))
        })
    });
}

criterion_group!(benches, parsing, arithmetic, formatting, whole_call);
criterion_main!(benches);
