//! Record decoders: what software reads back after tracing, turned into
//! branches in the order they were taken.
//!
//! * [`BtsDump`]: a DS buffer management area and a dump of its BTS buffer
//!   (or a file of raw records) → [`BtsEntry`]s, oldest first. In circular
//!   mode (DEBUGCTL.BTINT = 0) the processor goes back to the buffer base
//!   once the next record would pass the absolute maximum, so a buffer that
//!   has wrapped holds its oldest record at the BTS index (SDM Vol. 3B
//!   §18.4.5 “Branch Trace Store (BTS)”, §18.4.9 “BTS and DS Save Area”).
//! * [`LbrStack`]: the FROM/TO (and INFO) MSR values of an LBR stack and
//!   MSR_LASTBRANCH_TOS → [`LbrEntry`]s, oldest first. The processor
//!   increments TOS and then writes the entry TOS points at (SDM Vol. 3B
//!   §18.4.8 “LBR Stack”; seed 003), so the oldest entry is the one after
//!   TOS, modulo the depth.
//! * [`LbrMsrDump`]: a text dump of those MSRs, one `name_or_number value`
//!   per line, as `rdmsr` loops print them.
//!
//! Nothing here allocates; every error says where (record slot, byte offset,
//! line number) and what was wrong.

use crate::bts::BtsRecord;
use crate::ds::{DsError, DsFormat, DsManagementArea};
use crate::explain::{RegisterId, parse_number};
use crate::field::FieldName;
use crate::lbr::{LbrError, LbrFormat, LbrFrom, LbrInfo, LbrTo, tos_index};
use crate::msr::LBR_MAX_ENTRIES;

/// How the records of a BTS buffer are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BtsOrder {
    /// DEBUGCTL.BTINT = 1 (or a buffer drained by its interrupt handler):
    /// the records run from the base up to the index and never wrap.
    Linear,
    /// DEBUGCTL.BTINT = 0: the buffer is circular. It has wrapped when the
    /// slot at the index holds a record (any non-zero byte), which assumes
    /// the buffer was zero-filled when it was armed, as drivers allocate it;
    /// then the oldest record is the one at the index.
    Circular,
}

/// Why a BTS dump cannot be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BtsDumpError {
    /// The management area is unreadable or its BTS pointers are
    /// inconsistent (index outside the buffer or between records, buffer
    /// smaller than a record).
    #[error(transparent)]
    Area(#[from] DsError),
    /// The buffer dump is shorter than the records the area says it holds.
    #[error(
        "the BTS buffer dump has {got} bytes, but the DS area describes {records} records of {record} bytes ({needed} bytes from the buffer base)"
    )]
    DumpTooShort {
        /// Records the area describes.
        records: u64,
        /// Bytes per record.
        record: u64,
        /// Bytes needed.
        needed: u64,
        /// Bytes given.
        got: usize,
    },
    /// A raw record file whose length is not a whole number of records.
    #[error(
        "raw BTS records: {len} trailing bytes at offset {offset:#x} do not make a {record}-byte record"
    )]
    TrailingBytes {
        /// Offset of the partial record.
        offset: usize,
        /// Its length.
        len: usize,
        /// Bytes per record.
        record: usize,
    },
}

/// One record of a BTS buffer, with where it was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BtsEntry {
    /// Record number from the buffer base (byte offset = slot × record size).
    pub slot: u64,
    /// The record.
    pub record: BtsRecord,
}

/// A BTS buffer ready to be read in chronological order.
#[derive(Debug, Clone, Copy)]
pub struct BtsDump<'a> {
    buffer: &'a [u8],
    format: DsFormat,
    /// Whole records between base and absolute maximum.
    capacity: u64,
    /// Records from base to index.
    written: u64,
    wrapped: bool,
}

impl<'a> BtsDump<'a> {
    /// Reads the BTS buffer `buffer` (its bytes from the buffer base on)
    /// described by `area`.
    ///
    /// The index must lie on a record boundary between base and absolute
    /// maximum, and the dump must hold every record the order needs: up to
    /// the index for [`BtsOrder::Linear`], the whole buffer for
    /// [`BtsOrder::Circular`].
    pub fn new(
        area: &DsManagementArea,
        buffer: &'a [u8],
        format: DsFormat,
        order: BtsOrder,
    ) -> Result<Self, BtsDumpError> {
        let record = format.bts_record_size();
        let (base, max, index) = (
            area.bts_buffer_base,
            area.bts_absolute_maximum,
            area.bts_index,
        );
        if max < base || max - base < record {
            return Err(DsError::BufferTooSmall { base, max, record }.into());
        }
        if index < base || index > max {
            return Err(DsError::IndexOutOfBuffer { index, base, max }.into());
        }
        if (index - base) % record != 0 {
            return Err(DsError::NotOnRecordBoundary {
                field: "BTS index",
                value: index,
                base,
                record,
            }
            .into());
        }
        let capacity = (max - base) / record;
        let written = (index - base) / record;
        let records = match order {
            BtsOrder::Linear => written,
            BtsOrder::Circular => capacity,
        };
        let needed = records * record;
        if (buffer.len() as u64) < needed {
            return Err(BtsDumpError::DumpTooShort {
                records,
                record,
                needed,
                got: buffer.len(),
            });
        }
        let wrapped = order == BtsOrder::Circular
            && written < capacity
            && slot_bytes(buffer, written, record).is_some_and(|s| s.iter().any(|b| *b != 0));
        Ok(Self {
            buffer,
            format,
            capacity,
            written,
            wrapped,
        })
    }

    /// Reads a file of raw records written one after the other, oldest
    /// first (what a drain handler appends to its output).
    pub fn raw(records: &'a [u8], format: DsFormat) -> Result<Self, BtsDumpError> {
        let record = format.bts_record_size() as usize;
        let tail = records.len() % record;
        if tail != 0 {
            return Err(BtsDumpError::TrailingBytes {
                offset: records.len() - tail,
                len: tail,
                record,
            });
        }
        let n = (records.len() / record) as u64;
        Ok(Self {
            buffer: records,
            format,
            capacity: n,
            written: n,
            wrapped: false,
        })
    }

    /// The record layout.
    pub const fn format(&self) -> DsFormat {
        self.format
    }

    /// Whether the circular buffer has wrapped (its oldest record is at the
    /// index).
    pub const fn wrapped(&self) -> bool {
        self.wrapped
    }

    /// The number of records that [`records`](Self::records) yields.
    pub const fn len(&self) -> u64 {
        if self.wrapped {
            self.capacity
        } else {
            self.written
        }
    }

    /// True if the buffer holds no record.
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The records, oldest first.
    pub fn records(&self) -> BtsRecords<'a> {
        BtsRecords {
            dump: *self,
            next: 0,
        }
    }
}

fn slot_bytes(buffer: &[u8], slot: u64, record: u64) -> Option<&[u8]> {
    let start = usize::try_from(slot.checked_mul(record)?).ok()?;
    buffer.get(start..start.checked_add(record as usize)?)
}

/// Iterator over a [`BtsDump`], oldest record first.
#[derive(Debug, Clone)]
pub struct BtsRecords<'a> {
    dump: BtsDump<'a>,
    next: u64,
}

impl Iterator for BtsRecords<'_> {
    type Item = BtsEntry;

    fn next(&mut self) -> Option<BtsEntry> {
        let d = &self.dump;
        if self.next >= d.len() {
            return None;
        }
        let slot = if d.wrapped {
            (d.written + self.next) % d.capacity
        } else {
            self.next
        };
        self.next += 1;
        let record = d.format.bts_record_size();
        let bytes = slot_bytes(d.buffer, slot, record)?;
        let record = BtsRecord::parse(bytes, d.format).ok()?;
        Some(BtsEntry { slot, record })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = usize::try_from(self.dump.len().saturating_sub(self.next)).unwrap_or(usize::MAX);
        (left, Some(left))
    }
}

/// Why an LBR stack or MSR dump cannot be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LbrDumpError {
    /// FROM and TO lists of different lengths.
    #[error("{from} FROM_IP values but {to} TO_IP values: an LBR entry is one pair")]
    LengthMismatch {
        /// FROM values.
        from: usize,
        /// TO values.
        to: usize,
    },
    /// INFO values given, but not one per entry.
    #[error("{info} MSR_LBR_INFO values for a stack of {depth} entries")]
    InfoLengthMismatch {
        /// INFO values.
        info: usize,
        /// Entries.
        depth: usize,
    },
    /// A stack depth outside 1..=32.
    #[error(
        "an LBR stack of {0} entries: non-architectural LBR stacks have 1 to 32 (MSR_LASTBRANCH_0..31)"
    )]
    Depth(usize),
    /// TOS beyond the stack.
    #[error(transparent)]
    Tos(#[from] LbrError),
    /// An entry of the stack is missing from the dump.
    #[error("the dump has no {register} for entry {entry} of a {depth}-entry stack")]
    MissingEntry {
        /// The missing register's kind.
        register: &'static str,
        /// The entry.
        entry: u8,
        /// The stack depth asked for.
        depth: u8,
    },
    /// A line of a text dump is wrong.
    #[error("MSR dump line {line}: {kind}")]
    Line {
        /// 1-based line number.
        line: u32,
        /// What was wrong.
        kind: LbrLineError,
    },
}

/// What was wrong with one line of an MSR dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LbrLineError {
    /// Not `register value`.
    #[error("expected `REGISTER VALUE` (register by SDM name or MSR number)")]
    Syntax,
    /// Neither a known register name nor a known MSR number.
    #[error("`{0}` is not a register hwtrace knows")]
    UnknownRegister(FieldName),
    /// A register that is not part of the LBR state.
    #[error(
        "`{0}` is not an LBR register (expected MSR_LASTBRANCH_n_FROM_IP/_TO_IP, MSR_LBR_INFO_n, MSR_LASTBRANCH_TOS, MSR_LBR_SELECT, IA32_DEBUGCTL or IA32_PERF_CAPABILITIES)"
    )]
    NotLbr(FieldName),
    /// The value is not a number.
    #[error("value `{0}` is not a number (hex with 0x or h, or decimal)")]
    BadValue(FieldName),
    /// The register appeared before.
    #[error("`{0}` appears twice")]
    Duplicate(FieldName),
}

/// One entry of an LBR stack, decoded per the LBR format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LbrEntry {
    /// The MSR index n of MSR_LASTBRANCH_n_FROM_IP/_TO_IP.
    pub slot: u8,
    /// MSR_LASTBRANCH_n_FROM_IP.
    pub from: LbrFrom,
    /// MSR_LASTBRANCH_n_TO_IP.
    pub to: LbrTo,
    /// MSR_LBR_INFO_n, on formats that have it and when it was given.
    pub info: Option<LbrInfo>,
}

impl LbrEntry {
    /// The mispredicted flag, wherever the format keeps it (INFO bit 63 or
    /// FROM bit 63); `None` on formats without one.
    pub fn mispredicted(&self) -> Option<bool> {
        self.info.map(|i| i.mispredicted).or(self.from.mispredicted)
    }

    /// The cycle count, from INFO or TO, where the format has one.
    pub fn cycles(&self) -> Option<u16> {
        self.info.map(|i| i.cycles).or(self.to.cycles)
    }
}

/// The raw values of an LBR stack and its TOS.
#[derive(Debug, Clone, Copy)]
pub struct LbrStack<'a> {
    from: &'a [u64],
    to: &'a [u64],
    info: Option<&'a [u64]>,
    tos: u8,
    format: LbrFormat,
}

impl<'a> LbrStack<'a> {
    /// A stack from the values of MSR_LASTBRANCH_n_FROM_IP and _TO_IP
    /// (index n = position in the slice), optionally MSR_LBR_INFO_n, and
    /// MSR_LASTBRANCH_TOS.
    pub fn new(
        from: &'a [u64],
        to: &'a [u64],
        info: Option<&'a [u64]>,
        tos: u64,
        format: LbrFormat,
    ) -> Result<Self, LbrDumpError> {
        if from.len() != to.len() {
            return Err(LbrDumpError::LengthMismatch {
                from: from.len(),
                to: to.len(),
            });
        }
        let depth = from.len();
        if depth == 0 || depth > usize::from(LBR_MAX_ENTRIES) {
            return Err(LbrDumpError::Depth(depth));
        }
        if let Some(info) = info
            && info.len() != depth
        {
            return Err(LbrDumpError::InfoLengthMismatch {
                info: info.len(),
                depth,
            });
        }
        let tos = tos_index(tos, depth as u8)?;
        Ok(Self {
            from,
            to,
            info,
            tos,
            format,
        })
    }

    /// Entries in the stack.
    pub fn depth(&self) -> u8 {
        self.from.len() as u8
    }

    /// The index of the most recent entry.
    pub const fn tos(&self) -> u8 {
        self.tos
    }

    /// The entries, oldest first: from TOS + 1 round to TOS. Slots whose
    /// FROM and TO both read 0 were never written (the stack is cleared at
    /// reset) and are skipped.
    pub fn entries(&self) -> LbrEntries<'a> {
        LbrEntries {
            stack: *self,
            step: 0,
        }
    }

    fn entry(&self, slot: usize) -> Option<LbrEntry> {
        let (from, to) = (*self.from.get(slot)?, *self.to.get(slot)?);
        if from == 0 && to == 0 {
            return None;
        }
        let info = match self.info {
            Some(info) if self.format.has_info_msr() => info.get(slot).map(|r| LbrInfo::decode(*r)),
            _ => None,
        };
        Some(LbrEntry {
            slot: slot as u8,
            from: LbrFrom::decode(from, self.format),
            to: LbrTo::decode(to, self.format),
            info,
        })
    }
}

/// Iterator over an [`LbrStack`], oldest entry first.
#[derive(Debug, Clone)]
pub struct LbrEntries<'a> {
    stack: LbrStack<'a>,
    step: usize,
}

impl Iterator for LbrEntries<'_> {
    type Item = LbrEntry;

    fn next(&mut self) -> Option<LbrEntry> {
        let depth = self.stack.from.len();
        while self.step < depth {
            let slot = (usize::from(self.stack.tos) + 1 + self.step) % depth;
            self.step += 1;
            if let Some(e) = self.stack.entry(slot) {
                return Some(e);
            }
        }
        None
    }
}

const MAX: usize = LBR_MAX_ENTRIES as usize;

/// The LBR MSRs read from a text dump.
///
/// Each non-blank line is `REGISTER VALUE` (separated by blanks, `=` or
/// `:`); `#` starts a comment. REGISTER is an SDM name
/// (`MSR_LASTBRANCH_3_FROM_IP`, `MSR_LBR_INFO_3`, `MSR_LASTBRANCH_TOS`, …)
/// or an MSR number (`0x683`, `683h`); VALUE is hex (`0x…`, `…h`) or
/// decimal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LbrMsrDump {
    from: [Option<u64>; MAX],
    to: [Option<u64>; MAX],
    info: [Option<u64>; MAX],
    /// MSR_LASTBRANCH_TOS, if the dump has it.
    pub tos: Option<u64>,
    /// MSR_LBR_SELECT, if the dump has it.
    pub lbr_select: Option<u64>,
    /// IA32_DEBUGCTL, if the dump has it.
    pub debugctl: Option<u64>,
    /// IA32_PERF_CAPABILITIES, if the dump has it (bits 5:0 give the LBR format).
    pub perf_capabilities: Option<u64>,
}

impl Default for LbrMsrDump {
    fn default() -> Self {
        Self {
            from: [None; MAX],
            to: [None; MAX],
            info: [None; MAX],
            tos: None,
            lbr_select: None,
            debugctl: None,
            perf_capabilities: None,
        }
    }
}

impl LbrMsrDump {
    /// Parses a whole text dump.
    pub fn parse(text: &str) -> Result<Self, LbrDumpError> {
        let mut dump = Self::default();
        for (i, line) in text.lines().enumerate() {
            let line_no = u32::try_from(i + 1).unwrap_or(u32::MAX);
            dump.add_line(line).map_err(|kind| LbrDumpError::Line {
                line: line_no,
                kind,
            })?;
        }
        Ok(dump)
    }

    /// Adds one line (blank and comment lines are accepted and ignored).
    pub fn add_line(&mut self, line: &str) -> Result<(), LbrLineError> {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            return Ok(());
        }
        let mut parts = line
            .split(|c: char| c.is_whitespace() || c == '=' || c == ':')
            .filter(|p| !p.is_empty());
        let (Some(name), Some(value), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(LbrLineError::Syntax);
        };
        let id = RegisterId::parse(name)
            .map_err(|_| LbrLineError::UnknownRegister(FieldName::new(name)))?;
        let value = parse_number(value).ok_or(LbrLineError::BadValue(FieldName::new(value)))?;
        let slot = match id {
            RegisterId::LastBranchFromIp(n) => self.from.get_mut(usize::from(n)),
            RegisterId::LastBranchToIp(n) => self.to.get_mut(usize::from(n)),
            RegisterId::LbrInfo(n) => self.info.get_mut(usize::from(n)),
            RegisterId::LastBranchTos => Some(&mut self.tos),
            RegisterId::LbrSelect => Some(&mut self.lbr_select),
            RegisterId::DebugCtl => Some(&mut self.debugctl),
            RegisterId::PerfCapabilities => Some(&mut self.perf_capabilities),
            _ => None,
        }
        .ok_or(LbrLineError::NotLbr(FieldName::new(name)))?;
        if slot.is_some() {
            return Err(LbrLineError::Duplicate(FieldName::new(name)));
        }
        *slot = Some(value);
        Ok(())
    }

    /// Sets entry `n`'s values (for building dumps in code).
    pub fn set_entry(
        &mut self,
        n: u8,
        from: u64,
        to: u64,
        info: Option<u64>,
    ) -> Result<(), LbrDumpError> {
        let i = usize::from(n);
        if i >= MAX {
            return Err(LbrDumpError::Depth(i + 1));
        }
        self.from[i] = Some(from);
        self.to[i] = Some(to);
        self.info[i] = info;
        Ok(())
    }

    /// The stack depth the dump implies: one past the highest FROM/TO index present.
    pub fn depth(&self) -> u8 {
        (0..MAX)
            .rev()
            .find(|&i| self.from[i].is_some() || self.to[i].is_some())
            .map_or(0, |i| i as u8 + 1)
    }

    /// The LBR format named by IA32_PERF_CAPABILITIES, if the dump has it.
    pub fn format(&self) -> Option<Result<LbrFormat, LbrError>> {
        self.perf_capabilities
            .map(LbrFormat::from_perf_capabilities)
    }

    /// The values of a `depth`-entry stack, ready for [`LbrStack::new`]:
    /// FROM, TO and (if the dump has INFO for every entry) INFO arrays, each
    /// `depth` long. Every entry below `depth` must be in the dump.
    pub fn values(&self, depth: u8) -> Result<LbrValues, LbrDumpError> {
        let d = usize::from(depth);
        if d == 0 || d > MAX {
            return Err(LbrDumpError::Depth(d));
        }
        let mut out = LbrValues {
            from: [0; MAX],
            to: [0; MAX],
            info: [0; MAX],
            depth,
            has_info: self.info[..d].iter().all(Option::is_some),
        };
        let any_info = self.info[..d].iter().any(Option::is_some);
        for i in 0..d {
            let missing = |register| LbrDumpError::MissingEntry {
                register,
                entry: i as u8,
                depth,
            };
            out.from[i] = self.from[i].ok_or(missing("MSR_LASTBRANCH_n_FROM_IP"))?;
            out.to[i] = self.to[i].ok_or(missing("MSR_LASTBRANCH_n_TO_IP"))?;
            if any_info {
                out.info[i] = self.info[i].ok_or(missing("MSR_LBR_INFO_n"))?;
            }
        }
        Ok(out)
    }
}

/// FROM/TO/INFO arrays taken out of an [`LbrMsrDump`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LbrValues {
    from: [u64; MAX],
    to: [u64; MAX],
    info: [u64; MAX],
    depth: u8,
    has_info: bool,
}

impl LbrValues {
    /// The stack these values make with MSR_LASTBRANCH_TOS = `tos`.
    pub fn stack(&self, tos: u64, format: LbrFormat) -> Result<LbrStack<'_>, LbrDumpError> {
        let d = usize::from(self.depth);
        let info = self.has_info.then_some(&self.info[..d]);
        LbrStack::new(&self.from[..d], &self.to[..d], info, tos, format)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hwtrace_types::Ip;
    use proptest::prelude::*;
    use std::vec::Vec;

    fn rec(i: u64) -> BtsRecord {
        BtsRecord {
            from: Ip(0x8000_1000 + 16 * i),
            to: Ip(0x8000_2000 + 16 * i),
            predicted: !i.is_multiple_of(3),
        }
    }

    /// A buffer of `capacity` records in which records 0..n were written in
    /// order, wrapping as a circular buffer does; returns area and bytes.
    fn circular(format: DsFormat, capacity: u64, n: u64) -> (DsManagementArea, Vec<u8>) {
        let size = format.bts_record_size();
        let base = 0x8100_0000;
        let mut buf = vec![0u8; (capacity * size) as usize];
        for i in 0..n {
            let slot = (i % capacity) as usize;
            rec(i)
                .write(format, &mut buf[slot * size as usize..])
                .expect("room");
        }
        let area = DsManagementArea {
            bts_buffer_base: base,
            bts_index: base + (n % capacity) * size,
            bts_absolute_maximum: base + capacity * size,
            bts_interrupt_threshold: base + capacity * size + 1,
            ..DsManagementArea::default()
        };
        (area, buf)
    }

    #[test]
    fn circular_buffer_that_wrapped_starts_at_the_index() {
        for format in [DsFormat::Bits32, DsFormat::Bits64] {
            let (area, buf) = circular(format, 10, 23);
            let dump = BtsDump::new(&area, &buf, format, BtsOrder::Circular).expect("valid");
            assert!(dump.wrapped());
            let got: Vec<_> = dump.records().map(|e| e.record).collect();
            let want: Vec<_> = (13..23).map(rec).collect();
            assert_eq!(got, want);
            assert_eq!(dump.records().next().map(|e| e.slot), Some(3));
        }
    }

    #[test]
    fn circular_buffer_not_yet_wrapped_runs_from_the_base() {
        let (area, buf) = circular(DsFormat::Bits64, 10, 4);
        let dump = BtsDump::new(&area, &buf, DsFormat::Bits64, BtsOrder::Circular).expect("valid");
        assert!(!dump.wrapped());
        assert_eq!(
            dump.records().map(|e| e.record).collect::<Vec<_>>(),
            (0..4).map(rec).collect::<Vec<_>>()
        );
    }

    /// Seed 001: 2000 records, threshold at 1900; the handler runs when the
    /// index reaches the threshold, so the dump then holds records 0..1900.
    #[test]
    fn seed_001_linear_buffer_read_at_the_interrupt() {
        let format = DsFormat::Bits32;
        let (mut area, buf) = circular(format, 2000, 1900);
        area.bts_interrupt_threshold = area.bts_buffer_base + 1900 * 12;
        assert_eq!(area.bts_index, area.bts_interrupt_threshold);
        let dump = BtsDump::new(&area, &buf[..1900 * 12], format, BtsOrder::Linear).expect("valid");
        assert_eq!(dump.len(), 1900);
        assert_eq!(dump.records().last().map(|e| e.record), Some(rec(1899)));
        assert_eq!(
            BtsDump::new(&area, &buf[..1899 * 12], format, BtsOrder::Linear).err(),
            Some(BtsDumpError::DumpTooShort {
                records: 1900,
                record: 12,
                needed: 22800,
                got: 1899 * 12
            })
        );
    }

    #[test]
    fn bad_areas_and_raw_files_are_errors() {
        let (mut area, buf) = circular(DsFormat::Bits32, 4, 1);
        area.bts_index += 5;
        assert!(matches!(
            BtsDump::new(&area, &buf, DsFormat::Bits32, BtsOrder::Linear),
            Err(BtsDumpError::Area(DsError::NotOnRecordBoundary { .. }))
        ));
        area.bts_index = area.bts_absolute_maximum + 12;
        assert!(matches!(
            BtsDump::new(&area, &buf, DsFormat::Bits32, BtsOrder::Linear),
            Err(BtsDumpError::Area(DsError::IndexOutOfBuffer { .. }))
        ));
        assert_eq!(
            BtsDump::raw(&[0; 30], DsFormat::Bits32).err(),
            Some(BtsDumpError::TrailingBytes {
                offset: 24,
                len: 6,
                record: 12
            })
        );
        let raw = BtsDump::raw(&buf[..24], DsFormat::Bits32).expect("two records");
        assert_eq!(raw.len(), 2);
    }

    #[test]
    fn lbr_stack_reads_oldest_first_and_skips_empty_slots() {
        // Seed 003, experiment 14-2: ten chained JMPs on Westmere, TOS = 10,
        // entry 0 and 11..15 never written.
        let mut from = [0u64; 16];
        let mut to = [0u64; 16];
        for k in 1..=10u64 {
            from[k as usize] = 0x9000 + 2 * k;
            to[k as usize] = 0x9000 + 2 * (k + 1);
        }
        let stack =
            LbrStack::new(&from, &to, None, 10, LbrFormat::EipWithFlags).expect("valid stack");
        let slots: Vec<u8> = stack.entries().map(|e| e.slot).collect();
        assert_eq!(slots, (1..=10).collect::<Vec<u8>>());
        let e: Vec<_> = stack.entries().collect();
        // Chained jumps: each TO is the next FROM.
        assert!(e.windows(2).all(|w| w[0].to.ip == w[1].from.ip));
        assert_eq!(e[0].mispredicted(), Some(false));
        assert_eq!(
            LbrStack::new(&from, &to, None, 16, LbrFormat::EipWithFlags).err(),
            Some(LbrDumpError::Tos(LbrError::TosOutOfRange {
                tos: 16,
                depth: 16
            }))
        );
        assert_eq!(
            LbrStack::new(&from, &to[..15], None, 1, LbrFormat::Eip).err(),
            Some(LbrDumpError::LengthMismatch { from: 16, to: 15 })
        );
    }

    #[test]
    fn text_dump_by_name_and_number() {
        let text = "# Skylake, 4 entries shown\n\
                    MSR_LASTBRANCH_TOS 1\n\
                    IA32_PERF_CAPABILITIES 0x33c5\n\
                    0x680 0x401000\n0x6c0 0x401100\nMSR_LBR_INFO_0 0x8000000000000005\n\
                    msr_lastbranch_1_from_ip = 0x401105\nMSR_LASTBRANCH_1_TO_IP: 401200h\nMSR_LBR_INFO_1 7\n";
        let dump = LbrMsrDump::parse(text).expect("parses");
        assert_eq!(dump.depth(), 2);
        assert_eq!(dump.format(), Some(Ok(LbrFormat::EipWithFlagsInfo)));
        let values = dump.values(2).expect("complete");
        let stack = values
            .stack(dump.tos.expect("tos"), LbrFormat::EipWithFlagsInfo)
            .expect("valid");
        let e: Vec<_> = stack.entries().collect();
        assert_eq!(e.len(), 2);
        assert_eq!((e[0].from.ip, e[0].to.ip), (Ip(0x40_1000), Ip(0x40_1100)));
        assert_eq!(e[0].mispredicted(), Some(true));
        assert_eq!(e[0].cycles(), Some(5));
        assert_eq!(e[1].mispredicted(), Some(false));
        assert_eq!(
            dump.values(3).err(),
            Some(LbrDumpError::MissingEntry {
                register: "MSR_LASTBRANCH_n_FROM_IP",
                entry: 2,
                depth: 3
            })
        );
        let bad = LbrMsrDump::parse("MSR_LASTBRANCH_TOS 1\nIA32_RTIT_CTL 5\n").err();
        assert!(matches!(
            bad,
            Some(LbrDumpError::Line {
                line: 2,
                kind: LbrLineError::NotLbr(_)
            })
        ));
        assert!(matches!(
            LbrMsrDump::parse("0x680 1\n0x680 2").err(),
            Some(LbrDumpError::Line {
                line: 2,
                kind: LbrLineError::Duplicate(_)
            })
        ));
        assert!(matches!(
            LbrMsrDump::parse("0x680 zz").err(),
            Some(LbrDumpError::Line {
                kind: LbrLineError::BadValue(_),
                ..
            })
        ));
        assert!(matches!(
            LbrMsrDump::parse("0x680").err(),
            Some(LbrDumpError::Line {
                kind: LbrLineError::Syntax,
                ..
            })
        ));
    }

    proptest! {
        #[test]
        fn random_bts_dumps_never_panic(
            area in proptest::collection::vec(any::<u8>(), 0..0x50),
            buf in proptest::collection::vec(any::<u8>(), 0..512),
            wide in any::<bool>(),
            circular in any::<bool>(),
        ) {
            let format = if wide { DsFormat::Bits64 } else { DsFormat::Bits32 };
            let order = if circular { BtsOrder::Circular } else { BtsOrder::Linear };
            if let Ok(area) = DsManagementArea::parse(&area, format)
                && let Ok(dump) = BtsDump::new(&area, &buf, format, order) {
                    let n = dump.records().count() as u64;
                    prop_assert_eq!(n, dump.len());
                }
            if let Ok(dump) = BtsDump::raw(&buf, format) {
                prop_assert_eq!(dump.records().count() as u64, dump.len());
            }
        }

        #[test]
        fn bts_dumps_with_small_random_pointers_never_panic(
            base in 0u64..64, index in 0u64..600, max in 0u64..600,
            buf in proptest::collection::vec(any::<u8>(), 0..600),
        ) {
            let area = DsManagementArea {
                bts_buffer_base: base,
                bts_index: index,
                bts_absolute_maximum: max,
                ..DsManagementArea::default()
            };
            for order in [BtsOrder::Linear, BtsOrder::Circular] {
                if let Ok(dump) = BtsDump::new(&area, &buf, DsFormat::Bits32, order) {
                    prop_assert_eq!(dump.records().count() as u64, dump.len());
                }
            }
        }

        #[test]
        fn random_lbr_dumps_never_panic(
            text in "([0-9a-fA-Fx_ :=#hMSRLBATNCHOIFPE]{0,40}\n){0,40}",
            tos in any::<u64>(),
            enc in 0u8..8,
        ) {
            if let Ok(dump) = LbrMsrDump::parse(&text) {
                let format = LbrFormat::from_encoding(enc).expect("0..8 are formats");
                if let Ok(values) = dump.values(dump.depth())
                    && let Ok(stack) = values.stack(tos, format) {
                        prop_assert!(stack.entries().count() <= usize::from(stack.depth()));
                    }
            }
        }

        #[test]
        fn random_structured_lbr_dumps_never_panic(
            lines in proptest::collection::vec((0u8..7, 0u8..40, any::<u64>()), 0..70),
            tos in 0u64..40,
            enc in 0u8..8,
        ) {
            let mut text = std::string::String::new();
            for (kind, n, value) in lines {
                let line = match kind {
                    0 => format!("MSR_LASTBRANCH_{n}_FROM_IP {value:#x}"),
                    1 => format!("MSR_LASTBRANCH_{n}_TO_IP {value}"),
                    2 => format!("{:#x} {value:#x}", 0x680 + u32::from(n)),
                    3 => format!("{:x}h = {value:x}h", 0x6C0 + u32::from(n)),
                    4 => format!("MSR_LBR_INFO_{n} {value:#x}"),
                    5 => format!("MSR_LASTBRANCH_TOS {}", value % 40),
                    _ => format!("# comment {value}"),
                };
                text.push_str(&line);
                text.push('\n');
            }
            let format = LbrFormat::from_encoding(enc).expect("0..8 are formats");
            if let Ok(dump) = LbrMsrDump::parse(&text)
                && let Ok(values) = dump.values(dump.depth())
                    && let Ok(stack) = values.stack(tos, format) {
                        prop_assert!(stack.entries().count() <= usize::from(stack.depth()));
                    }
        }

        #[test]
        fn random_lbr_stacks_never_panic(
            from in proptest::collection::vec(any::<u64>(), 0..34),
            to in proptest::collection::vec(any::<u64>(), 0..34),
            info in proptest::option::of(proptest::collection::vec(any::<u64>(), 0..34)),
            tos in 0u64..40,
            enc in 0u8..8,
        ) {
            let format = LbrFormat::from_encoding(enc).expect("0..8 are formats");
            if let Ok(stack) = LbrStack::new(&from, &to, info.as_deref(), tos, format) {
                prop_assert!(stack.entries().count() <= from.len());
            }
        }
    }
}
