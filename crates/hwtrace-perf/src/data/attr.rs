//! `struct perf_event_attr` (Linux `include/uapi/linux/perf_event.h`): parsed
//! from and encoded to its little-endian byte layout, whatever its `size`
//! (`PERF_ATTR_SIZE_VER0` = 64 up to `VER8` = 136 and beyond: missing tail
//! fields read as zero, unknown tail bytes are ignored).

use super::bytes::le64_at;

/// `perf_event_attr.type` values (`enum perf_type_id`); dynamic PMUs such as
/// `intel_pt` get their number from `/sys/bus/event_source/devices/*/type`.
pub mod attr_type {
    /// `PERF_TYPE_HARDWARE`.
    pub const HARDWARE: u32 = 0;
    /// `PERF_TYPE_SOFTWARE`.
    pub const SOFTWARE: u32 = 1;
    /// `PERF_TYPE_TRACEPOINT`.
    pub const TRACEPOINT: u32 = 2;
    /// `PERF_TYPE_HW_CACHE`.
    pub const HW_CACHE: u32 = 3;
    /// `PERF_TYPE_RAW`.
    pub const RAW: u32 = 4;
    /// `PERF_TYPE_BREAKPOINT`.
    pub const BREAKPOINT: u32 = 5;
}

/// `PERF_COUNT_SW_DUMMY` (a software `config` that counts nothing, for sideband).
pub const SW_DUMMY: u64 = 9;

/// `perf_event_attr.sample_type` bits (`enum perf_event_sample_format`).
pub mod sample {
    /// `PERF_SAMPLE_IP`.
    pub const IP: u64 = 1 << 0;
    /// `PERF_SAMPLE_TID`.
    pub const TID: u64 = 1 << 1;
    /// `PERF_SAMPLE_TIME`.
    pub const TIME: u64 = 1 << 2;
    /// `PERF_SAMPLE_ADDR`.
    pub const ADDR: u64 = 1 << 3;
    /// `PERF_SAMPLE_READ`.
    pub const READ: u64 = 1 << 4;
    /// `PERF_SAMPLE_CALLCHAIN`.
    pub const CALLCHAIN: u64 = 1 << 5;
    /// `PERF_SAMPLE_ID`.
    pub const ID: u64 = 1 << 6;
    /// `PERF_SAMPLE_CPU`.
    pub const CPU: u64 = 1 << 7;
    /// `PERF_SAMPLE_PERIOD`.
    pub const PERIOD: u64 = 1 << 8;
    /// `PERF_SAMPLE_STREAM_ID`.
    pub const STREAM_ID: u64 = 1 << 9;
    /// `PERF_SAMPLE_RAW`.
    pub const RAW: u64 = 1 << 10;
    /// `PERF_SAMPLE_BRANCH_STACK`.
    pub const BRANCH_STACK: u64 = 1 << 11;
    /// `PERF_SAMPLE_REGS_USER`.
    pub const REGS_USER: u64 = 1 << 12;
    /// `PERF_SAMPLE_STACK_USER`.
    pub const STACK_USER: u64 = 1 << 13;
    /// `PERF_SAMPLE_WEIGHT`.
    pub const WEIGHT: u64 = 1 << 14;
    /// `PERF_SAMPLE_DATA_SRC`.
    pub const DATA_SRC: u64 = 1 << 15;
    /// `PERF_SAMPLE_IDENTIFIER`.
    pub const IDENTIFIER: u64 = 1 << 16;
    /// `PERF_SAMPLE_TRANSACTION`.
    pub const TRANSACTION: u64 = 1 << 17;
    /// `PERF_SAMPLE_REGS_INTR`.
    pub const REGS_INTR: u64 = 1 << 18;
    /// `PERF_SAMPLE_PHYS_ADDR`.
    pub const PHYS_ADDR: u64 = 1 << 19;
    /// `PERF_SAMPLE_AUX`.
    pub const AUX: u64 = 1 << 20;
    /// `PERF_SAMPLE_CGROUP`.
    pub const CGROUP: u64 = 1 << 21;
    /// `PERF_SAMPLE_DATA_PAGE_SIZE`.
    pub const DATA_PAGE_SIZE: u64 = 1 << 22;
    /// `PERF_SAMPLE_CODE_PAGE_SIZE`.
    pub const CODE_PAGE_SIZE: u64 = 1 << 23;
    /// `PERF_SAMPLE_WEIGHT_STRUCT`.
    pub const WEIGHT_STRUCT: u64 = 1 << 24;
    /// The bits this reader knows the layout of.
    pub const KNOWN: u64 = (1 << 25) - 1;
}

/// `perf_event_attr.read_format` bits.
pub mod read_format {
    /// `PERF_FORMAT_TOTAL_TIME_ENABLED`.
    pub const TOTAL_TIME_ENABLED: u64 = 1 << 0;
    /// `PERF_FORMAT_TOTAL_TIME_RUNNING`.
    pub const TOTAL_TIME_RUNNING: u64 = 1 << 1;
    /// `PERF_FORMAT_ID`.
    pub const ID: u64 = 1 << 2;
    /// `PERF_FORMAT_GROUP`.
    pub const GROUP: u64 = 1 << 3;
    /// `PERF_FORMAT_LOST`.
    pub const LOST: u64 = 1 << 4;
}

/// The single-bit flags of `perf_event_attr` (the bitfield at offset 40),
/// as bit numbers.
pub mod flag {
    /// `disabled`.
    pub const DISABLED: u32 = 0;
    /// `inherit`.
    pub const INHERIT: u32 = 1;
    /// `exclude_user`.
    pub const EXCLUDE_USER: u32 = 4;
    /// `exclude_kernel`.
    pub const EXCLUDE_KERNEL: u32 = 5;
    /// `exclude_hv`.
    pub const EXCLUDE_HV: u32 = 6;
    /// `mmap`.
    pub const MMAP: u32 = 8;
    /// `comm`.
    pub const COMM: u32 = 9;
    /// `freq`.
    pub const FREQ: u32 = 10;
    /// `enable_on_exec`.
    pub const ENABLE_ON_EXEC: u32 = 12;
    /// `task` (FORK/EXIT records).
    pub const TASK: u32 = 13;
    /// `watermark`.
    pub const WATERMARK: u32 = 14;
    /// `sample_id_all`.
    pub const SAMPLE_ID_ALL: u32 = 18;
    /// `exclude_guest`.
    pub const EXCLUDE_GUEST: u32 = 20;
    /// `mmap2`.
    pub const MMAP2: u32 = 23;
    /// `comm_exec`.
    pub const COMM_EXEC: u32 = 24;
    /// `context_switch`.
    pub const CONTEXT_SWITCH: u32 = 26;
}

/// `perf_event_attr.branch_sample_type` bits (`enum perf_branch_sample_type`).
pub mod branch {
    /// Every name `perf record -j` accepts, with its bit.
    pub const NAMES: &[(&str, u64)] = &[
        ("u", 1 << 0),
        ("k", 1 << 1),
        ("hv", 1 << 2),
        ("any", 1 << 3),
        ("any_call", 1 << 4),
        ("any_ret", 1 << 5),
        ("ind_call", 1 << 6),
        ("abort_tx", 1 << 7),
        ("in_tx", 1 << 8),
        ("no_tx", 1 << 9),
        ("cond", 1 << 10),
        ("call_stack", 1 << 11),
        ("ind_jmp", 1 << 12),
        ("call", 1 << 13),
        ("no_flags", 1 << 14),
        ("no_cycles", 1 << 15),
        ("save_type", 1 << 16),
        ("hw_index", 1 << 17),
        ("priv", 1 << 18),
        ("counter", 1 << 19),
    ];
    /// `PERF_SAMPLE_BRANCH_USER`.
    pub const USER: u64 = 1 << 0;
    /// `PERF_SAMPLE_BRANCH_KERNEL`.
    pub const KERNEL: u64 = 1 << 1;
    /// `PERF_SAMPLE_BRANCH_ANY`.
    pub const ANY: u64 = 1 << 3;
    /// `PERF_SAMPLE_BRANCH_HW_INDEX`: each stack carries `hw_idx`.
    pub const HW_INDEX: u64 = 1 << 17;
    /// `PERF_SAMPLE_BRANCH_COUNTERS`: each entry has a counters word after the stack.
    pub const COUNTERS: u64 = 1 << 19;

    /// The bit for one `-j` name.
    pub fn by_name(name: &str) -> Option<u64> {
        NAMES.iter().find(|(n, _)| *n == name).map(|&(_, b)| b)
    }
}

/// `PERF_ATTR_SIZE_VER8` (adds `config3`, Linux 6.3).
pub const ATTR_SIZE_VER8: u32 = 136;
/// `PERF_ATTR_SIZE_VER7` (adds `sig_data`, Linux 5.13): what this crate
/// writes unless `config3` is set, since perf before 6.3 rejects larger
/// attributes in a file.
pub const ATTR_SIZE_VER7: u32 = 128;
/// The smallest size the ABI ever had (`PERF_ATTR_SIZE_VER0`).
pub const ATTR_SIZE_VER0: u32 = 64;

/// `struct perf_event_attr`, every field of `PERF_ATTR_SIZE_VER8`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Attr {
    /// `type`: `PERF_TYPE_*` or a dynamic PMU number.
    pub kind: u32,
    /// `size` as found in the file (0 means `VER0`).
    pub size: u32,
    /// `config`.
    pub config: u64,
    /// `sample_period` (or `sample_freq` when the `freq` flag is set).
    pub sample_period: u64,
    /// `sample_type` (see [`sample`]).
    pub sample_type: u64,
    /// `read_format` (see [`read_format`]).
    pub read_format: u64,
    /// The flag bitfield (see [`flag`]; `precise_ip` is bits 15–16).
    pub flags: u64,
    /// `wakeup_events` / `wakeup_watermark`.
    pub wakeup: u32,
    /// `bp_type`.
    pub bp_type: u32,
    /// `config1` / `bp_addr`.
    pub config1: u64,
    /// `config2` / `bp_len`.
    pub config2: u64,
    /// `branch_sample_type` (see [`branch`]).
    pub branch_sample_type: u64,
    /// `sample_regs_user`.
    pub sample_regs_user: u64,
    /// `sample_stack_user`.
    pub sample_stack_user: u32,
    /// `clockid`.
    pub clockid: i32,
    /// `sample_regs_intr`.
    pub sample_regs_intr: u64,
    /// `aux_watermark`.
    pub aux_watermark: u32,
    /// `sample_max_stack`.
    pub sample_max_stack: u16,
    /// `aux_sample_size`.
    pub aux_sample_size: u32,
    /// `aux_action` (formerly `__reserved_3`).
    pub aux_action: u32,
    /// `sig_data`.
    pub sig_data: u64,
    /// `config3`.
    pub config3: u64,
}

fn le32_at(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .map_or(0, |s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

impl Attr {
    /// Parses an attribute from its bytes; fields past the end read as zero.
    pub fn parse(b: &[u8]) -> Self {
        let q = |at| le64_at(b, at).unwrap_or(0);
        let d = |at| le32_at(b, at);
        Self {
            kind: d(0),
            size: d(4),
            config: q(8),
            sample_period: q(16),
            sample_type: q(24),
            read_format: q(32),
            flags: q(40),
            wakeup: d(48),
            bp_type: d(52),
            config1: q(56),
            config2: q(64),
            branch_sample_type: q(72),
            sample_regs_user: q(80),
            sample_stack_user: d(88),
            clockid: d(92) as i32,
            sample_regs_intr: q(96),
            aux_watermark: d(104),
            sample_max_stack: b
                .get(108..110)
                .map_or(0, |s| u16::from_le_bytes([s[0], s[1]])),
            aux_sample_size: d(112),
            aux_action: d(116),
            sig_data: q(120),
            config3: q(128),
        }
    }

    /// The smallest size that holds every non-zero field this crate knows:
    /// [`ATTR_SIZE_VER7`], or [`ATTR_SIZE_VER8`] when `config3` is set.
    pub fn encoded_size(&self) -> u32 {
        if self.config3 != 0 {
            ATTR_SIZE_VER8
        } else {
            ATTR_SIZE_VER7
        }
    }

    /// The encoding at [`Self::encoded_size`].
    pub fn to_bytes(&self) -> Vec<u8> {
        self.to_bytes_sized(self.encoded_size())
    }

    /// The encoding padded or cut to `size` bytes (at least VER0), with
    /// `size` in its `size` field.
    pub fn to_bytes_sized(&self, size: u32) -> Vec<u8> {
        let size = size.max(ATTR_SIZE_VER0);
        let mut b = vec![0u8; ATTR_SIZE_VER8.max(size) as usize];
        let mut put = |at: usize, v: &[u8]| b[at..at + v.len()].copy_from_slice(v);
        put(0, &self.kind.to_le_bytes());
        put(4, &size.to_le_bytes());
        put(8, &self.config.to_le_bytes());
        put(16, &self.sample_period.to_le_bytes());
        put(24, &self.sample_type.to_le_bytes());
        put(32, &self.read_format.to_le_bytes());
        put(40, &self.flags.to_le_bytes());
        put(48, &self.wakeup.to_le_bytes());
        put(52, &self.bp_type.to_le_bytes());
        put(56, &self.config1.to_le_bytes());
        put(64, &self.config2.to_le_bytes());
        put(72, &self.branch_sample_type.to_le_bytes());
        put(80, &self.sample_regs_user.to_le_bytes());
        put(88, &self.sample_stack_user.to_le_bytes());
        put(92, &self.clockid.to_le_bytes());
        put(96, &self.sample_regs_intr.to_le_bytes());
        put(104, &self.aux_watermark.to_le_bytes());
        put(108, &self.sample_max_stack.to_le_bytes());
        put(112, &self.aux_sample_size.to_le_bytes());
        put(116, &self.aux_action.to_le_bytes());
        put(120, &self.sig_data.to_le_bytes());
        put(128, &self.config3.to_le_bytes());
        b.truncate(size as usize);
        b
    }

    /// Whether flag bit `bit` (see [`flag`]) is set.
    pub fn has(&self, bit: u32) -> bool {
        bit < 64 && self.flags & (1 << bit) != 0
    }

    /// Sets flag bit `bit` (see [`flag`]).
    pub fn set(&mut self, bit: u32, on: bool) {
        if bit < 64 {
            if on {
                self.flags |= 1 << bit;
            } else {
                self.flags &= !(1 << bit);
            }
        }
    }

    /// `sample_id_all`: non-sample records carry a `sample_id` trailer.
    pub fn sample_id_all(&self) -> bool {
        self.has(flag::SAMPLE_ID_ALL)
    }

    /// This attribute as read back from a file written with `size`.
    pub fn with_size(mut self, size: u32) -> Self {
        self.size = size;
        self
    }

    /// `precise_ip` (0–3).
    pub fn precise_ip(&self) -> u8 {
        ((self.flags >> 15) & 3) as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_parse_round_trip_and_short_sizes() {
        let mut a = Attr {
            kind: 8,
            size: ATTR_SIZE_VER8,
            config: 0x2001,
            sample_type: sample::TID | sample::TIME | sample::IDENTIFIER,
            branch_sample_type: branch::ANY | branch::HW_INDEX,
            aux_watermark: 0x1000,
            config3: 7,
            clockid: -1,
            ..Attr::default()
        };
        a.set(flag::SAMPLE_ID_ALL, true);
        a.set(flag::DISABLED, true);
        let b = a.to_bytes();
        assert_eq!(b.len(), ATTR_SIZE_VER8 as usize);
        assert_eq!(Attr::parse(&b), a);
        let mut v7 = a;
        v7.config3 = 0;
        assert_eq!(v7.to_bytes().len(), ATTR_SIZE_VER7 as usize);
        assert_eq!(Attr::parse(&v7.to_bytes()), v7.with_size(ATTR_SIZE_VER7));
        assert!(a.sample_id_all() && a.has(flag::DISABLED) && !a.has(flag::INHERIT));
        // A VER0 attribute: everything past byte 64 reads as zero.
        let short = Attr::parse(&b[..64]);
        assert_eq!(short.config, 0x2001);
        assert_eq!(short.branch_sample_type, 0);
        assert_eq!(short.config3, 0);
        assert_eq!(branch::by_name("any_call"), Some(1 << 4));
        assert_eq!(branch::by_name("nope"), None);
    }
}
