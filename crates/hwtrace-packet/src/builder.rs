//! Building traces packet by packet, for tests and simulators.

use crate::encode::{MAX_PACKET_LEN, encode};
use crate::error::EncodeError;
use crate::ip::{IpPayload, LastIp};
use crate::packet::{ModeExec, Packet};
use alloc::vec::Vec;

/// A growing trace: push packets, take the bytes.
///
/// IP packets can be pushed by full address with [`ip`](Self::ip) and the
/// builder compresses them against its own last IP, as the hardware does,
/// so tests can be written in addresses rather than payloads.
#[derive(Clone, Debug, Default)]
pub struct TraceBuilder {
    bytes: Vec<u8>,
    last_ip: Option<u64>,
}

impl TraceBuilder {
    /// An empty trace.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends one packet.
    pub fn push(&mut self, packet: Packet) -> Result<&mut Self, EncodeError> {
        let mut buf = [0u8; MAX_PACKET_LEN];
        let n = encode(&packet, &mut buf)?;
        self.bytes.extend_from_slice(&buf[..n]);
        match packet {
            Packet::Psb | Packet::Ovf => self.last_ip = None,
            _ => {
                if let Some(ip) = packet.ip_payload() {
                    let mut l = LastIp::new();
                    if let Some(last) = self.last_ip {
                        l.update(IpPayload::full(last));
                    }
                    l.update(ip);
                    self.last_ip = Some(l.raw()).filter(|_| l.ip().is_ok()).or(self.last_ip);
                }
            }
        }
        Ok(self)
    }

    /// Appends an IP packet (`make` is `Packet::Tip`, `Packet::Fup`, ...)
    /// carrying `ip`, compressed against the last IP.
    pub fn ip(&mut self, make: fn(IpPayload) -> Packet, ip: u64) -> Result<&mut Self, EncodeError> {
        let payload = IpPayload::compress(ip, self.last_ip);
        self.push(make(payload))
    }

    /// Appends the PSB+ a CPU writes while tracing 64-bit code that is
    /// about to run at `ip`: PSB, MODE.Exec (64-bit), FUP `ip`, PSBEND.
    pub fn psb_plus_64(&mut self, ip: u64) -> Result<&mut Self, EncodeError> {
        self.push(Packet::Psb)?;
        self.push(Packet::ModeExec(ModeExec {
            csl: true,
            csd: false,
            iflag: false,
        }))?;
        self.ip(Packet::Fup, ip)?;
        self.push(Packet::Psbend)
    }

    /// Appends raw bytes (to build broken traces on purpose).
    pub fn raw(&mut self, bytes: &[u8]) -> &mut Self {
        self.bytes.extend_from_slice(bytes);
        self
    }

    /// The bytes so far.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The finished trace.
    pub fn finish(self) -> Vec<u8> {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PacketDecoder;

    #[test]
    fn psb_plus_64_is_psb_mode_fup_psbend() {
        let mut t = TraceBuilder::new();
        t.psb_plus_64(0x40_1000).unwrap();
        let bytes = t.finish();
        let mut dec = PacketDecoder::new(&bytes);
        let mut got = Vec::new();
        while let Some(p) = dec.next_packet().unwrap() {
            got.push(p.packet);
        }
        assert_eq!(got.len(), 4);
        assert_eq!(got[0], Packet::Psb);
        assert_eq!(
            got[1],
            Packet::ModeExec(ModeExec {
                csl: true,
                csd: false,
                iflag: false,
            })
        );
        assert_eq!(got[2].ip_payload().map(|p| p.raw), Some(0x40_1000));
        assert_eq!(got[3], Packet::Psbend);
    }
}
