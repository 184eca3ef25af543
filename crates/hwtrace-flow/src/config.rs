//! What the flow decoders need to know about how the trace was recorded.

use crate::errata::Errata;
use crate::time::TimeConfig;

/// The IP filter ranges of IA32_RTIT_CTL.ADDRn_CFG and IA32_RTIT_ADDRn_A/B
/// (SDM vol. 3C, 33.2.4.3 "Filtering by IP").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AddrFilter {
    /// ADDRn_CFG, four bits per range (range `n` in bits `4n+3:4n`).
    pub cfg: u64,
    /// The range starts.
    pub a: [u64; 4],
    /// The range ends (inclusive).
    pub b: [u64; 4],
}

impl AddrFilter {
    /// Whether any range is configured.
    pub const fn is_configured(&self) -> bool {
        self.cfg != 0
    }

    /// Whether `ip` lies in a range configured as a trace filter
    /// (ADDRn_CFG = 1).
    pub fn contains(&self, ip: u64) -> bool {
        (0..4).any(|n| (self.cfg >> (4 * n)) & 0xf == 1 && self.a[n] <= ip && ip <= self.b[n])
    }
}

/// Decoder configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Config {
    /// The errata of the processor that wrote the trace.
    pub errata: Errata,
    /// Timing parameters.
    pub time: TimeConfig,
    /// The IP filter configuration tracing ran with.
    pub filter: AddrFilter,
    /// Keep the timing calibration across an overflow.
    pub keep_tcal_on_ovf: bool,
    /// Report a tick event whenever time moved at a branch.
    pub tick_events: bool,
    /// Report interrupt-flag changes (event trace).
    pub iflags_events: bool,
    /// Block decoder: end a block at every direct call.
    pub end_on_call: bool,
    /// Block decoder: end a block at every direct jump.
    pub end_on_jump: bool,
    /// Read tracing's on/off status as Linux perf and libxdc do: a PSB+
    /// that says tracing is on (a FUP in it) while it was off is believed
    /// (tracing goes on at the FUP's IP), and a TIP.PGE while tracing is
    /// on goes to its IP. Real traces show both after an asynchronous
    /// disable (a VM exit): PSB+ with a FUP, then TIP.PGE. libipt reports
    /// these as a bad status update and an unexpected packet context and
    /// skips to the next PSB, which is the default here too.
    pub lenient_status: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_ranges() {
        let f = AddrFilter {
            cfg: 1,
            a: [0x1000, 0, 0, 0],
            b: [0x10ff, 0, 0, 0],
        };
        assert!(f.is_configured());
        assert!(f.contains(0x1000) && f.contains(0x10ff));
        assert!(!f.contains(0x1100));
        let stop = AddrFilter { cfg: 2, ..f };
        assert!(!stop.contains(0x1000));
    }
}
