//! One module per subcommand.

mod bts;
pub(crate) mod calls;
mod coverage;
mod cpuid;
mod dump;
pub(crate) mod flow;
mod lbr;
mod libxdc;
mod mem;
mod msr;
mod perf;
mod ptdump;
mod ptxed;
mod record;
mod record_portable;
mod report;
mod sim;
mod timeline;

use std::process::ExitCode;

/// Every subcommand of `hwtrace`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// List the packets of a raw Intel PT trace.
    Dump(dump::DumpArgs),
    /// Print packets exactly as libipt's ptdump does (same options, same output).
    #[command(disable_help_flag = true)]
    Ptdump(ptdump::PtdumpArgs),
    /// Decode a trace over code images exactly as libipt's ptxed does (same options, same output).
    #[command(disable_help_flag = true)]
    Ptxed(ptxed::PtxedArgs),
    /// Decode a trace over code images or a memory dump: instructions, blocks or branches.
    Flow(flow::FlowArgs),
    /// Page tables of a physical memory dump: translate, maps, selfmap, cr3s.
    Mem(mem::MemArgs),
    /// Explain or build trace-hardware register values (IA32_RTIT_*, DEBUGCTL, LBR MSRs).
    Msr(msr::MsrArgs),
    /// Decode the Intel PT CPUID leaves (07H, 14H), given or read from this CPU.
    Cpuid(cpuid::CpuidArgs),
    /// Branch Trace Store: decode a DS area + BTS buffer dump, or raw records.
    Bts(bts::BtsArgs),
    /// Last Branch Records: decode an LBR MSR dump.
    Lbr(lbr::LbrArgs),
    /// Record a command or process with Intel PT, BTS or LBR (perf_event_open) into perf.data.
    Record(record::RecordArgs),
    /// perf.data files: info, dump-aux, decode (Intel PT, BTS, LBR samples).
    Perf(perf::PerfArgs),
    /// Simulate the trace hardware on a real program recorded with qemu-user: PT (with ToPA/single-range output), BTS, LBR.
    Sim(sim::SimArgs),
    /// Rebuild calls and returns: indented call trace, folded stacks, SVG flame graph.
    Calls(calls::CallsArgs),
    /// Function calls on a time axis as Chrome trace JSON (opens in Perfetto).
    Timeline(timeline::TimelineArgs),
    /// Basic blocks and edges with hit counts from any trace: drcov, lcov, AFL bitmap, JSON.
    Coverage(coverage::CoverageArgs),
    /// libxdc's bitmap (kAFL/Nyx) of each of many raw traces: hash, counters set and new, edge lists.
    Libxdc(libxdc::LibxdcArgs),
    /// Summarise a trace: top functions, images, threads, trace health.
    Report(report::ReportArgs),
}

/// Runs one subcommand.
pub fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Dump(args) => dump::run(args),
        Command::Ptdump(args) => ptdump::run(args),
        Command::Ptxed(args) => ptxed::run(args),
        Command::Flow(args) => flow::run(args),
        Command::Mem(args) => mem::run(args),
        Command::Msr(args) => msr::run(args),
        Command::Cpuid(args) => cpuid::run(args),
        Command::Bts(args) => bts::run(args),
        Command::Lbr(args) => lbr::run(args),
        Command::Record(args) => record::run(args),
        Command::Perf(args) => perf::run(args),
        Command::Sim(args) => sim::run(args),
        Command::Calls(args) => calls::run(args),
        Command::Timeline(args) => timeline::run(args),
        Command::Coverage(args) => coverage::run(args),
        Command::Libxdc(args) => libxdc::run(args),
        Command::Report(args) => report::run(args),
    }
}
