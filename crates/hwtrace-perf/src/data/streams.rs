//! AUX stream assembly: the AUXTRACE buffers of each (CPU, thread) queue,
//! in file order, with every gap and loss said with where and how much.
//!
//! Each AUXTRACE record carries `offset`, the position of its payload in the
//! AUX area's endless byte stream. Consecutive buffers of one queue follow
//! each other when `offset + size` of one is the next one's `offset`; a
//! larger next offset means the bytes in between were lost (the AUX area was
//! full); a smaller one means a restart (snapshot mode takes overlapping
//! windows). AUX records with the TRUNCATED flag and LOST records are
//! collected too. Nothing is copied: chunks borrow the file.

use std::collections::BTreeMap;
use std::io::{self, Write};

use super::error::{Error, FileOffset};
use super::reader::{Expanded, PerfData, PerfRecord, RecordItem};
use crate::pevent::record::Body;

/// A queue: `cpu` for per-CPU AUX areas, `tid` for per-thread ones
/// (`u32::MAX` stands for perf's -1, "any").
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueueKey {
    /// The CPU (`u32::MAX` for per-thread areas).
    pub cpu: u32,
    /// The thread (`u32::MAX` for per-CPU areas).
    pub tid: u32,
}

impl core::fmt::Display for QueueKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let show = |v: u32| {
            if v == u32::MAX {
                "-1".to_string()
            } else {
                v.to_string()
            }
        };
        write!(f, "cpu {} tid {}", show(self.cpu), show(self.tid))
    }
}

/// One AUXTRACE buffer of a queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuxChunk<'a> {
    /// The AUXTRACE record's file offset.
    pub record_offset: FileOffset,
    /// Its position in the AUX area's stream.
    pub aux_offset: u64,
    /// Where it starts in the assembled stream of the queue.
    pub stream_offset: u64,
    /// The payload.
    pub data: &'a [u8],
}

/// A discontinuity between two buffers of a queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuxGap {
    /// Where in the assembled stream the discontinuity is.
    pub stream_offset: u64,
    /// The file offset of the AUXTRACE record after it.
    pub record_offset: FileOffset,
    /// Where the AUX stream should have continued.
    pub expected_aux_offset: u64,
    /// Where it continued.
    pub found_aux_offset: u64,
}

impl AuxGap {
    /// Bytes lost (0 for a restart/overlap).
    pub fn lost_bytes(&self) -> u64 {
        self.found_aux_offset
            .saturating_sub(self.expected_aux_offset)
    }
}

/// One queue's stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuxQueue<'a> {
    /// The buffers in file order.
    pub chunks: Vec<AuxChunk<'a>>,
    /// The discontinuities between them.
    pub gaps: Vec<AuxGap>,
}

impl AuxQueue<'_> {
    /// The assembled stream's length.
    pub fn len(&self) -> u64 {
        self.chunks.iter().map(|c| c.data.len() as u64).sum()
    }

    /// Whether the queue holds no data.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Writes the assembled stream, one chunk at a time.
    pub fn write_to(&self, w: &mut dyn Write) -> io::Result<()> {
        self.chunks.iter().try_for_each(|c| w.write_all(c.data))
    }
}

/// An AUX record with the TRUNCATED flag: the hardware lost data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuxLoss {
    /// The AUX record's file offset.
    pub record_offset: FileOffset,
    /// The CPU/thread it came from, if its `sample_id` says.
    pub cpu: Option<u32>,
    /// The thread, if its `sample_id` says.
    pub tid: Option<u32>,
    /// `aux_offset`.
    pub aux_offset: u64,
    /// `aux_size`.
    pub aux_size: u64,
    /// `flags`.
    pub flags: u64,
}

/// Every AUX queue of a file, plus what was lost.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuxStreams<'a> {
    /// The queues.
    pub queues: BTreeMap<QueueKey, AuxQueue<'a>>,
    /// AUX records flagged TRUNCATED (or with a partial sample).
    pub aux_losses: Vec<AuxLoss>,
    /// LOST records: (file offset, events lost).
    pub lost_records: Vec<(FileOffset, u64)>,
    /// Records that failed to parse (iteration continued past them).
    pub errors: Vec<Error>,
}

impl<'a> AuxStreams<'a> {
    /// Walks the data section once and assembles the queues. Records
    /// inside COMPRESSED records (`perf record -z` compresses the AUX and
    /// LOST records with the rest of the ring buffer; AUXTRACE payloads are
    /// never compressed) are looked at too.
    pub fn collect(data: &PerfData<'a>) -> Self {
        let mut s = AuxStreams::default();
        let mut expected: BTreeMap<QueueKey, u64> = BTreeMap::new();
        // Each queue's length so far: summing its chunks per record would
        // be quadratic in the number of AUXTRACE records.
        let mut lengths: BTreeMap<QueueKey, u64> = BTreeMap::new();
        let mut records = data.records();
        while let Some(item) = records.next_expanded().transpose() {
            let item = match item {
                Ok(Expanded::File(i)) => i,
                Ok(Expanded::Decompressed { item, .. }) => {
                    s.note_loss(&item);
                    continue;
                }
                Err(e) => {
                    s.errors.push(e);
                    continue;
                }
            };
            if let PerfRecord::Auxtrace(a) = item.record {
                let key = QueueKey {
                    cpu: a.cpu,
                    tid: a.tid,
                };
                let q = s.queues.entry(key).or_default();
                let len = lengths.entry(key).or_default();
                let stream_offset = *len;
                *len += a.data.len() as u64;
                if let Some(&exp) = expected.get(&key)
                    && exp != a.offset
                {
                    q.gaps.push(AuxGap {
                        stream_offset,
                        record_offset: item.offset,
                        expected_aux_offset: exp,
                        found_aux_offset: a.offset,
                    });
                }
                expected.insert(key, a.offset.wrapping_add(a.size));
                q.chunks.push(AuxChunk {
                    record_offset: item.offset,
                    aux_offset: a.offset,
                    stream_offset,
                    data: a.data,
                });
            } else {
                s.note_loss(&item);
            }
        }
        s
    }

    /// Collects a truncated/partial AUX record or a LOST record.
    fn note_loss(&mut self, item: &RecordItem<'_>) {
        let PerfRecord::Event(r) = &item.record else {
            return;
        };
        match r.body {
            Body::Aux(aux) if aux.truncated() || aux.partial() => self.aux_losses.push(AuxLoss {
                record_offset: item.offset,
                cpu: r.sample.cpu,
                tid: r.sample.pid_tid.map(|(_, t)| t),
                aux_offset: aux.aux_offset,
                aux_size: aux.aux_size,
                flags: aux.flags,
            }),
            Body::Lost(l) => self.lost_records.push((item.offset, l.lost)),
            _ => {}
        }
    }

    /// The queue for `cpu` (per-CPU recording) or, failing that, the
    /// per-thread queue of `tid`.
    pub fn find(&self, cpu: Option<u32>, tid: Option<u32>) -> Option<(&QueueKey, &AuxQueue<'a>)> {
        self.queues
            .iter()
            .find(|(k, _)| cpu.is_none_or(|c| k.cpu == c) && tid.is_none_or(|t| k.tid == t))
    }
}
