//! Frames waiting for their departure time: a binary heap ordered by (departure, arrival
//! sequence), so frames due at the same instant leave in the order they arrived.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

struct Entry<T> {
    at: u64,
    seq: u64,
    item: T,
}

impl<T> PartialEq for Entry<T> {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at && self.seq == other.seq
    }
}
impl<T> Eq for Entry<T> {}
impl<T> PartialOrd for Entry<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Entry<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        // BinaryHeap is a max-heap: the earliest entry must compare greatest.
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

pub struct DelayLine<T> {
    heap: BinaryHeap<Entry<T>>,
    seq: u64,
}

impl<T> Default for DelayLine<T> {
    fn default() -> Self {
        DelayLine { heap: BinaryHeap::new(), seq: 0 }
    }
}

impl<T> DelayLine<T> {
    pub fn push(&mut self, at: u64, item: T) {
        self.seq += 1;
        self.heap.push(Entry { at, seq: self.seq, item });
    }

    /// Departure time of the next frame.
    pub fn next_at(&self) -> Option<u64> {
        self.heap.peek().map(|e| e.at)
    }

    /// The next frame and its departure time if it is due at `now`.
    pub fn pop_due(&mut self, now: u64) -> Option<(u64, T)> {
        if self.heap.peek()?.at <= now {
            self.heap.pop().map(|e| (e.at, e.item))
        } else {
            None
        }
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaves_in_time_order_then_arrival_order() {
        let mut d = DelayLine::default();
        d.push(30, "c");
        d.push(10, "a1");
        d.push(20, "b");
        d.push(10, "a2");
        assert_eq!(d.next_at(), Some(10));
        assert_eq!(d.pop_due(9), None);
        assert_eq!(d.pop_due(25), Some((10, "a1")));
        assert_eq!(d.pop_due(25), Some((10, "a2")));
        assert_eq!(d.pop_due(25), Some((20, "b")));
        assert_eq!(d.pop_due(25), None);
        assert_eq!(d.len(), 1);
        assert_eq!(d.pop_due(u64::MAX), Some((30, "c")));
        assert_eq!(d.next_at(), None);
    }
}
