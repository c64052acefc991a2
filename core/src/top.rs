//! The most-denied keys, for TB.TOP: "who is being limited right now?",
//! answered in the server, which alone sees every denial (most of them
//! write nothing).
//!
//! Each generation is a Space-Saving summary (Metwally, Agrawal and
//! El Abbadi, 2005) over a fixed number of slots: a key already in a slot
//! has its count raised; a new key takes a free slot, or else the slot with
//! the lowest count, inheriting that count (+1) as its possible error. So a
//! listed count is never below the key's true count and at most its `error`
//! above it, the error is at most N / slots (N denials seen), and every key
//! denied more than N / slots times is listed.
//!
//! Two generations, `current` and `previous`, each `window_ms` long: a
//! rotation keeps the last one whole, so a reply covers at least the last
//! window and never drops a recent denial. A key missing from a full
//! generation may still have been denied there up to that generation's
//! lowest count, which is added to both its count and its error, so the
//! merged bounds hold too.
//!
//! Memory is fixed by the slot count: key names are cut at
//! [`MAX_KEY_BYTES`] and the hash index is sized once, so no stream of keys
//! makes the summary grow (see [`bytes_bound`]).

use std::collections::HashMap;
use std::sync::Arc;

use crate::args::whole_from;
use crate::error::TbError;

/// The longest key name a slot keeps; a longer name is cut to this many
/// bytes and its row says `truncated` (keys that share those bytes share
/// the slot).
pub const MAX_KEY_BYTES: usize = 256;

/// The most slots a summary may have (`tb.top-slots`): [`bytes_bound`] of
/// it is under 4 MiB.
pub const MAX_SLOTS: usize = 4096;

/// The rows TB.TOP replies when COUNT is not given.
pub const DEFAULT_ROWS: usize = 10;

/// What a TB.TOP call asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopRequest {
    /// `TB.TOP [COUNT k]`: at most `rows` rows.
    List { rows: usize },
    /// `TB.TOP RESET`: forget every denial.
    Reset,
}

/// `[COUNT k]` or `RESET`, the words after TB.TOP: `k` a whole number from
/// 1 to 2^53 (rows beyond those listed are simply not there).
pub fn parse_top_args(args: &[&[u8]]) -> Result<TopRequest, TbError> {
    match args {
        [] => Ok(TopRequest::List { rows: DEFAULT_ROWS }),
        [word] if word.eq_ignore_ascii_case(b"RESET") => Ok(TopRequest::Reset),
        [word] if word.eq_ignore_ascii_case(b"COUNT") => Err(TbError::TopCount),
        [word, rows] if word.eq_ignore_ascii_case(b"COUNT") => whole_from(rows, 1)
            .and_then(|rows| usize::try_from(rows).ok())
            .map(|rows| TopRequest::List { rows })
            .ok_or(TbError::TopCount),
        _ => Err(TbError::TopSyntax),
    }
}

/// One row of TB.TOP's reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// The key's name, at most [`MAX_KEY_BYTES`] of it.
    pub key: Vec<u8>,
    /// The name was longer and has been cut.
    pub truncated: bool,
    /// Denials counted: at least the true number, at most `error` above it.
    pub count: u64,
    pub error: u64,
    /// How many of the denials counted since the key took its slot were
    /// shadow-mode ones (reported to the caller as allowed).
    pub shadow: u64,
}

/// A slot's name: the (cut) key bytes and one last byte, 1 if the key was
/// cut, so a 256-byte key and a longer one that starts with it stay apart.
type Name = Arc<[u8]>;

struct Slot {
    name: Name,
    count: u64,
    error: u64,
    shadow: u64,
    /// Where this slot sits in `Generation::heap`.
    heap_pos: usize,
}

/// One Space-Saving summary: the slots, a min-heap of slot indices by
/// count (the slot to give away is at its root), and a map from name to
/// slot.
struct Generation {
    slots: Vec<Slot>,
    heap: Vec<usize>,
    index: HashMap<Name, usize>,
    slot_limit: usize,
}

impl Generation {
    fn new(slot_limit: usize) -> Generation {
        Generation {
            slots: Vec::new(),
            heap: Vec::new(),
            index: HashMap::new(),
            slot_limit,
        }
    }

    fn clear(&mut self) {
        self.slots.clear();
        self.heap.clear();
        self.index.clear();
    }

    fn is_full(&self) -> bool {
        self.slots.len() >= self.slot_limit
    }

    /// The most a key that has no slot may have been denied in this
    /// generation: 0 while a slot is free (every key denied has one), else
    /// the lowest count.
    fn unlisted_bound(&self) -> u64 {
        if !self.is_full() {
            return 0;
        }
        self.count_at(0).unwrap_or(0)
    }

    fn count_at(&self, heap_pos: usize) -> Option<u64> {
        let slot = *self.heap.get(heap_pos)?;
        self.slots.get(slot).map(|slot| slot.count)
    }

    fn get(&self, name: &[u8]) -> Option<&Slot> {
        self.index.get(name).and_then(|&slot| self.slots.get(slot))
    }

    /// One denial of `name`.
    fn observe(&mut self, name: &[u8], shadow: bool) {
        let shadow = u64::from(shadow);
        if let Some(&slot) = self.index.get(name) {
            if let Some(slot) = self.slots.get_mut(slot) {
                slot.count = slot.count.saturating_add(1);
                slot.shadow = slot.shadow.saturating_add(shadow);
                let heap_pos = slot.heap_pos;
                self.sift_down(heap_pos);
            }
            return;
        }
        if self.index.capacity() == 0 {
            // Sized once, at twice the slots: hashbrown then always rehashes
            // in place for the tombstones that evictions leave, and never
            // grows.
            self.index.reserve(self.slot_limit.saturating_mul(2));
            self.slots.reserve_exact(self.slot_limit);
            self.heap.reserve_exact(self.slot_limit);
        }
        let name: Name = Arc::from(name);
        if !self.is_full() {
            let slot = self.slots.len();
            let heap_pos = self.heap.len();
            self.slots.push(Slot {
                name: Arc::clone(&name),
                count: 1,
                error: 0,
                shadow,
                heap_pos,
            });
            self.heap.push(slot);
            self.index.insert(name, slot);
            self.sift_up(heap_pos);
            return;
        }
        // Full: the key takes the slot with the lowest count, which may have
        // been its own count before it lost its slot.
        let Some(&slot_index) = self.heap.first() else {
            return; // no slot at all (a limit of 0 is never observed)
        };
        let Some(slot) = self.slots.get_mut(slot_index) else {
            return;
        };
        let evicted = std::mem::replace(&mut slot.name, Arc::clone(&name));
        slot.error = slot.count;
        slot.count = slot.count.saturating_add(1);
        slot.shadow = shadow;
        self.index.remove(&evicted);
        self.index.insert(name, slot_index);
        self.sift_down(0);
    }

    fn swap(&mut self, a: usize, b: usize) {
        let (Some(&slot_a), Some(&slot_b)) = (self.heap.get(a), self.heap.get(b)) else {
            return;
        };
        self.heap.swap(a, b);
        if let Some(slot) = self.slots.get_mut(slot_a) {
            slot.heap_pos = b;
        }
        if let Some(slot) = self.slots.get_mut(slot_b) {
            slot.heap_pos = a;
        }
    }

    fn sift_down(&mut self, mut heap_pos: usize) {
        while let Some(count) = self.count_at(heap_pos) {
            let left = heap_pos.saturating_mul(2).saturating_add(1);
            let right = left.saturating_add(1);
            let mut lowest = (heap_pos, count);
            for child in [left, right] {
                if let Some(child_count) = self.count_at(child) {
                    if child_count < lowest.1 {
                        lowest = (child, child_count);
                    }
                }
            }
            if lowest.0 == heap_pos {
                return;
            }
            self.swap(heap_pos, lowest.0);
            heap_pos = lowest.0;
        }
    }

    fn sift_up(&mut self, mut heap_pos: usize) {
        while heap_pos > 0 {
            let parent = heap_pos.saturating_sub(1) / 2;
            match (self.count_at(heap_pos), self.count_at(parent)) {
                (Some(count), Some(parent_count)) if count < parent_count => {
                    self.swap(heap_pos, parent);
                    heap_pos = parent;
                }
                _ => return,
            }
        }
    }
}

/// The summary TB.TOP reads: two generations of `slot_limit` slots each.
pub struct Top {
    current: Generation,
    previous: Generation,
    /// When `current` began, on the server's clock.
    started_ms: i64,
    window_ms: i64,
}

impl Top {
    /// `slot_limit` is cut to [`MAX_SLOTS`]; 0 counts nothing. A window
    /// below 1 ms is taken as 1 ms. Nothing is allocated before the first
    /// denial.
    pub fn new(slot_limit: usize, window_ms: i64, now_ms: i64) -> Top {
        let slot_limit = slot_limit.min(MAX_SLOTS);
        Top {
            current: Generation::new(slot_limit),
            previous: Generation::new(slot_limit),
            started_ms: now_ms,
            window_ms: window_ms.max(1),
        }
    }

    pub fn slot_limit(&self) -> usize {
        self.current.slot_limit
    }

    pub fn window_ms(&self) -> i64 {
        self.window_ms
    }

    /// A new window length; what is counted stays.
    pub fn set_window_ms(&mut self, window_ms: i64) {
        self.window_ms = window_ms.max(1);
    }

    /// Forget every denial (TB.TOP RESET).
    pub fn reset(&mut self, now_ms: i64) {
        self.current.clear();
        self.previous.clear();
        self.started_ms = now_ms;
    }

    /// One denial of `key` at `now_ms`; `shadow` if shadow mode let it
    /// through.
    pub fn observe(&mut self, key: &[u8], shadow: bool, now_ms: i64) {
        if self.current.slot_limit == 0 {
            return;
        }
        self.rotate(now_ms);
        let mut name = [0u8; MAX_KEY_BYTES + 1];
        let kept = key.len().min(MAX_KEY_BYTES);
        let (Some(to), Some(from)) = (name.get_mut(..kept), key.get(..kept)) else {
            return;
        };
        to.copy_from_slice(from);
        if let Some(flag) = name.get_mut(kept) {
            *flag = u8::from(key.len() > MAX_KEY_BYTES);
        }
        if let Some(name) = name.get(..=kept) {
            self.current.observe(name, shadow);
        }
    }

    /// Starts a new generation once `current` is a window old; drops both
    /// when even `current` began two windows ago (every denial it holds is
    /// then older than the last window).
    fn rotate(&mut self, now_ms: i64) {
        let age_ms = now_ms.saturating_sub(self.started_ms);
        if age_ms < self.window_ms {
            return; // a clock that went back rotates nothing
        }
        if age_ms >= self.window_ms.saturating_mul(2) {
            self.previous.clear();
        } else {
            std::mem::swap(&mut self.current, &mut self.previous);
        }
        self.current.clear();
        self.started_ms = now_ms;
    }

    /// Every listed key, the most denied first (then by name), over at
    /// least the last window before `now_ms`.
    pub fn rows(&self, now_ms: i64) -> Vec<Row> {
        let age_ms = now_ms.saturating_sub(self.started_ms);
        let mut rows = Vec::new();
        if age_ms < self.window_ms {
            merge_into(&mut rows, &self.current, Some(&self.previous), false);
            // The keys of `previous` alone; those in both are merged above.
            merge_into(&mut rows, &self.previous, Some(&self.current), true);
        } else if age_ms < self.window_ms.saturating_mul(2) {
            // What the next denial's rotation would leave: `current` as the
            // previous generation, and nothing new.
            merge_into(&mut rows, &self.current, None, false);
        }
        rows.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then(a.error.cmp(&b.error))
                .then(a.key.cmp(&b.key))
                .then(a.truncated.cmp(&b.truncated))
        });
        rows
    }
}

/// A row for each slot of `this`, plus what `other` says of the same key:
/// its counts where it lists the key, else the most it may have missed.
/// With `skip_shared`, the keys `other` lists are left out.
fn merge_into(
    rows: &mut Vec<Row>,
    this: &Generation,
    other: Option<&Generation>,
    skip_shared: bool,
) {
    let missed = other.map_or(0, Generation::unlisted_bound);
    for slot in &this.slots {
        let (count, error, shadow) = match other.and_then(|other| other.get(&slot.name)) {
            Some(_) if skip_shared => continue,
            Some(seen) => (seen.count, seen.error, seen.shadow),
            None => (missed, missed, 0),
        };
        rows.push(row(
            &slot.name,
            slot.count.saturating_add(count),
            slot.error.saturating_add(error),
            slot.shadow.saturating_add(shadow),
        ));
    }
}

fn row(name: &[u8], count: u64, error: u64, shadow: u64) -> Row {
    let (truncated, key) = match name.split_last() {
        Some((flag, key)) => (*flag == 1, key.to_vec()),
        None => (false, Vec::new()),
    };
    Row {
        key,
        truncated,
        count,
        error,
        shadow,
    }
}

/// The most memory a summary of `slot_limit` slots holds, whatever keys it
/// has seen: both generations full of the longest names, their slots and
/// heaps, and their indexes at the size they are reserved at (twice the
/// slots, in hashbrown's power-of-two buckets of one entry and one control
/// byte each, plus a group of control bytes).
pub fn bytes_bound(slot_limit: usize) -> usize {
    let slot_limit = slot_limit.min(MAX_SLOTS);
    let word = std::mem::size_of::<usize>();
    // An Arc<[u8]>'s allocation: two counts, then the bytes, rounded up to a
    // word. Every figure is small (MAX_SLOTS bounds them), so saturating
    // arithmetic never saturates.
    let name_bytes = (MAX_KEY_BYTES
        .saturating_add(1)
        .saturating_add(word.saturating_mul(2)))
    .div_ceil(word)
    .saturating_mul(word);
    let per_slot = std::mem::size_of::<Slot>()
        .saturating_add(word)
        .saturating_add(name_bytes);
    let buckets = (slot_limit.saturating_mul(16) / 7)
        .saturating_add(1)
        .next_power_of_two();
    let index = buckets
        .saturating_mul(std::mem::size_of::<(Name, usize)>().saturating_add(1))
        .saturating_add(64);
    slot_limit
        .saturating_mul(per_slot)
        .saturating_add(index)
        .saturating_mul(2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const WINDOW_MS: i64 = 60_000;
    const T0: i64 = 1_700_000_000_000;

    fn top(slot_limit: usize) -> Top {
        Top::new(slot_limit, WINDOW_MS, T0)
    }

    fn deny(top: &mut Top, key: &str, times: usize, now_ms: i64) {
        for _ in 0..times {
            top.observe(key.as_bytes(), false, now_ms);
        }
    }

    /// (key, count, error) of each row, in order.
    fn listed(top: &Top, now_ms: i64) -> Vec<(String, u64, u64)> {
        top.rows(now_ms)
            .into_iter()
            .map(|row| {
                (
                    String::from_utf8_lossy(&row.key).into_owned(),
                    row.count,
                    row.error,
                )
            })
            .collect()
    }

    #[test]
    fn top_takes_count_or_reset() {
        let parse = |words: &[&str]| {
            parse_top_args(&words.iter().map(|word| word.as_bytes()).collect::<Vec<_>>())
        };
        assert_eq!(parse(&[]), Ok(TopRequest::List { rows: 10 }));
        assert_eq!(parse(&["count", "3"]), Ok(TopRequest::List { rows: 3 }));
        assert_eq!(parse(&["RESET"]), Ok(TopRequest::Reset));
        assert_eq!(
            parse(&["COUNT", "9007199254740992"]),
            Ok(TopRequest::List { rows: 1 << 53 })
        );
        for bad in ["0", "-1", "1.5", "x", "9007199254740993", ""] {
            assert_eq!(parse(&["COUNT", bad]), Err(TbError::TopCount), "{bad}");
        }
        assert_eq!(parse(&["COUNT"]), Err(TbError::TopCount));
        for bad in [&["RESET", "x"][..], &["COUNT", "1", "COUNT", "2"], &["TOP"]] {
            assert_eq!(parse(bad), Err(TbError::TopSyntax), "{bad:?}");
        }
    }

    #[test]
    fn an_empty_summary_lists_nothing() {
        assert!(top(8).rows(T0).is_empty());
    }

    #[test]
    fn rows_are_the_most_denied_first_then_by_name() {
        let mut top = top(8);
        deny(&mut top, "b", 2, T0);
        deny(&mut top, "a", 2, T0);
        deny(&mut top, "c", 5, T0);
        deny(&mut top, "d", 1, T0);
        assert_eq!(
            listed(&top, T0),
            [
                ("c".into(), 5, 0),
                ("a".into(), 2, 0),
                ("b".into(), 2, 0),
                ("d".into(), 1, 0)
            ]
        );
    }

    #[test]
    fn a_new_key_in_a_full_summary_takes_the_lowest_slot_and_its_count_as_error() {
        let mut top = top(2);
        deny(&mut top, "a", 3, T0);
        deny(&mut top, "b", 1, T0);
        deny(&mut top, "c", 1, T0);
        // c took b's slot: 1 inherited (its error) + its own 1.
        assert_eq!(listed(&top, T0), [("a".into(), 3, 0), ("c".into(), 2, 1)]);
    }

    #[test]
    fn shadow_denials_are_counted_and_told_apart() {
        let mut top = top(4);
        top.observe(b"k", true, T0);
        top.observe(b"k", false, T0);
        top.observe(b"k", true, T0);
        let rows = top.rows(T0);
        assert_eq!((rows[0].count, rows[0].shadow), (3, 2));
    }

    #[test]
    fn long_names_are_cut_at_256_bytes_and_say_so() {
        let mut top = top(4);
        let exact = "x".repeat(MAX_KEY_BYTES);
        let longer = format!("{exact}tail");
        deny(&mut top, &exact, 1, T0);
        deny(&mut top, &longer, 2, T0);
        let rows = top.rows(T0);
        assert_eq!(
            rows.len(),
            2,
            "a 256-byte key and a longer one keep their own slots"
        );
        assert_eq!(
            (rows[0].key.len(), rows[0].truncated, rows[0].count),
            (256, true, 2)
        );
        assert_eq!(
            (rows[1].key.len(), rows[1].truncated, rows[1].count),
            (256, false, 1)
        );
    }

    #[test]
    fn names_are_bytes_not_text() {
        let mut top = top(4);
        top.observe(&[0xff, 0x00, 0xfe], false, T0);
        assert_eq!(top.rows(T0)[0].key, [0xff, 0x00, 0xfe]);
    }

    #[test]
    fn a_rotation_keeps_the_last_window_whole() {
        let mut top = top(8);
        deny(&mut top, "old", 3, T0);
        // A window later the next denial starts a new generation; "old" stays.
        deny(&mut top, "new", 1, T0 + WINDOW_MS);
        assert_eq!(
            listed(&top, T0 + WINDOW_MS),
            [("old".into(), 3, 0), ("new".into(), 1, 0)]
        );
        // A key in both generations is one row, its counts added.
        deny(&mut top, "old", 2, T0 + WINDOW_MS + 1);
        assert_eq!(listed(&top, T0 + WINDOW_MS + 1)[0], ("old".into(), 5, 0));
    }

    #[test]
    fn a_reply_after_a_quiet_window_reads_as_the_rotation_would() {
        let mut top = top(8);
        deny(&mut top, "k", 2, T0);
        assert_eq!(listed(&top, T0 + WINDOW_MS), [("k".into(), 2, 0)]);
        assert!(listed(&top, T0 + 2 * WINDOW_MS).is_empty());
    }

    #[test]
    fn denials_older_than_two_windows_are_gone() {
        let mut top = top(8);
        deny(&mut top, "k", 2, T0);
        deny(&mut top, "later", 1, T0 + 2 * WINDOW_MS);
        assert_eq!(listed(&top, T0 + 2 * WINDOW_MS), [("later".into(), 1, 0)]);
    }

    #[test]
    fn a_clock_that_goes_back_rotates_nothing() {
        let mut top = top(8);
        deny(&mut top, "k", 1, T0);
        deny(&mut top, "k", 1, T0 - 10 * WINDOW_MS);
        assert_eq!(listed(&top, T0), [("k".into(), 2, 0)]);
    }

    #[test]
    fn reset_forgets_every_denial() {
        let mut top = top(8);
        deny(&mut top, "k", 4, T0);
        top.reset(T0 + 1);
        assert!(top.rows(T0 + 1).is_empty());
    }

    #[test]
    fn zero_slots_count_nothing() {
        let mut top = top(0);
        deny(&mut top, "k", 4, T0);
        assert!(top.rows(T0).is_empty());
    }

    #[test]
    fn the_slot_count_is_capped_and_the_bound_is_under_4_mib() {
        assert_eq!(top(1 << 40).slot_limit(), MAX_SLOTS);
        assert!(
            bytes_bound(MAX_SLOTS) < 4 << 20,
            "{}",
            bytes_bound(MAX_SLOTS)
        );
    }

    /// A small deterministic generator (xorshift64*), so the stream tests
    /// need no seed file.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn unit(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    #[test]
    fn a_zipf_stream_of_a_million_denials_keeps_every_heavy_key_within_its_bound_across_a_rotation()
    {
        const KEYS: usize = 100_000;
        const DENIALS: u64 = 1_000_000;
        const SLOTS: usize = 1024;
        // Zipf(1.1) over KEYS ranks, sampled through its cumulative weights.
        let mut cumulative = Vec::with_capacity(KEYS);
        let mut total = 0.0;
        for rank in 1..=KEYS {
            total += 1.0 / (rank as f64).powf(1.1);
            cumulative.push(total);
        }
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut top = Top::new(SLOTS, WINDOW_MS, T0);
        let mut truth: HashMap<Vec<u8>, u64> = HashMap::new();
        for i in 0..DENIALS {
            let draw = rng.unit() * total;
            let rank = cumulative.partition_point(|&c| c < draw);
            let key = format!("user:{rank}").into_bytes();
            // Half in each generation: the rotation comes halfway.
            let now_ms = if i < DENIALS / 2 { T0 } else { T0 + WINDOW_MS };
            top.observe(&key, false, now_ms);
            *truth.entry(key).or_default() += 1;
        }
        let rows = top.rows(T0 + WINDOW_MS);
        let share = DENIALS / SLOTS as u64;
        let by_key: HashMap<&[u8], &Row> =
            rows.iter().map(|row| (row.key.as_slice(), row)).collect();
        for row in &rows {
            let true_count = truth[&row.key];
            assert!(
                row.count >= true_count,
                "{row:?} below its true {true_count}"
            );
            assert!(
                row.count - true_count <= row.error,
                "{row:?} true {true_count}"
            );
            // Each generation's error is at most its own share of a slot.
            assert!(row.error <= share, "{row:?} error above {share}");
        }
        let heavy: Vec<_> = truth.iter().filter(|(_, &count)| count > share).collect();
        assert!(
            heavy.len() > 50,
            "a stream with few heavy keys tests little"
        );
        for (key, count) in heavy {
            assert!(
                by_key.contains_key(key.as_slice()),
                "{key:?} ({count}) unlisted"
            );
        }
        assert!(rows.len() <= 2 * SLOTS);
        assert_eq!(rows[0].key, b"user:0", "the heaviest key comes first");
    }

    #[test]
    fn a_million_distinct_hostile_keys_keep_the_summary_under_its_bound() {
        for slot_limit in [1024, MAX_SLOTS] {
            let mut rng = Rng(7);
            // Every byte value, in names up to 2 KiB long.
            let noise: Vec<u8> = (0..2048).map(|_| rng.next() as u8).collect();
            let mut key = Vec::with_capacity(2048 + 8);
            let before = crate::live_bytes();
            let mut top = Top::new(slot_limit, WINDOW_MS, T0);
            for i in 0..1_000_000u64 {
                key.clear();
                // The distinct part first, so long names differ within the
                // bytes kept.
                key.extend_from_slice(&i.to_le_bytes());
                key.extend_from_slice(&noise[..(rng.next() % 2048) as usize]);
                // Two generations' worth: the rotation comes halfway.
                let now_ms = if i < 500_000 { T0 } else { T0 + WINDOW_MS };
                top.observe(&key, false, now_ms);
            }
            let held = (crate::live_bytes() - before) as usize;
            println!(
                "{slot_limit} slots: {held} bytes held, bound {}",
                bytes_bound(slot_limit)
            );
            assert!(
                held <= bytes_bound(slot_limit),
                "{slot_limit} slots hold {held} bytes, bound {}",
                bytes_bound(slot_limit)
            );
            drop(top);
        }
    }

    proptest! {
        /// Against an exact count, on small summaries where evictions are
        /// the rule: any stream, any rotation times.
        #[test]
        fn listed_counts_hold_the_true_count_within_their_error(
            slot_limit in 1usize..12,
            denials in proptest::collection::vec((0u8..40, 0i64..300), 0..400),
        ) {
            let window_ms = 1_000;
            let mut top = Top::new(slot_limit, window_ms, T0);
            let mut log: Vec<(Vec<u8>, i64)> = Vec::new();
            let mut now_ms = T0;
            for (key, gap_ms) in denials {
                now_ms += gap_ms;
                // A few heavy keys and a tail of light ones.
                let key = format!("k{}", if key < 20 { key % 4 } else { key }).into_bytes();
                top.observe(&key, false, now_ms);
                log.push((key, now_ms));
            }
            let rows = top.rows(now_ms);
            let mut recent: HashMap<Vec<u8>, u64> = HashMap::new();
            let mut everything: HashMap<Vec<u8>, u64> = HashMap::new();
            for (key, at_ms) in &log {
                *everything.entry(key.clone()).or_default() += 1;
                if *at_ms > now_ms - window_ms {
                    *recent.entry(key.clone()).or_default() += 1;
                }
            }
            for row in &rows {
                // Never below the last window's count, never above all that
                // was seen plus the error the row admits.
                let recent_count = recent.get(&row.key).copied().unwrap_or(0);
                let all_count = everything.get(&row.key).copied().unwrap_or(0);
                prop_assert!(row.count >= recent_count, "{:?} below {}", row, recent_count);
                prop_assert!(row.count <= all_count + row.error, "{:?} above {}", row, all_count);
            }
            // A key denied in the last window more often than a slot's share
            // of every denial seen is listed (its share of the span the reply
            // covers is larger still).
            let seen = log.len() as u64;
            for (key, &count) in &recent {
                if count * slot_limit as u64 > seen {
                    prop_assert!(rows.iter().any(|row| &row.key == key), "{:?} ({}) unlisted", key, count);
                }
            }
        }
    }
}
