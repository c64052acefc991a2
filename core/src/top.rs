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
//! The counts are kept as a "stream summary": groups of slots with equal
//! counts in a list by count, so raising a count or giving away the lowest
//! slot is O(1), and a denial costs one keyed hash of its name and no
//! allocation.
//!
//! Memory is bounded by the slot count: names are cut at [`MAX_KEY_BYTES`]
//! and kept in the slots, which grow with the keys denied up to the slot
//! count and never past it, whatever the stream of keys (see
//! [`bytes_bound`]).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

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

/// Table positions per slot: 4 bytes each, so 16 a slot against the ~300
/// of the slot itself.
const TABLE_PER_SLOT: usize = 4;

/// "No slot", "no group": the end of a list, an empty table entry.
const NONE: u32 = u32::MAX;

struct Slot {
    /// The name's hash, kept so the table never hashes a name twice.
    hash: u64,
    count: u64,
    error: u64,
    shadow: u64,
    /// The group of slots with this count, and this slot's neighbours in it.
    group: u32,
    prev: u32,
    next: u32,
    truncated: bool,
    len: u16,
    name: [u8; MAX_KEY_BYTES],
}

impl Slot {
    fn name(&self) -> &[u8] {
        self.name.get(..usize::from(self.len)).unwrap_or_default()
    }
}

/// The slots that share one count, linked through the slots; the groups
/// themselves in a list by count, lowest first.
#[derive(Clone, Copy)]
struct Group {
    count: u64,
    first: u32,
    prev: u32,
    next: u32,
}

/// One Space-Saving summary: its slots, their groups by count (`lowest`
/// holds the slots a new key may take), and an open-addressing table from
/// name to slot, probed linearly: TABLE_PER_SLOT positions a slot, so
/// probes are short (a quarter full at most).
struct Generation {
    slots: Vec<Slot>,
    groups: Vec<Group>,
    free_groups: Vec<u32>,
    lowest: u32,
    table: Vec<u32>,
    slot_limit: usize,
}

impl Generation {
    fn new(slot_limit: usize) -> Generation {
        Generation {
            slots: Vec::new(),
            groups: Vec::new(),
            free_groups: Vec::new(),
            lowest: NONE,
            table: Vec::new(),
            slot_limit,
        }
    }

    fn clear(&mut self) {
        self.slots.clear();
        self.groups.clear();
        self.free_groups.clear();
        self.lowest = NONE;
        self.table.fill(NONE);
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
        self.group(self.lowest).map_or(0, |group| group.count)
    }

    fn group(&self, group: u32) -> Option<&Group> {
        self.groups.get(group as usize)
    }

    fn slot(&self, slot: u32) -> Option<&Slot> {
        self.slots.get(slot as usize)
    }

    fn table_mask(&self) -> usize {
        self.table.len().saturating_sub(1)
    }

    /// The table position that holds `name`, or the empty one where it
    /// would go. The table is never more than half full, so an empty
    /// position is always met.
    fn find(&self, hash: u64, name: &[u8]) -> (usize, Option<u32>) {
        let mask = self.table_mask();
        let mut pos = hash as usize & mask;
        for _ in 0..self.table.len() {
            match self.table.get(pos) {
                Some(&NONE) | None => return (pos, None),
                Some(&slot) => {
                    if self
                        .slot(slot)
                        .is_some_and(|s| s.hash == hash && s.name() == name)
                    {
                        return (pos, Some(slot));
                    }
                }
            }
            pos = pos.wrapping_add(1) & mask;
        }
        (pos, None)
    }

    /// The table position that holds `slot` (found by its index on its
    /// hash's probe path: no name is compared).
    fn position_of(&self, slot: u32) -> Option<usize> {
        let mask = self.table_mask();
        let mut pos = self.slot(slot)?.hash as usize & mask;
        for _ in 0..self.table.len() {
            match self.table.get(pos) {
                Some(&entry) if entry == slot => return Some(pos),
                Some(&NONE) | None => return None,
                Some(_) => pos = pos.wrapping_add(1) & mask,
            }
        }
        None
    }

    /// The first empty position on `hash`'s probe path, where a name that
    /// is not in the table goes.
    fn first_empty(&self, hash: u64) -> usize {
        let mask = self.table_mask();
        let mut pos = hash as usize & mask;
        for _ in 0..self.table.len() {
            if self.table.get(pos).is_none_or(|&entry| entry == NONE) {
                break;
            }
            pos = pos.wrapping_add(1) & mask;
        }
        pos
    }

    fn get(&self, hash: u64, name: &[u8]) -> Option<&Slot> {
        self.find(hash, name).1.and_then(|slot| self.slot(slot))
    }

    /// Empties table position `pos`, moving back each entry after it that
    /// may sit there (a hole on its probe path), so lookups stop at no false
    /// end and no tombstone is left.
    fn remove_at(&mut self, pos: usize) {
        let mask = self.table_mask();
        let mut hole = pos;
        let mut next = pos.wrapping_add(1) & mask;
        for _ in 0..self.table.len() {
            let Some(&slot) = self.table.get(next) else {
                break;
            };
            if slot == NONE {
                break;
            }
            let home = self.slot(slot).map_or(next, |s| s.hash as usize & mask);
            // Probe distances: the entry may move back when the hole lies
            // between its home position and where it sits.
            if next.wrapping_sub(home) & mask >= next.wrapping_sub(hole) & mask {
                if let Some(entry) = self.table.get_mut(hole) {
                    *entry = slot;
                }
                hole = next;
            }
            next = next.wrapping_add(1) & mask;
        }
        if let Some(entry) = self.table.get_mut(hole) {
            *entry = NONE;
        }
    }

    /// One denial of `name` (its hash `hash`), cut to MAX_KEY_BYTES.
    fn observe(&mut self, hash: u64, name: &[u8], truncated: bool, shadow: bool) {
        if self.table.is_empty() {
            // The table (4 bytes a position) at once; the slots and groups
            // grow with the keys denied, so a server near its maxmemory does
            // not meet the whole summary at its first denial.
            let size = self
                .slot_limit
                .saturating_mul(TABLE_PER_SLOT)
                .next_power_of_two();
            self.table = vec![NONE; size];
        }
        let shadow = u64::from(shadow);
        let (pos, found) = self.find(hash, name);
        if let Some(slot) = found {
            if let Some(slot) = self.slots.get_mut(slot as usize) {
                slot.shadow = slot.shadow.saturating_add(shadow);
                slot.truncated |= truncated;
            }
            self.raise(slot);
            return;
        }
        let evicting = self.is_full();
        let taken = if evicting {
            // The key takes a slot of the lowest count, which may have been
            // its own count before it lost its slot: that count becomes its
            // possible error.
            let Some(slot) = self.group(self.lowest).map(|group| group.first) else {
                return;
            };
            if let Some(old_pos) = self.position_of(slot) {
                self.remove_at(old_pos);
            }
            if let Some(s) = self.slots.get_mut(slot as usize) {
                s.error = s.count;
                s.shadow = shadow;
            }
            self.raise(slot);
            slot
        } else {
            let Ok(slot) = u32::try_from(self.slots.len()) else {
                return;
            };
            grow(&mut self.slots, self.slot_limit);
            self.slots.push(Slot {
                hash,
                count: 1,
                error: 0,
                shadow,
                group: NONE,
                prev: NONE,
                next: NONE,
                truncated: false,
                len: 0,
                name: [0; MAX_KEY_BYTES],
            });
            let group = match self.group(self.lowest) {
                Some(group) if group.count == 1 => self.lowest,
                _ => self.new_group(1, NONE),
            };
            self.attach(slot, group);
            slot
        };
        if let Some(s) = self.slots.get_mut(taken as usize) {
            s.hash = hash;
            s.truncated = truncated;
            let len = name.len().min(MAX_KEY_BYTES);
            s.len = u16::try_from(len).unwrap_or(0);
            if let (Some(to), Some(from)) = (s.name.get_mut(..len), name.get(..len)) {
                to.copy_from_slice(from);
            }
        }
        // A removal above may have opened a hole earlier on the name's probe
        // path: its place is then the first empty position from its home.
        let pos = if evicting {
            self.first_empty(hash)
        } else {
            pos
        };
        if let Some(entry) = self.table.get_mut(pos) {
            *entry = taken;
        }
    }

    /// A group of `count` right after `after` (or first, with NONE).
    fn new_group(&mut self, count: u64, after: u32) -> u32 {
        let next = match self.group(after) {
            Some(group) => group.next,
            None => self.lowest,
        };
        let group = Group {
            count,
            first: NONE,
            prev: after,
            next,
        };
        let index = match self.free_groups.pop() {
            Some(index) => {
                if let Some(free) = self.groups.get_mut(index as usize) {
                    *free = group;
                }
                index
            }
            None => {
                grow(&mut self.groups, self.slot_limit);
                self.groups.push(group);
                u32::try_from(self.groups.len().saturating_sub(1)).unwrap_or(NONE)
            }
        };
        match self.groups.get_mut(after as usize) {
            Some(before) => before.next = index,
            None => self.lowest = index,
        }
        if let Some(following) = self.groups.get_mut(next as usize) {
            following.prev = index;
        }
        index
    }

    /// Links `slot` first into `group`.
    fn attach(&mut self, slot: u32, group: u32) {
        let first = self.group(group).map_or(NONE, |g| g.first);
        if let Some(s) = self.slots.get_mut(slot as usize) {
            s.group = group;
            s.prev = NONE;
            s.next = first;
        }
        if let Some(s) = self.slots.get_mut(first as usize) {
            s.prev = slot;
        }
        if let Some(g) = self.groups.get_mut(group as usize) {
            g.first = slot;
        }
    }

    /// Unlinks `slot` from its group; a group left empty leaves the list.
    fn detach(&mut self, slot: u32) {
        let Some((group, prev, next)) = self.slot(slot).map(|s| (s.group, s.prev, s.next)) else {
            return;
        };
        match self.slots.get_mut(prev as usize) {
            Some(before) => before.next = next,
            None => {
                if let Some(g) = self.groups.get_mut(group as usize) {
                    g.first = next;
                }
            }
        }
        if let Some(after) = self.slots.get_mut(next as usize) {
            after.prev = prev;
        }
        let Some(&Group {
            first,
            prev: group_prev,
            next: group_next,
            ..
        }) = self.group(group)
        else {
            return;
        };
        if first != NONE {
            return;
        }
        match self.groups.get_mut(group_prev as usize) {
            Some(before) => before.next = group_next,
            None => self.lowest = group_next,
        }
        if let Some(after) = self.groups.get_mut(group_next as usize) {
            after.prev = group_prev;
        }
        grow(&mut self.free_groups, self.slot_limit);
        self.free_groups.push(group);
    }

    /// Adds one to `slot`'s count, moving it to the group of its new count.
    fn raise(&mut self, slot: u32) {
        let Some(s) = self.slots.get_mut(slot as usize) else {
            return;
        };
        s.count = s.count.saturating_add(1);
        let (group, count, alone) = (s.group, s.count, s.prev == NONE && s.next == NONE);
        let next = self.group(group).map_or(NONE, |g| g.next);
        let next_has_count = self.group(next).is_some_and(|g| g.count == count);
        if alone && !next_has_count {
            // Its group becomes the next count's, in place.
            if let Some(g) = self.groups.get_mut(group as usize) {
                g.count = count;
            }
            return;
        }
        let target = if next_has_count {
            next
        } else {
            self.new_group(count, group)
        };
        self.detach(slot);
        self.attach(slot, target);
    }
}

/// Room for one more in `vector`, doubling it (from 16) but never past
/// `limit` entries, which bounds the summary's memory.
fn grow<T>(vector: &mut Vec<T>, limit: usize) {
    if vector.len() < vector.capacity() {
        return;
    }
    let wanted = vector
        .capacity()
        .saturating_mul(2)
        .max(16)
        .min(limit.max(1));
    vector.reserve_exact(wanted.saturating_sub(vector.len()).max(1));
}

/// The hash of a key name, keyed per summary with random words from the
/// standard library's `RandomState` (seeded by the operating system).
///
/// Not SipHash, which cost a denial about 140 instructions of its ~500:
/// folded 64x64->128-bit multiplies over 16 bytes at a time, as the fast
/// table hashes do. What SipHash would add, collisions that stay hard even
/// for someone who sees hash values, is not needed here: TB.TOP never
/// shows a hash or the table's order, so a client cannot learn the keys
/// to aim names at one position, and a probe never walks past the table
/// (a few thousand positions) however names collide.
#[derive(Clone, Copy)]
struct NameHasher {
    keys: [u64; 4],
}

impl NameHasher {
    fn new() -> NameHasher {
        let state = RandomState::new();
        let key = |index: u64| {
            let mut hasher = state.build_hasher();
            hasher.write_u64(index);
            hasher.finish()
        };
        NameHasher {
            keys: [key(0), key(1), key(2), key(3)],
        }
    }

    fn hash(&self, name: &[u8]) -> u64 {
        let [k0, k1, k2, k3] = self.keys;
        let len = name.len() as u64;
        let mut acc = k0 ^ len;
        let mut blocks = name.chunks_exact(16);
        for block in &mut blocks {
            let (low, high) = block.split_at(8);
            acc = folded_multiply(word(low) ^ k1, word(high) ^ acc);
        }
        let rest = blocks.remainder();
        if !rest.is_empty() {
            // Zero padding; the length, mixed in first and last, tells
            // "ab" from "ab\0".
            let mut block = [0u8; 16];
            if let Some(to) = block.get_mut(..rest.len()) {
                to.copy_from_slice(rest);
            }
            let (low, high) = block.split_at(8);
            acc = folded_multiply(word(low) ^ k2, word(high) ^ acc);
        }
        folded_multiply(acc ^ k3, len ^ k1)
    }
}

/// Eight bytes as a little-endian word (a shorter slice as zero).
fn word(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes.try_into().unwrap_or_default())
}

/// The 128-bit product's halves, xored: every input bit reaches the low
/// bits the table uses.
fn folded_multiply(a: u64, b: u64) -> u64 {
    // Two u64 factors never overflow a u128: wrapping is exact here.
    let product = u128::from(a).wrapping_mul(u128::from(b));
    (product as u64) ^ ((product >> 64) as u64)
}

/// The summary TB.TOP reads: two generations of `slot_limit` slots each.
pub struct Top {
    current: Generation,
    previous: Generation,
    /// When `current` began, on the server's clock.
    started_ms: i64,
    window_ms: i64,
    /// Keyed per summary, so names cannot be chosen to collide.
    hasher: NameHasher,
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
            hasher: NameHasher::new(),
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
        let name = key.get(..MAX_KEY_BYTES).unwrap_or(key);
        let hash = self.hasher.hash(name);
        self.current
            .observe(hash, name, key.len() > MAX_KEY_BYTES, shadow);
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
        });
        rows
    }
}

/// A row for each slot of `this`, plus what `other` says of the same key:
/// its counts where it lists the key, else the most it may have missed.
/// With `skip_shared`, the keys `other` lists are left out. (Both
/// generations hash with the summary's one key.)
fn merge_into(
    rows: &mut Vec<Row>,
    this: &Generation,
    other: Option<&Generation>,
    skip_shared: bool,
) {
    let missed = other.map_or(0, Generation::unlisted_bound);
    for slot in &this.slots {
        let seen = other.and_then(|other| other.get(slot.hash, slot.name()));
        let (count, error, shadow, truncated) = match seen {
            Some(_) if skip_shared => continue,
            Some(seen) => (seen.count, seen.error, seen.shadow, seen.truncated),
            None => (missed, missed, 0, false),
        };
        rows.push(Row {
            key: slot.name().to_vec(),
            truncated: slot.truncated || truncated,
            count: slot.count.saturating_add(count),
            error: slot.error.saturating_add(error),
            shadow: slot.shadow.saturating_add(shadow),
        });
    }
}

/// The most memory a summary of `slot_limit` slots holds, whatever keys it
/// has seen: in each of its two generations, the slots (names included),
/// as many groups and free-group entries, and the table of TABLE_PER_SLOT
/// positions a slot (rounded up to a power of two).
pub fn bytes_bound(slot_limit: usize) -> usize {
    let slot_limit = slot_limit.min(MAX_SLOTS);
    let per_slot = std::mem::size_of::<Slot>()
        .saturating_add(std::mem::size_of::<Group>())
        .saturating_add(std::mem::size_of::<u32>());
    let table = slot_limit
        .saturating_mul(TABLE_PER_SLOT)
        .next_power_of_two()
        .saturating_mul(std::mem::size_of::<u32>());
    slot_limit
        .saturating_mul(per_slot)
        .saturating_add(table)
        .saturating_mul(2)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_that_differ_only_in_padding_or_length_hash_apart() {
        let hasher = NameHasher::new();
        let names: [&[u8]; 6] = [
            b"",
            b"\0",
            b"ab",
            b"ab\0",
            b"0123456789abcdef",
            b"0123456789abcdef\0",
        ];
        for (i, a) in names.iter().enumerate() {
            for b in names.iter().skip(i + 1) {
                assert_ne!(hasher.hash(a), hasher.hash(b), "{a:?} and {b:?}");
            }
        }
        assert_eq!(hasher.hash(b"key:1"), hasher.hash(b"key:1"));
    }

    #[test]
    fn sequential_key_names_spread_over_the_table() {
        // The bench's names (`key:` and 12 digits): a table of 4096
        // positions a quarter full keeps every probe short.
        let hasher = NameHasher::new();
        let positions = 4096usize;
        let mut homes = vec![0u32; positions];
        for i in 0..1024u64 {
            let name = format!("key:{:012}", i * 7);
            homes[hasher.hash(name.as_bytes()) as usize & (positions - 1)] += 1;
        }
        let crowded = homes.iter().max().copied().unwrap_or(0);
        assert!(crowded <= 8, "{crowded} names share one home");
    }

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
        deny(&mut top, &format!("{exact}tail"), 2, T0);
        let rows = top.rows(T0);
        assert_eq!(
            (rows[0].key.len(), rows[0].truncated, rows[0].count),
            (256, true, 2)
        );
        // Keys that share the bytes kept share the row, which says it was cut.
        deny(&mut top, &exact, 1, T0);
        let rows = top.rows(T0);
        assert_eq!(rows.len(), 1);
        assert_eq!((rows[0].truncated, rows[0].count), (true, 3));
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

    /// The structure's own rules: every slot is found through the table at
    /// its index, the table holds nothing else, the groups run by count
    /// from `lowest` up, and each slot sits in the group of its count.
    fn check_structure(generation: &Generation) {
        let mut in_table = 0;
        for entry in &generation.table {
            if *entry != NONE {
                in_table += 1;
            }
        }
        assert_eq!(in_table, generation.slots.len(), "table entries");
        for (index, slot) in generation.slots.iter().enumerate() {
            assert_eq!(
                generation.find(slot.hash, slot.name()).1,
                Some(index as u32)
            );
            assert_eq!(generation.groups[slot.group as usize].count, slot.count);
        }
        let mut group = generation.lowest;
        let mut last = 0;
        let mut listed = 0;
        while group != NONE {
            let g = generation.groups[group as usize];
            assert!(g.count > last, "groups out of order");
            assert_ne!(g.first, NONE, "an empty group in the list");
            last = g.count;
            let mut slot = g.first;
            while slot != NONE {
                assert_eq!(generation.slots[slot as usize].group, group);
                listed += 1;
                slot = generation.slots[slot as usize].next;
            }
            group = g.next;
        }
        assert_eq!(listed, generation.slots.len(), "slots in the groups");
    }

    proptest! {
        /// Evictions, removals from the table and moves between groups,
        /// with hashes forced to collide (8 names per home) so the probe
        /// chains wrap and shift.
        #[test]
        fn the_summary_keeps_its_structure_under_any_stream(
            slot_limit in 1usize..16,
            denials in proptest::collection::vec(0u16..64, 0..300),
        ) {
            let mut generation = Generation::new(slot_limit);
            for key in denials {
                let name = format!("k{key}");
                generation.observe(u64::from(key / 8), name.as_bytes(), false, false);
                check_structure(&generation);
            }
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
