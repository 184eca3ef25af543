//! The perf.data file header, attribute table and feature sections (Linux
//! `tools/perf/Documentation/perf.data-file-format.txt`).
//!
//! ```text
//! struct perf_file_header {            // 104 bytes
//!     u64 magic;                       // "PERFILE2"
//!     u64 size;                        // sizeof(struct perf_file_header)
//!     u64 attr_size;                   // sizeof one attrs[] entry
//!     struct perf_file_section attrs;  // { u64 offset, size; }
//!     struct perf_file_section data;
//!     struct perf_file_section event_types;  // unused
//!     u64 adds_features[4];            // one bit per HEADER_* feature
//! };
//! attrs[i] = { struct perf_event_attr attr; struct perf_file_section ids; }
//! ```
//!
//! The feature sections follow the data section: one `perf_file_section`
//! per set feature bit, in bit order. The pipe format is a 16-byte header
//! (`magic`, `size` = 16) followed by records only: attributes and features
//! arrive as `PERF_RECORD_HEADER_ATTR` and `PERF_RECORD_HEADER_FEATURE`.

use super::attr::{ATTR_SIZE_VER0, Attr};
use super::bytes::{Cursor, cstr, le64};
use super::compressed::Compression;
use super::error::{Error, ErrorKind};

/// `"PERFILE2"` read as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"PERFILE2");
/// The size of the file-mode header.
pub const FILE_HEADER_SIZE: u64 = 104;
/// The size of the pipe-mode header.
pub const PIPE_HEADER_SIZE: u64 = 16;

/// Feature numbers (`HEADER_*` in perf's `util/header.h`).
pub mod feature {
    /// `HEADER_TRACING_DATA`.
    pub const TRACING_DATA: u32 = 1;
    /// `HEADER_BUILD_ID`.
    pub const BUILD_ID: u32 = 2;
    /// `HEADER_HOSTNAME`.
    pub const HOSTNAME: u32 = 3;
    /// `HEADER_OSRELEASE`.
    pub const OSRELEASE: u32 = 4;
    /// `HEADER_VERSION`.
    pub const VERSION: u32 = 5;
    /// `HEADER_ARCH`.
    pub const ARCH: u32 = 6;
    /// `HEADER_NRCPUS`.
    pub const NRCPUS: u32 = 7;
    /// `HEADER_CPUDESC`.
    pub const CPUDESC: u32 = 8;
    /// `HEADER_CPUID`.
    pub const CPUID: u32 = 9;
    /// `HEADER_TOTAL_MEM`.
    pub const TOTAL_MEM: u32 = 10;
    /// `HEADER_CMDLINE`.
    pub const CMDLINE: u32 = 11;
    /// `HEADER_AUXTRACE` (an index of AUXTRACE records).
    pub const AUXTRACE: u32 = 18;
    /// `HEADER_COMPRESSED` (`perf record -z`).
    pub const COMPRESSED: u32 = 27;

    /// A feature's name as `perf report --header` prints it.
    pub fn name(f: u32) -> &'static str {
        const NAMES: [&str; 32] = [
            "reserved",
            "tracing_data",
            "build_id",
            "hostname",
            "osrelease",
            "version",
            "arch",
            "nrcpus",
            "cpudesc",
            "cpuid",
            "total_mem",
            "cmdline",
            "event_desc",
            "cpu_topology",
            "numa_topology",
            "branch_stack",
            "pmu_mappings",
            "group_desc",
            "auxtrace",
            "stat",
            "cache",
            "sample_time",
            "mem_topology",
            "clockid",
            "dir_format",
            "bpf_prog_info",
            "bpf_btf",
            "compressed",
            "cpu_pmu_caps",
            "clock_data",
            "hybrid_topology",
            "pmu_caps",
        ];
        NAMES.get(f as usize).copied().unwrap_or("unknown")
    }
}

/// `struct perf_file_section`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileSection {
    /// File offset.
    pub offset: u64,
    /// Size in bytes.
    pub size: u64,
}

/// `struct perf_file_header` (file mode) or the pipe header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileHeader {
    /// The header's `size` field (104 in file mode, 16 in pipe mode).
    pub size: u64,
    /// The size of one attribute table entry (0 in pipe mode).
    pub attr_size: u64,
    /// The attribute table.
    pub attrs: FileSection,
    /// The data section (in pipe mode: everything after the header).
    pub data: FileSection,
    /// `adds_features`.
    pub features: [u64; 4],
}

impl FileHeader {
    /// Whether this is a pipe-mode stream.
    pub fn is_pipe(&self) -> bool {
        self.size == PIPE_HEADER_SIZE
    }

    /// The feature numbers whose bit is set, in order.
    pub fn feature_bits(&self) -> impl Iterator<Item = u32> + '_ {
        (0..256u32).filter(|&b| self.features[(b / 64) as usize] & (1 << (b % 64)) != 0)
    }
}

/// One event: its attribute and the sample ids that identify it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EventAttr {
    /// `perf_event_attr`.
    pub attr: Attr,
    /// The ids of this event's instances (one per CPU/thread).
    pub ids: Vec<u64>,
}

/// One `HEADER_BUILD_ID` entry (`struct perf_record_header_build_id`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BuildId<'a> {
    /// The pid (-1 for the kernel/host).
    pub pid: i32,
    /// `header.misc` (cpumode; bit 15 = the size byte is valid).
    pub misc: u16,
    /// The build id bytes.
    pub build_id: &'a [u8],
    /// The file name.
    pub filename: &'a [u8],
}

/// The feature sections this reader understands; the others are listed in
/// [`Features::present`] with where they are.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Features<'a> {
    /// Every feature present: number and section.
    pub present: Vec<(u32, FileSection)>,
    /// `HEADER_BUILD_ID`.
    pub build_ids: Vec<BuildId<'a>>,
    /// `HEADER_HOSTNAME`.
    pub hostname: Option<&'a [u8]>,
    /// `HEADER_OSRELEASE`.
    pub osrelease: Option<&'a [u8]>,
    /// `HEADER_VERSION` (perf's version).
    pub version: Option<&'a [u8]>,
    /// `HEADER_ARCH`.
    pub arch: Option<&'a [u8]>,
    /// `HEADER_NRCPUS`: (available, online).
    pub nrcpus: Option<(u32, u32)>,
    /// `HEADER_CPUDESC`.
    pub cpudesc: Option<&'a [u8]>,
    /// `HEADER_CPUID` (e.g. `GenuineIntel,6,85,4`).
    pub cpuid: Option<&'a [u8]>,
    /// `HEADER_TOTAL_MEM` in kB.
    pub total_mem: Option<u64>,
    /// `HEADER_CMDLINE`: perf's argv.
    pub cmdline: Option<Vec<&'a [u8]>>,
    /// `HEADER_AUXTRACE`: (file offset, size) of each AUXTRACE record.
    pub auxtrace_index: Vec<(u64, u64)>,
    /// `HEADER_COMPRESSED`: the records are zstd-compressed.
    pub compressed: Option<Compression>,
    /// Features that failed to parse (the rest of the file is still read).
    pub errors: Vec<Error>,
}

fn section(c: &mut Cursor<'_>) -> Result<FileSection, Error> {
    Ok(FileSection {
        offset: c.u64()?,
        size: c.u64()?,
    })
}

/// `bytes[s]`, or a typed error naming the section.
pub(crate) fn section_bytes<'a>(
    bytes: &'a [u8],
    s: FileSection,
    what: &'static str,
) -> Result<&'a [u8], Error> {
    let end = s.offset.checked_add(s.size);
    match end {
        Some(end) if end <= bytes.len() as u64 => Ok(&bytes[s.offset as usize..end as usize]),
        _ => Err(Error::at(
            s.offset,
            ErrorKind::SectionOutOfBounds {
                what,
                offset: s.offset,
                size: s.size,
                file_len: bytes.len() as u64,
            },
        )),
    }
}

/// Parses the header (file or pipe mode).
pub fn parse_file_header(bytes: &[u8]) -> Result<FileHeader, Error> {
    let mut c = Cursor::new(bytes, 0, "perf.data header");
    let magic = c.u64()?;
    if magic != MAGIC {
        return Err(Error::at(0, ErrorKind::BadMagic { found: magic }));
    }
    let size = c.u64()?;
    if size == PIPE_HEADER_SIZE {
        return Ok(FileHeader {
            size,
            data: FileSection {
                offset: PIPE_HEADER_SIZE,
                size: bytes.len() as u64 - PIPE_HEADER_SIZE,
            },
            ..FileHeader::default()
        });
    }
    if size < FILE_HEADER_SIZE {
        return Err(Error::at(
            8,
            ErrorKind::BadSize {
                what: "header size",
                value: size,
            },
        ));
    }
    let attr_size = c.u64()?;
    let attrs = section(&mut c)?;
    let data = section(&mut c)?;
    let _event_types = section(&mut c)?;
    let features = [c.u64()?, c.u64()?, c.u64()?, c.u64()?];
    Ok(FileHeader {
        size,
        attr_size,
        attrs,
        data,
        features,
    })
}

/// Reads an `ids` array (capped by what the file holds: never allocates
/// more than the section's size).
fn read_ids(bytes: &[u8], s: FileSection) -> Result<Vec<u64>, Error> {
    let b = section_bytes(bytes, s, "attribute ids")?;
    Ok(b.chunks_exact(8).map(le64).collect())
}

/// Parses the attribute table of a file-mode perf.data.
pub fn parse_attrs(bytes: &[u8], h: &FileHeader) -> Result<Vec<EventAttr>, Error> {
    if h.attrs.size == 0 {
        return Ok(Vec::new());
    }
    let entry = h.attr_size;
    // An entry is an attribute (at least VER0) plus a 16-byte ids section.
    if entry < u64::from(ATTR_SIZE_VER0) + 16 || entry > 4096 {
        return Err(Error::at(
            16,
            ErrorKind::BadSize {
                what: "attr_size",
                value: entry,
            },
        ));
    }
    let table = section_bytes(bytes, h.attrs, "attrs")?;
    let entry = entry as usize;
    let mut out = Vec::with_capacity(table.len() / entry);
    // perf writes each event's ids once, in sections of their own: all of
    // them fit in the file. Sections that overlap could otherwise make
    // every event read the whole file as ids (events × file size).
    let mut total_ids = 0u64;
    for (i, e) in table.chunks_exact(entry).enumerate() {
        let off = h.attrs.offset + (i * entry) as u64;
        let attr_len = entry - 16;
        let attr = Attr::parse(&e[..attr_len]);
        let mut c = Cursor::new(&e[attr_len..], off + attr_len as u64, "attr ids section");
        let s = section(&mut c)?;
        total_ids = total_ids.saturating_add(s.size / 8);
        if total_ids > bytes.len() as u64 / 8 {
            return Err(Error::at(
                off + attr_len as u64,
                ErrorKind::BadSize {
                    what: "attribute ids (more than the file holds: sections overlap)",
                    value: total_ids,
                },
            ));
        }
        let ids = read_ids(bytes, s)?;
        out.push(EventAttr { attr, ids });
    }
    Ok(out)
}

/// `struct perf_header_string { u32 len; char s[len]; }`.
fn header_string<'a>(c: &mut Cursor<'a>) -> Result<&'a [u8], Error> {
    let len = c.u32()?;
    Ok(cstr(c.take(len as usize)?))
}

impl<'a> Features<'a> {
    /// Parses the feature sections of a file-mode perf.data. A missing
    /// table or a broken section is recorded in [`Features::errors`], not
    /// fatal.
    pub fn parse(bytes: &'a [u8], h: &FileHeader) -> Result<Self, Error> {
        let mut f = Features::default();
        if h.is_pipe() {
            return Ok(f);
        }
        let start = h.data.offset.saturating_add(h.data.size);
        let bits: Vec<u32> = h.feature_bits().collect();
        let table = FileSection {
            offset: start,
            size: bits.len() as u64 * 16,
        };
        // A file whose recording was cut short may lack the table: the
        // records are still readable, so this is not fatal.
        let table = match section_bytes(bytes, table, "feature table") {
            Ok(t) => t,
            Err(e) => {
                f.errors.push(e);
                return Ok(f);
            }
        };
        let mut c = Cursor::new(table, start, "feature table");
        for &bit in &bits {
            let s = section(&mut c)?;
            f.present.push((bit, s));
            if let Err(e) = f.parse_one(bytes, bit, s) {
                f.errors.push(e);
            }
        }
        Ok(f)
    }

    /// Parses one feature from a `HEADER_FEATURE` record body or a section.
    pub(crate) fn parse_one(
        &mut self,
        bytes: &'a [u8],
        bit: u32,
        s: FileSection,
    ) -> Result<(), Error> {
        let b = section_bytes(bytes, s, feature::name(bit))?;
        let mut c = Cursor::new(b, s.offset, feature::name(bit));
        let bad = |reason| {
            Error::at(
                s.offset,
                ErrorKind::Feature {
                    feature: bit,
                    name: feature::name(bit),
                    reason,
                },
            )
        };
        match bit {
            feature::HOSTNAME => self.hostname = Some(header_string(&mut c)?),
            feature::OSRELEASE => self.osrelease = Some(header_string(&mut c)?),
            feature::VERSION => self.version = Some(header_string(&mut c)?),
            feature::ARCH => self.arch = Some(header_string(&mut c)?),
            feature::CPUDESC => self.cpudesc = Some(header_string(&mut c)?),
            feature::CPUID => self.cpuid = Some(header_string(&mut c)?),
            feature::NRCPUS => self.nrcpus = Some((c.u32()?, c.u32()?)),
            feature::TOTAL_MEM => self.total_mem = Some(c.u64()?),
            feature::CMDLINE => {
                let n = c.u32()?;
                // Each string takes at least 4 bytes: no allocation beyond the section.
                if u64::from(n) * 4 > b.len() as u64 {
                    return Err(bad("more strings than the section can hold"));
                }
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    v.push(header_string(&mut c)?);
                }
                self.cmdline = Some(v);
            }
            feature::BUILD_ID => {
                while c.remaining() >= 8 {
                    let _type = c.u32()?;
                    let misc = c.u16()?;
                    let size = usize::from(c.u16()?);
                    if size < 8 + 4 + 24 || size - 8 > c.remaining() {
                        return Err(bad("build-id entry size out of range"));
                    }
                    let body = c.take(size - 8)?;
                    let pid = i32::from_le_bytes([body[0], body[1], body[2], body[3]]);
                    let id = &body[4..28];
                    // misc bit 15 (PERF_RECORD_MISC_BUILD_ID_SIZE): id[20] is the length.
                    let len = if misc & (1 << 15) != 0 {
                        usize::from(id[20]).min(20)
                    } else {
                        20
                    };
                    self.build_ids.push(BuildId {
                        pid,
                        misc,
                        build_id: &id[..len],
                        filename: cstr(&body[28..]),
                    });
                }
            }
            feature::AUXTRACE => {
                // A list of tables: u64 nr; { u64 offset, size; }[nr] ...
                while c.remaining() >= 8 {
                    let n = c.u64()?;
                    if n.saturating_mul(16) > c.remaining() as u64 {
                        return Err(bad("index longer than its section"));
                    }
                    for _ in 0..n {
                        self.auxtrace_index.push((c.u64()?, c.u64()?));
                    }
                }
            }
            feature::COMPRESSED => {
                self.compressed = Some(Compression {
                    version: c.u32()?,
                    kind: c.u32()?,
                    level: c.u32()?,
                    ratio: c.u32()?,
                    mmap_len: c.u32()?,
                });
            }
            _ => {}
        }
        Ok(())
    }
}
