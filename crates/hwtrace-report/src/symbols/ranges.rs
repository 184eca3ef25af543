//! Overlapping address ranges flattened into a sorted, disjoint table
//! where the range added later wins, and looked up by binary search.

use std::collections::BTreeSet;

/// `list` holds `(start, end, value)` in the order added; the result is
/// sorted and disjoint, each piece carrying the value of the last range
/// that covers it. A sweep over the ends: O(n log n).
pub fn flatten(list: &[(u64, u64, usize)]) -> Vec<(u64, u64, usize)> {
    // (point, is_start, order)
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(list.len() * 2);
    for (order, &(start, end, _)) in list.iter().enumerate() {
        if start < end {
            events.push((start, true, order));
            events.push((end, false, order));
        }
    }
    events.sort_unstable();
    let mut active: BTreeSet<usize> = BTreeSet::new();
    let mut out: Vec<(u64, u64, usize)> = Vec::new();
    let mut i = 0;
    while i < events.len() {
        let point = events[i].0;
        while i < events.len() && events[i].0 == point {
            let (_, is_start, order) = events[i];
            if is_start {
                active.insert(order);
            } else {
                active.remove(&order);
            }
            i += 1;
        }
        let (Some(&top), Some(&(next, _, _))) = (active.last(), events.get(i)) else {
            continue;
        };
        let value = list[top].2;
        match out.last_mut() {
            Some(last) if last.1 == point && last.2 == value => last.1 = next,
            _ => out.push((point, next, value)),
        }
    }
    out
}

/// The value of the piece holding `addr`.
pub fn lookup(table: &[(u64, u64, usize)], addr: u64) -> Option<usize> {
    let i = table.partition_point(|&(start, _, _)| start <= addr);
    let &(_, end, value) = table.get(i.checked_sub(1)?)?;
    (addr < end).then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_ranges_win_where_they_overlap() {
        let table = flatten(&[
            (0x1000, 0x3000, 1),
            (0x2000, 0x2800, 2),
            (0x2400, 0x4000, 1),
        ]);
        assert_eq!(
            table,
            [
                (0x1000, 0x2000, 1),
                (0x2000, 0x2400, 2),
                (0x2400, 0x4000, 1)
            ]
        );
        assert_eq!(lookup(&table, 0xfff), None);
        assert_eq!(lookup(&table, 0x1000), Some(1));
        assert_eq!(lookup(&table, 0x23ff), Some(2));
        assert_eq!(lookup(&table, 0x3fff), Some(1));
        assert_eq!(lookup(&table, 0x4000), None);
        // Disjoint ranges stay apart; empty ones vanish.
        let table = flatten(&[(0x10, 0x20, 0), (0x30, 0x40, 0), (0x50, 0x50, 3)]);
        assert_eq!(table, [(0x10, 0x20, 0), (0x30, 0x40, 0)]);
        assert_eq!(lookup(&table, 0x25), None);
        assert_eq!(flatten(&[]), []);
    }
}
