//! A readable one-line form of every packet: the name, then the payload.
//!
//! This is hwtrace's own listing format. It follows the names libipt's
//! ptdump made familiar (`tip.pge`, `tnt.8`) and prints IPs with `?` for the
//! bytes that come from the last IP.

use crate::packet::{Packet, PacketKind};
use core::fmt;

impl fmt::Display for Packet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.kind().name();
        match self {
            Packet::Pad | Packet::Psb | Packet::Psbend | Packet::Ovf | Packet::Stop => {
                f.write_str(name)
            }
            Packet::Tnt(t) => {
                write!(f, "{name} ")?;
                for taken in t.iter() {
                    f.write_str(if taken { "!" } else { "." })?;
                }
                Ok(())
            }
            Packet::Tip(ip) | Packet::TipPge(ip) | Packet::TipPgd(ip) | Packet::Fup(ip) => {
                write!(f, "{name} {ip}")
            }
            Packet::ModeExec(m) => {
                let mode = match m.mode() {
                    crate::ExecMode::Bits16 => "16-bit",
                    crate::ExecMode::Bits32 => "32-bit",
                    crate::ExecMode::Bits64 => "64-bit",
                    crate::ExecMode::Reserved => "reserved (cs.l and cs.d)",
                };
                write!(f, "{name} {mode}{}", if m.iflag { ", if" } else { "" })
            }
            Packet::ModeTsx(m) => {
                let state = match (m.intx, m.abrt) {
                    (_, true) => "abort",
                    (true, false) => "begin",
                    (false, false) => "commit",
                };
                write!(f, "{name} {state}")
            }
            Packet::Pip(p) => write!(
                f,
                "{name} cr3 {:#x}{}",
                p.cr3.0,
                if p.nr { ", nr" } else { "" }
            ),
            Packet::Tsc(v) | Packet::Mnt(v) | Packet::Cyc(v) | Packet::Vmcs(v) => {
                write!(f, "{name} {v:#x}")
            }
            Packet::Cbr(v) | Packet::Mtc(v) => write!(f, "{name} {v:#x}"),
            Packet::Tma(t) => write!(f, "{name} ctc {:#x}, fc {:#x}", t.ctc, t.fc),
            Packet::Ptw(p) => {
                write!(
                    f,
                    "{name} {}: {:#x}{}",
                    u8::from(p.eight_bytes),
                    p.payload,
                    if p.ip { ", ip" } else { "" }
                )
            }
            Packet::Exstop { ip } | Packet::Bep { ip } => {
                write!(f, "{name}{}", if *ip { " ip" } else { "" })
            }
            Packet::Mwait(m) => write!(f, "{name} hints {:#x}, ext {:#x}", m.hints, m.ext),
            Packet::Pwre(p) => {
                write!(
                    f,
                    "{name} c{}.{}{}",
                    p.state(),
                    p.sub_state(),
                    if p.hw() { ", hw" } else { "" }
                )
            }
            Packet::Pwrx(p) => write!(
                f,
                "{name} last c{}, deepest c{}, wake {:#x}",
                p.last(),
                p.deepest(),
                p.wake_reason()
            ),
            Packet::Bbp(b) => write!(
                f,
                "{name} type {:#x}, {}-byte items",
                b.ty,
                if b.four_bytes { 4 } else { 8 }
            ),
            Packet::Bip { id, value, .. } => write!(f, "{name} id {id:#x}: {value:#x}"),
            Packet::Cfe(c) => {
                match cfe_type_name(c.ty) {
                    Some(ty) => write!(f, "{name} type {ty}")?,
                    None => write!(f, "{name} type {} (reserved)", c.ty)?,
                }
                if c.vector != 0 {
                    write!(f, ", vector {:#x}", c.vector)?;
                }
                if c.ip {
                    f.write_str(", ip")?;
                }
                Ok(())
            }
            Packet::Evd(e) => write!(f, "{name} type {}: {:#x}", evd_type_name(e.ty), e.payload),
            Packet::Trig(t) => {
                write!(f, "{name} trbv {:#x}", t.trbv)?;
                if t.ip {
                    f.write_str(", ip")?;
                }
                if t.mult {
                    f.write_str(", mult")?;
                }
                if let Some(icnt) = t.icnt {
                    write!(f, ", icnt {icnt}")?;
                }
                Ok(())
            }
        }
    }
}

/// The name of a CFE type (SDM vol. 3C, 33.4.2.29, table "CFE Packet
/// Type and Vector Fields"); `None` for a type the SDM does not define.
pub fn cfe_type_name(ty: u8) -> Option<&'static str> {
    Some(match ty {
        1 => "intr",
        2 => "iret",
        3 => "smi",
        4 => "rsm",
        5 => "sipi",
        6 => "init",
        7 => "vmentry",
        8 => "vmexit",
        9 => "vmexit_intr",
        10 => "shutdown",
        12 => "uintr",
        13 => "uiret",
        14 => "swintr",
        15 => "syscall",
        _ => return None,
    })
}

/// The name of an EVD type (SDM 33.4.2.30).
pub fn evd_type_name(ty: u8) -> &'static str {
    match ty {
        0 => "cr2",
        1 => "vmxq",
        2 => "vmxr",
        _ => "reserved",
    }
}

impl PacketKind {
    /// Whether packets of this kind carry an IP payload.
    pub const fn has_ip(self) -> bool {
        matches!(self, Self::Tip | Self::TipPge | Self::TipPgd | Self::Fup)
    }
}
