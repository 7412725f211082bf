//! The segments' bytes cut into runs of consecutive sections: what lets a pass write
//! sections on every core (each thread owns the runs it was given; nothing is shared,
//! nothing is unsafe). A run is a whole segment on one thread, a few runs per segment on
//! several — never one piece per section, whose bookkeeping would cost more than the
//! copy of a small section.

/// A section's place in its segment as a pass sees it: `item` (the caller's name for
/// it), its offset, its length.
pub(crate) type SectionPlace<T> = (T, usize, usize);

/// Consecutive sections of one segment and the bytes they lie in, gaps between them
/// included: `bytes` starts at `offset` in segment `seg`.
pub(crate) struct Run<'m, 'p, T> {
    pub(crate) seg: usize,
    pub(crate) offset: usize,
    pub(crate) bytes: &'m mut [u8],
    pub(crate) places: &'p [SectionPlace<T>],
}

impl<T: Copy> Run<'_, '_, T> {
    /// Visits the run in address order: `gap(offset, bytes)` for what lies between the
    /// sections (and at the run's ends), `section(item, offset, bytes)` for each section.
    pub(crate) fn visit<E>(
        &mut self,
        mut gap: impl FnMut(usize, &mut [u8]),
        mut section: impl FnMut(T, usize, &mut [u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut cursor = 0;
        for &(item, offset, len) in self.places {
            let start = offset - self.offset;
            gap(self.offset + cursor, &mut self.bytes[cursor..start]);
            section(item, offset, &mut self.bytes[start..start + len])?;
            cursor = start + len;
        }
        let end = self.bytes.len();
        gap(self.offset + cursor, &mut self.bytes[cursor..end]);
        Ok(())
    }
}

/// Runs, inline for a few (no allocation).
pub(crate) type Runs<'m, 'p, T> = smallvec::SmallVec<[Run<'m, 'p, T>; 8]>;

/// Sorts each segment's `places` (by segment index; each list in layout order already,
/// so sorting checks more than it moves) and cuts `segs` (the segments' bytes, by index)
/// into runs covering every byte: one per segment when `per_segment` is 1, else up to
/// `per_segment` per segment with about as much `weight` each. `Err` with the segment if
/// two places overlap, one lies outside its segment, or a segment has places but no
/// bytes (layout never makes any of these).
pub(crate) fn runs<'m, 'p, T: Copy>(
    segs: impl IntoIterator<Item = &'m mut [u8]>,
    places: &'p mut [Vec<SectionPlace<T>>],
    per_segment: usize,
    weight: impl Fn(&SectionPlace<T>) -> usize,
) -> Result<Runs<'m, 'p, T>, usize> {
    let mut runs = Runs::new();
    let mut lists = places.iter_mut();
    for (seg, bytes) in segs.into_iter().enumerate() {
        let mine: &'p [SectionPlace<T>] = match lists.next() {
            Some(list) => {
                // An empty section before one that starts where it lies.
                list.sort_unstable_by_key(|&(_, offset, len)| (offset, len));
                list
            }
            None => &[],
        };
        // Checked once here, so a run's visit cannot go out of bounds.
        let mut end = 0;
        for &(_, offset, len) in mine {
            if offset < end || offset.checked_add(len).is_none_or(|e| e > bytes.len()) {
                return Err(seg);
            }
            end = offset + len;
        }
        // Where each run's places begin (the first at 0), balanced by weight.
        let total: usize = mine.iter().map(&weight).sum();
        let share = total.div_ceil(per_segment.max(1)).max(1);
        let mut cuts: smallvec::SmallVec<[usize; 8]> = smallvec::smallvec![0];
        let mut sum = 0;
        for (i, p) in mine.iter().enumerate() {
            if sum >= share * cuts.len() && cuts.len() < per_segment {
                cuts.push(i);
            }
            sum += weight(p);
        }
        let mut rest = bytes;
        let mut at = 0;
        for (k, &first) in cuts.iter().enumerate() {
            let next = cuts.get(k + 1).copied();
            // The run ends where the next one's first section begins.
            let len = match next {
                Some(n) => mine[n].1 - at,
                None => rest.len(),
            };
            let (bytes, tail) = std::mem::take(&mut rest).split_at_mut(len);
            rest = tail;
            runs.push(Run {
                seg,
                offset: at,
                bytes,
                places: &mine[first..next.unwrap_or(mine.len())],
            });
            at += len;
        }
    }
    // Places in a segment beyond those given.
    match lists.position(|l| !l.is_empty()) {
        Some(i) => Err(runs.last().map_or(0, |r| r.seg + 1) + i),
        None => Ok(runs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each run's (segment, offset, length, items).
    fn shape(runs: &Runs<'_, '_, char>) -> Vec<(usize, usize, usize, String)> {
        runs.iter()
            .map(|r| {
                let items = r.places.iter().map(|p| p.0).collect();
                (r.seg, r.offset, r.bytes.len(), items)
            })
            .collect()
    }

    #[test]
    fn one_run_per_segment_covers_it_whole() {
        let (mut a, mut b) = ([0u8; 10], [0u8; 4]);
        let mut places = [vec![('y', 6, 2), ('x', 2, 3)], vec![('z', 0, 4)]];
        let runs = runs([&mut a[..], &mut b[..]], &mut places, 1, |_| 1).unwrap();
        assert_eq!(
            shape(&runs),
            [(0, 0, 10, "xy".into()), (1, 0, 4, "z".into())]
        );
    }

    #[test]
    fn several_runs_split_between_sections() {
        let mut a = [0u8; 12];
        let mut places = [vec![('a', 1, 2), ('b', 4, 2), ('c', 7, 2), ('d', 10, 1)]];
        let runs = runs([&mut a[..]], &mut places, 2, |p| p.2).unwrap();
        assert_eq!(
            shape(&runs),
            [(0, 0, 7, "ab".into()), (0, 7, 5, "cd".into())]
        );
    }

    #[test]
    fn a_visit_sees_gaps_and_sections_in_order() {
        let mut a = [0u8; 10];
        let mut places = [vec![('y', 6, 2), ('x', 2, 3)]];
        let mut runs = runs([&mut a[..]], &mut places, 1, |_| 1).unwrap();
        let seen = std::cell::RefCell::new(Vec::new());
        runs[0]
            .visit::<()>(
                |at, bytes| {
                    seen.borrow_mut().push((None, at, bytes.len()));
                    bytes.fill(0xee);
                },
                |item, at, bytes| {
                    seen.borrow_mut().push((Some(item), at, bytes.len()));
                    bytes.fill(item as u8);
                    Ok(())
                },
            )
            .unwrap();
        drop(runs);
        assert_eq!(
            seen.into_inner(),
            [
                (None, 0, 2),
                (Some('x'), 2, 3),
                (None, 5, 1),
                (Some('y'), 6, 2),
                (None, 8, 2)
            ]
        );
        assert_eq!(
            a,
            [0xee, 0xee, b'x', b'x', b'x', 0xee, b'y', b'y', 0xee, 0xee]
        );
    }

    #[test]
    fn overlaps_and_overruns_are_refused() {
        let mut a = [0u8; 10];
        let overlap = &mut [vec![(1, 0, 4), (2, 3, 2)]];
        assert_eq!(runs([&mut a[..]], overlap, 1, |_| 1).err(), Some(0));
        let overrun = &mut [vec![(1, 8, 4)]];
        assert_eq!(runs([&mut a[..]], overrun, 1, |_| 1).err(), Some(0));
        let elsewhere = &mut [vec![], vec![(1, 0, 1)]];
        assert_eq!(runs([&mut a[..]], elsewhere, 1, |_| 1).err(), Some(1));
    }

    #[test]
    fn an_empty_section_where_another_starts_is_no_overlap() {
        let mut a = [0u8; 10];
        let mut places = [vec![('a', 4, 3), ('b', 4, 0), ('c', 7, 0)]];
        let runs = runs([&mut a[..]], &mut places, 1, |_| 1).unwrap();
        assert_eq!(shape(&runs), [(0, 0, 10, "bac".into())]);
    }
}
