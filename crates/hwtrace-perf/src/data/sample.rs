//! `PERF_RECORD_SAMPLE`: the fields `sample_type` selects, in the order of
//! `include/uapi/linux/perf_event.h` ("struct { ... } && PERF_SAMPLE_*"),
//! with the branch stack (`PERF_SAMPLE_BRANCH_STACK`) decoded.

use super::attr::{Attr, branch, read_format, sample};
use super::bytes::{le64, le64_at};
use super::error::{Error, ErrorKind};

/// One `struct perf_branch_entry`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BranchEntry {
    /// Branch source.
    pub from: u64,
    /// Branch target.
    pub to: u64,
    /// The flags word, raw (see the accessors).
    pub flags: u64,
}

impl BranchEntry {
    /// `mispred`: the branch was mispredicted.
    pub fn mispred(&self) -> bool {
        self.flags & 1 != 0
    }
    /// `predicted`: the branch was predicted correctly.
    pub fn predicted(&self) -> bool {
        self.flags & 2 != 0
    }
    /// `in_tx`: inside a transaction.
    pub fn in_tx(&self) -> bool {
        self.flags & 4 != 0
    }
    /// `abort`: a transaction abort.
    pub fn abort(&self) -> bool {
        self.flags & 8 != 0
    }
    /// `cycles`: cycles since the previous branch (0 when unknown).
    pub fn cycles(&self) -> u16 {
        ((self.flags >> 4) & 0xffff) as u16
    }
    /// `type`: `PERF_BR_*` (0 unknown, 1 cond, 2 uncond, 3 ind, 4 call,
    /// 5 ind_call, 6 ret, 7 syscall, 8 sysret, 9 cond_call, 10 cond_ret, ...).
    pub fn branch_type(&self) -> u8 {
        ((self.flags >> 20) & 0xf) as u8
    }
    /// `spec`: speculation outcome (`PERF_BR_SPEC_*`).
    pub fn spec(&self) -> u8 {
        ((self.flags >> 24) & 3) as u8
    }
    /// `new_type`: extended branch type (`PERF_BR_NEW_*`).
    pub fn new_type(&self) -> u8 {
        ((self.flags >> 26) & 0xf) as u8
    }
    /// `priv`: privilege level (`PERF_BR_PRIV_*`).
    pub fn privilege(&self) -> u8 {
        ((self.flags >> 30) & 7) as u8
    }
}

/// `PERF_SAMPLE_BRANCH_STACK`: the entries, newest first, borrowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BranchStack<'a> {
    /// `hw_idx` (with `PERF_SAMPLE_BRANCH_HW_INDEX`): the LBR top of stack,
    /// `u64::MAX` when the stack is not a full LBR snapshot.
    pub hw_idx: Option<u64>,
    entries: &'a [u8],
}

impl<'a> BranchStack<'a> {
    /// `nr`.
    pub fn len(&self) -> usize {
        self.entries.len() / 24
    }
    /// Whether the stack is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    /// The entries.
    pub fn entries(&self) -> impl Iterator<Item = BranchEntry> + 'a {
        self.entries.chunks_exact(24).map(|e| BranchEntry {
            from: le64(e),
            to: le64(&e[8..]),
            flags: le64(&e[16..]),
        })
    }
}

/// A parsed `PERF_RECORD_SAMPLE`. Fields the attribute did not ask for are
/// `None`; variable-length fields are borrowed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample<'a> {
    /// `PERF_SAMPLE_IDENTIFIER`.
    pub identifier: Option<u64>,
    /// `PERF_SAMPLE_IP`.
    pub ip: Option<u64>,
    /// `PERF_SAMPLE_TID`: pid and tid.
    pub pid_tid: Option<(u32, u32)>,
    /// `PERF_SAMPLE_TIME`.
    pub time: Option<u64>,
    /// `PERF_SAMPLE_ADDR`.
    pub addr: Option<u64>,
    /// `PERF_SAMPLE_ID`.
    pub id: Option<u64>,
    /// `PERF_SAMPLE_STREAM_ID`.
    pub stream_id: Option<u64>,
    /// `PERF_SAMPLE_CPU`.
    pub cpu: Option<u32>,
    /// `PERF_SAMPLE_PERIOD`.
    pub period: Option<u64>,
    /// `PERF_SAMPLE_READ`, raw.
    pub read: Option<&'a [u8]>,
    /// `PERF_SAMPLE_CALLCHAIN`: the `ips` as raw little-endian u64s.
    pub callchain: Option<&'a [u8]>,
    /// `PERF_SAMPLE_RAW`.
    pub raw: Option<&'a [u8]>,
    /// `PERF_SAMPLE_BRANCH_STACK`.
    pub branch_stack: Option<BranchStack<'a>>,
    /// `PERF_SAMPLE_WEIGHT` / `WEIGHT_STRUCT`.
    pub weight: Option<u64>,
    /// `PERF_SAMPLE_DATA_SRC`.
    pub data_src: Option<u64>,
    /// `PERF_SAMPLE_TRANSACTION`.
    pub transaction: Option<u64>,
    /// `PERF_SAMPLE_PHYS_ADDR`.
    pub phys_addr: Option<u64>,
    /// `PERF_SAMPLE_CGROUP`.
    pub cgroup: Option<u64>,
    /// `PERF_SAMPLE_AUX`.
    pub aux: Option<&'a [u8]>,
}

impl Sample<'_> {
    /// The callchain's addresses.
    pub fn callchain_ips(&self) -> impl Iterator<Item = u64> + '_ {
        self.callchain.unwrap_or(&[]).chunks_exact(8).map(le64)
    }
}

struct Fields<'a> {
    raw: &'a [u8],
    pos: usize,
    offset: u64,
    size: u16,
}

impl<'a> Fields<'a> {
    fn take(&mut self, n: u64, field: &'static str) -> Result<&'a [u8], Error> {
        let end = (self.pos as u64).saturating_add(n);
        if end > self.raw.len() as u64 {
            return Err(Error::at(
                self.offset,
                ErrorKind::SampleTooShort {
                    field,
                    needed: end,
                    size: self.size,
                },
            ));
        }
        let s = &self.raw[self.pos..end as usize];
        self.pos = end as usize;
        Ok(s)
    }
    fn u64(&mut self, field: &'static str) -> Result<u64, Error> {
        Ok(le64(self.take(8, field)?))
    }
    fn opt(&mut self, on: bool, field: &'static str) -> Result<Option<u64>, Error> {
        if on {
            self.u64(field).map(Some)
        } else {
            Ok(None)
        }
    }
}

/// Where `PERF_SAMPLE_ID` sits in a sample (in u64 words from the body
/// start), or `None` when the sample type has neither ID nor IDENTIFIER.
pub fn sample_id_pos(sample_type: u64) -> Option<usize> {
    if sample_type & sample::IDENTIFIER != 0 {
        return Some(0);
    }
    if sample_type & sample::ID == 0 {
        return None;
    }
    let before = [sample::IP, sample::TID, sample::TIME, sample::ADDR];
    Some(before.iter().filter(|&&b| sample_type & b != 0).count())
}

/// The id a SAMPLE record carries, if its type says where (`raw` includes
/// the header).
pub fn sample_record_id(raw: &[u8], sample_type: u64) -> Option<u64> {
    le64_at(raw, 8 + sample_id_pos(sample_type)? * 8)
}

/// Parses a SAMPLE record (`raw` includes its 8-byte header) as `attr`
/// describes it; `offset` is the record's file offset. Sample-type bits this
/// reader does not know stop the parse after the known fields.
pub fn parse_sample<'a>(raw: &'a [u8], offset: u64, attr: &Attr) -> Result<Sample<'a>, Error> {
    let st = attr.sample_type;
    let mut f = Fields {
        raw,
        pos: 8,
        offset,
        size: raw.len().min(u16::MAX as usize) as u16,
    };
    let mut s = Sample {
        identifier: f.opt(st & sample::IDENTIFIER != 0, "identifier")?,
        ip: f.opt(st & sample::IP != 0, "ip")?,
        ..Sample::default()
    };
    if st & sample::TID != 0 {
        let v = f.u64("tid")?;
        s.pid_tid = Some((v as u32, (v >> 32) as u32));
    }
    s.time = f.opt(st & sample::TIME != 0, "time")?;
    s.addr = f.opt(st & sample::ADDR != 0, "addr")?;
    s.id = f.opt(st & sample::ID != 0, "id")?;
    s.stream_id = f.opt(st & sample::STREAM_ID != 0, "stream_id")?;
    if st & sample::CPU != 0 {
        s.cpu = Some(f.u64("cpu")? as u32);
    }
    s.period = f.opt(st & sample::PERIOD != 0, "period")?;
    if st & sample::READ != 0 {
        let rf = attr.read_format;
        let extra = [
            read_format::TOTAL_TIME_ENABLED,
            read_format::TOTAL_TIME_RUNNING,
        ]
        .iter()
        .filter(|&&b| rf & b != 0)
        .count() as u64;
        let per_value =
            1 + u64::from(rf & read_format::ID != 0) + u64::from(rf & read_format::LOST != 0);
        let words = if rf & read_format::GROUP != 0 {
            let nr = le64(f.take(8, "read.nr")?);
            f.pos -= 8;
            nr.saturating_mul(per_value).saturating_add(1 + extra)
        } else {
            per_value + extra
        };
        s.read = Some(f.take(words.saturating_mul(8), "read")?);
    }
    if st & sample::CALLCHAIN != 0 {
        let nr = f.u64("callchain.nr")?;
        s.callchain = Some(f.take(nr.saturating_mul(8), "callchain")?);
    }
    if st & sample::RAW != 0 {
        let size = f.take(4, "raw.size")?;
        let size = u32::from_le_bytes([size[0], size[1], size[2], size[3]]);
        s.raw = Some(f.take(u64::from(size), "raw")?);
    }
    if st & sample::BRANCH_STACK != 0 {
        let nr = f.u64("branch_stack.nr")?;
        let bst = attr.branch_sample_type;
        let hw_idx = f.opt(bst & branch::HW_INDEX != 0, "branch_stack.hw_idx")?;
        let entries = f.take(nr.saturating_mul(24), "branch_stack.entries")?;
        if bst & branch::COUNTERS != 0 {
            f.take(nr.saturating_mul(8), "branch_stack.counters")?;
        }
        s.branch_stack = Some(BranchStack { hw_idx, entries });
    }
    if st & sample::REGS_USER != 0 {
        let abi = f.u64("regs_user.abi")?;
        if abi != 0 {
            f.take(
                u64::from(attr.sample_regs_user.count_ones()) * 8,
                "regs_user",
            )?;
        }
    }
    if st & sample::STACK_USER != 0 {
        let size = f.u64("stack_user.size")?;
        f.take(size, "stack_user")?;
        if size != 0 {
            f.u64("stack_user.dyn_size")?;
        }
    }
    s.weight = f.opt(st & (sample::WEIGHT | sample::WEIGHT_STRUCT) != 0, "weight")?;
    s.data_src = f.opt(st & sample::DATA_SRC != 0, "data_src")?;
    s.transaction = f.opt(st & sample::TRANSACTION != 0, "transaction")?;
    if st & sample::REGS_INTR != 0 {
        let abi = f.u64("regs_intr.abi")?;
        if abi != 0 {
            f.take(
                u64::from(attr.sample_regs_intr.count_ones()) * 8,
                "regs_intr",
            )?;
        }
    }
    s.phys_addr = f.opt(st & sample::PHYS_ADDR != 0, "phys_addr")?;
    s.cgroup = f.opt(st & sample::CGROUP != 0, "cgroup")?;
    f.opt(st & sample::DATA_PAGE_SIZE != 0, "data_page_size")?;
    f.opt(st & sample::CODE_PAGE_SIZE != 0, "code_page_size")?;
    if st & sample::AUX != 0 {
        let size = f.u64("aux.size")?;
        s.aux = Some(f.take(size, "aux")?);
    }
    Ok(s)
}
