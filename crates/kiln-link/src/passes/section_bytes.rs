//! The segments' bytes split into one slice per section, and the gaps between: what lets
//! a pass write sections on every core (each thread owns the slices it writes; nothing
//! is shared, nothing is unsafe).

/// A piece of a segment: a section's bytes (`item` is the caller's name for it) or a gap
/// between sections (`item` is `None`).
pub(crate) struct Piece<'m, T> {
    pub(crate) item: Option<T>,
    /// Its segment, and its offset there.
    pub(crate) seg: usize,
    pub(crate) offset: usize,
    pub(crate) bytes: &'m mut [u8],
}

/// The pieces of a link's segments: inline for a small module (no allocation).
pub(crate) type Pieces<'m, T> = smallvec::SmallVec<[Piece<'m, T>; 16]>;

/// Splits `segs` (the segments' bytes, by index) at `places` — `(item, segment, offset,
/// length)` each — into pieces: in each segment's order, the gaps between the sections
/// and at the ends included. `Err` with the segment if two places overlap or one lies
/// outside its segment (layout never makes either).
pub(crate) fn split<'m, T: Copy>(
    segs: impl IntoIterator<Item = &'m mut [u8]>,
    places: &mut [(T, usize, usize, usize)],
) -> Result<Pieces<'m, T>, usize> {
    // An empty section before one that starts where it lies.
    places.sort_unstable_by_key(|&(_, seg, offset, len)| (seg, offset, len));
    let mut pieces = Pieces::with_capacity(places.len() * 2 + 3);
    let mut places = places.iter().copied().peekable();
    for (seg, mut rest) in segs.into_iter().enumerate() {
        let mut cursor = 0;
        while let Some(&(item, _, offset, len)) = places.peek().filter(|p| p.1 == seg) {
            places.next();
            let gap = offset.checked_sub(cursor).ok_or(seg)?;
            if gap.checked_add(len).is_none_or(|end| end > rest.len()) {
                return Err(seg);
            }
            let (before, tail) = std::mem::take(&mut rest).split_at_mut(gap);
            let (bytes, tail) = tail.split_at_mut(len);
            rest = tail;
            if !before.is_empty() {
                pieces.push(Piece {
                    item: None,
                    seg,
                    offset: cursor,
                    bytes: before,
                });
            }
            pieces.push(Piece {
                item: Some(item),
                seg,
                offset,
                bytes,
            });
            cursor = offset + len;
        }
        if !rest.is_empty() {
            pieces.push(Piece {
                item: None,
                seg,
                offset: cursor,
                bytes: rest,
            });
        }
    }
    // A place in a segment beyond those given.
    match places.next() {
        Some((_, seg, _, _)) => Err(seg),
        None => Ok(pieces),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_and_gaps_in_order() {
        let (mut a, mut b) = ([0u8; 10], [0u8; 4]);
        let pieces = split(
            [&mut a[..], &mut b[..]],
            &mut [('y', 0, 6, 2), ('x', 0, 2, 3), ('z', 1, 0, 4)],
        )
        .unwrap();
        let shape: Vec<(Option<char>, usize, usize, usize)> = pieces
            .iter()
            .map(|p| (p.item, p.seg, p.offset, p.bytes.len()))
            .collect();
        assert_eq!(
            shape,
            [
                (None, 0, 0, 2),
                (Some('x'), 0, 2, 3),
                (None, 0, 5, 1),
                (Some('y'), 0, 6, 2),
                (None, 0, 8, 2),
                (Some('z'), 1, 0, 4),
            ]
        );
    }

    #[test]
    fn overlaps_and_overruns_are_refused() {
        let mut a = [0u8; 10];
        assert!(split([&mut a[..]], &mut [(1, 0, 0, 4), (2, 0, 3, 2)]).is_err());
        assert!(split([&mut a[..]], &mut [(1, 0, 8, 4)]).is_err());
        assert!(split([&mut a[..]], &mut [(1, 1, 0, 1)]).is_err());
    }

    #[test]
    fn an_empty_section_where_another_starts_is_no_overlap() {
        let mut a = [0u8; 10];
        let pieces = split(
            [&mut a[..]],
            &mut [(1, 0, 4, 3), (2, 0, 4, 0), (3, 0, 7, 0)],
        )
        .unwrap();
        let items: Vec<_> = pieces
            .iter()
            .map(|p| (p.item, p.offset, p.bytes.len()))
            .collect();
        assert_eq!(
            items,
            [
                (None, 0, 4),
                (Some(2), 4, 0),
                (Some(1), 4, 3),
                (Some(3), 7, 0),
                (None, 7, 3)
            ]
        );
    }
}
