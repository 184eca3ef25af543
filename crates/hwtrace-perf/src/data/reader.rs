//! [`PerfData`]: a perf.data file (or pipe stream) over borrowed bytes, and
//! [`Records`], the iterator over its data section.
//!
//! # Compressed records and borrowing
//!
//! Every record [`Records`] yields as an [`Iterator`] borrows the input
//! (`'a`), so callers may keep them. The records inside a
//! `PERF_RECORD_COMPRESSED` (`perf record -z`) exist only in a
//! decompression buffer that is reused for the next ones: keeping memory
//! bounded and not copying each record means they can only be lent until
//! the next call. So there are two ways to walk a file:
//!
//! * the iterator ([`Records::next_record`]) yields the COMPRESSED record
//!   itself ([`PerfRecord::Compressed`]) and not what is inside;
//! * [`Records::next_expanded`] yields the same records and, after each
//!   COMPRESSED one, the records inside it, as [`Expanded::Decompressed`]
//!   borrowing the buffer (the others come as [`Expanded::File`], still
//!   borrowing the input for `'a`). Pulling records out one call at a time
//!   is what lets the buffer be reused: it is a lending iterator.

use super::attr::{Attr, sample};
use std::collections::HashMap;

use super::auxtrace::{
    AUXTRACE, AUXTRACE_INFO, AUXTRACE_RECORD_SIZE, Auxtrace, AuxtraceInfo, parse_auxtrace_fixed,
};
use super::bytes::{le64, le64_at};
use super::compressed::{
    COMP_ZSTD, COMPRESSED, COMPRESSED2, Compressed, Inflate, parse_compressed,
};
use super::error::{Error, ErrorKind, FileOffset};
use super::header::{
    EventAttr, Features, FileHeader, FileSection, parse_attrs, parse_file_header, section_bytes,
};
use super::sample::{Sample, parse_sample, sample_record_id};
use crate::pevent::record::{self as pev, HEADER_SIZE, Header, parse_header, record_type};
use crate::pevent::{Record, SidebandOffset};

/// User-space record types perf writes (`enum perf_user_event_type`).
pub mod user_type {
    /// `PERF_RECORD_HEADER_ATTR` (pipe mode).
    pub const HEADER_ATTR: u32 = 64;
    /// `PERF_RECORD_FINISHED_ROUND`.
    pub const FINISHED_ROUND: u32 = 68;
    /// `PERF_RECORD_ID_INDEX`.
    pub const ID_INDEX: u32 = 69;
    /// `PERF_RECORD_AUXTRACE_INFO`.
    pub const AUXTRACE_INFO: u32 = super::AUXTRACE_INFO;
    /// `PERF_RECORD_AUXTRACE`.
    pub const AUXTRACE: u32 = super::AUXTRACE;
    /// `PERF_RECORD_AUXTRACE_ERROR`.
    pub const AUXTRACE_ERROR: u32 = 72;
    /// `PERF_RECORD_THREAD_MAP`.
    pub const THREAD_MAP: u32 = 73;
    /// `PERF_RECORD_CPU_MAP`.
    pub const CPU_MAP: u32 = 74;
    /// `PERF_RECORD_TIME_CONV`.
    pub const TIME_CONV: u32 = 79;
    /// `PERF_RECORD_HEADER_FEATURE` (pipe mode).
    pub const HEADER_FEATURE: u32 = 80;
    /// `PERF_RECORD_FINISHED_INIT`.
    pub const FINISHED_INIT: u32 = 82;
}

/// A record's name as `perf report -D` prints it.
pub fn record_type_name(t: u32) -> &'static str {
    match t {
        1 => "MMAP",
        2 => "LOST",
        3 => "COMM",
        4 => "EXIT",
        5 => "THROTTLE",
        6 => "UNTHROTTLE",
        7 => "FORK",
        8 => "READ",
        9 => "SAMPLE",
        10 => "MMAP2",
        11 => "AUX",
        12 => "ITRACE_START",
        13 => "LOST_SAMPLES",
        14 => "SWITCH",
        15 => "SWITCH_CPU_WIDE",
        16 => "NAMESPACES",
        17 => "KSYMBOL",
        18 => "BPF_EVENT",
        19 => "CGROUP",
        20 => "TEXT_POKE",
        21 => "AUX_OUTPUT_HW_ID",
        64 => "ATTR",
        65 => "EVENT_TYPE",
        66 => "TRACING_DATA",
        67 => "BUILD_ID",
        68 => "FINISHED_ROUND",
        69 => "ID_INDEX",
        70 => "AUXTRACE_INFO",
        71 => "AUXTRACE",
        72 => "AUXTRACE_ERROR",
        73 => "THREAD_MAP",
        74 => "CPU_MAP",
        75 => "STAT_CONFIG",
        76 => "STAT",
        77 => "STAT_ROUND",
        78 => "EVENT_UPDATE",
        79 => "TIME_CONV",
        80 => "FEATURE",
        81 => "COMPRESSED",
        82 => "FINISHED_INIT",
        83 => "COMPRESSED2",
        _ => "UNKNOWN",
    }
}

/// What one record of the data section is.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PerfRecord<'a> {
    /// A kernel record other than SAMPLE (MMAP, MMAP2, COMM, FORK, EXIT,
    /// AUX, ITRACE_START, SWITCH, SWITCH_CPU_WIDE, LOST, ...), parsed with
    /// its `sample_id` trailer by [`crate::pevent::parse_record`].
    Event(Record<'a>),
    /// `PERF_RECORD_SAMPLE`, parsed as its event's attribute says.
    Sample {
        /// The index of the event in [`Records::attrs`], when known.
        attr_index: Option<usize>,
        /// The fields.
        sample: Sample<'a>,
    },
    /// `PERF_RECORD_AUXTRACE_INFO`.
    AuxtraceInfo(AuxtraceInfo<'a>),
    /// `PERF_RECORD_AUXTRACE` with its payload (borrowed).
    Auxtrace(Auxtrace<'a>),
    /// `PERF_RECORD_HEADER_ATTR` (pipe mode); the event was added to
    /// [`Records::attrs`] at this index.
    HeaderAttr(usize),
    /// `PERF_RECORD_FINISHED_ROUND`.
    FinishedRound,
    /// `PERF_RECORD_COMPRESSED` or `COMPRESSED2`: zstd-compressed records
    /// ([`Records::next_expanded`] yields what is inside).
    Compressed(Compressed<'a>),
    /// Any other user-space record, raw (body after the header).
    User {
        /// The record type.
        kind: u32,
        /// The body.
        body: &'a [u8],
    },
}

/// One record and where it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordItem<'a> {
    /// The record's file offset (for a record inside a COMPRESSED record,
    /// the COMPRESSED record's offset, as `perf report -D` prints it).
    pub offset: FileOffset,
    /// Its header.
    pub header: Header,
    /// What it is.
    pub record: PerfRecord<'a>,
}

/// A record of [`Records::next_expanded`]: one of the input itself, or one
/// from inside a COMPRESSED record, lent from the decompression buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expanded<'a, 'b> {
    /// A record of the data section (borrowing the input).
    File(RecordItem<'a>),
    /// A record decompressed from the COMPRESSED record at `item.offset`.
    Decompressed {
        /// The record.
        item: RecordItem<'b>,
        /// Where it starts in the decompressed stream (every COMPRESSED
        /// record of the file, decoded and concatenated).
        stream_offset: u64,
    },
}

impl<'a: 'b, 'b> Expanded<'a, 'b> {
    /// The record, wherever it came from.
    pub fn item(&self) -> &RecordItem<'b> {
        match self {
            Expanded::File(i) => i,
            Expanded::Decompressed { item, .. } => item,
        }
    }

    /// Whether it came out of a COMPRESSED record.
    pub fn is_decompressed(&self) -> bool {
        matches!(self, Expanded::Decompressed { .. })
    }
}

/// A perf.data file over borrowed bytes (typically a memory map): nothing
/// is copied except the attribute table.
#[derive(Clone, Debug)]
pub struct PerfData<'a> {
    bytes: &'a [u8],
    /// The header.
    pub header: FileHeader,
    /// The events (file mode; pipe mode learns them while reading).
    pub attrs: Vec<EventAttr>,
    /// The feature sections.
    pub features: Features<'a>,
}

impl<'a> PerfData<'a> {
    /// Parses the header, attributes and features.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, Error> {
        let header = parse_file_header(bytes)?;
        if !header.is_pipe() {
            section_bytes(bytes, header.data, "data")?;
        }
        let attrs = if header.is_pipe() {
            Vec::new()
        } else {
            parse_attrs(bytes, &header)?
        };
        let features = Features::parse(bytes, &header)?;
        Ok(Self {
            bytes,
            header,
            attrs,
            features,
        })
    }

    /// The whole input.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The feature sections: the file's, or in a pipe stream those its
    /// HEADER_FEATURE records brought, as far as `records` has read.
    pub fn features_after<'r>(&'r self, records: &'r Records<'a>) -> &'r Features<'a> {
        if self.header.is_pipe() {
            records.pipe_features()
        } else {
            &self.features
        }
    }

    /// Iterates over the data section's records.
    pub fn records(&self) -> Records<'a> {
        let FileSection { offset, size } = self.header.data;
        let start = offset.min(self.bytes.len() as u64) as usize;
        let end = offset.saturating_add(size).min(self.bytes.len() as u64) as usize;
        let mut r = Records::new(
            self.bytes,
            start,
            end,
            self.attrs.clone(),
            self.header.is_pipe(),
        );
        r.parser.compression = self.features.compressed;
        r
    }
}

/// What record parsing needs to know: the events, and what pipe-mode
/// HEADER_FEATURE records brought.
#[derive(Clone, Debug, Default)]
struct Parser<'a> {
    attrs: Vec<EventAttr>,
    pipe: bool,
    features: Features<'a>,
    /// `HEADER_COMPRESSED`, from the file's features or a pipe's record.
    compression: Option<super::compressed::Compression>,
    /// Sample id → the first event that has it: a lookup per SAMPLE
    /// record must not walk every id of every event (a file may have
    /// thousands of events, one per CPU and thread).
    by_id: HashMap<u64, usize>,
    /// Whether every event has the same `sample_type`.
    uniform_sample_type: bool,
    /// The `sample_type` of the events with `sample_id_all`: `Some` of
    /// the first one's, and whether they all agree.
    trailer: Option<(u64, bool)>,
}

impl Parser<'_> {
    fn new(attrs: Vec<EventAttr>, pipe: bool) -> Self {
        let mut p = Parser {
            pipe,
            uniform_sample_type: true,
            ..Parser::default()
        };
        for a in attrs {
            p.add_attr(a);
        }
        p
    }

    /// Adds an event, keeping the lookups current.
    fn add_attr(&mut self, a: EventAttr) {
        let index = self.attrs.len();
        for &id in &a.ids {
            self.by_id.entry(id).or_insert(index);
        }
        if let Some(first) = self.attrs.first() {
            self.uniform_sample_type &= first.attr.sample_type == a.attr.sample_type;
        }
        if a.attr.sample_id_all() {
            let st = a.attr.sample_type;
            self.trailer = Some(match self.trailer {
                None => (st, true),
                Some((first, same)) => (first, same && first == st),
            });
        }
        self.attrs.push(a);
    }

    fn attr_index_for_id(&self, id: u64) -> Option<usize> {
        self.by_id.get(&id).copied()
    }

    /// The attribute that describes a SAMPLE record (`raw` with header).
    fn sample_attr(&self, raw: &[u8]) -> Option<usize> {
        match self.attrs.len() {
            0 => None,
            1 => Some(0),
            _ => {
                let st = self.attrs[0].attr.sample_type;
                let st = if self.uniform_sample_type {
                    st
                } else {
                    st & sample::IDENTIFIER
                };
                sample_record_id(raw, st)
                    .and_then(|id| self.attr_index_for_id(id))
                    .or(Some(0))
            }
        }
    }

    /// The `sample_type` that shapes a non-sample kernel record's trailer.
    fn trailer_type(&self, raw: &[u8]) -> u64 {
        let Some((st, same)) = self.trailer else {
            return 0;
        };
        if same {
            return st;
        }
        // Mixed sample types: perf adds IDENTIFIER, the last word of the record.
        raw.len()
            .checked_sub(8)
            .and_then(|at| le64_at(raw, at))
            .and_then(|id| self.attr_index_for_id(id))
            .map_or(st, |i| self.attrs[i].attr.sample_type)
    }

    /// Parses a record body. `raw` is the record (`header.size` bytes),
    /// `avail` everything from its start to the end of its stream (an
    /// AUXTRACE payload follows the record); `next` is advanced past a
    /// payload. HEADER_FEATURE is the caller's (it borrows the input).
    fn parse_body<'r>(
        &mut self,
        header: Header,
        raw: &'r [u8],
        off: u64,
        avail: &'r [u8],
        next: &mut usize,
    ) -> Result<PerfRecord<'r>, Error> {
        let short = |needed| {
            Error::at(
                off,
                ErrorKind::RecordTooShort {
                    record_type: header.kind,
                    needed,
                    size: header.size,
                },
            )
        };
        match header.kind {
            record_type::SAMPLE => {
                let attr_index = self.sample_attr(raw);
                let attr = attr_index.map_or(Attr::default(), |i| self.attrs[i].attr);
                if attr_index.is_none() && self.pipe {
                    return Err(Error::at(off, ErrorKind::NoAttr));
                }
                let sample = parse_sample(raw, off, &attr)?;
                Ok(PerfRecord::Sample { attr_index, sample })
            }
            1..=63 => {
                let st = self.trailer_type(raw);
                pev::parse_record(raw, SidebandOffset(off), st)
                    .map(PerfRecord::Event)
                    .map_err(|e| Error::at(off, ErrorKind::Record(e.kind)))
            }
            AUXTRACE_INFO => Ok(PerfRecord::AuxtraceInfo(AuxtraceInfo::parse(
                &raw[HEADER_SIZE..],
                off,
            )?)),
            AUXTRACE => {
                if raw.len() < AUXTRACE_RECORD_SIZE {
                    return Err(short(AUXTRACE_RECORD_SIZE));
                }
                let (size, offset, reference, idx, tid, cpu) = parse_auxtrace_fixed(raw, off)?;
                let start = raw.len();
                let left = (avail.len() - start) as u64;
                if size > left {
                    return Err(Error::at(
                        off,
                        ErrorKind::AuxtracePayload {
                            size,
                            available: left,
                        },
                    ));
                }
                let data = &avail[start..start + size as usize];
                *next += size as usize;
                Ok(PerfRecord::Auxtrace(Auxtrace {
                    size,
                    offset,
                    reference,
                    idx,
                    tid,
                    cpu,
                    data,
                    data_offset: off + start as u64,
                }))
            }
            user_type::HEADER_ATTR => {
                // { header; perf_event_attr attr (attr.size bytes); u64 id[]; }
                let body = &raw[HEADER_SIZE..];
                if body.len() < 8 {
                    return Err(short(HEADER_SIZE + 8));
                }
                let asize = u32::from_le_bytes([body[4], body[5], body[6], body[7]]) as usize;
                let asize = if asize == 0 { 64 } else { asize };
                if asize > body.len() || asize < 64 {
                    return Err(short(HEADER_SIZE + asize.max(64)));
                }
                let attr = Attr::parse(&body[..asize]);
                let ids = body[asize..].chunks_exact(8).map(le64).collect();
                self.add_attr(EventAttr { attr, ids });
                Ok(PerfRecord::HeaderAttr(self.attrs.len() - 1))
            }
            user_type::FINISHED_ROUND => Ok(PerfRecord::FinishedRound),
            COMPRESSED | COMPRESSED2 => {
                parse_compressed(raw, header.kind, off).map(PerfRecord::Compressed)
            }
            _ => Ok(PerfRecord::User {
                kind: header.kind,
                body: &raw[HEADER_SIZE..],
            }),
        }
    }
}

/// The records of a data section, in file order. After an error in a record
/// whose header is sound, iteration goes on with the next record; after a
/// broken header it stops.
#[derive(Debug)]
pub struct Records<'a> {
    bytes: &'a [u8],
    pos: usize,
    end: usize,
    parser: Parser<'a>,
    failed: bool,
    /// The decompression state, once a COMPRESSED record was expanded.
    inflate: Option<Box<Inflate<'a>>>,
}

impl<'a> Records<'a> {
    fn new(bytes: &'a [u8], pos: usize, end: usize, attrs: Vec<EventAttr>, pipe: bool) -> Self {
        Self {
            bytes,
            pos,
            end,
            parser: Parser::new(attrs, pipe),
            failed: false,
            inflate: None,
        }
    }

    /// The events known so far.
    pub fn attrs(&self) -> &[EventAttr] {
        &self.parser.attrs
    }

    /// The features pipe-mode HEADER_FEATURE records brought so far.
    pub fn pipe_features(&self) -> &Features<'a> {
        &self.parser.features
    }

    /// The file offset of the next record.
    pub fn offset(&self) -> FileOffset {
        FileOffset(self.pos as u64)
    }

    /// The event whose ids include `id`.
    pub fn attr_index_for_id(&self, id: u64) -> Option<usize> {
        self.parser.attr_index_for_id(id)
    }

    /// The next record of the data section, `Ok(None)` at the end.
    /// COMPRESSED records come as they are ([`PerfRecord::Compressed`]).
    pub fn next_record(&mut self) -> Result<Option<RecordItem<'a>>, Error> {
        if self.failed || self.pos >= self.end {
            return Ok(None);
        }
        let off = self.pos as u64;
        let avail = &self.bytes[self.pos..self.end];
        let header = match parse_header(avail, SidebandOffset(off)) {
            Ok(h) => h,
            Err(e) => {
                self.failed = true;
                return Err(Error::at(off, ErrorKind::Record(e.kind)));
            }
        };
        let size = usize::from(header.size);
        let raw = &avail[..size];
        let mut next = self.pos + size;
        let result = if header.kind == user_type::HEADER_FEATURE {
            self.header_feature(header, raw, off)
        } else {
            self.parser.parse_body(header, raw, off, avail, &mut next)
        };
        if let Err(e) = &result
            && matches!(e.kind, ErrorKind::AuxtracePayload { .. })
        {
            self.failed = true;
        }
        self.pos = next;
        result.map(|record| {
            Some(RecordItem {
                offset: FileOffset(off),
                header,
                record,
            })
        })
    }

    /// `PERF_RECORD_HEADER_FEATURE`: `{ header; u64 feat_id; data }`,
    /// parsed as a section of the input into [`Records::pipe_features`].
    fn header_feature(
        &mut self,
        header: Header,
        raw: &'a [u8],
        off: u64,
    ) -> Result<PerfRecord<'a>, Error> {
        let body = &raw[HEADER_SIZE..];
        let id = le64_at(body, 0).ok_or(Error::at(
            off,
            ErrorKind::RecordTooShort {
                record_type: header.kind,
                needed: HEADER_SIZE + 8,
                size: header.size,
            },
        ))?;
        let s = FileSection {
            offset: off + 16,
            size: (raw.len() - 16) as u64,
        };
        let features = &mut self.parser.features;
        if let Ok(bit) = u32::try_from(id) {
            if let Err(e) = features.parse_one(self.bytes, bit, s) {
                features.errors.push(e);
            } else if features.compressed.is_some() {
                self.parser.compression = features.compressed;
            }
        }
        Ok(PerfRecord::User {
            kind: header.kind,
            body,
        })
    }

    /// The next record with COMPRESSED records expanded: each COMPRESSED
    /// record comes as it is, then the records inside it, lent from the
    /// decompression buffer until the next call. `Ok(None)` at the end.
    ///
    /// A broken inner record or zstd stream is one error (at the
    /// COMPRESSED record's offset, with the position in the decompressed
    /// stream); the rest of that COMPRESSED record is dropped and the next
    /// one is decoded afresh.
    pub fn next_expanded(&mut self) -> Result<Option<Expanded<'a, '_>>, Error> {
        // First what is left inside the COMPRESSED record being expanded
        // (found without keeping a borrow, then borrowed to return it).
        let found = match self.inflate.as_deref_mut() {
            Some(inf) => inf.next_record()?,
            None => None,
        };
        if let Some((range, stream_offset)) = found {
            let Some(inf) = self.inflate.as_deref() else {
                return Ok(None);
            };
            let record_offset = inf.record_offset();
            let raw = &inf.buf()[range];
            return Self::inner(&mut self.parser, raw, record_offset, stream_offset)
                .map(|item| {
                    Some(Expanded::Decompressed {
                        item,
                        stream_offset,
                    })
                })
                .map_err(|e| Inflate::inner_error(record_offset, stream_offset, e));
        }
        let item = match self.next_record()? {
            Some(item) => item,
            None => {
                return match self.inflate.as_deref_mut().and_then(Inflate::leftover) {
                    Some(e) => Err(e),
                    None => Ok(None),
                };
            }
        };
        if let PerfRecord::Compressed(c) = &item.record {
            match self.parser.compression {
                Some(comp) if comp.kind != COMP_ZSTD => {
                    return Err(Error::at(
                        item.offset.0,
                        ErrorKind::UnsupportedCompression { kind: comp.kind },
                    ));
                }
                _ => {}
            }
            let limit = Inflate::limit_for(self.parser.compression.as_ref());
            self.inflate
                .get_or_insert_with(|| Box::new(Inflate::new()))
                .feed(c.data, item.offset.0, limit);
        }
        Ok(Some(Expanded::File(item)))
    }

    /// Parses one record from inside a COMPRESSED record.
    fn inner<'r>(
        parser: &mut Parser<'a>,
        raw: &'r [u8],
        record_offset: u64,
        stream_offset: u64,
    ) -> Result<RecordItem<'r>, Error> {
        // `raw` is a whole record: Inflate checked its size.
        let header = parse_header(raw, SidebandOffset(stream_offset))
            .map_err(|e| Error::at(record_offset, ErrorKind::Record(e.kind)))?;
        let record = match header.kind {
            AUXTRACE | COMPRESSED | COMPRESSED2 => {
                return Err(Error::at(
                    record_offset,
                    ErrorKind::NotAllowedInCompressed {
                        record_type: header.kind,
                    },
                ));
            }
            // Features inside compressed data are not collected: they
            // would have to borrow the buffer.
            user_type::HEADER_FEATURE => PerfRecord::User {
                kind: header.kind,
                body: &raw[HEADER_SIZE..],
            },
            _ => {
                let mut next = 0;
                parser.parse_body(header, raw, record_offset, raw, &mut next)?
            }
        };
        Ok(RecordItem {
            offset: FileOffset(record_offset),
            header,
            record,
        })
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<RecordItem<'a>, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_record().transpose()
    }
}
