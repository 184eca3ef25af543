//! Event trace (CFE and EVD packets, SDM vol. 3C, 33.4.2.29-30).
//!
//! An EVD carries data (CR2, VMX exit qualification or reason) for the CFE
//! that follows it. A CFE reports a control-flow event: interrupts,
//! exceptions and VM exits bind to the FUP that gives their IP (and leave
//! that FUP to form the asynchronous branch with the TIP after it); IRET,
//! UIRET and RSM bind to the TIP of their far return; VM entry binds to
//! the VMLAUNCH/VMRESUME its FUP names.

use super::decoder::EventDecoder;
use super::queue::Binding;
use super::{Event, EventKind};
use crate::error::ErrorKind;
use hwtrace_packet::Packet;

/// EVD payloads seen since the last CFE.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventData {
    /// Page-fault linear address (EVD type 0).
    pub cr2: Option<u64>,
    /// VMX exit qualification (EVD type 1).
    pub vmxq: Option<u64>,
    /// VMX exit reason (EVD type 2).
    pub vmxr: Option<u64>,
}

impl EventData {
    pub(super) const fn is_empty(&self) -> bool {
        self.cr2.is_none() && self.vmxq.is_none() && self.vmxr.is_none()
    }
}

/// CFE types (SDM table 33-50).
mod cfe {
    pub const INTR: u8 = 1;
    pub const IRET: u8 = 2;
    pub const SMI: u8 = 3;
    pub const RSM: u8 = 4;
    pub const SIPI: u8 = 5;
    pub const INIT: u8 = 6;
    pub const VMENTRY: u8 = 7;
    pub const VMEXIT: u8 = 8;
    pub const VMEXIT_INTR: u8 = 9;
    pub const SHUTDOWN: u8 = 10;
    pub const UINTR: u8 = 12;
    pub const UIRET: u8 = 13;
    pub const SWINTR: u8 = 14;
    pub const SYSCALL: u8 = 15;
}

/// Whether `ev` is an event-trace event waiting for a FUP.
pub(crate) fn binds_to_fup(ev: &Event) -> bool {
    matches!(
        ev.kind,
        EventKind::Interrupt { .. }
            | EventKind::Swintr { .. }
            | EventKind::Syscall { .. }
            | EventKind::Smi { .. }
            | EventKind::Init { .. }
            | EventKind::Vmentry { .. }
            | EventKind::Vmexit { .. }
            | EventKind::Shutdown { .. }
            | EventKind::Uintr { .. }
    )
}

/// Whether the FUP `ev` bound to also starts an asynchronous branch.
pub(super) fn leaves_fup(ev: &Event) -> bool {
    !matches!(
        ev.kind,
        EventKind::Vmentry { .. }
            | EventKind::Iret { .. }
            | EventKind::Rsm { .. }
            | EventKind::Uiret { .. }
    )
}

/// Whether `ev` names the instruction it happened at (the FUP gives that
/// instruction's own IP) rather than the next one.
pub fn binds_to_insn(ev: &Event) -> bool {
    !ev.ip_hidden
        && matches!(
            ev.kind,
            EventKind::Vmentry { .. }
                | EventKind::Iret { .. }
                | EventKind::Rsm { .. }
                | EventKind::Uiret { .. }
        )
}

/// Whether `ev` is an event-trace event waiting for a TIP.
pub(super) fn binds_to_tip(ev: &Event) -> bool {
    matches!(
        ev.kind,
        EventKind::Iret { .. }
            | EventKind::Rsm { .. }
            | EventKind::Uiret { .. }
            | EventKind::Vmentry { .. }
    )
}

/// Handles one CFE or EVD packet.
pub(super) fn decode(
    dec: &mut EventDecoder<'_>,
    packet: Packet,
) -> Result<super::decoder::StepOut, ErrorKind> {
    match packet {
        Packet::Evd(evd) => {
            let data = dec.evd_mut();
            // Page-fault and VMX data never describe the same event.
            let clash = match evd.ty {
                0 => data.vmxq.is_some() || data.vmxr.is_some(),
                1 | 2 => data.cr2.is_some(),
                _ => false,
            };
            if clash {
                return Err(ErrorKind::BadContext);
            }
            match evd.ty {
                0 => data.cr2 = Some(evd.payload),
                1 => data.vmxq = Some(evd.payload),
                2 => data.vmxr = Some(evd.payload),
                // Types the SDM does not define carry nothing we know.
                _ => {}
            }
            Ok(super::decoder::StepOut::More)
        }
        Packet::Cfe(c) => {
            let data = core::mem::take(dec.evd_mut());
            let takes_cr2 = matches!(c.ty, cfe::INTR | cfe::SWINTR);
            let takes_vmx = matches!(c.ty, cfe::VMEXIT | cfe::VMEXIT_INTR);
            if (data.cr2.is_some() && !takes_cr2)
                || ((data.vmxq.is_some() || data.vmxr.is_some()) && !takes_vmx)
            {
                return Err(ErrorKind::BadContext);
            }
            let _ = data.is_empty();
            let kind = match c.ty {
                cfe::SWINTR => EventKind::Swintr {
                    vector: c.vector,
                    ip: 0,
                },
                cfe::INTR => EventKind::Interrupt {
                    vector: c.vector,
                    cr2: data.cr2,
                    ip: 0,
                },
                cfe::IRET => EventKind::Iret { ip: 0 },
                cfe::SMI => EventKind::Smi { ip: 0 },
                cfe::RSM => EventKind::Rsm { ip: 0 },
                cfe::SIPI => EventKind::Sipi { vector: c.vector },
                cfe::INIT => EventKind::Init { ip: 0 },
                cfe::VMENTRY => EventKind::Vmentry { ip: 0 },
                cfe::VMEXIT => EventKind::Vmexit {
                    vector: None,
                    vmxr: data.vmxr,
                    vmxq: data.vmxq,
                    ip: 0,
                },
                cfe::VMEXIT_INTR => EventKind::Vmexit {
                    vector: Some(c.vector),
                    vmxr: data.vmxr,
                    vmxq: data.vmxq,
                    ip: 0,
                },
                cfe::SHUTDOWN => EventKind::Shutdown { ip: 0 },
                cfe::UINTR => EventKind::Uintr {
                    vector: c.vector,
                    ip: 0,
                },
                cfe::UIRET => EventKind::Uiret { ip: 0 },
                cfe::SYSCALL => EventKind::Syscall { ip: 0 },
                // Types the SDM does not define report nothing.
                _ => return Ok(super::decoder::StepOut::More),
            };
            let mut ev = Event::new(kind);
            ev.ip_hidden = !c.ip;
            // IRET, RSM, UIRET and VM entry with their IP bit name the
            // instruction through a FUP; without it they bind to their TIP.
            let returns = matches!(
                kind,
                EventKind::Iret { .. }
                    | EventKind::Rsm { .. }
                    | EventKind::Uiret { .. }
                    | EventKind::Vmentry { .. }
            );
            if !dec.is_enabled() && !c.ip {
                // With tracing off no TIP will come: report it now.
                dec.emit(kind, true);
                let _ = ev;
                Ok(super::decoder::StepOut::Event)
            } else if (binds_to_fup(&ev) && !returns) || (returns && c.ip) {
                dec.push_event(Binding::Fup, ev)?;
                Ok(super::decoder::StepOut::More)
            } else if binds_to_tip(&ev) {
                dec.push_event(Binding::Tip, ev)?;
                Ok(super::decoder::StepOut::More)
            } else {
                dec.emit(kind, true);
                Ok(super::decoder::StepOut::Event)
            }
        }
        _ => Err(ErrorKind::Internal),
    }
}
