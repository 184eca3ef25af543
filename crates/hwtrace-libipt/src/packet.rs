//! libipt's packet decoder (`pt_pkt_*`): every packet with its offset and payload, as libipt
//! 2.0.5 sees it.

use core::fmt;
use core::marker::PhantomData;
use core::ptr::NonNull;

use crate::config::{Config, SyncMode};
use crate::error::{OracleError, Stage};
use crate::ffi;

/// One packet as libipt decoded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OraclePacket {
    /// Byte offset of the packet in the trace.
    pub offset: u64,
    /// Packet size in bytes.
    pub size: u8,
    /// Packet type and payload.
    pub kind: OracleKind,
}

/// Packet type and payload, one variant per `enum pt_packet_type` of libipt 2.0.5. IPs are the
/// raw packet payload (`ipc` says how many bytes are valid), not reconstructed last-IPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OracleKind {
    Pad,
    Psb,
    Psbend,
    Ovf,
    /// TNT-8; `payload` holds `bit_size` bits, the oldest branch in the most significant one.
    Tnt8 {
        bit_size: u8,
        payload: u64,
    },
    /// TNT-64, same convention.
    Tnt64 {
        bit_size: u8,
        payload: u64,
    },
    /// `ipc` is the IPBytes compression (0 suppressed, 1 update-16, 2 update-32, 3 sext-48,
    /// 4 update-48, 6 full).
    Tip {
        ipc: u8,
        ip: u64,
    },
    TipPge {
        ipc: u8,
        ip: u64,
    },
    TipPgd {
        ipc: u8,
        ip: u64,
    },
    Fup {
        ipc: u8,
        ip: u64,
    },
    ModeExec {
        csl: bool,
        csd: bool,
    },
    ModeTsx {
        intx: bool,
        abrt: bool,
    },
    Pip {
        cr3: u64,
        nr: bool,
    },
    Tsc {
        tsc: u64,
    },
    Cbr {
        ratio: u8,
    },
    Tma {
        ctc: u16,
        fc: u16,
    },
    Mtc {
        ctc: u8,
    },
    Cyc {
        value: u64,
    },
    Stop,
    Vmcs {
        base: u64,
    },
    Mnt {
        payload: u64,
    },
    Exstop {
        ip: bool,
    },
    Mwait {
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
    /// `plc` 0: 4-byte payload, 1: 8-byte payload.
    Ptw {
        plc: u8,
        ip: bool,
        payload: u64,
    },
    /// `ppt_invalid`: libipt reports it for bytes it consumed but could not make sense of
    /// (e.g. under the SKZ84 erratum); ptdump prints `<invalid>`.
    Invalid,
    /// `ppt_unknown`, a mode leaf 2.0.5 does not define, or a type number this binding does not
    /// know (`raw_type` is `enum pt_packet_type`).
    Unknown {
        raw_type: u32,
    },
}

impl OracleKind {
    /// ptdump's name for the packet ("tnt.8", "tip.pge", "mode.exec", …).
    pub fn name(&self) -> &'static str {
        match self {
            OracleKind::Pad => "pad",
            OracleKind::Psb => "psb",
            OracleKind::Psbend => "psbend",
            OracleKind::Ovf => "ovf",
            OracleKind::Tnt8 { .. } => "tnt.8",
            OracleKind::Tnt64 { .. } => "tnt.64",
            OracleKind::Tip { .. } => "tip",
            OracleKind::TipPge { .. } => "tip.pge",
            OracleKind::TipPgd { .. } => "tip.pgd",
            OracleKind::Fup { .. } => "fup",
            OracleKind::ModeExec { .. } => "mode.exec",
            OracleKind::ModeTsx { .. } => "mode.tsx",
            OracleKind::Pip { .. } => "pip",
            OracleKind::Tsc { .. } => "tsc",
            OracleKind::Cbr { .. } => "cbr",
            OracleKind::Tma { .. } => "tma",
            OracleKind::Mtc { .. } => "mtc",
            OracleKind::Cyc { .. } => "cyc",
            OracleKind::Stop => "stop",
            OracleKind::Vmcs { .. } => "vmcs",
            OracleKind::Mnt { .. } => "mnt",
            OracleKind::Exstop { .. } => "exstop",
            OracleKind::Mwait { .. } => "mwait",
            OracleKind::Pwre { .. } => "pwre",
            OracleKind::Pwrx { .. } => "pwrx",
            OracleKind::Ptw { .. } => "ptw",
            OracleKind::Invalid => "<invalid>",
            OracleKind::Unknown { .. } => "unknown",
        }
    }

    /// Decode the payload union of a `struct pt_packet` (layout notes in `ffi.rs`).
    fn from_raw(raw: &ffi::PtPacket) -> Self {
        let lo = raw.payload[0];
        let hi = raw.payload[1];
        let b = lo.to_le_bytes();
        let bit = |byte: u8, n: u32| byte >> n & 1 == 1;
        let ip_payload = || (b[0], hi); // struct pt_packet_ip { enum ipc; uint64_t ip; }
        match raw.kind {
            0 => OracleKind::Invalid,
            2 => OracleKind::Pad,
            3 => OracleKind::Psb,
            4 => OracleKind::Psbend,
            5 => {
                let (ipc, ip) = ip_payload();
                OracleKind::Fup { ipc, ip }
            }
            6 => {
                let (ipc, ip) = ip_payload();
                OracleKind::Tip { ipc, ip }
            }
            7 => {
                let (ipc, ip) = ip_payload();
                OracleKind::TipPge { ipc, ip }
            }
            8 => {
                let (ipc, ip) = ip_payload();
                OracleKind::TipPgd { ipc, ip }
            }
            // struct pt_packet_tnt { uint8_t bit_size; uint64_t payload; }
            9 => OracleKind::Tnt8 {
                bit_size: b[0],
                payload: hi,
            },
            10 => OracleKind::Tnt64 {
                bit_size: b[0],
                payload: hi,
            },
            // struct pt_packet_mode { enum leaf; union bits (at 4) }
            11 => match lo as u32 {
                0x00 => OracleKind::ModeExec {
                    csl: bit(b[4], 0),
                    csd: bit(b[4], 1),
                },
                0x20 => OracleKind::ModeTsx {
                    intx: bit(b[4], 0),
                    abrt: bit(b[4], 1),
                },
                _ => OracleKind::Unknown { raw_type: raw.kind },
            },
            12 => OracleKind::Pip {
                cr3: lo,
                nr: hi & 1 == 1,
            },
            13 => OracleKind::Vmcs { base: lo },
            14 => OracleKind::Cbr { ratio: b[0] },
            15 => OracleKind::Tsc { tsc: lo },
            16 => OracleKind::Tma {
                ctc: u16::from_le_bytes([b[0], b[1]]),
                fc: u16::from_le_bytes([b[2], b[3]]),
            },
            17 => OracleKind::Mtc { ctc: b[0] },
            18 => OracleKind::Cyc { value: lo },
            19 => OracleKind::Stop,
            20 => OracleKind::Ovf,
            21 => OracleKind::Mnt { payload: lo },
            22 => OracleKind::Exstop { ip: bit(b[0], 0) },
            23 => OracleKind::Mwait {
                hints: lo as u32,
                ext: (lo >> 32) as u32,
            },
            24 => OracleKind::Pwre {
                state: b[0],
                sub_state: b[1],
                hw: bit(b[2], 0),
            },
            25 => OracleKind::Pwrx {
                last: b[0],
                deepest: b[1],
                interrupt: bit(b[2], 0),
                store: bit(b[2], 1),
                autonomous: bit(b[2], 2),
            },
            // struct pt_packet_ptw { uint64_t payload; uint8_t plc; uint32_t ip:1; }
            26 => {
                let h = hi.to_le_bytes();
                OracleKind::Ptw {
                    plc: h[0],
                    ip: bit(h[1], 0),
                    payload: lo,
                }
            }
            other => OracleKind::Unknown { raw_type: other },
        }
    }
}

/// The packet name and payload columns of libipt's ptdump (2.0.5 conventions; no last-IP,
/// timing or CR3 tracking columns): `tip.pge    3: 00007ffff78508e0`.
impl fmt::Display for OracleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.name();
        match *self {
            OracleKind::Tnt8 { bit_size, payload } | OracleKind::Tnt64 { bit_size, payload } => {
                write!(f, "{name:<11}")?;
                for n in (0..u32::from(bit_size.min(64))).rev() {
                    f.write_str(if payload >> n & 1 == 1 { "!" } else { "." })?;
                }
                Ok(())
            }
            OracleKind::Tip { ipc, ip }
            | OracleKind::TipPge { ipc, ip }
            | OracleKind::TipPgd { ipc, ip }
            | OracleKind::Fup { ipc, ip } => write!(f, "{name:<11}{ipc}: {}", ptdump_ip(ipc, ip)),
            OracleKind::ModeExec { csl, csd } => {
                let flags = [(csl, "cs.l"), (csd, "cs.d")];
                write_flags(f, name, &flags)
            }
            OracleKind::ModeTsx { intx, abrt } => {
                write_flags(f, name, &[(intx, "intx"), (abrt, "abrt")])
            }
            OracleKind::Pip { cr3, nr } => {
                write!(f, "{name:<11}{cr3:x}{}", if nr { ", nr" } else { "" })
            }
            OracleKind::Tsc { tsc } => write!(f, "{name:<11}{tsc:x}"),
            OracleKind::Cbr { ratio } => write!(f, "{name:<11}{ratio:x}"),
            OracleKind::Tma { ctc, fc } => write!(f, "{name:<11}{ctc:x}, {fc:x}"),
            OracleKind::Mtc { ctc } => write!(f, "{name:<11}{ctc:x}"),
            OracleKind::Cyc { value } => write!(f, "{name:<11}{value:x}"),
            OracleKind::Vmcs { base } => write!(f, "{name:<11}{base:x}"),
            OracleKind::Mnt { payload } => write!(f, "{name:<11}{payload:x}"),
            OracleKind::Exstop { ip } => write_flags(f, name, &[(ip, "ip")]),
            OracleKind::Mwait { hints, ext } => write!(f, "{name:<11}{hints:08x}, {ext:08x}"),
            // PWRE/PWRX encode C-states minus one (0xf is C0); ptdump prints them plus one.
            OracleKind::Pwre {
                state,
                sub_state,
                hw,
            } => {
                let (c, sub) = (state.wrapping_add(1) & 0xf, sub_state.wrapping_add(1) & 0xf);
                write!(
                    f,
                    "{name:<11}c{c:x}.{sub:x}{}",
                    if hw { ", hw" } else { "" }
                )
            }
            OracleKind::Pwrx {
                last,
                deepest,
                interrupt,
                store,
                autonomous,
            } => {
                write!(f, "{name:<11}")?;
                for (set, label) in [(interrupt, "int: "), (store, "st: "), (autonomous, "hw: ")] {
                    if set {
                        f.write_str(label)?;
                    }
                }
                let (last, deepest) = (last.wrapping_add(1) & 0xf, deepest.wrapping_add(1) & 0xf);
                write!(f, "c{last:x}, c{deepest:x}")
            }
            OracleKind::Ptw { plc, ip, payload } => {
                write!(
                    f,
                    "{name:<11}{plc:x}: {payload:x}{}",
                    if ip { ", ip" } else { "" }
                )
            }
            OracleKind::Unknown { raw_type } => write!(f, "{name:<11}type {raw_type}"),
            OracleKind::Pad
            | OracleKind::Invalid
            | OracleKind::Psb
            | OracleKind::Psbend
            | OracleKind::Ovf
            | OracleKind::Stop => f.write_str(name),
        }
    }
}

fn write_flags(f: &mut fmt::Formatter<'_>, name: &str, flags: &[(bool, &str)]) -> fmt::Result {
    let set: Vec<&str> = flags
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, s)| *s)
        .collect();
    if set.is_empty() {
        f.write_str(name)
    } else {
        write!(f, "{name:<11}{}", set.join(", "))
    }
}

/// ptdump's rendering of a packet IP: the bytes the packet does not carry are `?`; a sign-
/// extended 48-bit IP is printed extended.
fn ptdump_ip(ipc: u8, ip: u64) -> String {
    let hidden_nibbles = match ipc {
        0 => return "?".repeat(16),
        1 => 12,
        2 => 8,
        4 => 4,
        3 => return format!("{:016x}", ((ip << 16) as i64 >> 16) as u64),
        _ => 0,
    };
    let full = format!("{ip:016x}");
    format!("{}{}", "?".repeat(hidden_nibbles), &full[hidden_nibbles..])
}

/// An allocated `pt_packet_decoder` over a borrowed trace.
struct PacketDecoder<'t> {
    raw: NonNull<ffi::PtPacketDecoder>,
    _trace: PhantomData<&'t [u8]>,
}

impl<'t> PacketDecoder<'t> {
    fn new(trace: &'t [u8], cfg: &Config) -> Result<Self, OracleError> {
        let raw_cfg = cfg.to_raw(trace)?;
        // SAFETY: `raw_cfg` is a fully initialised 2.0.5 `struct pt_config` whose begin/end span
        // `trace`; libipt copies the struct and keeps only the trace pointers, which stay valid
        // for 't, the lifetime this wrapper carries.
        let raw = unsafe { ffi::pt_pkt_alloc_decoder(&raw_cfg) };
        NonNull::new(raw)
            .map(|raw| PacketDecoder {
                raw,
                _trace: PhantomData,
            })
            .ok_or_else(|| OracleError::from_status(-ffi::PTE_INTERNAL, 0, Stage::Setup))
    }

    fn sync(&mut self, mode: SyncMode) -> i32 {
        // SAFETY: `self.raw` is a live decoder owned by `self`.
        unsafe {
            match mode {
                SyncMode::Forward => ffi::pt_pkt_sync_forward(self.raw.as_ptr()),
                SyncMode::AssumeAtStart => ffi::pt_pkt_sync_set(self.raw.as_ptr(), 0),
            }
        }
    }

    fn offset(&self) -> u64 {
        let mut offset = 0;
        // SAFETY: live decoder; `offset` is a valid out-pointer. The call only fails for an
        // unsynchronised decoder, and we only ask after a successful sync (offset stays 0).
        unsafe { ffi::pt_pkt_get_offset(self.raw.as_ptr(), &mut offset) };
        offset
    }

    fn next(&mut self, packet: &mut ffi::PtPacket) -> i32 {
        // SAFETY: live decoder; `packet` is a writable `struct pt_packet` of the size we pass.
        unsafe {
            ffi::pt_pkt_next(
                self.raw.as_ptr(),
                packet,
                core::mem::size_of::<ffi::PtPacket>(),
            )
        }
    }

    /// ptdump's loop: sync, decode until an error, resync forward after it, stop at the end.
    /// `on_packet` gets the offset and raw packet, `on_error` each error except end-of-stream.
    fn run(
        &mut self,
        mode: SyncMode,
        mut on_packet: impl FnMut(u64, &ffi::PtPacket),
        mut on_error: impl FnMut(OracleError),
    ) {
        let status = self.sync(mode);
        if status < 0 {
            if status != -ffi::PTE_EOS {
                on_error(OracleError::from_status(status, 0, Stage::Sync));
            }
            return;
        }
        let mut packet = ffi::PtPacket::default();
        loop {
            let offset = self.offset();
            let status = self.next(&mut packet);
            if status >= 0 {
                on_packet(offset, &packet);
                continue;
            }
            if status == -ffi::PTE_EOS {
                return;
            }
            on_error(OracleError::from_status(status, offset, Stage::Packet));
            let status = self.sync(SyncMode::Forward);
            if status < 0 {
                if status != -ffi::PTE_EOS {
                    on_error(OracleError::from_status(status, offset, Stage::Sync));
                }
                return;
            }
        }
    }
}

impl Drop for PacketDecoder<'_> {
    fn drop(&mut self) {
        // SAFETY: `self.raw` came from pt_pkt_alloc_decoder and is freed exactly once, here.
        unsafe { ffi::pt_pkt_free_decoder(self.raw.as_ptr()) }
    }
}

/// Decode every packet of `trace` with libipt, the way ptdump does: sync (per `cfg.sync`), decode
/// until an error, report it, resync at the next PSB, until the end of the trace. Errors appear
/// in the list at the position where they happened; the end of the trace is not an error.
pub fn packets(trace: &[u8], cfg: &Config) -> Vec<Result<OraclePacket, OracleError>> {
    let mut decoder = match PacketDecoder::new(trace, cfg) {
        Ok(d) => d,
        Err(e) => return vec![Err(e)],
    };
    let out = core::cell::RefCell::new(Vec::new());
    decoder.run(
        cfg.sync,
        |offset, raw| {
            out.borrow_mut().push(Ok(OraclePacket {
                offset,
                size: raw.size,
                kind: OracleKind::from_raw(raw),
            }))
        },
        |e| out.borrow_mut().push(Err(e)),
    );
    out.into_inner()
}

/// Benchmark loop: decode all of `trace` with `pt_pkt_next` (resyncing after errors, like
/// [`packets`]) and return (packets, errors) without allocating per packet.
pub fn count_packets(trace: &[u8], cfg: &Config) -> Result<(u64, u64), OracleError> {
    let mut decoder = PacketDecoder::new(trace, cfg)?;
    let (mut n, mut errors) = (0u64, 0u64);
    decoder.run(cfg.sync, |_, _| n += 1, |_| errors += 1);
    Ok((n, errors))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptdump_ip_hides_bytes_the_packet_does_not_carry() {
        assert_eq!(ptdump_ip(0, 0), "????????????????");
        assert_eq!(ptdump_ip(1, 0x1002), "????????????1002");
        assert_eq!(ptdump_ip(2, 0x0000_1001), "????????00001001");
        assert_eq!(ptdump_ip(3, 0xffff_ffff_1000), "ffffffffffff1000");
        assert_eq!(ptdump_ip(3, 0x7fff_ffff_1000), "00007fffffff1000");
        assert_eq!(ptdump_ip(4, 0xffff_ffff_4000), "????ffffffff4000");
        assert_eq!(ptdump_ip(6, 0x00cc_cccc_cccc_4000), "00cccccccccc4000");
    }

    #[test]
    fn empty_trace_has_no_packets_and_no_error() {
        assert!(packets(&[], &Config::default()).is_empty());
        let no_sync = Config {
            sync: SyncMode::AssumeAtStart,
            ..Config::default()
        };
        assert!(packets(&[], &no_sync).is_empty());
        assert_eq!(count_packets(&[], &Config::default()).unwrap(), (0, 0));
    }
}
