//! Stored bucket data, as src/bucket/hash.rs reads it from a hash anyone may
//! have written (HSET of garbage, another client, an older version).
//!
//! On every input:
//! 1. The whole input as one stored field: `parse_decimal(.., Sign::Allowed)`
//!    never panics and agrees with the contract's grammar (optional sign) and
//!    64-byte bound; the argument form (`Sign::Forbidden`) agrees with its
//!    own. A value read back is formatted by `format_tokens` and must read
//!    back to the same bits.
//! 2. The first 8 bytes as an f64 bit pattern: every finite f64 survives
//!    `format_tokens` -> `parse_decimal` bit for bit, in <= 24 bytes; as an
//!    i64, the `last_refill` integer text reads back as `now as f64`.
//! 3. Split at the first `|` into `tokens` and `last_refill`: when both
//!    decode (else the module replies "corrupt bucket"), TB.TAKE, TB.PEEK
//!    and TB.REFUND on that hand-edited bucket keep every invariant.
//! 4. The input as a key name: the corrupt-bucket error message is one
//!    printable line and unescapes to the key (cut at 64 bytes + `...`).

#![no_main]

use libfuzzer_sys::fuzz_target;
use tb_fuzz::bucket::{Limit, State};
use tb_fuzz::error::corrupt_bucket_message;
use tb_fuzz::number::{format_tokens, parse_decimal, Sign};
use tb_fuzz::{check_refund, check_take, reference_decimal, same, NOW_MS};

/// A few everyday limits and requests to judge a hand-edited bucket with.
const LIMITS: [(f64, f64, f64); 4] = [
    (10.0, 1.0, 1.0),
    (1.0, 0.001, 0.5),
    (1000.0, 1e6, 1000.0),
    (1e15, 1e-3, 0.0),
];

fuzz_target!(|data: &[u8]| {
    // 1. One stored field.
    let stored = parse_decimal(data, Sign::Allowed);
    let want = reference_decimal(data, true);
    assert!(
        same(stored, want),
        "stored {stored:?}, contract says {want:?}"
    );
    let arg = parse_decimal(data, Sign::Forbidden);
    let want_arg = reference_decimal(data, false);
    assert!(
        same(arg, want_arg),
        "argument {arg:?}, contract says {want_arg:?}"
    );
    if let Some(value) = stored {
        round_trip(value);
    }

    // 2. Bit patterns.
    let mut head = [0u8; 8];
    let len = data.len().min(8);
    head[..len].copy_from_slice(&data[..len]);
    let bits = f64::from_bits(u64::from_le_bytes(head));
    if bits.is_finite() {
        round_trip(bits);
    }
    let ms = i64::from_le_bytes(head);
    let text = ms.to_string();
    assert!(
        same(
            parse_decimal(text.as_bytes(), Sign::Allowed),
            Some(ms as f64)
        ),
        "last_refill {text} does not read back as {:?}",
        ms as f64
    );

    // 3. A hand-edited bucket.
    if let Some(split) = data.iter().position(|b| *b == b'|') {
        let (tokens, last_refill) = (&data[..split], &data[split + 1..]);
        if let (Some(tokens), Some(last_refill_ms)) = (
            parse_decimal(tokens, Sign::Allowed),
            parse_decimal(last_refill, Sign::Allowed),
        ) {
            let state = State {
                tokens,
                last_refill_ms,
            };
            for (capacity, refill_per_sec, n) in LIMITS {
                let limit = Limit {
                    capacity,
                    refill_per_sec,
                };
                let got = check_take(Some(state), &limit, n, NOW_MS);
                // Never more than the bucket could hold, and a last_refill
                // in the future (clock stepped back) refills nothing.
                if got.allowed && last_refill_ms >= NOW_MS as f64 {
                    assert!(
                        n <= tokens.max(0.0),
                        "a future last_refill granted a refill"
                    );
                }
                check_refund(Some(state), &limit, n, NOW_MS);
            }
        }
    }

    // 4. The error message that names a corrupt bucket's key.
    check_corrupt_message(data);
});

fn round_trip(value: f64) {
    let text = format_tokens(value);
    let bytes = text.as_bytes();
    assert!(
        bytes.len() <= 24,
        "{value:?} formats to {} bytes",
        bytes.len()
    );
    let back = parse_decimal(bytes, Sign::Allowed);
    assert!(
        same(back, Some(value)),
        "{value:?} -> {:?} -> {back:?}",
        String::from_utf8_lossy(bytes)
    );
}

const PREFIX: &str = "ERR corrupt bucket '";
const SUFFIX: &str = "': tokens and last_refill must be finite numbers";

fn check_corrupt_message(key: &[u8]) {
    let message = corrupt_bucket_message(key);
    let text = message.to_str().expect("the message is ASCII");
    assert!(
        text.bytes().all(|b| (0x20..=0x7e).contains(&b)),
        "non-printable byte in {text:?}"
    );
    let body = text
        .strip_prefix(PREFIX)
        .and_then(|t| t.strip_suffix(SUFFIX))
        .unwrap_or_else(|| panic!("unexpected shape: {text:?}"));
    let body = if key.len() > 64 {
        body.strip_suffix("...").expect("a long key ends in ...")
    } else {
        body
    };
    assert_eq!(unescape(body), key[..key.len().min(64)], "{text:?}");
}

/// `\'` -> `'`, `\\` -> `\`, `\xNN` -> byte; anything else as is.
fn unescape(text: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut bytes = text.bytes();
    while let Some(b) = bytes.next() {
        if b != b'\\' {
            assert!(b != b'\'', "unescaped quote in {text:?}");
            out.push(b);
            continue;
        }
        match bytes.next() {
            Some(b'x') => {
                let hex: Vec<u8> = bytes.by_ref().take(2).collect();
                let hex = std::str::from_utf8(&hex).expect("ASCII");
                out.push(u8::from_str_radix(hex, 16).expect("two hex digits after \\x"));
            }
            Some(escaped @ (b'\'' | b'\\')) => out.push(escaped),
            other => panic!("bad escape {other:?} in {text:?}"),
        }
    }
    out
}
