//! A set of page runs: which pages of a pool are not committed (not backed, not
//! accessible in the target view). Pure data structure, no system calls.

use std::collections::BTreeMap;

/// Disjoint, non-adjacent half-open ranges `[start, end)`.
#[derive(Debug, Clone, Default)]
pub struct PageRuns {
    runs: BTreeMap<u64, u64>,
    total: u64,
}

impl PageRuns {
    /// A set holding `[start, end)`.
    pub fn new(start: u64, end: u64) -> Self {
        let mut runs = PageRuns::default();
        runs.insert(start, end);
        runs
    }

    /// Total bytes covered.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Whether no part of `[start, end)` is in the set.
    pub fn is_disjoint(&self, start: u64, end: u64) -> bool {
        if start >= end {
            return true;
        }
        if let Some((_, &e)) = self.runs.range(..=start).next_back() {
            if e > start {
                return false;
            }
        }
        self.runs.range(start..end).next().is_none()
    }

    /// Where the set next covers a byte at or after `at` (`at` itself if a run holds it),
    /// or `None` if nothing at or after `at` is in the set.
    pub fn next_covered(&self, at: u64) -> Option<u64> {
        if let Some((_, &e)) = self.runs.range(..=at).next_back() {
            if e > at {
                return Some(at);
            }
        }
        self.runs.range(at..).next().map(|(&s, _)| s)
    }

    /// Bytes of `[start, end)` that are in the set.
    pub fn covered(&self, start: u64, end: u64) -> u64 {
        if start >= end {
            return 0;
        }
        let first = self
            .runs
            .range(..=start)
            .next_back()
            .filter(|&(_, &e)| e > start)
            .map(|(&s, _)| s)
            .unwrap_or(start);
        self.runs
            .range(first..end)
            .map(|(&s, &e)| e.min(end) - s.max(start))
            .sum()
    }

    /// Adds `[start, end)`; returns the parts that were not in the set before.
    pub fn insert(&mut self, start: u64, end: u64) -> Vec<(u64, u64)> {
        if start >= end {
            return Vec::new();
        }
        let mut added = Vec::new();
        let mut new_start = start;
        let mut new_end = end;
        let mut cursor = start;
        // Runs overlapping or touching [start, end).
        let first = self
            .runs
            .range(..=start)
            .next_back()
            .filter(|&(_, &e)| e >= start)
            .map(|(&s, _)| s)
            .unwrap_or(start);
        let touching: Vec<(u64, u64)> = self
            .runs
            .range(first..=end)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in touching {
            if s > cursor && cursor < end {
                added.push((cursor, s.min(end)));
            }
            cursor = cursor.max(e);
            new_start = new_start.min(s);
            new_end = new_end.max(e);
            self.runs.remove(&s);
            self.total -= e - s;
        }
        if cursor < end {
            added.push((cursor, end));
        }
        self.runs.insert(new_start, new_end);
        self.total += new_end - new_start;
        added
    }

    /// Removes `[start, end)`; returns the parts that were in the set.
    pub fn remove(&mut self, start: u64, end: u64) -> Vec<(u64, u64)> {
        if start >= end {
            return Vec::new();
        }
        let first = self
            .runs
            .range(..=start)
            .next_back()
            .filter(|&(_, &e)| e > start)
            .map(|(&s, _)| s)
            .unwrap_or(start);
        let overlapping: Vec<(u64, u64)> =
            self.runs.range(first..end).map(|(&s, &e)| (s, e)).collect();
        let mut removed = Vec::new();
        for (s, e) in overlapping {
            self.runs.remove(&s);
            self.total -= e - s;
            if s < start {
                self.runs.insert(s, start);
                self.total += start - s;
            }
            if e > end {
                self.runs.insert(end, e);
                self.total += e - end;
            }
            removed.push((s.max(start), e.min(end)));
        }
        removed
    }

    /// The runs, by address.
    pub fn runs(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.runs.iter().map(|(&s, &e)| (s, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_reports_new_parts_and_merges() {
        let mut runs = PageRuns::new(0x1000, 0x2000);
        assert_eq!(runs.insert(0x3000, 0x4000), vec![(0x3000, 0x4000)]);
        assert_eq!(
            runs.insert(0x0, 0x5000),
            vec![(0x0, 0x1000), (0x2000, 0x3000), (0x4000, 0x5000)]
        );
        assert_eq!(runs.runs().collect::<Vec<_>>(), vec![(0, 0x5000)]);
        assert_eq!(runs.total(), 0x5000);
    }

    #[test]
    fn remove_splits() {
        let mut runs = PageRuns::new(0, 0x10000);
        assert_eq!(runs.remove(0x2000, 0x3000), vec![(0x2000, 0x3000)]);
        assert_eq!(
            runs.remove(0x1000, 0x4000),
            vec![(0x1000, 0x2000), (0x3000, 0x4000)]
        );
        assert_eq!(runs.total(), 0x10000 - 0x3000);
        assert!(runs.is_disjoint(0x1000, 0x4000));
        assert_eq!(runs.covered(0, 0x5000), 0x2000);
        assert_eq!(runs.covered(0x1000, 0x4000), 0);
        assert!(!runs.is_disjoint(0x1000, 0x4001));
    }

    #[test]
    fn next_covered_finds_the_run_holding_or_after() {
        let mut runs = PageRuns::new(0x1000, 0x2000);
        runs.insert(0x5000, 0x6000);
        assert_eq!(runs.next_covered(0), Some(0x1000));
        assert_eq!(runs.next_covered(0x1800), Some(0x1800));
        assert_eq!(runs.next_covered(0x2000), Some(0x5000));
        assert_eq!(runs.next_covered(0x6000), None);
    }
}
