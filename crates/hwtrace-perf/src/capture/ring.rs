//! Ring-buffer arithmetic of the perf mmap protocol, over plain slices so
//! it is tested without a kernel.
//!
//! The data ring and the AUX area are power-of-two byte rings. The kernel
//! advances `head` (`data_head`, `aux_head`) as it writes; the reader
//! consumes `[tail, head)` and then stores the new `tail` (`data_tail`,
//! `aux_tail`). Positions grow forever; the byte at position `p` is at
//! `p % size`. A readable range that crosses the end of the buffer is two
//! slices ([`RawData::Split`]). In snapshot (overwrite) mode the kernel
//! ignores `aux_tail` and keeps writing: the newest `size` bytes before
//! `head` are what is there ([`snapshot_range`]).

use std::borrow::Cow;

use super::error::CaptureError;

/// Bytes that may wrap around the end of a ring: one or two slices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RawData<'a> {
    /// Contiguous.
    Single(&'a [u8]),
    /// Wrapped: the first part runs to the end of the buffer, the second
    /// starts at its beginning.
    Split(&'a [u8], &'a [u8]),
}

impl<'a> RawData<'a> {
    /// Total length.
    pub fn len(&self) -> usize {
        match self {
            Self::Single(a) => a.len(),
            Self::Split(a, b) => a.len() + b.len(),
        }
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The two parts (the second empty when contiguous).
    pub fn parts(&self) -> (&'a [u8], &'a [u8]) {
        match *self {
            Self::Single(a) => (a, &[]),
            Self::Split(a, b) => (a, b),
        }
    }

    /// `n` bytes from `at`, borrowed when contiguous, copied when they wrap.
    pub fn get(&self, at: usize, n: usize) -> Option<Cow<'a, [u8]>> {
        let (a, b) = self.parts();
        let end = at.checked_add(n)?;
        if end > self.len() {
            return None;
        }
        if end <= a.len() {
            Some(Cow::Borrowed(&a[at..end]))
        } else if at >= a.len() {
            Some(Cow::Borrowed(&b[at - a.len()..end - a.len()]))
        } else {
            let mut v = a[at..].to_vec();
            v.extend_from_slice(&b[..end - a.len()]);
            Some(Cow::Owned(v))
        }
    }

    /// Appends everything to `out`.
    pub fn copy_into(&self, out: &mut Vec<u8>) {
        let (a, b) = self.parts();
        out.extend_from_slice(a);
        out.extend_from_slice(b);
    }
}

/// The readable `[tail, head)` of a ring of `size` bytes as buffer index
/// ranges: `(start, len)` of the first part, and the length of the part
/// that wrapped to index 0.
pub fn readable_range(size: u64, tail: u64, head: u64) -> Result<((u64, u64), u64), CaptureError> {
    debug_assert!(size.is_power_of_two());
    let behind = head.wrapping_sub(tail);
    if behind > size {
        return Err(CaptureError::Overrun {
            head,
            tail,
            behind,
            size,
        });
    }
    let start = tail & (size - 1);
    let first = behind.min(size - start);
    Ok(((start, first), behind - first))
}

/// The readable bytes of `buf` (a whole ring) between `tail` and `head`.
pub fn readable<'a>(buf: &'a [u8], tail: u64, head: u64) -> Result<RawData<'a>, CaptureError> {
    let size = buf.len() as u64;
    if !size.is_power_of_two() {
        return Err(CaptureError::BadOption(format!(
            "ring size {size:#x} is not a power of two"
        )));
    }
    let ((start, first), second) = readable_range(size, tail, head)?;
    let a = &buf[start as usize..(start + first) as usize];
    Ok(if second == 0 {
        RawData::Single(a)
    } else {
        RawData::Split(a, &buf[..second as usize])
    })
}

/// In snapshot mode: the positions `[start, head)` still in a ring of
/// `size` bytes (the newest `size` bytes, or all when fewer were written),
/// and whether older data was overwritten (then the first bytes may be the
/// middle of a packet: a decoder must sync forward).
pub fn snapshot_range(size: u64, head: u64) -> (u64, bool) {
    if head > size {
        (head - size, true)
    } else {
        (0, false)
    }
}

/// One record of the data ring: its bytes (copied only when it wraps).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingRecord<'a> {
    /// The record type.
    pub kind: u32,
    /// The whole record, header included.
    pub bytes: Cow<'a, [u8]>,
}

/// Splits readable data-ring bytes into records. Stops at a record that
/// is not complete yet (the kernel never publishes one, so that is an
/// error in the ring) and reports how many bytes were consumed.
pub fn records<'a>(data: &RawData<'a>) -> (Vec<RingRecord<'a>>, usize, Option<String>) {
    let mut out = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let Some(h) = data.get(at, 8) else {
            return (
                out,
                at,
                Some(format!(
                    "{} stray bytes at the end of the ring",
                    data.len() - at
                )),
            );
        };
        let kind = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
        let size = usize::from(u16::from_le_bytes([h[6], h[7]]));
        if size < 8 {
            return (
                out,
                at,
                Some(format!("record of size {size} at ring offset {at}")),
            );
        }
        let Some(bytes) = data.get(at, size) else {
            return (
                out,
                at,
                Some(format!(
                    "record of size {size} runs past the ring head at {at}"
                )),
            );
        };
        out.push(RingRecord { kind, bytes });
        at += size;
    }
    (out, at, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake ring of 64 bytes the test writes as the kernel would.
    struct FakeRing {
        buf: Vec<u8>,
        head: u64,
    }

    impl FakeRing {
        fn write(&mut self, bytes: &[u8]) {
            let n = self.buf.len() as u64;
            for &b in bytes {
                self.buf[(self.head % n) as usize] = b;
                self.head += 1;
            }
        }
        fn record(&mut self, kind: u32, payload: &[u8]) {
            let size = (8 + payload.len()) as u16;
            let mut r = kind.to_le_bytes().to_vec();
            r.extend_from_slice(&0u16.to_le_bytes());
            r.extend_from_slice(&size.to_le_bytes());
            r.extend_from_slice(payload);
            self.write(&r);
        }
    }

    #[test]
    fn wrapped_record_reads_whole() {
        let mut ring = FakeRing {
            buf: vec![0; 64],
            head: 0,
        };
        let mut tail = 0;
        // 40 bytes, consumed; then a 32-byte record that wraps at 64.
        ring.record(3, &[1; 32]);
        let data = readable(&ring.buf, tail, ring.head).unwrap();
        let (recs, used, err) = records(&data);
        assert_eq!((recs.len(), used, err), (1, 40, None));
        assert!(matches!(recs[0].bytes, Cow::Borrowed(_)));
        tail += used as u64;
        ring.record(10, &[2; 24]);
        let data = readable(&ring.buf, tail, ring.head).unwrap();
        assert!(matches!(data, RawData::Split(a, b) if a.len() == 24 && b.len() == 8));
        let (recs, used, err) = records(&data);
        assert_eq!((used, err), (32, None));
        assert_eq!(recs[0].kind, 10);
        assert!(
            matches!(recs[0].bytes, Cow::Owned(_)),
            "a wrapped record is copied"
        );
        assert_eq!(&recs[0].bytes[8..], &[2; 24]);
    }

    #[test]
    fn overrun_and_partial_records_are_reported() {
        let mut ring = FakeRing {
            buf: vec![0; 64],
            head: 0,
        };
        ring.write(&[0; 100]);
        let e = readable(&ring.buf, 0, ring.head).unwrap_err();
        assert!(
            matches!(
                e,
                CaptureError::Overrun {
                    behind: 100,
                    size: 64,
                    ..
                }
            ),
            "{e}"
        );
        // Head in the middle of a record.
        let mut ring = FakeRing {
            buf: vec![0; 64],
            head: 0,
        };
        ring.record(3, &[0; 16]);
        let data = readable(&ring.buf, 0, 12).unwrap();
        let (recs, used, err) = records(&data);
        assert!(recs.is_empty() && used == 0);
        assert!(err.unwrap().contains("past the ring head"));
        assert!(readable(&[0u8; 48], 0, 1).is_err(), "not a power of two");
    }

    #[test]
    fn range_arithmetic() {
        assert_eq!(readable_range(4096, 0, 0).unwrap(), ((0, 0), 0));
        assert_eq!(readable_range(4096, 4000, 4200).unwrap(), ((4000, 96), 104));
        // Positions past 2^64 wrap like the kernel's u64 counters.
        assert_eq!(
            readable_range(4096, u64::MAX - 15, 16).unwrap(),
            ((4080, 16), 16)
        );
        assert_eq!(snapshot_range(4096, 100), (0, false));
        assert_eq!(snapshot_range(4096, 10_000), (10_000 - 4096, true));
        let buf: Vec<u8> = (0..16).collect();
        let d = readable(&buf, 14, 18).unwrap();
        assert_eq!(d.get(1, 2).unwrap().as_ref(), &[15, 0]);
        let mut all = Vec::new();
        d.copy_into(&mut all);
        assert_eq!(all, [14, 15, 0, 1]);
    }
}
