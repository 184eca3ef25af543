//! The code an execution ran over: byte runs at virtual addresses.
//!
//! A recorded [`Execution`](crate::Execution) keeps exactly the bytes of the
//! instructions it executed, as the recorder saw them when it translated them
//! (see [`crate::execution`] for why). Adjacent instructions merge into one
//! contiguous [`Segment`], so a straight-line run of code reads as one slice.

use std::collections::BTreeMap;

use hwtrace_types::{AddressSpace, Ip, MemoryError, ReadMemory};

/// Two pieces of code disagree about the bytes at one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "code at {addr} was seen as {first:#04x} and later as {second:#04x} \
     (self-modifying or re-mapped code is not supported)"
)]
pub struct CodeConflict {
    /// The first address whose byte differs.
    pub addr: Ip,
    /// The byte seen first.
    pub first: u8,
    /// The byte seen later.
    pub second: u8,
}

/// One contiguous run of code bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// The address of the first byte.
    pub addr: Ip,
    /// The bytes.
    pub bytes: Vec<u8>,
}

impl Segment {
    /// The address one past the last byte.
    pub fn end(&self) -> u64 {
        self.addr.0.saturating_add(self.bytes.len() as u64)
    }
}

/// Code bytes at virtual addresses: sorted, non-overlapping, non-adjacent
/// segments. Built with [`CodeImageBuilder`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CodeImage {
    segments: Vec<Segment>,
}

impl CodeImage {
    /// The segments, by ascending address.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Total number of bytes.
    pub fn len(&self) -> usize {
        self.segments.iter().map(|s| s.bytes.len()).sum()
    }

    /// True if no byte is known.
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    /// The bytes from `addr` to the end of the segment holding it.
    pub fn bytes_at(&self, addr: Ip) -> Option<&[u8]> {
        let at = self.segments.partition_point(|s| s.addr.0 <= addr.0);
        let seg = self.segments.get(at.checked_sub(1)?)?;
        let off = usize::try_from(addr.0 - seg.addr.0).ok()?;
        seg.bytes.get(off..).filter(|b| !b.is_empty())
    }
}

impl ReadMemory for CodeImage {
    /// Every address space sees the same code: a recorded execution is one
    /// process.
    fn read_memory(
        &self,
        _space: AddressSpace,
        addr: Ip,
        buf: &mut [u8],
    ) -> Result<usize, MemoryError> {
        let avail = self.bytes_at(addr).ok_or(MemoryError::Unmapped { addr })?;
        let n = avail.len().min(buf.len());
        buf[..n].copy_from_slice(&avail[..n]);
        Ok(n)
    }
}

/// Collects pieces of code (in any order, repeats allowed) and merges them
/// into a [`CodeImage`], refusing pieces that disagree.
#[derive(Debug, Clone, Default)]
pub struct CodeImageBuilder {
    /// Pieces by start address; the longest piece seen at each address.
    pieces: BTreeMap<u64, Vec<u8>>,
}

impl CodeImageBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `bytes` at `addr`. A piece at the same address must agree on the
    /// bytes both have; overlaps with pieces at other addresses are checked
    /// by [`build`](Self::build).
    pub fn add(&mut self, addr: Ip, bytes: &[u8]) -> Result<(), CodeConflict> {
        if bytes.is_empty() {
            return Ok(());
        }
        match self.pieces.get_mut(&addr.0) {
            None => {
                self.pieces.insert(addr.0, bytes.to_vec());
            }
            Some(old) => {
                compare(addr.0, old, bytes)?;
                if bytes.len() > old.len() {
                    old.extend_from_slice(&bytes[old.len()..]);
                }
            }
        }
        Ok(())
    }

    /// Copies the bytes known from `addr` on, as far as pieces continue
    /// without a gap, into `buf`; returns how many were copied.
    pub fn peek(&self, addr: Ip, buf: &mut [u8]) -> usize {
        let mut filled = 0;
        let end = addr.0.saturating_add(buf.len() as u64);
        // A piece starting before `addr` may cover it.
        let first = self
            .pieces
            .range(..=addr.0)
            .next_back()
            .map_or(addr.0, |(&a, _)| a);
        for (&start, bytes) in self.pieces.range(first..end) {
            let want = addr.0 + filled as u64;
            let piece_end = start.saturating_add(bytes.len() as u64);
            if start > want {
                break;
            }
            if piece_end <= want {
                continue;
            }
            let from = usize::try_from(want - start).unwrap_or(usize::MAX);
            let n = (bytes.len() - from).min(buf.len() - filled);
            buf[filled..filled + n].copy_from_slice(&bytes[from..from + n]);
            filled += n;
            if filled == buf.len() {
                break;
            }
        }
        filled
    }

    /// Merges the pieces into segments.
    pub fn build(self) -> Result<CodeImage, CodeConflict> {
        let mut segments: Vec<Segment> = Vec::new();
        for (addr, bytes) in self.pieces {
            if let Some(last) = segments.last_mut() {
                let end = last.end();
                if addr <= end {
                    // Overlapping or adjacent: the shared bytes must agree.
                    let skip = usize::try_from(end - addr).unwrap_or(usize::MAX);
                    let off = last.bytes.len() - skip.min(last.bytes.len());
                    compare(addr, &last.bytes[off..], &bytes)?;
                    if bytes.len() > skip {
                        last.bytes.extend_from_slice(&bytes[skip..]);
                    }
                    continue;
                }
            }
            segments.push(Segment {
                addr: Ip(addr),
                bytes,
            });
        }
        Ok(CodeImage { segments })
    }
}

/// Checks that two byte strings starting at `addr` agree where both exist.
fn compare(addr: u64, first: &[u8], second: &[u8]) -> Result<(), CodeConflict> {
    match first.iter().zip(second).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(CodeConflict {
            addr: Ip(addr.wrapping_add(i as u64)),
            first: first[i],
            second: second[i],
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adjacent_and_overlapping_pieces_merge() {
        let mut b = CodeImageBuilder::new();
        b.add(Ip(0x1003), &[4, 5]).unwrap();
        b.add(Ip(0x1000), &[1, 2, 3]).unwrap();
        b.add(Ip(0x1001), &[2, 3, 4]).unwrap();
        b.add(Ip(0x2000), &[9]).unwrap();
        let image = b.build().unwrap();
        assert_eq!(
            image.segments(),
            &[
                Segment {
                    addr: Ip(0x1000),
                    bytes: vec![1, 2, 3, 4, 5]
                },
                Segment {
                    addr: Ip(0x2000),
                    bytes: vec![9]
                }
            ]
        );
        assert_eq!(image.len(), 6);
        assert_eq!(image.bytes_at(Ip(0x1002)), Some(&[3u8, 4, 5][..]));
        assert_eq!(image.bytes_at(Ip(0x1005)), None);
        assert_eq!(image.bytes_at(Ip(0xfff)), None);
    }

    #[test]
    fn peek_follows_contiguous_pieces() {
        let mut b = CodeImageBuilder::new();
        b.add(Ip(0x1000), &[1, 2, 3]).unwrap();
        b.add(Ip(0x1003), &[4]).unwrap();
        b.add(Ip(0x1005), &[6]).unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(b.peek(Ip(0x1001), &mut buf), 3);
        assert_eq!(&buf[..3], &[2, 3, 4]);
        assert_eq!(b.peek(Ip(0x1004), &mut buf), 0);
        assert_eq!(b.peek(Ip(0x1005), &mut buf[..1]), 1);
    }

    #[test]
    fn disagreeing_pieces_are_refused_with_the_address() {
        let mut b = CodeImageBuilder::new();
        b.add(Ip(0x1000), &[1, 2, 3]).unwrap();
        assert_eq!(
            b.add(Ip(0x1000), &[1, 7]),
            Err(CodeConflict {
                addr: Ip(0x1001),
                first: 2,
                second: 7
            })
        );
        b.add(Ip(0x1002), &[8]).unwrap();
        assert_eq!(
            b.build(),
            Err(CodeConflict {
                addr: Ip(0x1002),
                first: 3,
                second: 8
            })
        );
    }

    #[test]
    fn reads_stop_at_the_segment_end_and_miss_with_the_address() {
        let mut b = CodeImageBuilder::new();
        b.add(Ip(0x10), &[1, 2]).unwrap();
        let image = b.build().unwrap();
        let mut buf = [0u8; 4];
        let got = image.read_memory(AddressSpace::UNKNOWN, Ip(0x11), &mut buf);
        assert_eq!(got, Ok(1));
        assert_eq!(buf[0], 2);
        assert_eq!(
            image.read_memory(AddressSpace::UNKNOWN, Ip(0x12), &mut buf),
            Err(MemoryError::Unmapped { addr: Ip(0x12) })
        );
    }
}
