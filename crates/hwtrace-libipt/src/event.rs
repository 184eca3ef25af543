//! `struct pt_event`, as the instruction and block decoders report it (libipt 2.0.5).

use crate::ffi;

/// An event libipt reported between instructions or blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OracleEvent {
    /// The event's IP is not known (`ip_suppressed`); IP fields are then meaningless.
    pub ip_suppressed: bool,
    /// The event is a status update from a PSB+ (`status_update`).
    pub status_update: bool,
    /// The timestamp, when the decoder had timing (`has_tsc`).
    pub tsc: Option<u64>,
    /// What happened.
    pub kind: OracleEventKind,
}

/// `enum pt_event_type` with its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OracleEventKind {
    Enabled {
        ip: u64,
        resumed: bool,
    },
    Disabled {
        ip: u64,
    },
    AsyncDisabled {
        at: u64,
        ip: u64,
    },
    AsyncBranch {
        from: u64,
        to: u64,
    },
    Paging {
        cr3: u64,
        non_root: bool,
    },
    AsyncPaging {
        cr3: u64,
        non_root: bool,
        ip: u64,
    },
    Overflow {
        ip: u64,
    },
    /// `mode`: 0 unknown, 1 16-bit, 2 32-bit, 3 64-bit (`enum pt_exec_mode`).
    ExecMode {
        mode: u8,
        ip: u64,
    },
    Tsx {
        ip: u64,
        speculative: bool,
        aborted: bool,
    },
    Stop,
    Vmcs {
        base: u64,
    },
    AsyncVmcs {
        base: u64,
        ip: u64,
    },
    Exstop {
        ip: u64,
    },
    Mwait {
        ip: u64,
        hints: u32,
        ext: u32,
    },
    Pwre {
        state: u8,
        sub_state: u8,
        hw: bool,
    },
    Pwrx {
        last: u8,
        deepest: u8,
        interrupt: bool,
        store: bool,
        autonomous: bool,
    },
    Ptwrite {
        ip: u64,
        size: u8,
        payload: u64,
    },
    Tick {
        ip: u64,
    },
    Cbr {
        ratio: u16,
    },
    Mnt {
        payload: u64,
    },
    /// A type number this binding does not know.
    Unknown {
        raw_type: u32,
    },
}

impl OracleEvent {
    /// Decode a `struct pt_event`: flag bits at byte 4, the variant union as three `u64`s at 40;
    /// bit-fields inside a variant sit in the word after the last full `u64` field.
    pub(crate) fn from_raw(raw: &ffi::PtEvent) -> Self {
        let [v0, v1, v2] = raw.variant;
        let b = v0.to_le_bytes();
        let bit = |word: u64, n: u32| word >> n & 1 == 1;
        let kind = match raw.kind {
            0 => OracleEventKind::Enabled {
                ip: v0,
                resumed: bit(v1, 0),
            },
            1 => OracleEventKind::Disabled { ip: v0 },
            2 => OracleEventKind::AsyncDisabled { at: v0, ip: v1 },
            3 => OracleEventKind::AsyncBranch { from: v0, to: v1 },
            4 => OracleEventKind::Paging {
                cr3: v0,
                non_root: bit(v1, 0),
            },
            5 => OracleEventKind::AsyncPaging {
                cr3: v0,
                non_root: bit(v1, 0),
                ip: v2,
            },
            6 => OracleEventKind::Overflow { ip: v0 },
            7 => OracleEventKind::ExecMode { mode: b[0], ip: v1 },
            8 => OracleEventKind::Tsx {
                ip: v0,
                speculative: bit(v1, 0),
                aborted: bit(v1, 1),
            },
            9 => OracleEventKind::Stop,
            10 => OracleEventKind::Vmcs { base: v0 },
            11 => OracleEventKind::AsyncVmcs { base: v0, ip: v1 },
            12 => OracleEventKind::Exstop { ip: v0 },
            13 => OracleEventKind::Mwait {
                ip: v0,
                hints: v1 as u32,
                ext: (v1 >> 32) as u32,
            },
            14 => OracleEventKind::Pwre {
                state: b[0],
                sub_state: b[1],
                hw: bit(v0, 16),
            },
            15 => OracleEventKind::Pwrx {
                last: b[0],
                deepest: b[1],
                interrupt: bit(v0, 16),
                store: bit(v0, 17),
                autonomous: bit(v0, 18),
            },
            16 => OracleEventKind::Ptwrite {
                ip: v0,
                size: v1 as u8,
                payload: v2,
            },
            17 => OracleEventKind::Tick { ip: v0 },
            18 => OracleEventKind::Cbr { ratio: v0 as u16 },
            19 => OracleEventKind::Mnt { payload: v0 },
            other => OracleEventKind::Unknown { raw_type: other },
        };
        OracleEvent {
            ip_suppressed: bit(u64::from(raw.flags), 0),
            status_update: bit(u64::from(raw.flags), 1),
            tsc: bit(u64::from(raw.flags), 2).then_some(raw.tsc),
            kind,
        }
    }
}
