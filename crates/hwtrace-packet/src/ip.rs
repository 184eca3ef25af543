//! IP payloads and their compression (SDM vol. 3C, 33.4.2.2, table 33-11).
//!
//! TIP, TIP.PGE, TIP.PGD and FUP carry an IP compressed against the last IP
//! the decoder saw: only the bytes that changed are written. [`LastIp`] is
//! the state machine that undoes it.

use core::fmt;

/// The IPBytes field of an IP packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IpCompression {
    /// 000b: no IP; it is out of context or filtered.
    Suppressed,
    /// 001b: the low 16 bits, the rest from the last IP.
    Update16,
    /// 010b: the low 32 bits, the rest from the last IP.
    Update32,
    /// 011b: 48 bits, sign-extended.
    Sext48,
    /// 100b: the low 48 bits, the rest from the last IP.
    Update48,
    /// 110b: all 64 bits.
    Full,
}

impl IpCompression {
    /// Decodes the three IPBytes bits; 101b and 111b are reserved.
    pub const fn from_bits(bits: u8) -> Option<Self> {
        Some(match bits {
            0 => Self::Suppressed,
            1 => Self::Update16,
            2 => Self::Update32,
            3 => Self::Sext48,
            4 => Self::Update48,
            6 => Self::Full,
            _ => return None,
        })
    }

    /// The three IPBytes bits.
    pub const fn bits(self) -> u8 {
        match self {
            Self::Suppressed => 0,
            Self::Update16 => 1,
            Self::Update32 => 2,
            Self::Sext48 => 3,
            Self::Update48 => 4,
            Self::Full => 6,
        }
    }

    /// How many payload bytes follow the opcode.
    pub const fn payload_len(self) -> usize {
        match self {
            Self::Suppressed => 0,
            Self::Update16 => 2,
            Self::Update32 => 4,
            Self::Sext48 | Self::Update48 => 6,
            Self::Full => 8,
        }
    }
}

/// An IP payload as written: the compression and the bytes that were there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IpPayload {
    /// How the IP was compressed.
    pub compression: IpCompression,
    /// The payload bytes, little-endian, zero-extended (not sign-extended
    /// and not merged with any last IP).
    pub raw: u64,
}

impl IpPayload {
    /// A payload with no IP.
    pub const SUPPRESSED: Self = Self {
        compression: IpCompression::Suppressed,
        raw: 0,
    };

    /// A payload carrying `ip` in full.
    pub const fn full(ip: u64) -> Self {
        Self {
            compression: IpCompression::Full,
            raw: ip,
        }
    }

    /// The cheapest payload that makes a decoder whose last IP is `last`
    /// reconstruct `ip`, as the hardware chooses it. With `last == None`
    /// (after PSB or OVF) only self-contained forms qualify.
    pub const fn compress(ip: u64, last: Option<u64>) -> Self {
        if let Some(last) = last {
            if ip >> 16 == last >> 16 {
                return Self {
                    compression: IpCompression::Update16,
                    raw: ip & 0xffff,
                };
            }
            if ip >> 32 == last >> 32 {
                return Self {
                    compression: IpCompression::Update32,
                    raw: ip & 0xffff_ffff,
                };
            }
        }
        if sext48(ip & 0xffff_ffff_ffff) == ip {
            return Self {
                compression: IpCompression::Sext48,
                raw: ip & 0xffff_ffff_ffff,
            };
        }
        if let Some(last) = last
            && ip >> 48 == last >> 48
        {
            return Self {
                compression: IpCompression::Update48,
                raw: ip & 0xffff_ffff_ffff,
            };
        }
        Self::full(ip)
    }
}

impl fmt::Display for IpPayload {
    /// `3: ffffffffffff1000`, with `?` for the bytes taken from the last IP.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bits = self.compression.bits();
        let shown = match self.compression {
            IpCompression::Suppressed => 0,
            IpCompression::Update16 => 4,
            IpCompression::Update32 => 8,
            IpCompression::Update48 => 12,
            IpCompression::Sext48 | IpCompression::Full => 16,
        };
        let value = if self.compression == IpCompression::Sext48 {
            sext48(self.raw)
        } else {
            self.raw
        };
        write!(f, "{bits}: ")?;
        for _ in shown..16 {
            f.write_str("?")?;
        }
        if shown > 0 {
            write!(
                f,
                "{:0width$x}",
                value & mask(shown * 4),
                width = shown as usize
            )?;
        }
        Ok(())
    }
}

const fn mask(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

/// Sign-extends a 48-bit value to 64 bits.
#[inline]
pub(crate) const fn sext48(v: u64) -> u64 {
    (((v << 16) as i64) >> 16) as u64
}

/// Why [`LastIp`] has no IP to give.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LastIpError {
    /// No IP packet has been seen since the last reset (PSB, OVF).
    NoIp,
    /// The last IP packet had its IP suppressed.
    Suppressed,
}

impl fmt::Display for LastIpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NoIp => "no ip",
            Self::Suppressed => "ip suppressed",
        })
    }
}

impl core::error::Error for LastIpError {}

/// The last-IP state machine (SDM 33.4.2.2): the reference against which
/// compressed IPs are rebuilt. PSB and OVF reset it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LastIp {
    ip: u64,
    have_ip: bool,
    suppressed: bool,
}

impl LastIp {
    /// A state with no IP, as after PSB.
    pub const fn new() -> Self {
        Self {
            ip: 0,
            have_ip: false,
            suppressed: false,
        }
    }

    /// Forgets the IP (PSB, OVF).
    pub fn reset(&mut self) {
        *self = Self::new();
    }

    /// Applies one IP payload. A suppressed payload leaves the stored IP as
    /// it was but marks it unavailable until the next real one.
    #[inline]
    pub fn update(&mut self, payload: IpPayload) {
        let raw = payload.raw;
        self.ip = match payload.compression {
            IpCompression::Suppressed => {
                self.suppressed = true;
                return;
            }
            IpCompression::Update16 => (self.ip & !0xffff) | (raw & 0xffff),
            IpCompression::Update32 => (self.ip & !0xffff_ffff) | (raw & 0xffff_ffff),
            IpCompression::Sext48 => sext48(raw),
            IpCompression::Update48 => (self.ip & !0xffff_ffff_ffff) | (raw & 0xffff_ffff_ffff),
            IpCompression::Full => raw,
        };
        self.have_ip = true;
        self.suppressed = false;
    }

    /// [`update`](Self::update) for a decoder reading IP packets straight
    /// from trace bytes in a hot loop: the IP packet whose header byte is
    /// `header`, its payload the low bytes of `raw` (little-endian; bytes
    /// past the payload are ignored, so eight can be loaded at once).
    /// Returns the IP it leaves and the packet's size (header included),
    /// or `None`, the state untouched, when its IP is suppressed or its
    /// IPBytes reserved. The same arithmetic as `update`, from tables
    /// instead of a branch per compression.
    #[inline(always)]
    pub fn update_raw(&mut self, header: u8, raw: u64) -> Option<(u64, u8)> {
        /// By IPBytes: the packet's size, the last IP's bits kept, the
        /// payload's bits taken (SDM 33.4.2.2).
        const SIZE: [u8; 8] = [0, 3, 5, 7, 7, 0, 9, 0];
        const KEEP: [u64; 8] = [0, !0xffff, !0xffff_ffff, 0, !0xffff_ffff_ffff, 0, 0, 0];
        const TAKE: [u64; 8] = [
            0,
            0xffff,
            0xffff_ffff,
            0xffff_ffff_ffff,
            0xffff_ffff_ffff,
            0,
            u64::MAX,
            0,
        ];
        let c = usize::from(header >> 5);
        let size = SIZE[c];
        if size == 0 {
            return None;
        }
        let mut ip = (self.ip & KEEP[c]) | (raw & TAKE[c]);
        if c == 3 {
            ip = sext48(ip);
        }
        *self = Self {
            ip,
            have_ip: true,
            suppressed: false,
        };
        Some((ip, size))
    }

    /// The current full IP.
    #[inline]
    pub fn ip(&self) -> Result<u64, LastIpError> {
        if !self.have_ip {
            Err(LastIpError::NoIp)
        } else if self.suppressed {
            Err(LastIpError::Suppressed)
        } else {
            Ok(self.ip)
        }
    }

    /// The stored IP bits whether or not they are currently valid (the base
    /// the next compressed payload will be merged into).
    pub const fn raw(&self) -> u64 {
        self.ip
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(c: IpCompression, raw: u64) -> IpPayload {
        IpPayload {
            compression: c,
            raw,
        }
    }

    #[test]
    fn update_raw_is_update_for_every_header() {
        let raws = [
            0,
            0x1234,
            0xdead_beef_cafe_f00d,
            0x0000_8000_0000_1000,
            0x0000_7fff_ffff_ffff,
            u64::MAX,
        ];
        let starts = [
            LastIp::new(),
            {
                let mut l = LastIp::new();
                l.update(p(IpCompression::Full, 0xffff_8000_1234_5678));
                l
            },
            {
                let mut l = LastIp::new();
                l.update(p(IpCompression::Full, 0x7f00_0000_4000));
                l.update(IpPayload::SUPPRESSED);
                l
            },
        ];
        for start in starts {
            for bits in 0u8..8 {
                for raw in raws {
                    // Low five bits: any packet kind's, ignored.
                    let header = (bits << 5) | 0x0d;
                    let mut fast = start;
                    let got = fast.update_raw(header, raw);
                    match IpCompression::from_bits(bits) {
                        Some(c) if c != IpCompression::Suppressed => {
                            let n = c.payload_len();
                            let masked = if n == 8 {
                                raw
                            } else {
                                raw & ((1u64 << (8 * n)) - 1)
                            };
                            let mut slow = start;
                            slow.update(p(c, masked));
                            assert_eq!(fast, slow, "IPBytes {bits}, raw {raw:#x}");
                            assert_eq!(got, Some((slow.ip().unwrap(), n as u8 + 1)));
                        }
                        _ => {
                            assert_eq!(got, None, "IPBytes {bits}");
                            assert_eq!(fast, start);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn empty_state_has_no_ip() {
        assert_eq!(LastIp::new().ip(), Err(LastIpError::NoIp));
    }

    #[test]
    fn each_compression_merges_the_right_bytes() {
        let mut l = LastIp::new();
        l.update(p(IpCompression::Full, 0x1122_3344_5566_7788));
        l.update(p(IpCompression::Update16, 0xaaaa));
        assert_eq!(l.ip(), Ok(0x1122_3344_5566_aaaa));
        l.update(p(IpCompression::Update32, 0xbbbb_cccc));
        assert_eq!(l.ip(), Ok(0x1122_3344_bbbb_cccc));
        l.update(p(IpCompression::Update48, 0x0000_dddd_eeee));
        assert_eq!(l.ip(), Ok(0x1122_0000_dddd_eeee));
        l.update(p(IpCompression::Sext48, 0x8000_0000_0000));
        assert_eq!(l.ip(), Ok(0xffff_8000_0000_0000));
        l.update(p(IpCompression::Sext48, 0x7fff_0000_0000));
        assert_eq!(l.ip(), Ok(0x0000_7fff_0000_0000));
    }

    #[test]
    fn suppression_keeps_the_base_for_later_updates() {
        let mut l = LastIp::new();
        l.update(IpPayload::full(0xffff_ffff_dddd_eeee));
        l.update(IpPayload::SUPPRESSED);
        assert_eq!(l.ip(), Err(LastIpError::Suppressed));
        l.update(p(IpCompression::Update16, 0x1234));
        assert_eq!(l.ip(), Ok(0xffff_ffff_dddd_1234));
    }

    #[test]
    fn compress_picks_the_smallest_form_that_round_trips() {
        let cases = [
            (0x1234u64, Some(0x1000u64), IpCompression::Update16),
            (
                0x7fff_1234_5678,
                Some(0x7fff_0000_0000),
                IpCompression::Update32,
            ),
            (0x7fff_1234_5678, None, IpCompression::Sext48),
            (0xffff_8000_0000_1000, Some(0x1000), IpCompression::Sext48),
            (
                0x00cc_cccc_cccc_4000,
                Some(0x00cc_0000_0000_0000),
                IpCompression::Update48,
            ),
            (0x00cc_cccc_cccc_4000, None, IpCompression::Full),
        ];
        for (ip, last, want) in cases {
            let c = IpPayload::compress(ip, last);
            assert_eq!(c.compression, want, "ip {ip:#x} last {last:x?}");
            let mut l = LastIp::new();
            if let Some(last) = last {
                l.update(IpPayload::full(last));
            }
            l.update(c);
            assert_eq!(l.ip(), Ok(ip));
        }
    }

    #[test]
    fn display_marks_inherited_bytes() {
        extern crate std;
        use std::string::ToString;
        assert_eq!(
            p(IpCompression::Update32, 0x1001).to_string(),
            "2: ????????00001001"
        );
        assert_eq!(
            p(IpCompression::Suppressed, 0).to_string(),
            "0: ????????????????"
        );
        assert_eq!(
            p(IpCompression::Sext48, 0xffff_ffff_1000).to_string(),
            "3: ffffffffffff1000"
        );
        assert_eq!(
            p(IpCompression::Update48, 0xffff_ffff_4000).to_string(),
            "4: ????ffffffff4000"
        );
        assert_eq!(
            p(IpCompression::Full, 0x00cc_cccc_cccc_4000).to_string(),
            "6: 00cccccccccc4000"
        );
    }
}
