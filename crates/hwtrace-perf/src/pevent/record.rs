//! Zero-copy parsing of `perf_event` records.
//!
//! A sideband file, as libipt's tools take it (`--pevent:primary FILE`), is
//! the raw content of perf's ring buffer: records of
//! `struct perf_event_header { u32 type; u16 misc; u16 size; }` followed by a
//! type-specific body and, when the event was opened with
//! `perf_event_attr.sample_id_all`, a `sample_id` trailer whose fields are
//! selected by `perf_event_attr.sample_type` (Linux
//! `include/uapi/linux/perf_event.h`, "struct sample_id"):
//!
//! ```text
//! { u32 pid, tid; }  if PERF_SAMPLE_TID
//! { u64 time;     }  if PERF_SAMPLE_TIME
//! { u64 id;       }  if PERF_SAMPLE_ID
//! { u64 stream_id;}  if PERF_SAMPLE_STREAM_ID
//! { u32 cpu, res; }  if PERF_SAMPLE_CPU
//! { u64 id;       }  if PERF_SAMPLE_IDENTIFIER
//! ```
//!
//! Like libipt-sb (`pev_read`), the trailer is read right after the body and
//! must end exactly at `header.size`; record types libipt-sb does not know are
//! kept raw, without a trailer. Values are little-endian (x86 perf output).

use thiserror::Error;

/// A byte offset into a sideband buffer (from the start of the loaded range,
/// the way libipt prints it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SidebandOffset(pub u64);

impl core::fmt::Display for SidebandOffset {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// `perf_event_header.type` values (`enum perf_event_type`).
pub mod record_type {
    /// `PERF_RECORD_MMAP`.
    pub const MMAP: u32 = 1;
    /// `PERF_RECORD_LOST`.
    pub const LOST: u32 = 2;
    /// `PERF_RECORD_COMM`.
    pub const COMM: u32 = 3;
    /// `PERF_RECORD_EXIT`.
    pub const EXIT: u32 = 4;
    /// `PERF_RECORD_THROTTLE`.
    pub const THROTTLE: u32 = 5;
    /// `PERF_RECORD_UNTHROTTLE`.
    pub const UNTHROTTLE: u32 = 6;
    /// `PERF_RECORD_FORK`.
    pub const FORK: u32 = 7;
    /// `PERF_RECORD_READ` (kept raw).
    pub const READ: u32 = 8;
    /// `PERF_RECORD_SAMPLE` (kept raw).
    pub const SAMPLE: u32 = 9;
    /// `PERF_RECORD_MMAP2`.
    pub const MMAP2: u32 = 10;
    /// `PERF_RECORD_AUX`.
    pub const AUX: u32 = 11;
    /// `PERF_RECORD_ITRACE_START`.
    pub const ITRACE_START: u32 = 12;
    /// `PERF_RECORD_LOST_SAMPLES`.
    pub const LOST_SAMPLES: u32 = 13;
    /// `PERF_RECORD_SWITCH`.
    pub const SWITCH: u32 = 14;
    /// `PERF_RECORD_SWITCH_CPU_WIDE`.
    pub const SWITCH_CPU_WIDE: u32 = 15;
}

/// `perf_event_header.misc` bits.
pub mod misc {
    /// `PERF_RECORD_MISC_CPUMODE_MASK`.
    pub const CPUMODE_MASK: u16 = 7;
    /// `PERF_RECORD_MISC_KERNEL` (a cpumode value).
    pub const KERNEL: u16 = 1;
    /// `PERF_RECORD_MISC_COMM_EXEC` (on COMM records).
    pub const COMM_EXEC: u16 = 1 << 13;
    /// `PERF_RECORD_MISC_SWITCH_OUT` (on SWITCH and SWITCH_CPU_WIDE records).
    pub const SWITCH_OUT: u16 = 1 << 13;
    /// `PERF_RECORD_MISC_MMAP_BUILD_ID` (on MMAP2 records).
    pub const MMAP_BUILD_ID: u16 = 1 << 14;
}

/// `perf_event_attr.sample_type` bits that select `sample_id` fields.
pub mod sample_type {
    /// `PERF_SAMPLE_TID`.
    pub const TID: u64 = 1 << 1;
    /// `PERF_SAMPLE_TIME`.
    pub const TIME: u64 = 1 << 2;
    /// `PERF_SAMPLE_ID`.
    pub const ID: u64 = 1 << 6;
    /// `PERF_SAMPLE_CPU`.
    pub const CPU: u64 = 1 << 7;
    /// `PERF_SAMPLE_STREAM_ID`.
    pub const STREAM_ID: u64 = 1 << 9;
    /// `PERF_SAMPLE_IDENTIFIER`.
    pub const IDENTIFIER: u64 = 1 << 16;
}

/// `perf_event_aux.flags` bits.
pub mod aux_flag {
    /// `PERF_AUX_FLAG_TRUNCATED`: the AUX buffer was full, trace was lost.
    pub const TRUNCATED: u64 = 1;
    /// `PERF_AUX_FLAG_OVERWRITE`: snapshot mode, the data was overwritten.
    pub const OVERWRITE: u64 = 2;
    /// `PERF_AUX_FLAG_PARTIAL`: the record covers a partial sample.
    pub const PARTIAL: u64 = 4;
}

/// The size of `struct perf_event_header`.
pub const HEADER_SIZE: usize = 8;

/// `struct perf_event_header`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The record type (see [`record_type`]).
    pub kind: u32,
    /// The misc bits (see [`misc`]).
    pub misc: u16,
    /// The record size in bytes, header included.
    pub size: u16,
}

/// The `sample_id` trailer: each field is present when `sample_type` asked
/// for it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleId {
    /// `PERF_SAMPLE_TID`: pid and tid.
    pub pid_tid: Option<(u32, u32)>,
    /// `PERF_SAMPLE_TIME`: perf time (convert with [`super::time::TimeConversion`]).
    pub time: Option<u64>,
    /// `PERF_SAMPLE_ID`.
    pub id: Option<u64>,
    /// `PERF_SAMPLE_STREAM_ID`.
    pub stream_id: Option<u64>,
    /// `PERF_SAMPLE_CPU` (the reserved half is skipped).
    pub cpu: Option<u32>,
    /// `PERF_SAMPLE_IDENTIFIER`.
    pub identifier: Option<u64>,
}

impl SampleId {
    /// The pid sample, if any.
    pub fn pid(&self) -> Option<u32> {
        self.pid_tid.map(|(pid, _)| pid)
    }
}

/// `PERF_RECORD_MMAP`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mmap<'a> {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Start address of the mapping.
    pub addr: u64,
    /// Length of the mapping.
    pub len: u64,
    /// File offset of the mapping.
    pub pgoff: u64,
    /// The file name, without its NUL terminator.
    pub filename: &'a [u8],
}

/// `PERF_RECORD_MMAP2`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mmap2<'a> {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Start address of the mapping.
    pub addr: u64,
    /// Length of the mapping.
    pub len: u64,
    /// File offset of the mapping.
    pub pgoff: u64,
    /// Device major number (build-id bytes when [`misc::MMAP_BUILD_ID`] is set).
    pub maj: u32,
    /// Device minor number (build-id bytes when [`misc::MMAP_BUILD_ID`] is set).
    pub min: u32,
    /// Inode number (build-id bytes when [`misc::MMAP_BUILD_ID`] is set).
    pub ino: u64,
    /// Inode generation (build-id bytes when [`misc::MMAP_BUILD_ID`] is set).
    pub ino_generation: u64,
    /// Protection bits.
    pub prot: u32,
    /// Mapping flags.
    pub flags: u32,
    /// The 24 bytes that hold either the device fields or the build id.
    pub id_bytes: &'a [u8],
    /// The file name, without its NUL terminator.
    pub filename: &'a [u8],
}

impl<'a> Mmap2<'a> {
    /// The build id, if the record carries one instead of device fields
    /// (`misc` has [`misc::MMAP_BUILD_ID`]): `u8 size; u8 reserved[3]; u8 id[20]`.
    pub fn build_id(&self, misc_bits: u16) -> Option<&'a [u8]> {
        if misc_bits & misc::MMAP_BUILD_ID == 0 {
            return None;
        }
        let size = usize::from(*self.id_bytes.first()?).min(20);
        self.id_bytes.get(4..4 + size)
    }
}

/// `PERF_RECORD_LOST`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lost {
    /// The id of the event that lost records.
    pub id: u64,
    /// How many records were lost.
    pub lost: u64,
}

/// `PERF_RECORD_COMM`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Comm<'a> {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// The command name, without its NUL terminator.
    pub comm: &'a [u8],
}

/// `PERF_RECORD_EXIT` and `PERF_RECORD_FORK`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Task {
    /// Process id.
    pub pid: u32,
    /// Parent process id.
    pub ppid: u32,
    /// Thread id.
    pub tid: u32,
    /// Parent thread id.
    pub ptid: u32,
    /// Perf time of the event.
    pub time: u64,
}

/// `PERF_RECORD_THROTTLE` and `PERF_RECORD_UNTHROTTLE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Throttle {
    /// Perf time of the event.
    pub time: u64,
    /// Event id.
    pub id: u64,
    /// Event stream id.
    pub stream_id: u64,
}

/// `PERF_RECORD_AUX`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Aux {
    /// Offset of the new data in the AUX buffer.
    pub aux_offset: u64,
    /// Size of the new data.
    pub aux_size: u64,
    /// [`aux_flag`] bits.
    pub flags: u64,
}

impl Aux {
    /// Trace was lost because the AUX buffer was full.
    pub fn truncated(&self) -> bool {
        self.flags & aux_flag::TRUNCATED != 0
    }
    /// The data was written in overwrite (snapshot) mode.
    pub fn overwrite(&self) -> bool {
        self.flags & aux_flag::OVERWRITE != 0
    }
    /// The record describes a partial sample.
    pub fn partial(&self) -> bool {
        self.flags & aux_flag::PARTIAL != 0
    }
}

/// `PERF_RECORD_ITRACE_START`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItraceStart {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
}

/// `PERF_RECORD_SWITCH_CPU_WIDE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwitchCpuWide {
    /// The next (switch out) or previous (switch in) process id.
    pub next_prev_pid: u32,
    /// The next (switch out) or previous (switch in) thread id.
    pub next_prev_tid: u32,
}

/// The type-specific part of a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Body<'a> {
    /// `PERF_RECORD_MMAP`.
    Mmap(Mmap<'a>),
    /// `PERF_RECORD_MMAP2`.
    Mmap2(Mmap2<'a>),
    /// `PERF_RECORD_LOST`.
    Lost(Lost),
    /// `PERF_RECORD_COMM` (`.EXEC` when `misc` has [`misc::COMM_EXEC`]).
    Comm(Comm<'a>),
    /// `PERF_RECORD_EXIT`.
    Exit(Task),
    /// `PERF_RECORD_FORK`.
    Fork(Task),
    /// `PERF_RECORD_THROTTLE`.
    Throttle(Throttle),
    /// `PERF_RECORD_UNTHROTTLE`.
    Unthrottle(Throttle),
    /// `PERF_RECORD_AUX`.
    Aux(Aux),
    /// `PERF_RECORD_ITRACE_START`.
    ItraceStart(ItraceStart),
    /// `PERF_RECORD_LOST_SAMPLES`: how many samples were lost.
    LostSamples(u64),
    /// `PERF_RECORD_SWITCH` (out when `misc` has [`misc::SWITCH_OUT`]).
    Switch,
    /// `PERF_RECORD_SWITCH_CPU_WIDE`.
    SwitchCpuWide(SwitchCpuWide),
    /// Any other type: the bytes after the header, uninterpreted.
    Unknown(&'a [u8]),
}

/// One parsed record, borrowing from the sideband buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    /// Where the record starts in the buffer.
    pub offset: SidebandOffset,
    /// The header.
    pub header: Header,
    /// The type-specific fields.
    pub body: Body<'a>,
    /// The `sample_id` trailer (empty for unknown types).
    pub sample: SampleId,
    /// The whole record, header included.
    pub raw: &'a [u8],
}

impl Record<'_> {
    /// `COMM` with [`misc::COMM_EXEC`].
    pub fn is_comm_exec(&self) -> bool {
        matches!(self.body, Body::Comm(_)) && self.header.misc & misc::COMM_EXEC != 0
    }

    /// `SWITCH` or `SWITCH_CPU_WIDE` with [`misc::SWITCH_OUT`].
    pub fn is_switch_out(&self) -> bool {
        matches!(self.body, Body::Switch | Body::SwitchCpuWide(_))
            && self.header.misc & misc::SWITCH_OUT != 0
    }
}

/// What was wrong with a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Fewer than 8 bytes left for a header.
    #[error("truncated record header: {available} of 8 bytes")]
    TruncatedHeader {
        /// Bytes left in the buffer.
        available: usize,
    },
    /// `header.type` is zero (perf never writes it; it marks unused space).
    #[error("record type 0")]
    ZeroType,
    /// `header.size` is smaller than the header itself.
    #[error("record type {record_type}: size {size} is smaller than the header")]
    SizeTooSmall {
        /// The record type.
        record_type: u32,
        /// `header.size`.
        size: u16,
    },
    /// The record extends past the end of the buffer.
    #[error("record type {record_type}: size {size} exceeds the {available} bytes left")]
    SizeTooBig {
        /// The record type.
        record_type: u32,
        /// `header.size`.
        size: u16,
        /// Bytes left in the buffer, header included.
        available: usize,
    },
    /// The fixed fields of the body do not fit into `header.size`.
    #[error("record type {record_type}: body needs {needed} bytes, size is {size}")]
    BodyTooShort {
        /// The record type.
        record_type: u32,
        /// Bytes the header and fixed body fields need.
        needed: usize,
        /// `header.size`.
        size: u16,
    },
    /// A file name or command string has no NUL terminator inside the record.
    #[error("record type {record_type}: unterminated {field} string")]
    BadString {
        /// The record type.
        record_type: u32,
        /// Which string.
        field: &'static str,
    },
    /// Body plus `sample_id` trailer do not add up to `header.size`.
    #[error("record type {record_type}: body and sample_id need {needed} bytes, size is {size}")]
    SampleSizeMismatch {
        /// The record type.
        record_type: u32,
        /// Bytes the header, body and trailer need.
        needed: usize,
        /// `header.size`.
        size: u16,
    },
}

impl ErrorKind {
    /// libipt's `pev_read` reports these as "end of stream" and its session
    /// silently stops reading the channel; the others are reported as
    /// "sideband error"s.
    pub fn is_end_of_stream(&self) -> bool {
        matches!(
            self,
            Self::TruncatedHeader { .. } | Self::ZeroType | Self::SizeTooBig { .. }
        )
    }

    /// The message libipt prints for this error (`pt_errstr` of the error
    /// code `pev_read` returns).
    pub fn libipt_message(&self) -> &'static str {
        match self {
            Self::TruncatedHeader { .. } | Self::ZeroType | Self::SizeTooBig { .. } => {
                "reached end of trace stream"
            }
            Self::BadString { .. } => "unknown packet",
            Self::SizeTooSmall { .. }
            | Self::BodyTooShort { .. }
            | Self::SampleSizeMismatch { .. } => "decoder out of sync",
        }
    }
}

/// A record could not be parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
#[error("sideband offset {offset}: {kind}")]
pub struct Error {
    /// Where the offending record starts.
    pub offset: SidebandOffset,
    /// What was wrong.
    pub kind: ErrorKind,
}

/// Little-endian reads inside one record; every read is bounds-checked.
struct Fields<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.bytes.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }
    fn u32(&mut self) -> Option<u32> {
        let b = self.take(4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Option<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Some(u64::from_le_bytes(a))
    }
    /// A NUL-terminated string padded to 8 bytes; the NUL must lie inside
    /// the record. Returns the string without the NUL, or `None` if
    /// unterminated. A pad running past the record end is left for the size
    /// check to report.
    fn string(&mut self) -> Option<&'a [u8]> {
        let rest = self.bytes.get(self.pos..)?;
        let len = rest.iter().position(|&b| b == 0)?;
        let padded = (len + 1 + 7) & !7;
        self.pos = self.pos.saturating_add(padded);
        Some(&rest[..len])
    }
}

/// Parses the header at the start of `bytes`.
pub fn parse_header(bytes: &[u8], offset: SidebandOffset) -> Result<Header, Error> {
    let err = |kind| Error { offset, kind };
    let h = bytes
        .get(..HEADER_SIZE)
        .ok_or(err(ErrorKind::TruncatedHeader {
            available: bytes.len(),
        }))?;
    let header = Header {
        kind: u32::from_le_bytes([h[0], h[1], h[2], h[3]]),
        misc: u16::from_le_bytes([h[4], h[5]]),
        size: u16::from_le_bytes([h[6], h[7]]),
    };
    if usize::from(header.size) < HEADER_SIZE {
        return Err(err(ErrorKind::SizeTooSmall {
            record_type: header.kind,
            size: header.size,
        }));
    }
    if header.kind == 0 {
        return Err(err(ErrorKind::ZeroType));
    }
    if bytes.len() < usize::from(header.size) {
        return Err(err(ErrorKind::SizeTooBig {
            record_type: header.kind,
            size: header.size,
            available: bytes.len(),
        }));
    }
    Ok(header)
}

/// Parses one record at the start of `bytes` (which may hold more records),
/// reading the trailer fields `sample_type` selects. `offset` is where
/// `bytes` starts in the buffer, for records and errors.
pub fn parse_record(
    bytes: &[u8],
    offset: SidebandOffset,
    sample_type: u64,
) -> Result<Record<'_>, Error> {
    let header = parse_header(bytes, offset)?;
    let raw = &bytes[..usize::from(header.size)];
    let record_type = header.kind;
    let err = |kind| Error { offset, kind };
    let short = |needed| {
        err(ErrorKind::BodyTooShort {
            record_type,
            needed,
            size: header.size,
        })
    };
    let mut f = Fields {
        bytes: raw,
        pos: HEADER_SIZE,
    };
    let bad_string = |field| err(ErrorKind::BadString { record_type, field });

    use self::record_type as t;
    let body = match record_type {
        t::MMAP => {
            let fixed = (|| Some((f.u32()?, f.u32()?, f.u64()?, f.u64()?, f.u64()?)))();
            let (pid, tid, addr, len, pgoff) = fixed.ok_or(short(HEADER_SIZE + 32))?;
            let filename = f.string().ok_or(bad_string("filename"))?;
            Body::Mmap(Mmap {
                pid,
                tid,
                addr,
                len,
                pgoff,
                filename,
            })
        }
        t::MMAP2 => {
            let mut read = || {
                let (pid, tid) = (f.u32()?, f.u32()?);
                let (addr, len, pgoff) = (f.u64()?, f.u64()?, f.u64()?);
                let id_start = f.pos;
                let (maj, min) = (f.u32()?, f.u32()?);
                let (ino, ino_generation) = (f.u64()?, f.u64()?);
                let id_bytes = &raw[id_start..f.pos];
                let (prot, flags) = (f.u32()?, f.u32()?);
                Some(Mmap2 {
                    pid,
                    tid,
                    addr,
                    len,
                    pgoff,
                    maj,
                    min,
                    ino,
                    ino_generation,
                    prot,
                    flags,
                    id_bytes,
                    filename: &[],
                })
            };
            let mut m = read().ok_or(short(HEADER_SIZE + 64))?;
            m.filename = f.string().ok_or(bad_string("filename"))?;
            Body::Mmap2(m)
        }
        t::LOST => {
            let v = (|| Some((f.u64()?, f.u64()?)))().ok_or(short(HEADER_SIZE + 16))?;
            Body::Lost(Lost { id: v.0, lost: v.1 })
        }
        t::COMM => {
            let v = (|| Some((f.u32()?, f.u32()?)))().ok_or(short(HEADER_SIZE + 8))?;
            let comm = f.string().ok_or(bad_string("comm"))?;
            Body::Comm(Comm {
                pid: v.0,
                tid: v.1,
                comm,
            })
        }
        t::EXIT | t::FORK => {
            let task = (|| {
                Some(Task {
                    pid: f.u32()?,
                    ppid: f.u32()?,
                    tid: f.u32()?,
                    ptid: f.u32()?,
                    time: f.u64()?,
                })
            })()
            .ok_or(short(HEADER_SIZE + 24))?;
            if record_type == t::EXIT {
                Body::Exit(task)
            } else {
                Body::Fork(task)
            }
        }
        t::THROTTLE | t::UNTHROTTLE => {
            let v = (|| {
                Some(Throttle {
                    time: f.u64()?,
                    id: f.u64()?,
                    stream_id: f.u64()?,
                })
            })()
            .ok_or(short(HEADER_SIZE + 24))?;
            if record_type == t::THROTTLE {
                Body::Throttle(v)
            } else {
                Body::Unthrottle(v)
            }
        }
        t::AUX => {
            let v = (|| {
                Some(Aux {
                    aux_offset: f.u64()?,
                    aux_size: f.u64()?,
                    flags: f.u64()?,
                })
            })()
            .ok_or(short(HEADER_SIZE + 24))?;
            Body::Aux(v)
        }
        t::ITRACE_START => {
            let v = (|| Some((f.u32()?, f.u32()?)))().ok_or(short(HEADER_SIZE + 8))?;
            Body::ItraceStart(ItraceStart { pid: v.0, tid: v.1 })
        }
        t::LOST_SAMPLES => Body::LostSamples(f.u64().ok_or(short(HEADER_SIZE + 8))?),
        t::SWITCH => Body::Switch,
        t::SWITCH_CPU_WIDE => {
            let v = (|| Some((f.u32()?, f.u32()?)))().ok_or(short(HEADER_SIZE + 8))?;
            Body::SwitchCpuWide(SwitchCpuWide {
                next_prev_pid: v.0,
                next_prev_tid: v.1,
            })
        }
        _ => {
            return Ok(Record {
                offset,
                header,
                body: Body::Unknown(&raw[HEADER_SIZE..]),
                sample: SampleId::default(),
                raw,
            });
        }
    };

    let body_end = f.pos;
    let (sample, needed) = parse_sample_id(raw, body_end, sample_type);
    if needed != raw.len() {
        return Err(err(ErrorKind::SampleSizeMismatch {
            record_type,
            needed,
            size: header.size,
        }));
    }
    Ok(Record {
        offset,
        header,
        body,
        sample,
        raw,
    })
}

/// The size of the `sample_id` trailer `sample_type` selects.
pub fn sample_id_size(stype: u64) -> usize {
    use self::sample_type as s;
    [s::TID, s::TIME, s::ID, s::STREAM_ID, s::CPU, s::IDENTIFIER]
        .iter()
        .filter(|&&bit| stype & bit != 0)
        .count()
        * 8
}

/// Reads the trailer starting at `start`; returns it and where it ends (which
/// may lie beyond `raw` if the record is too short, so the caller can report
/// the mismatch). Fields that do not fit are left out.
fn parse_sample_id(raw: &[u8], start: usize, stype: u64) -> (SampleId, usize) {
    use self::sample_type as s;
    let mut f = Fields {
        bytes: raw,
        pos: start,
    };
    let mut sample = SampleId::default();
    if stype & s::TID != 0 {
        let pid = f.u32();
        let tid = f.u32();
        sample.pid_tid = pid.zip(tid);
    }
    if stype & s::TIME != 0 {
        sample.time = f.u64();
    }
    if stype & s::ID != 0 {
        sample.id = f.u64();
    }
    if stype & s::STREAM_ID != 0 {
        sample.stream_id = f.u64();
    }
    if stype & s::CPU != 0 {
        sample.cpu = f.u32();
        let _reserved = f.u32();
    }
    if stype & s::IDENTIFIER != 0 {
        sample.identifier = f.u64();
    }
    (sample, start.saturating_add(sample_id_size(stype)))
}

/// Iterates over the records of a buffer.
///
/// After an error the reader stops (returns `None`): like libipt, there is no
/// way to find the next record boundary in a corrupt stream.
#[derive(Clone, Debug)]
pub struct RecordReader<'a> {
    bytes: &'a [u8],
    pos: usize,
    sample_type: u64,
    failed: bool,
}

impl<'a> RecordReader<'a> {
    /// A reader over `bytes` whose records carry the `sample_id` fields
    /// `sample_type` selects.
    pub fn new(bytes: &'a [u8], sample_type: u64) -> Self {
        Self {
            bytes,
            pos: 0,
            sample_type,
            failed: false,
        }
    }

    /// The offset of the next record.
    pub fn offset(&self) -> SidebandOffset {
        SidebandOffset(self.pos as u64)
    }

    /// The next record, `Ok(None)` at the end of the buffer (exactly at a
    /// record boundary), or the error that stopped the reader.
    pub fn next_record(&mut self) -> Result<Option<Record<'a>>, Error> {
        if self.failed || self.pos >= self.bytes.len() {
            return Ok(None);
        }
        let offset = self.offset();
        match parse_record(&self.bytes[self.pos..], offset, self.sample_type) {
            Ok(record) => {
                self.pos += record.raw.len();
                Ok(Some(record))
            }
            Err(e) => {
                self.failed = true;
                Err(e)
            }
        }
    }
}

impl<'a> Iterator for RecordReader<'a> {
    type Item = Result<Record<'a>, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_record().transpose()
    }
}
