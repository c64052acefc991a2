//! A small seeded random generator (SplitMix64) for picking test inputs: the same sequence on
//! every platform, so a seed printed by a failing test replays it.

/// SplitMix64: small, seeded, the same on every platform; for picking test inputs.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// `count` random decimal digits.
    pub fn digits(&mut self, count: usize) -> Vec<u8> {
        (0..count).map(|_| b'0' + self.below(10) as u8).collect()
    }

    /// A decimal in [low, low + span) with `places` decimals, as text.
    pub fn decimal(&mut self, low: f64, span: f64, places: usize) -> String {
        let unit = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        format!("{:.*}", places, low + unit * span)
    }
}
