//! The packets of Intel PT and their payloads.
//!
//! Payload structs keep the bits the hardware wrote (reserved bits dropped)
//! and offer accessors for their meaning, so a printer can show what the SDM
//! says and a compatibility printer can still show what another tool shows.

use crate::ip::IpPayload;
use hwtrace_types::Cr3;

/// One Intel PT packet (SDM vol. 3C, 33.4.2 "Packet Definitions").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Packet {
    /// PAD: fills space, means nothing (33.4.2.11).
    Pad,
    /// PSB: the synchronisation boundary, 16 bytes of `02 82` (33.4.2.17).
    Psb,
    /// PSBEND: ends the status packets that follow a PSB (33.4.2.18).
    Psbend,
    /// OVF: internal buffer overflow; packets were lost (33.4.2.16).
    Ovf,
    /// TNT-8 or TNT-64: taken/not-taken bits of conditional branches and
    /// compressed returns (33.4.2.1).
    Tnt(Tnt),
    /// TIP: target of an indirect branch, far transfer or return (33.4.2.2).
    Tip(IpPayload),
    /// TIP.PGE: tracing (packet generation) enabled at this IP (33.4.2.3).
    TipPge(IpPayload),
    /// TIP.PGD: tracing disabled; the IP is the next one not traced (33.4.2.4).
    TipPgd(IpPayload),
    /// FUP: the source IP of an asynchronous event or a status IP (33.4.2.5).
    Fup(IpPayload),
    /// MODE.Exec: the execution mode (CS.L/CS.D) and, with event trace, IF
    /// (33.4.2.8).
    ModeExec(ModeExec),
    /// MODE.TSX: transactional state (33.4.2.8).
    ModeTsx(ModeTsx),
    /// PIP: the new CR3 and whether the CPU is in VMX non-root (33.4.2.7).
    Pip(Pip),
    /// TSC: the low 56 bits of the time-stamp counter (33.4.2.9).
    Tsc(u64),
    /// CBR: the core:bus ratio (33.4.2.13).
    Cbr(u8),
    /// TMA: CTC and fast-counter values relating the TSC to MTC (33.4.2.12).
    Tma(Tma),
    /// MTC: bits of the crystal clock counter (33.4.2.10).
    Mtc(u8),
    /// CYC: core cycles since the last CYC (33.4.2.14).
    Cyc(u64),
    /// VMCS: the base address of the current VMCS (33.4.2.15).
    Vmcs(u64),
    /// TraceStop: tracing stopped by an IP filter or a full output (33.4.2.19).
    Stop,
    /// MNT: a maintenance payload (33.4.2.20).
    Mnt(u64),
    /// PTW: a PTWRITE payload (33.4.2.21).
    Ptw(Ptw),
    /// EXSTOP: execution stopped (power event trace, 33.4.2.22).
    Exstop {
        /// A FUP with the IP of the stop follows.
        ip: bool,
    },
    /// MWAIT: an MWAIT's hints and extensions (33.4.2.23).
    Mwait(Mwait),
    /// PWRE: entering a C-state (33.4.2.24).
    Pwre(Pwre),
    /// PWRX: leaving a C-state (33.4.2.25).
    Pwrx(Pwrx),
    /// BBP: a block of PEBS items begins (33.4.2.26).
    Bbp(Bbp),
    /// BIP: one item of a PEBS block (33.4.2.27).
    Bip {
        /// The item's ID (its position in the PEBS record layout).
        id: u8,
        /// The item's value.
        value: u64,
        /// Whether the value was 4 bytes (set by the preceding BBP) or 8.
        four_bytes: bool,
    },
    /// BEP: a block of items ends (33.4.2.28).
    Bep {
        /// A FUP with the IP follows.
        ip: bool,
    },
    /// CFE: a control-flow event with event trace (33.4.2.29).
    Cfe(Cfe),
    /// EVD: event data for the following CFE (33.4.2.30).
    Evd(Evd),
    /// TRIG: a trigger fired (33.4.2.31).
    Trig(Trig),
}

/// The kind of a packet without its payload: for statistics, errors and
/// names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(missing_docs)]
pub enum PacketKind {
    Pad,
    Psb,
    Psbend,
    Ovf,
    Tnt8,
    Tnt64,
    Tip,
    TipPge,
    TipPgd,
    Fup,
    ModeExec,
    ModeTsx,
    Pip,
    Tsc,
    Cbr,
    Tma,
    Mtc,
    Cyc,
    Vmcs,
    Stop,
    Mnt,
    Ptw,
    Exstop,
    Mwait,
    Pwre,
    Pwrx,
    Bbp,
    Bip,
    Bep,
    Cfe,
    Evd,
    Trig,
}

impl PacketKind {
    /// Every kind, in the order of the SDM's packet list.
    pub const ALL: [PacketKind; 32] = [
        Self::Pad,
        Self::Psb,
        Self::Psbend,
        Self::Ovf,
        Self::Tnt8,
        Self::Tnt64,
        Self::Tip,
        Self::TipPge,
        Self::TipPgd,
        Self::Fup,
        Self::ModeExec,
        Self::ModeTsx,
        Self::Pip,
        Self::Tsc,
        Self::Cbr,
        Self::Tma,
        Self::Mtc,
        Self::Cyc,
        Self::Vmcs,
        Self::Stop,
        Self::Mnt,
        Self::Ptw,
        Self::Exstop,
        Self::Mwait,
        Self::Pwre,
        Self::Pwrx,
        Self::Bbp,
        Self::Bip,
        Self::Bep,
        Self::Cfe,
        Self::Evd,
        Self::Trig,
    ];

    /// The packet's short name as trace dumps print it (`tip.pge`, `tnt.8`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Pad => "pad",
            Self::Psb => "psb",
            Self::Psbend => "psbend",
            Self::Ovf => "ovf",
            Self::Tnt8 => "tnt.8",
            Self::Tnt64 => "tnt.64",
            Self::Tip => "tip",
            Self::TipPge => "tip.pge",
            Self::TipPgd => "tip.pgd",
            Self::Fup => "fup",
            Self::ModeExec => "mode.exec",
            Self::ModeTsx => "mode.tsx",
            Self::Pip => "pip",
            Self::Tsc => "tsc",
            Self::Cbr => "cbr",
            Self::Tma => "tma",
            Self::Mtc => "mtc",
            Self::Cyc => "cyc",
            Self::Vmcs => "vmcs",
            Self::Stop => "stop",
            Self::Mnt => "mnt",
            Self::Ptw => "ptw",
            Self::Exstop => "exstop",
            Self::Mwait => "mwait",
            Self::Pwre => "pwre",
            Self::Pwrx => "pwrx",
            Self::Bbp => "bbp",
            Self::Bip => "bip",
            Self::Bep => "bep",
            Self::Cfe => "cfe",
            Self::Evd => "evd",
            Self::Trig => "trig",
        }
    }
}

impl core::fmt::Display for PacketKind {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

impl Packet {
    /// The packet's kind.
    pub const fn kind(&self) -> PacketKind {
        match self {
            Self::Pad => PacketKind::Pad,
            Self::Psb => PacketKind::Psb,
            Self::Psbend => PacketKind::Psbend,
            Self::Ovf => PacketKind::Ovf,
            Self::Tnt(t) if t.long => PacketKind::Tnt64,
            Self::Tnt(_) => PacketKind::Tnt8,
            Self::Tip(_) => PacketKind::Tip,
            Self::TipPge(_) => PacketKind::TipPge,
            Self::TipPgd(_) => PacketKind::TipPgd,
            Self::Fup(_) => PacketKind::Fup,
            Self::ModeExec(_) => PacketKind::ModeExec,
            Self::ModeTsx(_) => PacketKind::ModeTsx,
            Self::Pip(_) => PacketKind::Pip,
            Self::Tsc(_) => PacketKind::Tsc,
            Self::Cbr(_) => PacketKind::Cbr,
            Self::Tma(_) => PacketKind::Tma,
            Self::Mtc(_) => PacketKind::Mtc,
            Self::Cyc(_) => PacketKind::Cyc,
            Self::Vmcs(_) => PacketKind::Vmcs,
            Self::Stop => PacketKind::Stop,
            Self::Mnt(_) => PacketKind::Mnt,
            Self::Ptw(_) => PacketKind::Ptw,
            Self::Exstop { .. } => PacketKind::Exstop,
            Self::Mwait(_) => PacketKind::Mwait,
            Self::Pwre(_) => PacketKind::Pwre,
            Self::Pwrx(_) => PacketKind::Pwrx,
            Self::Bbp(_) => PacketKind::Bbp,
            Self::Bip { .. } => PacketKind::Bip,
            Self::Bep { .. } => PacketKind::Bep,
            Self::Cfe(_) => PacketKind::Cfe,
            Self::Evd(_) => PacketKind::Evd,
            Self::Trig(_) => PacketKind::Trig,
        }
    }

    /// The IP payload of TIP, TIP.PGE, TIP.PGD and FUP.
    pub const fn ip_payload(&self) -> Option<IpPayload> {
        match self {
            Self::Tip(ip) | Self::TipPge(ip) | Self::TipPgd(ip) | Self::Fup(ip) => Some(*ip),
            _ => None,
        }
    }
}

/// Taken/not-taken bits (SDM 33.4.2.1).
///
/// The hardware writes the oldest branch in the most significant payload
/// bit below the stop bit; `bits` keeps that order: bit `len - 1` is the
/// first branch, bit 0 the last.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tnt {
    /// The branch bits, oldest in bit `len - 1`; 1 means taken.
    pub bits: u64,
    /// How many branches (1..=6 for TNT-8, 1..=47 for TNT-64).
    pub len: u8,
    /// Whether this was a TNT-64 (long) packet.
    pub long: bool,
}

impl Tnt {
    /// The most branches a short (one-byte) TNT holds.
    pub const MAX_SHORT: u8 = 6;
    /// The most branches a long (TNT-64) packet holds.
    pub const MAX_LONG: u8 = 47;

    /// Whether the `i`-th branch (0 = oldest) was taken.
    #[inline]
    pub const fn taken(&self, i: u8) -> bool {
        (self.bits >> (self.len - 1 - i)) & 1 != 0
    }

    /// The branches, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = bool> + '_ {
        (0..self.len).map(|i| self.taken(i))
    }
}

/// The execution mode MODE.Exec reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExecMode {
    /// 16-bit code (CS.L = 0, CS.D = 0).
    Bits16,
    /// 32-bit code (CS.L = 0, CS.D = 1).
    Bits32,
    /// 64-bit code (CS.L = 1, CS.D = 0).
    Bits64,
    /// CS.L = 1 with CS.D = 1, which the architecture reserves.
    Reserved,
}

/// MODE.Exec payload (SDM 33.4.2.8, table 33-20).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ModeExec {
    /// CS.L: 64-bit code segment.
    pub csl: bool,
    /// CS.D: default operand size 32.
    pub csd: bool,
    /// RFLAGS.IF, reported when event trace is enabled.
    pub iflag: bool,
}

impl ModeExec {
    /// The execution mode these bits mean.
    pub const fn mode(&self) -> ExecMode {
        match (self.csl, self.csd) {
            (false, false) => ExecMode::Bits16,
            (false, true) => ExecMode::Bits32,
            (true, false) => ExecMode::Bits64,
            (true, true) => ExecMode::Reserved,
        }
    }
}

/// MODE.TSX payload (SDM 33.4.2.8, table 33-21).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ModeTsx {
    /// InTX: executing inside a transaction.
    pub intx: bool,
    /// TXAbort: the transaction aborted.
    pub abrt: bool,
}

/// PIP payload (SDM 33.4.2.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pip {
    /// The new CR3 (bits 51:5; the rest are zero).
    pub cr3: Cr3,
    /// NR: the CPU is in VMX non-root operation.
    pub nr: bool,
}

/// TMA payload (SDM 33.4.2.12).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Tma {
    /// `CTC[15:0]` at the time of the preceding TSC.
    pub ctc: u16,
    /// The fast counter (9 bits).
    pub fc: u16,
}

/// PTW payload (SDM 33.4.2.21).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ptw {
    /// The operand of PTWRITE.
    pub payload: u64,
    /// Whether the operand was 8 bytes (PayloadBytes = 01b) or 4 (00b).
    pub eight_bytes: bool,
    /// A FUP with the PTWRITE's IP follows.
    pub ip: bool,
}

/// MWAIT payload (SDM 33.4.2.23): two 32-bit fields as written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Mwait {
    /// EAX of MWAIT (the SDM defines bits 7:0, the hints).
    pub hints: u32,
    /// ECX of MWAIT (the SDM defines bits 1:0, the extensions).
    pub ext: u32,
}

/// PWRE payload (SDM 33.4.2.24): the two payload bytes as written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Pwre {
    /// Byte 2 and byte 3 of the packet, little-endian.
    pub raw: u16,
}

impl Pwre {
    /// HW: the C-state was requested by hardware, not by MWAIT (byte 2
    /// bit 7).
    pub const fn hw(&self) -> bool {
        self.raw & 0x80 != 0
    }
    /// The resolved thread C-state, as encoded (byte 3 bits 7:4).
    pub const fn state(&self) -> u8 {
        (self.raw >> 12) as u8
    }
    /// The resolved thread sub C-state, as encoded (byte 3 bits 3:0).
    pub const fn sub_state(&self) -> u8 {
        ((self.raw >> 8) & 0xf) as u8
    }
}

/// PWRX payload (SDM 33.4.2.25): the five payload bytes as written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Pwrx {
    /// Bytes 2..7 of the packet, little-endian (40 bits).
    pub raw: u64,
}

impl Pwrx {
    /// The deepest core C-state reached, as encoded (byte 2 bits 3:0).
    pub const fn deepest(&self) -> u8 {
        (self.raw & 0xf) as u8
    }
    /// The last core C-state, as encoded (byte 2 bits 7:4).
    pub const fn last(&self) -> u8 {
        ((self.raw >> 4) & 0xf) as u8
    }
    /// The wake reason bits (byte 3 bits 3:0).
    pub const fn wake_reason(&self) -> u8 {
        ((self.raw >> 8) & 0xf) as u8
    }
    /// Woken by an interrupt.
    pub const fn interrupt(&self) -> bool {
        self.wake_reason() & 1 != 0
    }
    /// Woken by a timer deadline.
    pub const fn timer(&self) -> bool {
        self.wake_reason() & 2 != 0
    }
    /// Woken by a store to the monitored address.
    pub const fn store(&self) -> bool {
        self.wake_reason() & 4 != 0
    }
    /// Woken autonomously by hardware.
    pub const fn autonomous(&self) -> bool {
        self.wake_reason() & 8 != 0
    }
}

/// BBP payload (SDM 33.4.2.26).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Bbp {
    /// SZ: the items that follow are 4 bytes (else 8).
    pub four_bytes: bool,
    /// The block type (5 bits).
    pub ty: u8,
}

/// CFE payload (SDM 33.4.2.29).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Cfe {
    /// The event type (5 bits): 1 INTR, 2 IRET, 3 SMI, 4 RSM, 5 SIPI, 6 INIT,
    /// 7 VMENTRY, 8 VMEXIT, 9 VMEXIT_INTR, 10 SHUTDOWN, 12 UINTR, 13 UIRET.
    pub ty: u8,
    /// A FUP with the event's IP follows.
    pub ip: bool,
    /// The vector, for the types that have one.
    pub vector: u8,
}

/// EVD payload (SDM 33.4.2.30).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Evd {
    /// The event data type (byte 2 bits 5:0): 0 CR2, 1 VMX exit
    /// qualification, 2 VMX exit reason.
    pub ty: u8,
    /// The data.
    pub payload: u64,
}

/// TRIG payload (SDM 33.4.2.31).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Trig {
    /// TRBV: which triggers fired.
    pub trbv: u8,
    /// A FUP with the IP follows.
    pub ip: bool,
    /// MULT: more than one trigger event was folded into this packet.
    pub mult: bool,
    /// ICNT: instructions since the previous TRIG, when reported.
    pub icnt: Option<u16>,
}
