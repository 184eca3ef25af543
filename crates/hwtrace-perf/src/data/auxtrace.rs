//! `PERF_RECORD_AUXTRACE_INFO` and `PERF_RECORD_AUXTRACE`, the user-space
//! records perf writes around AUX area data (Linux
//! `tools/lib/perf/include/perf/event.h`, `struct perf_record_auxtrace_info`
//! and `struct perf_record_auxtrace`).
//!
//! AUXTRACE_INFO is `{ header; u32 type; u32 reserved; u64 priv[]; }`. The
//! private words of Intel PT are, in order (perf `tools/perf/util/intel-pt.h`,
//! the `INTEL_PT_*` index enum): pmu_type, time_shift, time_mult, time_zero,
//! cap_user_time_zero, tsc_bit, noretcomp_bit, have_sched_switch,
//! snapshot_mode, per_cpu_mmaps, then (newer perf) mtc_bit, mtc_freq_bits,
//! tsc_ctc_ratio_n, tsc_ctc_ratio_d, cyc_bit, then max_non_turbo_ratio, then
//! filter_str_len (the string's length) followed by the NUL-terminated
//! filter string padded to 8 bytes. Older files stop after any of these groups: absent words are
//! `None`. Intel BTS has pmu_type, time_shift, time_mult, time_zero,
//! cap_user_time_zero, snapshot_mode.
//!
//! AUXTRACE is `{ header; u64 size, offset, reference; u32 idx, tid, cpu,
//! reserved; }` followed by `size` payload bytes that `header.size` does not
//! count.

use super::bytes::{Cursor, cstr, le64};
use super::error::Error;

/// `PERF_RECORD_AUXTRACE_INFO`.
pub const AUXTRACE_INFO: u32 = 70;
/// `PERF_RECORD_AUXTRACE`.
pub const AUXTRACE: u32 = 71;
/// The size of a `PERF_RECORD_AUXTRACE` without its payload.
pub const AUXTRACE_RECORD_SIZE: usize = 48;

/// `enum auxtrace_type` value for Intel PT.
pub const AUXTRACE_TYPE_INTEL_PT: u32 = 1;
/// `enum auxtrace_type` value for Intel BTS.
pub const AUXTRACE_TYPE_INTEL_BTS: u32 = 2;

/// The TSC ↔ perf time conversion the kernel publishes in
/// `perf_event_mmap_page` (`time_shift`, `time_mult`, `time_zero`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TscConversion {
    /// `time_shift`.
    pub time_shift: u16,
    /// `time_mult`.
    pub time_mult: u32,
    /// `time_zero`.
    pub time_zero: u64,
    /// `cap_user_time_zero`: the three values above are valid.
    pub cap_user_time_zero: bool,
}

/// Intel PT's AUXTRACE_INFO private words.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IntelPtInfo {
    /// The `intel_pt` PMU type the trace was recorded with.
    pub pmu_type: u32,
    /// TSC conversion.
    pub tsc: TscConversion,
    /// The config bit that enables TSC packets.
    pub tsc_bit: u64,
    /// The config bit that disables return compression.
    pub noretcomp_bit: u64,
    /// How context switches were recorded: 0 not, 1 a `sched:sched_switch`
    /// tracepoint event, 2 events with the `context_switch` flag (per-task
    /// PERF_RECORD_SWITCH), 3 CPU-wide PERF_RECORD_SWITCH_CPU_WIDE.
    pub have_sched_switch: u64,
    /// Snapshot mode (`perf record -S`).
    pub snapshot_mode: bool,
    /// One AUX area per CPU (else per thread).
    pub per_cpu_mmaps: bool,
    /// The config bit that enables MTC packets (newer files only).
    pub mtc_bit: Option<u64>,
    /// The config bits of the MTC period field.
    pub mtc_freq_bits: Option<u64>,
    /// TSC:CTC ratio numerator (CPUID 15H EBX).
    pub tsc_ctc_ratio_n: Option<u64>,
    /// TSC:CTC ratio denominator (CPUID 15H EAX).
    pub tsc_ctc_ratio_d: Option<u64>,
    /// The config bit that enables CYC packets.
    pub cyc_bit: Option<u64>,
    /// The maximum non-turbo ratio.
    pub max_non_turbo_ratio: Option<u64>,
    /// The address filter string (`--filter`), if the file has one.
    pub filter: Option<Vec<u8>>,
}

/// Intel BTS's AUXTRACE_INFO private words.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IntelBtsInfo {
    /// The `intel_bts` PMU type.
    pub pmu_type: u32,
    /// TSC conversion.
    pub tsc: TscConversion,
    /// Snapshot mode.
    pub snapshot_mode: bool,
}

/// What an AUXTRACE_INFO record says.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AuxtraceKind<'a> {
    /// Intel PT.
    IntelPt(IntelPtInfo),
    /// Intel BTS.
    IntelBts(IntelBtsInfo),
    /// Another tracer (ARM CoreSight, SPE, s390, ...), its words raw.
    Other(&'a [u8]),
}

/// `PERF_RECORD_AUXTRACE_INFO`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuxtraceInfo<'a> {
    /// `enum auxtrace_type`.
    pub kind_code: u32,
    /// The decoded private words.
    pub kind: AuxtraceKind<'a>,
}

const PT_BASE_WORDS: usize = 10;

impl<'a> AuxtraceInfo<'a> {
    /// Parses the record body after its 8-byte header; `offset` is the
    /// record's file offset.
    pub fn parse(body: &'a [u8], offset: u64) -> Result<Self, Error> {
        let mut c = Cursor::new(body, offset + 8, "AUXTRACE_INFO");
        let kind_code = c.u32()?;
        let _reserved = c.u32()?;
        let words = &body[c.pos()..];
        let n = words.len() / 8;
        let w = |i: usize| (i < n).then(|| le64(&words[i * 8..]));
        let tsc = |base: usize| TscConversion {
            time_shift: w(base).unwrap_or(0) as u16,
            time_mult: w(base + 1).unwrap_or(0) as u32,
            time_zero: w(base + 2).unwrap_or(0),
            cap_user_time_zero: w(base + 3).unwrap_or(0) != 0,
        };
        let kind = match kind_code {
            AUXTRACE_TYPE_INTEL_PT if n >= PT_BASE_WORDS => {
                let ext = n >= 15;
                let filter = match w(16) {
                    Some(len) if len > 0 => {
                        let start: usize = 17 * 8;
                        let len = usize::try_from(len).unwrap_or(usize::MAX);
                        let bytes =
                            words
                                .get(start..start.saturating_add(len))
                                .ok_or(Error::at(
                                    offset + 16 + start as u64,
                                    super::error::ErrorKind::Truncated {
                                        what: "intel_pt filter string",
                                        needed: len as u64,
                                        available: words.len().saturating_sub(start) as u64,
                                    },
                                ))?;
                        Some(cstr(bytes).to_vec())
                    }
                    _ => None,
                };
                AuxtraceKind::IntelPt(IntelPtInfo {
                    pmu_type: w(0).unwrap_or(0) as u32,
                    tsc: tsc(1),
                    tsc_bit: w(5).unwrap_or(0),
                    noretcomp_bit: w(6).unwrap_or(0),
                    have_sched_switch: w(7).unwrap_or(0),
                    snapshot_mode: w(8).unwrap_or(0) != 0,
                    per_cpu_mmaps: w(9).unwrap_or(0) != 0,
                    mtc_bit: w(10).filter(|_| ext),
                    mtc_freq_bits: w(11).filter(|_| ext),
                    tsc_ctc_ratio_n: w(12).filter(|_| ext),
                    tsc_ctc_ratio_d: w(13).filter(|_| ext),
                    cyc_bit: w(14).filter(|_| ext),
                    max_non_turbo_ratio: w(15),
                    filter,
                })
            }
            AUXTRACE_TYPE_INTEL_BTS if n >= 6 => AuxtraceKind::IntelBts(IntelBtsInfo {
                pmu_type: w(0).unwrap_or(0) as u32,
                tsc: tsc(1),
                snapshot_mode: w(5).unwrap_or(0) != 0,
            }),
            _ => AuxtraceKind::Other(words),
        };
        Ok(Self { kind_code, kind })
    }
}

impl IntelPtInfo {
    /// The info of a trace recorded with Linux's `intel_pt` PMU number
    /// `pmu_type`: its format's config bits (`cyc` 1, `mtc` 9, `tsc` 10,
    /// `noretcomp` 11, `mtc_period` 14–17; `/sys/bus/event_source/devices/
    /// intel_pt/format`), no TSC:CTC or non-turbo ratio known, and nothing
    /// else set: what a perf.data written for a trace perf did not record
    /// itself says.
    pub fn linux_pmu(pmu_type: u32) -> Self {
        Self {
            pmu_type,
            tsc_bit: 1 << 10,
            noretcomp_bit: 1 << 11,
            mtc_bit: Some(1 << 9),
            mtc_freq_bits: Some(0xf << 14),
            tsc_ctc_ratio_n: Some(0),
            tsc_ctc_ratio_d: Some(0),
            cyc_bit: Some(1 << 1),
            max_non_turbo_ratio: Some(0),
            ..Self::default()
        }
    }

    /// The private words as perf writes them (all 17, then the filter).
    pub fn to_words(&self) -> Vec<u64> {
        let t = &self.tsc;
        let mut v = vec![
            u64::from(self.pmu_type),
            u64::from(t.time_shift),
            u64::from(t.time_mult),
            t.time_zero,
            u64::from(t.cap_user_time_zero),
            self.tsc_bit,
            self.noretcomp_bit,
            self.have_sched_switch,
            u64::from(self.snapshot_mode),
            u64::from(self.per_cpu_mmaps),
            self.mtc_bit.unwrap_or(0),
            self.mtc_freq_bits.unwrap_or(0),
            self.tsc_ctc_ratio_n.unwrap_or(0),
            self.tsc_ctc_ratio_d.unwrap_or(0),
            self.cyc_bit.unwrap_or(0),
            self.max_non_turbo_ratio.unwrap_or(0),
        ];
        match &self.filter {
            Some(f) if !f.is_empty() => {
                // The length word is the string's length; the string
                // follows NUL-terminated, padded to 8 bytes (perf reads
                // roundup(len + 1, 8) bytes).
                let mut bytes = f.clone();
                v.push(bytes.len() as u64);
                bytes.push(0);
                while bytes.len() % 8 != 0 {
                    bytes.push(0);
                }
                v.extend(bytes.chunks(8).map(le64));
            }
            _ => v.push(0),
        }
        v
    }
}

impl IntelBtsInfo {
    /// The private words as perf writes them.
    pub fn to_words(&self) -> Vec<u64> {
        vec![
            u64::from(self.pmu_type),
            u64::from(self.tsc.time_shift),
            u64::from(self.tsc.time_mult),
            self.tsc.time_zero,
            u64::from(self.tsc.cap_user_time_zero),
            u64::from(self.snapshot_mode),
        ]
    }
}

/// `PERF_RECORD_AUXTRACE`: one buffer of AUX area data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Auxtrace<'a> {
    /// The payload size.
    pub size: u64,
    /// The buffer's offset in the AUX area's infinite byte stream
    /// (`aux_tail` when it was read).
    pub offset: u64,
    /// An opaque reference (perf puts a timestamp here).
    pub reference: u64,
    /// The mmap index (the queue number).
    pub idx: u32,
    /// The thread, for per-thread AUX areas (`u32::MAX` when per CPU).
    pub tid: u32,
    /// The CPU, for per-CPU AUX areas (`u32::MAX` when per thread).
    pub cpu: u32,
    /// The payload: borrowed from the file, never copied.
    pub data: &'a [u8],
    /// The file offset of the payload.
    pub data_offset: u64,
}

/// Parses the fixed part of an AUXTRACE record (`raw` is the 48-byte
/// record, header included).
pub(crate) fn parse_auxtrace_fixed(
    raw: &[u8],
    offset: u64,
) -> Result<(u64, u64, u64, u32, u32, u32), Error> {
    let mut c = Cursor::new(raw, offset, "AUXTRACE");
    c.take(8)?;
    Ok((c.u64()?, c.u64()?, c.u64()?, c.u32()?, c.u32()?, c.u32()?))
}
