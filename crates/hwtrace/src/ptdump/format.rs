//! ptdump's text for each packet's opcode and payload columns.
//!
//! These follow libipt's ptdump exactly (including its quirks, such as the
//! three-character wake-reason field of PWRX), because scripts parse it.

use hwtrace_packet::{
    Cfe, Evd, IpCompression, IpPayload, ModeExec, ModeTsx, Pip, Ptw, Pwre, Pwrx, Tnt, Trig,
};

/// The IP payload column: compression bits, then the bytes present, with
/// `?` for bytes taken from the last IP.
pub fn ip_payload(ip: &IpPayload) -> String {
    let bits = ip.compression.bits();
    match ip.compression {
        IpCompression::Suppressed => format!("{bits:x}: ????????????????"),
        IpCompression::Update16 => format!("{bits:x}: ????????????{:04x}", ip.raw & 0xffff),
        IpCompression::Update32 => format!("{bits:x}: ????????{:08x}", ip.raw & 0xffff_ffff),
        IpCompression::Update48 => format!("{bits:x}: ????{:012x}", ip.raw & 0xffff_ffff_ffff),
        IpCompression::Sext48 => {
            let ip = (((ip.raw << 16) as i64) >> 16) as u64;
            format!("{bits:x}: {ip:016x}")
        }
        IpCompression::Full => format!("{bits:x}: {:016x}", ip.raw),
    }
}

/// TNT bits, oldest first: `!` taken, `.` not taken.
pub fn tnt(tnt: &Tnt) -> String {
    tnt.iter().map(|t| if t { '!' } else { '.' }).collect()
}

/// Joins the flags that are set with ", ".
fn flags(list: &[(bool, &str)]) -> String {
    list.iter()
        .filter(|(set, _)| *set)
        .map(|(_, name)| *name)
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn mode_exec(mode: &ModeExec) -> String {
    flags(&[(mode.csd, "cs.d"), (mode.csl, "cs.l"), (mode.iflag, "if")])
}

/// The execution mode a MODE.Exec selects.
pub fn exec_mode(mode: &ModeExec) -> &'static str {
    match (mode.csl, mode.csd) {
        (true, false) => "64-bit",
        (false, true) => "32-bit",
        (false, false) => "16-bit",
        (true, true) => "unknown",
    }
}

pub fn mode_tsx(mode: &ModeTsx) -> String {
    flags(&[(mode.intx, "intx"), (mode.abrt, "abrt")])
}

pub fn pip(pip: &Pip) -> String {
    format!("{:x}{}", pip.cr3.0, if pip.nr { ", nr" } else { "" })
}

pub fn ptw(ptw: &Ptw) -> String {
    format!(
        "{:x}: {:x}{}",
        u8::from(ptw.eight_bytes),
        ptw.payload,
        if ptw.ip { ", ip" } else { "" }
    )
}

/// C-states are written minus one; ptdump shows them as numbered.
fn c_state(encoded: u8) -> u8 {
    encoded.wrapping_add(1) & 0xf
}

/// PWRE; `hw` says whether the C-state was requested by hardware (passed
/// in because ptdump reads that flag from a different bit than the SDM).
pub fn pwre(pwre: &Pwre, hw: bool) -> String {
    format!(
        "c{}.{}{}",
        c_state(pwre.state()),
        c_state(pwre.sub_state()),
        if hw { ", hw" } else { "" }
    )
}

pub fn pwrx(pwrx: &Pwrx) -> String {
    // Exactly one of interrupt, store, autonomous; anything else is "bad".
    let reasons = [
        (pwrx.interrupt(), "int"),
        (pwrx.store(), " st"),
        (pwrx.autonomous(), " hw"),
    ];
    let mut set = reasons.iter().filter(|(on, _)| *on);
    let wr = match (set.next(), set.next()) {
        (Some((_, name)), None) => *name,
        _ => "bad",
    };
    format!(
        "{wr}: c{}, c{}",
        c_state(pwrx.last()),
        c_state(pwrx.deepest())
    )
}

pub fn cfe(cfe: &Cfe) -> String {
    let ip = if cfe.ip { ", ip" } else { "" };
    match cfe.ty {
        // INTR, VMEXIT_INTR, UINTR and software interrupts carry a vector.
        1 | 9 | 12 | 14 => format!("{}: {}{ip}", cfe.ty, cfe.vector),
        // SIPI carries the start-up vector, shown in hex.
        5 => format!("{}: {:x}{ip}", cfe.ty, cfe.vector),
        _ => format!("{}{ip}", cfe.ty),
    }
}

pub fn cfe_type(cfe: &Cfe) -> &'static str {
    hwtrace_packet::cfe_type_name(cfe.ty).unwrap_or("unknown")
}

pub fn evd(evd: &Evd) -> String {
    format!("{}: {:x}", evd.ty, evd.payload)
}

pub fn evd_type(evd: &Evd) -> &'static str {
    match evd.ty {
        0 => "cr2",
        1 => "vmxq",
        2 => "vmxr",
        _ => "unknown",
    }
}

pub fn trig(trig: &Trig) -> String {
    let mut text = format!("{:02x}", trig.trbv);
    if trig.ip {
        text.push_str(", ip");
    }
    if trig.mult {
        text.push_str(", mult");
    }
    if let Some(icnt) = trig.icnt {
        text.push_str(&format!(", icnt: {icnt}"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use hwtrace_types::Cr3;

    #[test]
    fn ip_payloads() {
        let p = |compression, raw| ip_payload(&IpPayload { compression, raw });
        assert_eq!(p(IpCompression::Suppressed, 0), "0: ????????????????");
        assert_eq!(p(IpCompression::Update16, 0x1002), "1: ????????????1002");
        assert_eq!(p(IpCompression::Update32, 0x1001), "2: ????????00001001");
        assert_eq!(
            p(IpCompression::Sext48, 0xffff_ffff_1000),
            "3: ffffffffffff1000"
        );
        assert_eq!(
            p(IpCompression::Update48, 0xffff_ffff_4000),
            "4: ????ffffffff4000"
        );
        assert_eq!(
            p(IpCompression::Full, 0x00cc_cccc_cccc_4000),
            "6: 00cccccccccc4000"
        );
    }

    #[test]
    fn modes() {
        let m = ModeExec {
            csl: true,
            csd: false,
            iflag: true,
        };
        assert_eq!(
            (mode_exec(&m), exec_mode(&m)),
            ("cs.l, if".into(), "64-bit")
        );
        let t = ModeTsx {
            intx: true,
            abrt: true,
        };
        assert_eq!(mode_tsx(&t), "intx, abrt");
    }

    #[test]
    fn pip_and_ptw() {
        let p = Pip {
            cr3: Cr3(0xafafa0),
            nr: true,
        };
        assert_eq!(pip(&p), "afafa0, nr");
        let w = Ptw {
            payload: 0x90abcdef,
            eight_bytes: false,
            ip: true,
        };
        assert_eq!(ptw(&w), "0: 90abcdef, ip");
    }

    #[test]
    fn power_packets() {
        // State c6 (encoded 5), sub-state 0 (encoded 0xf), hw.
        assert_eq!(pwre(&Pwre { raw: 0x5f00 }, true), "c6.0, hw");
        assert_eq!(pwre(&Pwre { raw: 0x0000 }, false), "c1.1");
        // Interrupt wake, last c1 (0), deepest c6 (5).
        assert_eq!(pwrx(&Pwrx { raw: 0x105 }), "int: c1, c6");
        assert_eq!(pwrx(&Pwrx { raw: 0x405 }), " st: c1, c6");
        assert_eq!(pwrx(&Pwrx { raw: 0x505 }), "bad: c1, c6");
    }

    #[test]
    fn event_trace_packets() {
        let c = |ty, vector, ip| Cfe { ty, ip, vector };
        assert_eq!(cfe(&c(1, 14, false)), "1: 14");
        assert_eq!(cfe(&c(5, 0xce, false)), "5: ce");
        assert_eq!(cfe(&c(3, 0, true)), "3, ip");
        assert_eq!(cfe_type(&c(31, 0, false)), "unknown");
        let e = Evd {
            ty: 2,
            payload: 0xf00baa,
        };
        assert_eq!((evd(&e), evd_type(&e)), ("2: f00baa".into(), "vmxr"));
        let t = Trig {
            trbv: 0xa1,
            ip: true,
            mult: true,
            icnt: Some(23),
        };
        assert_eq!(trig(&t), "a1, ip, mult, icnt: 23");
    }
}
