//! The trace output stage: where the packet bytes of [`crate::PtEncoder`]
//! land in memory, as SDM Vol. 3C §33.2.7 “Trace Output” describes it.
//!
//! * **Single-range output** (§33.2.7.1): one contiguous region at
//!   IA32_RTIT_OUTPUT_BASE whose size is given by the mask in
//!   `IA32_RTIT_OUTPUT_MASK_PTRS[31:0]`; the write position
//!   (`OutputOffset`, bits 63:32) wraps at the end of the region, so the
//!   oldest bytes are overwritten.
//! * **ToPA output** (§33.2.7.2): the processor walks a Table of Physical
//!   Addresses. When the current region is full it moves to the next entry;
//!   an END entry links to the next table (possibly back to the first one,
//!   making a ring); a region whose entry has INT raises a PMI once it is
//!   filled (“ToPA PMI”); one whose entry has STOP sets
//!   IA32_RTIT_STATUS.Stopped and clears TriggerEn once it is filled, and
//!   everything after its last byte is lost, “which may mean that a packet is
//!   cut off in the middle” (“ToPA STOP”). After a ToPA stop OUTPUT_BASE
//!   holds the table of the STOP entry, MaskOrTableOffset its index and
//!   OutputOffset the region size.
//!
//! **A consumer that falls behind** ([`Consumer`]): the hardware itself
//! never waits for software. This module models a reader that drains `N`
//! bytes for every `M` bytes the tracer produces, and a tracer that must not
//! overwrite bytes not read yet (a single range or ToPA ring “without wrap
//! allowance”). Real processors then lose packets in their internal buffers
//! and write an OVF packet once space returns (§33.3.8 “Overflow Handling”
//! and the OVF packet, §33.4.2.16), followed by FUP or TIP.PGE, or a PSB+.
//! **Simplification:** this model drops whole packets from the first one
//! that does not fit, and resumes only at the next PSB that fits together
//! with a 2-byte OVF in front of it; the bytes in between are counted as
//! lost ([`Loss`]). A PSB+ is a point where a decoder can start afresh, so
//! the output stays decodable; the real hardware may resume earlier (with
//! a FUP after the OVF) and lose fewer bytes.
//!
//! Region memory is modelled sparsely: each output region's contents
//! ([`RegionContents`]) holds the bytes up to the highest offset written;
//! bytes never written are not represented.

use std::collections::BTreeMap;

use hwtrace_packet::{PacketKind, decode_packet};
use hwtrace_regs::cpuid::{CpuidRegs, PtCaps};
use hwtrace_regs::output::{OutputError as PositionError, SingleRange, TopaPosition};
use hwtrace_regs::rtit::{RtitOutputBase, RtitOutputMaskPtrs, RtitStatus};
use hwtrace_regs::topa::{TopaEntry, TopaError, validate_table};
use hwtrace_types::{PhysAddr, TraceOffset};

/// MAXPHYADDR assumed when checking ToPA tables (the largest the
/// architecture defines, SDM Vol. 3A §4.1.4).
const MAX_PHYS_ADDR: u8 = 52;

/// The OVF packet (SDM Vol. 3C §33.4.2.16): `02 F3`.
const OVF: [u8; 2] = [0x02, 0xF3];

/// One ToPA table in (simulated) physical memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopaTable {
    /// The table's physical base (4 KiB aligned).
    pub base: PhysAddr,
    /// Its entries, from entry 0.
    pub entries: Vec<TopaEntry>,
}

/// Where the trace goes: IA32_RTIT_CTL.ToPA = 0 or 1 with the matching
/// OUTPUT_BASE / OUTPUT_MASK_PTRS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputTarget {
    /// A single contiguous range of `size` bytes (a power of two, 128 B to
    /// 4 GiB) at `base`, aligned to its size (§33.2.7.1).
    SingleRange {
        /// IA32_RTIT_OUTPUT_BASE.
        base: PhysAddr,
        /// Region size: the mask in `OUTPUT_MASK_PTRS[31:0]` plus one.
        size: u64,
    },
    /// ToPA output starting at entry 0 of `tables[0]` (§33.2.7.2); END
    /// entries may link to any of `tables`.
    Topa {
        /// Every table the walk may reach; the first is IA32_RTIT_OUTPUT_BASE.
        tables: Vec<TopaTable>,
    },
}

/// A reader that drains `drain` bytes for every `per` bytes the tracer
/// produces, and whose unread bytes the tracer may not overwrite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Consumer {
    /// Bytes read per period.
    pub drain: u64,
    /// Bytes produced per period (at least 1).
    pub per: u64,
}

/// A PMI raised because a region whose ToPA entry has INT was filled
/// (SDM Vol. 3C §33.2.7.2 “ToPA PMI”).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PmiPoint {
    /// Bytes written to the output when the region became full (the PMI is
    /// raised after the byte at `written - 1`).
    pub written: u64,
    /// The table holding the entry.
    pub table: PhysAddr,
    /// The entry's index in its table.
    pub entry: u32,
    /// The region that was filled.
    pub region: PhysAddr,
}

/// Packets dropped because the consumer had not made room in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loss {
    /// Offset in the encoder's stream of the first dropped byte.
    pub from: TraceOffset,
    /// Bytes of the encoder's stream dropped.
    pub bytes: u64,
    /// Offset in the written stream of the OVF packet that marks the loss,
    /// or `None` when the stream ended before space returned.
    pub ovf_at: Option<TraceOffset>,
}

/// The bytes one output region holds at the end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionContents {
    /// The region's physical base.
    pub base: PhysAddr,
    /// The region's size.
    pub size: u64,
    /// Its bytes from offset 0 up to the highest offset written.
    pub bytes: Vec<u8>,
}

/// What the output stage leaves behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputRun {
    /// Every region written to, in the order first written.
    pub regions: Vec<RegionContents>,
    /// IA32_RTIT_OUTPUT_BASE at the end.
    pub output_base: RtitOutputBase,
    /// IA32_RTIT_OUTPUT_MASK_PTRS at the end.
    pub mask_ptrs: RtitOutputMaskPtrs,
    /// IA32_RTIT_STATUS at the end: TriggerEn unless a ToPA STOP fired,
    /// Stopped if it did, PacketByteCnt the bytes written since the last
    /// PSB (§33.2.7.4). FilterEn and ContextEn depend on the code running
    /// when the register is read, which this stage does not know: left 0.
    pub status: RtitStatus,
    /// PMIs raised, in order.
    pub pmis: Vec<PmiPoint>,
    /// The stream handed to the output stage, in order: the encoder's
    /// bytes with the [`Consumer`]'s losses cut out and OVFs put in (the
    /// encoder's bytes unchanged without a consumer). A reader that keeps
    /// up reads exactly this, up to `written` bytes.
    pub stream: Vec<u8>,
    /// Bytes of `stream` written to memory (less than its length only
    /// after a ToPA STOP).
    pub written: u64,
    /// Bytes of the handed-over stream not written because a ToPA STOP ended
    /// tracing.
    pub lost_after_stop: u64,
    /// Packet losses caused by the [`Consumer`].
    pub losses: Vec<Loss>,
    /// Readback order: `(region index, start, end)` slices, oldest first.
    readback: Vec<(usize, usize, usize)>,
}

impl OutputRun {
    /// The bytes a reader of the buffer gets, oldest first: the whole
    /// written stream if it fits, else the newest bytes contiguous with the
    /// write position (the ring from the write position round to it). For
    /// a ToPA whose END leads back into the middle of the chain, regions
    /// before the ring keep older, non-contiguous bytes and are left out.
    pub fn read_back(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for &(region, start, end) in &self.readback {
            out.extend_from_slice(&self.regions[region].bytes[start..end]);
        }
        out
    }
}

/// Why the output stage failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OutputStageError {
    /// The single range is not valid.
    #[error("single-range output: {0}")]
    SingleRange(PositionError),
    /// A ToPA table is refused as the processor would refuse it.
    #[error("ToPA table {index}: {error}")]
    Table {
        /// Index in [`OutputTarget::Topa::tables`].
        index: usize,
        /// Why.
        error: TopaError,
    },
    /// No ToPA table given.
    #[error("ToPA output needs at least one table")]
    NoTable,
    /// An END entry links to a table that was not given.
    #[error("ToPA END entry links to {table}, which is not one of the tables given")]
    UnknownTable {
        /// The linked table base.
        table: PhysAddr,
    },
    /// The walk ran off a table's end.
    #[error(
        "the ToPA walk reached entry {entry} of the table at {table}, past its last entry: \
         the processor would read whatever follows as entries"
    )]
    PastTableEnd {
        /// The table.
        table: PhysAddr,
        /// The entry index.
        entry: usize,
    },
    /// END entries form a loop with no output region in it.
    #[error("ToPA END entries starting at table {table} loop without reaching an output region")]
    EndLoop {
        /// Where the loop was detected.
        table: PhysAddr,
    },
    /// A ToPA position does not fit the MSR fields.
    #[error("ToPA position: {0}")]
    Position(PositionError),
    /// The consumer's period is zero.
    #[error("consumer period must be at least 1 byte")]
    ZeroPeriod,
    /// The consumer model needs packet boundaries and the stream has a
    /// byte that is not a packet.
    #[error("the trace is not a valid packet stream at offset {offset}: {kind}")]
    NotPackets {
        /// The offset of the bad packet.
        offset: TraceOffset,
        /// What was wrong.
        kind: hwtrace_packet::DecodeErrorKind,
    },
}

/// Writes `stream` (a [`crate::EncodedTrace`]'s bytes) to `target` as the
/// processor would, optionally throttled by a `consumer`.
pub fn write_output(
    stream: &[u8],
    target: &OutputTarget,
    consumer: Option<Consumer>,
) -> Result<OutputRun, OutputStageError> {
    match target {
        OutputTarget::SingleRange { base, size } => {
            let range = SingleRange::new(*base, *size).map_err(OutputStageError::SingleRange)?;
            let (bytes, losses) = throttle(stream, *size, consumer)?;
            Ok(write_single(&bytes, range, losses))
        }
        OutputTarget::Topa { tables } => {
            let ring = TopaRing::walk(tables)?;
            let (bytes, losses) = throttle(stream, ring.capacity(), consumer)?;
            ring.write(&bytes, losses)
        }
    }
}

/// Applies the consumer model: returns the stream the tracer manages to
/// write, with OVFs, and the losses.
fn throttle(
    stream: &[u8],
    capacity: u64,
    consumer: Option<Consumer>,
) -> Result<(Vec<u8>, Vec<Loss>), OutputStageError> {
    let Some(consumer) = consumer else {
        return Ok((stream.to_vec(), Vec::new()));
    };
    if consumer.per == 0 {
        return Err(OutputStageError::ZeroPeriod);
    }
    let mut out = Vec::with_capacity(stream.len());
    let mut losses = Vec::new();
    let mut lost: Option<Loss> = None;
    let mut at = 0usize;
    while at < stream.len() {
        let (packet, len) =
            decode_packet(&stream[at..]).map_err(|kind| OutputStageError::NotPackets {
                offset: TraceOffset(at as u64),
                kind,
            })?;
        // The consumer has drained `drain` bytes per `per` bytes produced
        // so far, never more than was written.
        let drained = (at as u64 / consumer.per).saturating_mul(consumer.drain);
        let unread = (out.len() as u64).saturating_sub(drained);
        let free = capacity.saturating_sub(unread);
        let len64 = len as u64;
        match lost.as_mut() {
            None if len64 <= free => out.extend_from_slice(&stream[at..at + len]),
            None => {
                lost = Some(Loss {
                    from: TraceOffset(at as u64),
                    bytes: len64,
                    ovf_at: None,
                });
            }
            Some(loss) => {
                if packet.kind() == PacketKind::Psb && len64 + OVF.len() as u64 <= free {
                    loss.ovf_at = Some(TraceOffset(out.len() as u64));
                    losses.push(*loss);
                    lost = None;
                    out.extend_from_slice(&OVF);
                    out.extend_from_slice(&stream[at..at + len]);
                } else {
                    loss.bytes += len64;
                }
            }
        }
        at += len;
    }
    losses.extend(lost);
    Ok((out, losses))
}

/// PacketByteCnt (`IA32_RTIT_STATUS[48:32]`, 17 bits): bytes since the last
/// PSB of what was written.
fn packet_byte_count(written: &[u8]) -> u64 {
    let since = match hwtrace_packet::find_psb_backward(written, written.len()) {
        Some(psb) => written.len() - psb,
        None => written.len(),
    };
    (since as u64) & 0x1_FFFF
}

/// IA32_RTIT_STATUS after the run (§33.2.7.4): TriggerEn set unless a ToPA
/// STOP cleared it, Stopped if it did, PacketByteCnt as given (already
/// 17 bits wide).
fn final_status(stopped: bool, packet_byte_cnt: u64) -> RtitStatus {
    let flags = RtitStatus::new()
        .with_trigger_en(!stopped)
        .with_stopped(stopped);
    RtitStatus::from_raw(flags.raw() | ((packet_byte_cnt & 0x1_FFFF) << 32))
}

fn write_single(bytes: &[u8], range: SingleRange, losses: Vec<Loss>) -> OutputRun {
    let size = range.size() as usize;
    let mut memory = Vec::new();
    // Only the last `size` bytes survive; write them where they land, in
    // at most two pieces: up to the end of the range, then from its start.
    let skip = bytes.len().saturating_sub(size);
    let offset = (range.offset() as usize + skip) % size;
    let (tail, head) = bytes[skip..].split_at((size - offset).min(bytes.len() - skip));
    for (at, piece) in [(offset, tail), (0, head)] {
        if piece.is_empty() {
            continue;
        }
        if memory.len() < at + piece.len() {
            memory.resize(at + piece.len(), 0);
        }
        memory[at..at + piece.len()].copy_from_slice(piece);
    }
    let end = range.advance(bytes.len() as u64);
    let readback = if bytes.len() <= size {
        vec![(0, 0, bytes.len())]
    } else {
        let pos = end.offset() as usize;
        vec![(0, pos, size), (0, 0, pos)]
    };
    OutputRun {
        regions: vec![RegionContents {
            base: range.base(),
            size: range.size(),
            bytes: memory,
        }],
        output_base: end.output_base(),
        mask_ptrs: end.mask_ptrs(),
        status: final_status(false, packet_byte_count(bytes)),
        pmis: Vec::new(),
        stream: bytes.to_vec(),
        written: bytes.len() as u64,
        lost_after_stop: 0,
        losses,
        readback,
    }
}

/// One output entry as the walk meets it.
#[derive(Debug, Clone, Copy)]
struct Slot {
    table: PhysAddr,
    entry: u32,
    region: PhysAddr,
    size: u64,
    int: bool,
    stop: bool,
}

/// The output entries in walk order from entry 0 of the first table, up to
/// a STOP or to where the walk comes back to an entry already seen.
struct TopaRing {
    slots: Vec<Slot>,
    /// Where the walk continues after the last slot (`None`: it stopped).
    loop_to: Option<usize>,
}

impl TopaRing {
    fn walk(tables: &[TopaTable]) -> Result<Self, OutputStageError> {
        let first = tables.first().ok_or(OutputStageError::NoTable)?;
        let caps = PtCaps {
            sub0: CpuidRegs {
                eax: 0,
                ebx: 0,
                ecx: 0b11,
                edx: 0,
            },
            sub1: CpuidRegs::default(),
        };
        let mut by_base = BTreeMap::new();
        for (index, t) in tables.iter().enumerate() {
            validate_table(t.base, &t.entries, &caps, MAX_PHYS_ADDR)
                .map_err(|error| OutputStageError::Table { index, error })?;
            by_base.insert(t.base.0, t);
        }
        let mut slots: Vec<Slot> = Vec::new();
        let mut seen: BTreeMap<(u64, u32), usize> = BTreeMap::new();
        let (mut table, mut entry) = (first, 0usize);
        let mut ends_in_a_row = 0usize;
        loop {
            let e = *table
                .entries
                .get(entry)
                .ok_or(OutputStageError::PastTableEnd {
                    table: table.base,
                    entry,
                })?;
            if e.end() {
                ends_in_a_row += 1;
                if ends_in_a_row > tables.len() {
                    return Err(OutputStageError::EndLoop { table: table.base });
                }
                table = by_base
                    .get(&e.base().0)
                    .ok_or(OutputStageError::UnknownTable { table: e.base() })?;
                entry = 0;
                continue;
            }
            ends_in_a_row = 0;
            let key = (table.base.0, entry as u32);
            if let Some(&index) = seen.get(&key) {
                return Ok(Self {
                    slots,
                    loop_to: Some(index),
                });
            }
            seen.insert(key, slots.len());
            slots.push(Slot {
                table: table.base,
                entry: entry as u32,
                region: e.base(),
                size: e.size().bytes(),
                int: e.int(),
                stop: e.stop(),
            });
            if e.stop() {
                return Ok(Self {
                    slots,
                    loop_to: None,
                });
            }
            entry += 1;
        }
    }

    /// Bytes the buffer holds before it wraps (the ring's part when the
    /// walk loops back into the middle of the chain).
    fn capacity(&self) -> u64 {
        let from = self.loop_to.unwrap_or(0);
        self.slots[from..].iter().map(|s| s.size).sum()
    }

    fn write(&self, bytes: &[u8], losses: Vec<Loss>) -> Result<OutputRun, OutputStageError> {
        let mut memory: Vec<RegionContents> = Vec::new();
        let mut region_index: BTreeMap<u64, usize> = BTreeMap::new();
        let mut pmis = Vec::new();
        let mut slot = 0usize;
        let mut offset = 0u64;
        let mut at = 0usize;
        let mut stopped = false;
        let mut wrapped = false;
        while at < bytes.len() {
            let s = self.slots[slot];
            let idx = *region_index.entry(s.region.0).or_insert_with(|| {
                memory.push(RegionContents {
                    base: s.region,
                    size: s.size,
                    bytes: Vec::new(),
                });
                memory.len() - 1
            });
            let n = ((s.size - offset) as usize).min(bytes.len() - at);
            let region = &mut memory[idx].bytes;
            let (lo, hi) = (offset as usize, offset as usize + n);
            if region.len() < hi {
                region.resize(hi, 0);
            }
            region[lo..hi].copy_from_slice(&bytes[at..at + n]);
            at += n;
            offset += n as u64;
            if offset < s.size {
                break;
            }
            // The region is full (§33.2.7.2).
            if s.int {
                pmis.push(PmiPoint {
                    written: at as u64,
                    table: s.table,
                    entry: s.entry,
                    region: s.region,
                });
            }
            if s.stop {
                stopped = true;
                break;
            }
            offset = 0;
            slot += 1;
            if slot == self.slots.len() {
                // Only a loop gets here: a walk without one ends in STOP.
                slot = self.loop_to.unwrap_or(0);
                wrapped = true;
            }
        }
        let written = at;
        let s = self.slots[slot];
        let position = TopaPosition::new(s.table, u64::from(s.entry), offset as u32)
            .map_err(OutputStageError::Position)?;
        let status = final_status(stopped, packet_byte_count(&bytes[..written]));
        let readback = self.readback(&region_index, slot, offset, wrapped);
        Ok(OutputRun {
            regions: memory,
            output_base: position.output_base(),
            mask_ptrs: position.mask_ptrs(),
            status,
            pmis,
            stream: bytes.to_vec(),
            written: written as u64,
            lost_after_stop: (bytes.len() - written) as u64,
            losses,
            readback,
        })
    }

    fn readback(
        &self,
        region_index: &BTreeMap<u64, usize>,
        slot: usize,
        offset: u64,
        wrapped: bool,
    ) -> Vec<(usize, usize, usize)> {
        let index = |s: usize| region_index.get(&self.slots[s].region.0).copied();
        let full = |s: usize| (s, 0usize, self.slots[s].size as usize);
        let mut order: Vec<(usize, usize, usize)> = Vec::new();
        if wrapped {
            let from = self.loop_to.unwrap_or(0);
            let cur = self.slots[slot].size as usize;
            order.push((slot, offset as usize, cur));
            order.extend((slot + 1..self.slots.len()).map(full));
            order.extend((from..slot).map(full));
        } else {
            order.extend((0..slot).map(full));
        }
        order.push((slot, 0, offset as usize));
        order
            .into_iter()
            .filter(|&(_, a, b)| a < b)
            .filter_map(|(s, a, b)| index(s).map(|r| (r, a, b)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hwtrace_regs::topa::TopaSize;

    fn psb_stream(chunks: usize, filler: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for _ in 0..chunks {
            out.extend_from_slice(&hwtrace_packet::PSB);
            out.extend_from_slice(&[0x02, 0x23]); // PSBEND
            out.extend(std::iter::repeat_n(0u8, filler)); // PADs
        }
        out
    }

    #[test]
    fn single_range_wraps_and_keeps_the_newest_bytes() {
        let stream: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
        let run = write_output(
            &stream,
            &OutputTarget::SingleRange {
                base: PhysAddr(0x1000),
                size: 128,
            },
            None,
        )
        .expect("valid range");
        assert_eq!(run.read_back(), stream[300 - 128..].to_vec());
        assert_eq!(run.mask_ptrs.output_offset(), 300 % 128);
        assert_eq!(run.mask_ptrs.raw() & 0xFFFF_FFFF, 127);
    }

    fn chain(links: &[(u64, u64)]) -> Vec<TopaTable> {
        let mut tables = vec![TopaTable {
            base: PhysAddr(0x1000),
            entries: vec![
                TopaEntry::output(PhysAddr(0x10_0000), TopaSize::SIZE_4K, false, false),
                TopaEntry::end_link(PhysAddr(links[0].0)),
            ],
        }];
        tables.extend(links.iter().map(|&(base, next)| TopaTable {
            base: PhysAddr(base),
            entries: vec![TopaEntry::end_link(PhysAddr(next))],
        }));
        tables
    }

    #[test]
    fn topa_end_links_must_reach_known_tables_and_output() {
        let unknown = write_output(
            &[0u8; 16],
            &OutputTarget::Topa {
                tables: chain(&[(0x2000, 0x3000)]),
            },
            None,
        );
        assert_eq!(
            unknown.unwrap_err(),
            OutputStageError::UnknownTable {
                table: PhysAddr(0x3000)
            }
        );
        let looping = write_output(
            &[0u8; 16],
            &OutputTarget::Topa {
                tables: chain(&[(0x2000, 0x3000), (0x3000, 0x2000)]),
            },
            None,
        );
        assert!(matches!(looping, Err(OutputStageError::EndLoop { .. })));
    }

    /// END entries that lead back into the middle of the chain: the first
    /// region is written once, then the ring of the other two wraps
    /// (§33.2.7.2); read back gives the ring's newest bytes.
    #[test]
    fn topa_ring_entered_after_a_lead_in_region() {
        let (a, b) = (PhysAddr(0x1000), PhysAddr(0x2000));
        let region = |base| TopaEntry::output(PhysAddr(base), TopaSize::SIZE_4K, false, false);
        let tables = vec![
            TopaTable {
                base: a,
                entries: vec![region(0x10_0000), TopaEntry::end_link(b)],
            },
            TopaTable {
                base: b,
                entries: vec![
                    TopaEntry::output(PhysAddr(0x20_0000), TopaSize::SIZE_4K, true, false),
                    region(0x30_0000),
                    TopaEntry::end_link(b),
                ],
            },
        ];
        let stream: Vec<u8> = (0..5 * 4096 + 100u32).map(|i| (i / 7) as u8).collect();
        let run = write_output(&stream, &OutputTarget::Topa { tables }, None).expect("valid");
        assert_eq!(run.regions[0].base, PhysAddr(0x10_0000));
        assert_eq!(run.regions[0].bytes, stream[..4096].to_vec());
        let newest = stream.len() - 2 * 4096;
        assert_eq!(run.read_back(), stream[newest..].to_vec());
        // The INT region filled after bytes 8 KiB and 16 KiB.
        let pmis: Vec<u64> = run.pmis.iter().map(|p| p.written).collect();
        assert_eq!(pmis, [2 * 4096, 4 * 4096]);
        assert_eq!(run.output_base.base_phys_addr(), b.0);
        assert_eq!(run.mask_ptrs.mask_or_table_offset(), 0);
        assert_eq!(run.mask_ptrs.output_offset(), 100);
    }

    #[test]
    fn single_range_reads_back_short_and_wrapped_streams() {
        let stream: Vec<u8> = (0..100u8).collect();
        let run = write_output(
            &stream,
            &OutputTarget::SingleRange {
                base: PhysAddr(0x8000),
                size: 128,
            },
            None,
        )
        .expect("valid");
        assert_eq!(run.read_back(), stream);
        let twice: Vec<u8> = (0..=255u8).chain(0..40).collect();
        let run = write_output(
            &twice,
            &OutputTarget::SingleRange {
                base: PhysAddr(0x8000),
                size: 128,
            },
            None,
        )
        .expect("valid");
        assert_eq!(run.read_back(), twice[twice.len() - 128..].to_vec());
        assert_eq!(run.regions[0].bytes[..40], twice[256..]);
        assert_eq!(run.mask_ptrs.output_offset(), 40);
    }

    #[test]
    fn consumer_losses_end_with_ovf_before_a_psb() {
        let stream = psb_stream(8, 100);
        let (out, losses) = throttle(
            &stream,
            128,
            Some(Consumer {
                drain: 10,
                per: 100,
            }),
        )
        .expect("packets");
        assert!(!losses.is_empty());
        for loss in losses.iter().filter_map(|l| l.ovf_at) {
            let at = loss.0 as usize;
            assert_eq!(&out[at..at + 2], &OVF);
            assert!(hwtrace_packet::is_psb_at(&out, at + 2));
        }
        let lost: u64 = losses.iter().map(|l| l.bytes).sum();
        let ovfs = losses.iter().filter(|l| l.ovf_at.is_some()).count() as u64;
        assert_eq!(out.len() as u64 + lost, stream.len() as u64 + 2 * ovfs);
    }
}
