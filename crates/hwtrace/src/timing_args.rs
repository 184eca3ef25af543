//! What a raw PT trace's timing packets need to become time, as libipt's
//! ptdump and ptxed take it (`--mtc-freq`, `--nom-freq`,
//! `--cpuid-0x15.eax`, `--cpuid-0x15.ebx`; perf.data files carry these in
//! their AUXTRACE_INFO record).
//!
//! Without them a decode still has the TSC packets' times, but MTC packets
//! cannot advance the time (their crystal-clock ticks have no TSC ratio)
//! and CYC packets cannot be calibrated, so events between two TSCs are
//! all stamped with the earlier one.

use hwtrace_flow::TimeConfig;

/// The timing options of the answer commands (raw PT input).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::Args)]
pub struct TimingArgs {
    /// Raw PT: the MTC frequency the trace was written with
    /// (IA32_RTIT_CTL.MTCFreq, 0-15: an MTC every 2^N crystal-clock ticks;
    /// perf's `mtc_period`).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(0..=15))]
    pub mtc_freq: Option<u8>,
    /// Raw PT: the nominal core:bus ratio (MSR_PLATFORM_INFO bits 15:8); with
    /// it, a CBR packet calibrates CYC packets.
    #[arg(long, value_name = "N", value_parser = parse_number::<u8>)]
    pub nom_freq: Option<u8>,
    /// Raw PT: CPUID.(EAX=15H):EAX, the TSC / crystal clock ratio's
    /// denominator (with `--cpuid-0x15.ebx`, MTC packets advance the time).
    #[arg(long = "cpuid-0x15.eax", value_name = "N", value_parser = parse_number::<u32>)]
    pub cpuid_0x15_eax: Option<u32>,
    /// Raw PT: CPUID.(EAX=15H):EBX, the ratio's numerator.
    #[arg(long = "cpuid-0x15.ebx", value_name = "N", value_parser = parse_number::<u32>)]
    pub cpuid_0x15_ebx: Option<u32>,
}

impl TimingArgs {
    /// `time` with the values given set.
    pub fn apply(&self, time: TimeConfig) -> TimeConfig {
        TimeConfig {
            mtc_freq: self.mtc_freq.unwrap_or(time.mtc_freq),
            nom_freq: self.nom_freq.unwrap_or(time.nom_freq),
            cpuid_0x15_eax: self.cpuid_0x15_eax.unwrap_or(time.cpuid_0x15_eax),
            cpuid_0x15_ebx: self.cpuid_0x15_ebx.unwrap_or(time.cpuid_0x15_ebx),
            ..time
        }
    }
}

/// A decimal number, or a hexadecimal one with `0x` (as ptdump reads them).
fn parse_number<T: TryFrom<u64>>(text: &str) -> Result<T, String> {
    let value = match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse::<u64>(),
    }
    .map_err(|e| format!("{text:?}: {e}"))?;
    T::try_from(value).map_err(|_| format!("{text:?}: out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        timing: TimingArgs,
    }

    fn parse(args: &[&str]) -> Result<TimingArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("t").chain(args.iter().copied())).map(|c| c.timing)
    }

    #[test]
    fn the_options_set_what_they_name_and_leave_the_rest() {
        let t = parse(&[
            "--mtc-freq",
            "3",
            "--nom-freq",
            "0x18",
            "--cpuid-0x15.eax",
            "2",
            "--cpuid-0x15.ebx",
            "188",
        ])
        .unwrap();
        let base = TimeConfig {
            skl168: true,
            ..TimeConfig::default()
        };
        assert_eq!(
            t.apply(base),
            TimeConfig {
                mtc_freq: 3,
                nom_freq: 24,
                cpuid_0x15_eax: 2,
                cpuid_0x15_ebx: 188,
                skl168: true,
            }
        );
        assert_eq!(parse(&[]).unwrap().apply(base), base);
        for bad in [
            &["--mtc-freq", "16"][..],
            &["--nom-freq", "256"],
            &["--cpuid-0x15.eax", "x"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
