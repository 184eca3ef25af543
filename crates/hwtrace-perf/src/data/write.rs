//! A perf.data (file format) writer for hwtrace's own captures.
//!
//! Layout: header (104 bytes) | attribute ids | attribute table | data
//! section (records, streamed) | feature table | feature payloads. The
//! header is written last (`finish` seeks back), so records stream straight
//! to the output and memory stays bounded whatever the capture's size.

use std::io::{self, Seek, SeekFrom, Write};

use super::attr::{ATTR_SIZE_VER7, Attr};
use super::auxtrace::{AUXTRACE, AUXTRACE_INFO, AUXTRACE_TYPE_INTEL_BTS, AUXTRACE_TYPE_INTEL_PT};
use super::auxtrace::{IntelBtsInfo, IntelPtInfo};
use super::header::{EventAttr, FILE_HEADER_SIZE, MAGIC, PIPE_HEADER_SIZE, feature};
use super::reader::user_type::{HEADER_ATTR, HEADER_FEATURE};
use super::sample::BranchEntry;
use crate::pevent::record::{SampleId, Task, record_type, sample_type as st};

/// What the feature sections will say.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FeatureData {
    /// `HEADER_HOSTNAME`.
    pub hostname: Option<String>,
    /// `HEADER_OSRELEASE`.
    pub osrelease: Option<String>,
    /// `HEADER_VERSION`.
    pub version: Option<String>,
    /// `HEADER_ARCH`.
    pub arch: Option<String>,
    /// `HEADER_NRCPUS`: (available, online).
    pub nrcpus: Option<(u32, u32)>,
    /// `HEADER_CPUDESC`.
    pub cpudesc: Option<String>,
    /// `HEADER_CPUID`.
    pub cpuid: Option<String>,
    /// `HEADER_TOTAL_MEM` (kB).
    pub total_mem: Option<u64>,
    /// `HEADER_CMDLINE`.
    pub cmdline: Option<Vec<String>>,
    /// `HEADER_BUILD_ID`: (pid, build id of up to 20 bytes, file name).
    pub build_ids: Vec<(i32, Vec<u8>, String)>,
}

/// Streams records into a perf.data file.
#[derive(Debug)]
pub struct PerfDataWriter<W: Write + Seek> {
    out: W,
    attrs_section: (u64, u64),
    attr_size: u64,
    data_start: u64,
    pos: u64,
    trailer_type: Option<u64>,
}

fn pad8(n: usize) -> usize {
    (n + 7) & !7
}

/// A string padded with NULs to a multiple of 8 (at least one NUL).
fn padded(s: &[u8]) -> Vec<u8> {
    let mut v = s.to_vec();
    v.resize(pad8(s.len() + 1), 0);
    v
}

/// `struct perf_header_string`: u32 length, then the padded string.
fn header_string(s: &str) -> Vec<u8> {
    let p = padded(s.as_bytes());
    let mut v = (p.len() as u32).to_le_bytes().to_vec();
    v.extend_from_slice(&p);
    v
}

fn record_too_big() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        "perf record larger than 64 KiB",
    )
}

impl<W: Write + Seek> PerfDataWriter<W> {
    /// Starts a file with these events. Non-sample records written through
    /// the helpers get a `sample_id` trailer shaped by the first attribute
    /// when it has `sample_id_all`.
    pub fn new(mut out: W, attrs: &[EventAttr]) -> io::Result<Self> {
        out.write_all(&[0u8; FILE_HEADER_SIZE as usize])?;
        let mut pos = FILE_HEADER_SIZE;
        let mut id_sections = Vec::new();
        for a in attrs {
            id_sections.push((pos, a.ids.len() as u64 * 8));
            for id in &a.ids {
                out.write_all(&id.to_le_bytes())?;
            }
            pos += a.ids.len() as u64 * 8;
        }
        let attrs_start = pos;
        let attr_size = attrs
            .iter()
            .map(|a| a.attr.encoded_size())
            .max()
            .unwrap_or(ATTR_SIZE_VER7);
        for (a, (off, size)) in attrs.iter().zip(&id_sections) {
            out.write_all(&a.attr.to_bytes_sized(attr_size))?;
            out.write_all(&off.to_le_bytes())?;
            out.write_all(&size.to_le_bytes())?;
            pos += u64::from(attr_size) + 16;
        }
        let trailer_type = attrs
            .first()
            .filter(|a| a.attr.sample_id_all())
            .map(|a| a.attr.sample_type);
        Ok(Self {
            out,
            attrs_section: (attrs_start, pos - attrs_start),
            attr_size: u64::from(attr_size) + 16,
            data_start: pos,
            pos,
            trailer_type,
        })
    }

    /// Writes the feature sections and the header; returns the output.
    pub fn finish(mut self, f: &FeatureData) -> io::Result<W> {
        let data_end = self.pos;
        let feats = feature_payloads(f)?;
        let mut at = data_end + feats.len() as u64 * 16;
        let mut bits = [0u64; 4];
        for (bit, payload) in &feats {
            bits[(*bit / 64) as usize] |= 1 << (bit % 64);
            self.out.write_all(&at.to_le_bytes())?;
            self.out.write_all(&(payload.len() as u64).to_le_bytes())?;
            at += payload.len() as u64;
        }
        for (_, payload) in &feats {
            self.out.write_all(payload)?;
        }
        let mut h = Vec::with_capacity(FILE_HEADER_SIZE as usize);
        let attr_size = self.attr_size;
        for v in [
            MAGIC,
            FILE_HEADER_SIZE,
            attr_size,
            self.attrs_section.0,
            self.attrs_section.1,
            self.data_start,
            data_end - self.data_start,
            0,
            0,
        ] {
            h.extend_from_slice(&v.to_le_bytes());
        }
        for b in bits {
            h.extend_from_slice(&b.to_le_bytes());
        }
        self.out.seek(SeekFrom::Start(0))?;
        self.out.write_all(&h)?;
        self.out.seek(SeekFrom::End(0))?;
        self.out.flush()?;
        Ok(self.out)
    }
}

impl<W: Write + Seek> RecordWriter for PerfDataWriter<W> {
    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.pos += bytes.len() as u64;
        Ok(())
    }

    fn trailer_type(&self) -> Option<u64> {
        self.trailer_type
    }
}

/// Streams records in perf's pipe format (what `perf record -o -` writes):
/// a 16-byte header, the events as `PERF_RECORD_HEADER_ATTR` records, the
/// features as `PERF_RECORD_HEADER_FEATURE` records, then the data. Needs
/// no seeking, so it can write to a pipe.
#[derive(Debug)]
pub struct PipeWriter<W: Write> {
    out: W,
    trailer_type: Option<u64>,
}

impl<W: Write> PipeWriter<W> {
    /// Writes the header, the events and the features.
    pub fn new(mut out: W, attrs: &[EventAttr], features: &FeatureData) -> io::Result<Self> {
        out.write_all(&MAGIC.to_le_bytes())?;
        out.write_all(&PIPE_HEADER_SIZE.to_le_bytes())?;
        let trailer_type = attrs
            .first()
            .filter(|a| a.attr.sample_id_all())
            .map(|a| a.attr.sample_type);
        let mut w = Self { out, trailer_type };
        for a in attrs {
            let mut b = a.attr.to_bytes();
            for id in &a.ids {
                b.extend_from_slice(&id.to_le_bytes());
            }
            w.write_record(HEADER_ATTR, 0, &b)?;
        }
        for (bit, payload) in feature_payloads(features)? {
            let mut b = u64::from(bit).to_le_bytes().to_vec();
            b.extend_from_slice(&payload);
            w.write_record(HEADER_FEATURE, 0, &b)?;
        }
        Ok(w)
    }

    /// Flushes and returns the output.
    pub fn finish(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

impl<W: Write> RecordWriter for PipeWriter<W> {
    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)
    }

    fn trailer_type(&self) -> Option<u64> {
        self.trailer_type
    }
}

/// Record writing shared by the file and pipe writers: each record is
/// built here and handed to [`RecordWriter::put`].
pub trait RecordWriter {
    /// Writes bytes to the data stream.
    fn put(&mut self, bytes: &[u8]) -> io::Result<()>;

    /// The `sample_type` that shapes non-sample records' `sample_id`
    /// trailers (`None` without `sample_id_all`).
    fn trailer_type(&self) -> Option<u64>;

    /// Writes one record: header, then `body` (which must include any
    /// `sample_id` trailer).
    fn write_record(&mut self, kind: u32, misc: u16, body: &[u8]) -> io::Result<()> {
        let size = u16::try_from(8 + body.len()).map_err(|_| record_too_big())?;
        self.put(&kind.to_le_bytes())?;
        self.put(&misc.to_le_bytes())?;
        self.put(&size.to_le_bytes())?;
        self.put(body)?;
        Ok(())
    }

    /// Writes a kernel record with its `sample_id` trailer.
    fn write_event(
        &mut self,
        kind: u32,
        misc: u16,
        body: &[u8],
        sample: &SampleId,
    ) -> io::Result<()> {
        let mut b = body.to_vec();
        if let Some(t) = self.trailer_type() {
            encode_sample_id(&mut b, t, sample);
        }
        self.write_record(kind, misc, &b)
    }

    /// `PERF_RECORD_MMAP2` (device fields form; `prot`/`flags` as mmap(2)).
    #[allow(clippy::too_many_arguments)]
    fn mmap2(
        &mut self,
        misc: u16,
        pid: u32,
        tid: u32,
        addr: u64,
        len: u64,
        pgoff: u64,
        prot: u32,
        flags: u32,
        filename: &str,
        sample: &SampleId,
    ) -> io::Result<()> {
        let mut b = Vec::with_capacity(72 + filename.len());
        b.extend_from_slice(&pid.to_le_bytes());
        b.extend_from_slice(&tid.to_le_bytes());
        for v in [addr, len, pgoff] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&[0u8; 24]); // maj, min, ino, ino_generation
        b.extend_from_slice(&prot.to_le_bytes());
        b.extend_from_slice(&flags.to_le_bytes());
        b.extend_from_slice(&padded(filename.as_bytes()));
        self.write_event(record_type::MMAP2, misc, &b, sample)
    }

    /// `PERF_RECORD_COMM` (`exec` sets `PERF_RECORD_MISC_COMM_EXEC`).
    fn comm(
        &mut self,
        pid: u32,
        tid: u32,
        comm: &str,
        exec: bool,
        sample: &SampleId,
    ) -> io::Result<()> {
        let mut b = Vec::new();
        b.extend_from_slice(&pid.to_le_bytes());
        b.extend_from_slice(&tid.to_le_bytes());
        b.extend_from_slice(&padded(comm.as_bytes()));
        let misc = if exec {
            crate::pevent::record::misc::COMM_EXEC
        } else {
            0
        };
        self.write_event(record_type::COMM, misc, &b, sample)
    }

    /// `PERF_RECORD_ITRACE_START`.
    fn itrace_start(&mut self, pid: u32, tid: u32, sample: &SampleId) -> io::Result<()> {
        let mut b = pid.to_le_bytes().to_vec();
        b.extend_from_slice(&tid.to_le_bytes());
        self.write_event(record_type::ITRACE_START, 0, &b, sample)
    }

    /// `PERF_RECORD_AUX`.
    fn aux(
        &mut self,
        aux_offset: u64,
        aux_size: u64,
        flags: u64,
        sample: &SampleId,
    ) -> io::Result<()> {
        let mut b = Vec::with_capacity(24);
        for v in [aux_offset, aux_size, flags] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        self.write_event(record_type::AUX, 0, &b, sample)
    }

    /// `PERF_RECORD_EXIT` / `PERF_RECORD_FORK` (`fork` picks which).
    fn task(&mut self, fork: bool, t: &Task, sample: &SampleId) -> io::Result<()> {
        let mut b = Vec::with_capacity(24);
        for v in [t.pid, t.ppid, t.tid, t.ptid] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&t.time.to_le_bytes());
        let kind = if fork {
            record_type::FORK
        } else {
            record_type::EXIT
        };
        self.write_event(kind, 0, &b, sample)
    }

    /// `PERF_RECORD_AUXTRACE_INFO` for Intel PT.
    fn auxtrace_info_pt(&mut self, info: &IntelPtInfo) -> io::Result<()> {
        self.auxtrace_info(AUXTRACE_TYPE_INTEL_PT, &info.to_words())
    }

    /// `PERF_RECORD_AUXTRACE_INFO` for Intel BTS.
    fn auxtrace_info_bts(&mut self, info: &IntelBtsInfo) -> io::Result<()> {
        self.auxtrace_info(AUXTRACE_TYPE_INTEL_BTS, &info.to_words())
    }

    fn auxtrace_info(&mut self, kind: u32, words: &[u64]) -> io::Result<()> {
        let mut b = kind.to_le_bytes().to_vec();
        b.extend_from_slice(&[0u8; 4]);
        for w in words {
            b.extend_from_slice(&w.to_le_bytes());
        }
        self.write_record(AUXTRACE_INFO, 0, &b)
    }

    /// `PERF_RECORD_AUXTRACE` and its payload (padded to 8 bytes as perf
    /// does; `size` says the padded length). `cpu`/`tid` are `u32::MAX` for
    /// "none" (perf's -1).
    fn auxtrace(
        &mut self,
        data: &[u8],
        offset: u64,
        reference: u64,
        idx: u32,
        tid: u32,
        cpu: u32,
    ) -> io::Result<()> {
        self.auxtrace_parts(&[data], offset, reference, idx, tid, cpu)
    }

    /// `PERF_RECORD_AUXTRACE` whose payload is the concatenation of `parts`
    /// (a wrapped AUX area is two slices; nothing is joined in memory).
    fn auxtrace_parts(
        &mut self,
        parts: &[&[u8]],
        offset: u64,
        reference: u64,
        idx: u32,
        tid: u32,
        cpu: u32,
    ) -> io::Result<()> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let size = pad8(len) as u64;
        let mut b = Vec::with_capacity(40);
        for v in [size, offset, reference] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for v in [idx, tid, cpu, 0] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        self.write_record(AUXTRACE, 0, &b)?;
        for p in parts {
            self.put(p)?;
        }
        self.put(&[0u8; 8][..size as usize - len])?;
        Ok(())
    }

    /// Copies a whole record (header included) as it came from the kernel's
    /// ring; its size must match its header.
    fn write_raw_record(&mut self, record: &[u8]) -> io::Result<()> {
        let size = record
            .get(6..8)
            .map(|b| usize::from(u16::from_le_bytes([b[0], b[1]])));
        if size != Some(record.len()) || record.len() < 8 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "record size does not match its header",
            ));
        }
        self.put(record)?;
        Ok(())
    }

    /// `PERF_RECORD_FINISHED_ROUND`.
    fn finished_round(&mut self) -> io::Result<()> {
        self.write_record(68, 0, &[])
    }

    /// `PERF_RECORD_SAMPLE` shaped by `attr` (its `sample_type`, and
    /// `branch_sample_type` for `hw_idx`). `misc` carries the cpumode
    /// (2 = user). Sample types this writer cannot fill are refused.
    fn sample(&mut self, attr: &Attr, misc: u16, s: &SampleData<'_>) -> io::Result<()> {
        self.write_record(record_type::SAMPLE, misc, &encode_sample(attr, s)?)
    }
}

/// What a SAMPLE record holds, for [`RecordWriter::sample`]: each field is
/// written when the attribute's `sample_type` asks for it (missing values
/// as 0).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleData<'b> {
    /// `PERF_SAMPLE_IP`.
    pub ip: u64,
    /// `PERF_SAMPLE_TID`.
    pub pid_tid: (u32, u32),
    /// `PERF_SAMPLE_TIME`.
    pub time: u64,
    /// `PERF_SAMPLE_ADDR`.
    pub addr: u64,
    /// `PERF_SAMPLE_ID` and `PERF_SAMPLE_IDENTIFIER`.
    pub id: u64,
    /// `PERF_SAMPLE_STREAM_ID`.
    pub stream_id: u64,
    /// `PERF_SAMPLE_CPU`.
    pub cpu: u32,
    /// `PERF_SAMPLE_PERIOD`.
    pub period: u64,
    /// `PERF_SAMPLE_BRANCH_STACK`: newest first, as LBR reports them.
    pub branches: &'b [BranchEntry],
    /// `hw_idx` (with `PERF_SAMPLE_BRANCH_HW_INDEX`).
    pub hw_idx: u64,
}

/// The body of a SAMPLE record (see [`RecordWriter::sample`]).
pub fn encode_sample(attr: &Attr, s: &SampleData<'_>) -> io::Result<Vec<u8>> {
    use super::attr::{branch, sample};
    const WRITABLE: u64 = sample::IDENTIFIER
        | sample::IP
        | sample::TID
        | sample::TIME
        | sample::ADDR
        | sample::ID
        | sample::STREAM_ID
        | sample::CPU
        | sample::PERIOD
        | sample::BRANCH_STACK;
    let t = attr.sample_type;
    if t & !WRITABLE != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "sample_type bits {:#x} are not written by hwtrace",
                t & !WRITABLE
            ),
        ));
    }
    let mut b = Vec::with_capacity(64 + s.branches.len() * 24);
    let mut q = |on: bool, v: u64| {
        if on {
            b.extend_from_slice(&v.to_le_bytes());
        }
    };
    q(t & sample::IDENTIFIER != 0, s.id);
    q(t & sample::IP != 0, s.ip);
    q(
        t & sample::TID != 0,
        u64::from(s.pid_tid.0) | u64::from(s.pid_tid.1) << 32,
    );
    q(t & sample::TIME != 0, s.time);
    q(t & sample::ADDR != 0, s.addr);
    q(t & sample::ID != 0, s.id);
    q(t & sample::STREAM_ID != 0, s.stream_id);
    q(t & sample::CPU != 0, u64::from(s.cpu));
    q(t & sample::PERIOD != 0, s.period);
    if t & sample::BRANCH_STACK != 0 {
        q(true, s.branches.len() as u64);
        q(attr.branch_sample_type & branch::HW_INDEX != 0, s.hw_idx);
        for e in s.branches {
            q(true, e.from);
            q(true, e.to);
            q(true, e.flags);
        }
        if attr.branch_sample_type & branch::COUNTERS != 0 {
            for _ in s.branches {
                q(true, 0);
            }
        }
    }
    Ok(b)
}

/// The feature sections' payloads, in feature-bit order.
fn feature_payloads(f: &FeatureData) -> io::Result<Vec<(u32, Vec<u8>)>> {
    let mut feats: Vec<(u32, Vec<u8>)> = Vec::new();
    if !f.build_ids.is_empty() {
        let mut b = Vec::new();
        for (pid, id, name) in &f.build_ids {
            let name = padded(name.as_bytes());
            let size = u16::try_from(8 + 4 + 24 + name.len()).map_err(|_| record_too_big())?;
            b.extend_from_slice(&0u32.to_le_bytes());
            b.extend_from_slice(&(1u16 << 15 | 2).to_le_bytes()); // BUILD_ID_SIZE | user
            b.extend_from_slice(&size.to_le_bytes());
            b.extend_from_slice(&pid.to_le_bytes());
            let mut raw = [0u8; 24];
            let n = id.len().min(20);
            raw[..n].copy_from_slice(&id[..n]);
            raw[20] = n as u8;
            b.extend_from_slice(&raw);
            b.extend_from_slice(&name);
        }
        feats.push((feature::BUILD_ID, b));
    }
    let strings = [
        (feature::HOSTNAME, &f.hostname),
        (feature::OSRELEASE, &f.osrelease),
        (feature::VERSION, &f.version),
        (feature::ARCH, &f.arch),
    ];
    for (bit, s) in strings {
        if let Some(s) = s {
            feats.push((bit, header_string(s)));
        }
    }
    if let Some((avail, online)) = f.nrcpus {
        let mut b = avail.to_le_bytes().to_vec();
        b.extend_from_slice(&online.to_le_bytes());
        feats.push((feature::NRCPUS, b));
    }
    if let Some(s) = &f.cpudesc {
        feats.push((feature::CPUDESC, header_string(s)));
    }
    if let Some(s) = &f.cpuid {
        feats.push((feature::CPUID, header_string(s)));
    }
    if let Some(m) = f.total_mem {
        feats.push((feature::TOTAL_MEM, m.to_le_bytes().to_vec()));
    }
    if let Some(args) = &f.cmdline {
        let mut b = (args.len() as u32).to_le_bytes().to_vec();
        for a in args {
            b.extend_from_slice(&header_string(a));
        }
        feats.push((feature::CMDLINE, b));
    }
    feats.sort_by_key(|(bit, _)| *bit);
    Ok(feats)
}

/// Appends a `sample_id` trailer for `sample_type` (missing values as 0).
pub fn encode_sample_id(b: &mut Vec<u8>, sample_type: u64, s: &SampleId) {
    if sample_type & st::TID != 0 {
        let (pid, tid) = s.pid_tid.unwrap_or((0, 0));
        b.extend_from_slice(&pid.to_le_bytes());
        b.extend_from_slice(&tid.to_le_bytes());
    }
    let mut q = |on: bool, v: Option<u64>| {
        if on {
            b.extend_from_slice(&v.unwrap_or(0).to_le_bytes());
        }
    };
    q(sample_type & st::TIME != 0, s.time);
    q(sample_type & st::ID != 0, s.id);
    q(sample_type & st::STREAM_ID != 0, s.stream_id);
    q(sample_type & st::CPU != 0, s.cpu.map(u64::from));
    q(sample_type & st::IDENTIFIER != 0, s.identifier);
}

/// The Intel PT attribute hwtrace writes: `pmu_type` as the PMU number,
/// `config` as built from the PMU's format terms, sample type
/// TID|TIME|CPU|IDENTIFIER with `sample_id_all`, user-space only.
pub fn intel_pt_attr(pmu_type: u32, config: u64) -> Attr {
    use super::attr::{flag, sample};
    let mut a = Attr {
        kind: pmu_type,
        config,
        sample_period: 1,
        sample_type: sample::IP | sample::TID | sample::TIME | sample::CPU | sample::IDENTIFIER,
        ..Attr::default()
    };
    for bit in [
        flag::DISABLED,
        flag::EXCLUDE_KERNEL,
        flag::EXCLUDE_HV,
        flag::SAMPLE_ID_ALL,
        flag::ENABLE_ON_EXEC,
    ] {
        a.set(bit, true);
    }
    a
}
