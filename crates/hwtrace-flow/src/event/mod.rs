//! The event layer: packets in, events and branch answers out.
//!
//! Modelled on libipt's split of the query layer:
//!
//! - [`EventDecoder`] turns packets into [`Event`]s. Packets whose meaning
//!   depends on a later packet wait in an [`EventQueue`] for it (MODE.Exec
//!   for the next TIP, PTW/EXSTOP/MODE.TSX for a FUP, PSB+ status for
//!   PSBEND); an asynchronous FUP pairs with the TIP or TIP.PGD after it.
//!   OVF is resolved by looking ahead for the FUP or TIP.PGE it binds to,
//!   with the errata workarounds libipt applies per processor.
//! - [`QueryDecoder`] answers the instruction layer's questions: the next
//!   TNT bit ([`TntCache`]), the next TIP target, the next event.

mod decoder;
mod lane;
mod query;
mod queue;
pub mod quirks;
mod tnt;
pub mod trace;

pub use decoder::EventDecoder;
pub use decoder::passable_status;
pub(crate) use decoder::{PassState, StatusPass, passes_over};
pub use lane::TraceLane;
pub(crate) use lane::{
    LaneAt, TIP_PGD, TogglePair, lane_reads, plain_offset, skip_pads, tip_ip, tnt8, toggle_pair_at,
};
pub use query::{QueryDecoder, Status, TntState};
pub use queue::{Binding, EventQueue};
pub use tnt::TntCache;
pub(crate) use tnt::low_bits;

use hwtrace_packet::ExecMode;

/// One event, with the time at which it was decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// The event's IP is unknown (suppressed, or tracing was off).
    pub ip_suppressed: bool,
    /// A status report from PSB+ rather than a change.
    pub status_update: bool,
    /// For PSB+ status events: the offset of the packet that reported
    /// the status (the event itself is delivered at PSBEND).
    pub status_offset: Option<hwtrace_types::TraceOffset>,
    /// The decoder knows the event's IP but the trace did not report it
    /// (a CFE without its IP bit): printers leave it out.
    pub ip_hidden: bool,
    /// Whether `tsc` is wall-clock time (a TSC packet was seen).
    pub has_tsc: bool,
    /// The estimated TSC (relative to the start when `has_tsc` is false).
    pub tsc: u64,
    /// MTC packets lost so far.
    pub lost_mtc: u32,
    /// CYC packets lost so far.
    pub lost_cyc: u32,
}

impl Event {
    /// An event of `kind` with no time and an IP not yet known.
    pub const fn new(kind: EventKind) -> Self {
        Self {
            kind,
            ip_suppressed: false,
            status_update: false,
            status_offset: None,
            ip_hidden: false,
            has_tsc: false,
            tsc: 0,
            lost_mtc: 0,
            lost_cyc: 0,
        }
    }

    /// Sets the IP field of the event, if it has one.
    pub fn set_ip(&mut self, value: u64) {
        use EventKind as K;
        match &mut self.kind {
            K::Enabled { ip, .. }
            | K::Disabled { ip }
            | K::AsyncDisabled { ip, .. }
            | K::AsyncPaging { ip, .. }
            | K::Overflow { ip }
            | K::ExecMode { ip, .. }
            | K::Tsx { ip, .. }
            | K::AsyncVmcs { ip, .. }
            | K::Exstop { ip }
            | K::Mwait { ip, .. }
            | K::Ptwrite { ip, .. }
            | K::Tick { ip }
            | K::Tip { ip }
            | K::Iflags { ip, .. }
            | K::Interrupt { ip, .. }
            | K::Swintr { ip, .. }
            | K::Syscall { ip }
            | K::Iret { ip }
            | K::Smi { ip }
            | K::Rsm { ip }
            | K::Init { ip }
            | K::Vmentry { ip }
            | K::Vmexit { ip, .. }
            | K::Shutdown { ip }
            | K::Uintr { ip, .. }
            | K::Uiret { ip }
            | K::Trig { ip, .. } => *ip = value,
            K::AsyncBranch { to, .. } => *to = value,
            _ => {}
        }
    }
}

/// What an [`Event`] reports. Field `ip` is the IP the event binds to:
/// for most events the first instruction not (yet) executed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum EventKind {
    /// Tracing enabled at `ip`; `resumed` when it resumes where it stopped.
    Enabled { ip: u64, resumed: bool },
    /// Tracing disabled after a branch; `ip` is where it would have gone.
    Disabled { ip: u64 },
    /// Tracing disabled asynchronously at `at`.
    AsyncDisabled { at: u64, ip: u64 },
    /// An interrupt or exception: from `from` to `to`.
    AsyncBranch { from: u64, to: u64 },
    /// CR3 changed (PIP) at an instruction.
    Paging { cr3: u64, non_root: bool },
    /// CR3 changed with an asynchronous branch.
    AsyncPaging { cr3: u64, non_root: bool, ip: u64 },
    /// Packets were lost; tracing resumes at `ip` (suppressed: disabled).
    Overflow { ip: u64 },
    /// The execution mode.
    ExecMode { mode: ExecMode, ip: u64 },
    /// Transactional state.
    Tsx {
        speculative: bool,
        aborted: bool,
        ip: u64,
    },
    /// Tracing stopped (TraceStop).
    Stop,
    /// VMCS base changed at an instruction.
    Vmcs { base: u64 },
    /// VMCS base changed with an asynchronous branch.
    AsyncVmcs { base: u64, ip: u64 },
    /// Execution stopped.
    Exstop { ip: u64 },
    /// MWAIT hints and extensions.
    Mwait { hints: u32, ext: u32, ip: u64 },
    /// Entering a C-state.
    Pwre { state: u8, sub_state: u8, hw: bool },
    /// Leaving a C-state.
    Pwrx {
        last: u8,
        deepest: u8,
        interrupt: bool,
        store: bool,
        autonomous: bool,
    },
    /// A PTWRITE payload.
    Ptwrite { ip: u64, size: u8, payload: u64 },
    /// Time moved (synthesised by the instruction layer).
    Tick { ip: u64 },
    /// A new core:bus ratio.
    Cbr { ratio: u8 },
    /// A maintenance packet.
    Mnt { payload: u64 },
    /// A TIP (query layer only).
    Tip { ip: u64 },
    /// TNT bits (query layer only).
    Tnt { bits: u64, size: u8 },
    /// Interrupt flag (event trace).
    Iflags { iflag: bool, ip: u64 },
    /// An interrupt or exception with its vector (event trace).
    Interrupt {
        vector: u8,
        cr2: Option<u64>,
        ip: u64,
    },
    /// A software interrupt (INT n) with its vector (event trace).
    Swintr { vector: u8, ip: u64 },
    /// SYSCALL (event trace).
    Syscall { ip: u64 },
    /// IRET (event trace).
    Iret { ip: u64 },
    /// SMI (event trace).
    Smi { ip: u64 },
    /// RSM (event trace).
    Rsm { ip: u64 },
    /// SIPI (event trace).
    Sipi { vector: u8 },
    /// INIT (event trace).
    Init { ip: u64 },
    /// VM entry (event trace).
    Vmentry { ip: u64 },
    /// VM exit (event trace).
    Vmexit {
        vector: Option<u8>,
        vmxr: Option<u64>,
        vmxq: Option<u64>,
        ip: u64,
    },
    /// Shutdown (event trace).
    Shutdown { ip: u64 },
    /// User interrupt (event trace).
    Uintr { vector: u8, ip: u64 },
    /// UIRET (event trace).
    Uiret { ip: u64 },
    /// A trigger fired.
    Trig {
        trbv: u8,
        mult: bool,
        icnt: u16,
        ip: u64,
    },
}
