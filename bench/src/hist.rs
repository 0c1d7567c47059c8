//! A log-linear latency histogram: exact below 64 ns, then 32 buckets per power of two (about 3%
//! resolution), so millions of samples take a few kilobytes and merge by adding counts.

const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;
const LINEAR: u64 = 2 * SUB;
const BUCKETS: usize = (LINEAR + (64 - (SUB_BITS + 1) as u64) * SUB) as usize;

/// Counts of values (nanoseconds) in log-linear buckets.
#[derive(Clone, Debug)]
pub struct Hist {
    counts: Vec<u64>,
    n: u64,
    max: u64,
    sum: u128,
}

impl Default for Hist {
    fn default() -> Self {
        Self {
            counts: vec![0; BUCKETS],
            n: 0,
            max: 0,
            sum: 0,
        }
    }
}

fn index(v: u64) -> usize {
    if v < LINEAR {
        return v as usize;
    }
    let e = 63 - v.leading_zeros(); // v in [2^e, 2^(e+1)), e >= SUB_BITS + 1
    let sub = (v >> (e - SUB_BITS)) & (SUB - 1);
    (LINEAR + u64::from(e - (SUB_BITS + 1)) * SUB + sub) as usize
}

/// The middle of bucket `i`.
fn value(i: usize) -> u64 {
    let i = i as u64;
    if i < LINEAR {
        return i;
    }
    let j = i - LINEAR;
    let e = j / SUB + u64::from(SUB_BITS + 1);
    let sub = j % SUB;
    let width = 1u64 << (e - u64::from(SUB_BITS));
    (SUB + sub) * width + width / 2
}

impl Hist {
    /// Records one value.
    pub fn record(&mut self, v: u64) {
        self.counts[index(v)] += 1;
        self.n += 1;
        self.max = self.max.max(v);
        self.sum += u128::from(v);
    }

    /// Adds the counts of `other`.
    pub fn merge(&mut self, other: &Hist) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.n += other.n;
        self.max = self.max.max(other.max);
        self.sum += other.sum;
    }

    /// Number of values.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// The largest value.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// The mean, 0 when empty.
    pub fn mean(&self) -> u64 {
        if self.n == 0 {
            0
        } else {
            u64::try_from(self.sum / u128::from(self.n)).unwrap_or(u64::MAX)
        }
    }

    /// The `q` quantile (0..=1), 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.n == 0 {
            return 0;
        }
        let target = ((q * self.n as f64).ceil() as u64).clamp(1, self.n);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= target {
                return value(i).min(self.max);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_close() {
        let mut last = 0;
        for v in [
            0u64,
            1,
            63,
            64,
            65,
            127,
            128,
            1000,
            999_999,
            1 << 40,
            u64::MAX / 2,
        ] {
            let i = index(v);
            assert!(i >= last);
            last = i;
            let m = value(i);
            let err = m.abs_diff(v) as f64 / (v.max(1)) as f64;
            assert!(err <= 0.04, "{v} -> {m}");
        }
        assert!(index(u64::MAX) < BUCKETS);
    }

    #[test]
    fn quantiles() {
        let mut h = Hist::default();
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        let p50 = h.quantile(0.5) as f64;
        let p99 = h.quantile(0.99) as f64;
        assert!((p50 / 500_000.0 - 1.0).abs() < 0.04, "{p50}");
        assert!((p99 / 990_000.0 - 1.0).abs() < 0.04, "{p99}");
        assert_eq!(h.max(), 1_000_000);
    }
}
