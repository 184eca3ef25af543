//! libipt ptxed's command line.

use anyhow::{Context, bail};
use hwtrace_flow::{Config, Errata};
use hwtrace_mem::image::{Image, parse_ptxed_elf, parse_ptxed_raw};
use hwtrace_perf::pevent::SidebandOptions;
use hwtrace_perf::pevent::session::parse_c_u64;
use std::path::Path;

use crate::input::MappedRange;

/// Which decoder ptxed runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecoderKind {
    /// Instruction by instruction (`--insn-decoder`).
    Insn,
    /// Block by block (`--block-decoder`, the default).
    Block,
}

/// Everything the command line says.
#[derive(Debug)]
pub struct Options {
    pub decoder: DecoderKind,
    pub config: Config,
    pub image: Image,
    pub trace: MappedRange,
    pub dont_print_insn: bool,
    pub quiet: bool,
    pub print_stats: bool,
    pub stat_insn: bool,
    pub stat_blocks: bool,
    pub track_blocks: bool,
    pub print_offset: bool,
    pub print_time: bool,
    pub print_raw_insn: bool,
    pub check: bool,
    pub print_event_time: bool,
    pub print_event_ip: bool,
    /// After an error, go on at the next IP the trace gives.
    pub resync_on_error: bool,
    pub sideband: SidebandOptions,
    /// Diagnostics ptxed prints before decoding (`--cpu` problems).
    pub preamble: Vec<String>,
}

fn number(opt: &str, value: Option<&String>) -> anyhow::Result<u64> {
    let v = value.with_context(|| format!("{opt}: missing argument"))?;
    if v.is_empty() || v.starts_with("--") {
        bail!("{opt}: missing argument");
    }
    parse_c_u64(v).with_context(|| format!("{opt}: bad argument: {v}"))
}

fn narrow<T: TryFrom<u64>>(opt: &str, v: u64) -> anyhow::Result<T> {
    T::try_from(v).map_err(|_| anyhow::anyhow!("{opt}: value too big: {v:#x}"))
}

/// What `--cpu` said.
enum CpuArg {
    None,
    Model(u16, u8),
}

/// `none` or `f/m[/s]`, parsed as ptdump parses it (one grammar for both).
fn parse_cpu(text: &str) -> anyhow::Result<CpuArg> {
    if text == "none" {
        return Ok(CpuArg::None);
    }
    let cpu = crate::ptdump::cpu::Cpu::parse(text)?;
    Ok(CpuArg::Model(cpu.family, cpu.model))
}

/// Maps `FILE[:FROM[-TO]]` of the trace.
fn load_trace(arg: &str) -> anyhow::Result<MappedRange> {
    let (path, range) = match arg.rsplit_once(':') {
        Some((name, r)) => match parse_range(r) {
            Some(range) => (name, Some(range)),
            None => (arg, None),
        },
        None => (arg, None),
    };
    let whole =
        MappedRange::whole(Path::new(path)).with_context(|| format!("failed to open {path}"))?;
    let Some((from, to)) = range else {
        return Ok(whole);
    };
    if from >= whole.file_len() {
        bail!("bad offset {from:#x} into {path}");
    }
    let end = to.unwrap_or(whole.file_len());
    if end <= from {
        bail!("bad range {end:#x} in {path}");
    }
    match whole.narrowed(from..end) {
        Some(part) => Ok(part),
        None => bail!("bad range {end:#x} in {path}"),
    }
}

fn parse_range(r: &str) -> Option<(u64, Option<u64>)> {
    match r.split_once('-') {
        Some((a, b)) => Some((parse_c_u64(a)?, Some(parse_c_u64(b)?))),
        None => Some((parse_c_u64(r)?, None)),
    }
}

/// Parses ptxed's arguments (without the program name).
pub fn parse(args: &[String]) -> anyhow::Result<Options> {
    let mut o = Options {
        decoder: DecoderKind::Block,
        config: Config::default(),
        image: Image::new(),
        trace: MappedRange::empty(),
        dont_print_insn: false,
        quiet: false,
        print_stats: false,
        stat_insn: false,
        stat_blocks: false,
        track_blocks: false,
        print_offset: false,
        print_time: false,
        print_raw_insn: false,
        check: false,
        print_event_time: false,
        print_event_ip: false,
        resync_on_error: false,
        sideband: SidebandOptions::default(),
        preamble: Vec::new(),
    };
    // ptxed's default: no kernel unless --pevent:kernel-start says where.
    o.sideband.channel.kernel_start = hwtrace_types::Ip(u64::MAX);
    let mut cpu = CpuArg::None;
    let mut have_pt = false;
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_str();
        i += 1;
        let mut take = || {
            let v = args.get(i).cloned();
            i += 1;
            v
        };
        if o.sideband
            .parse_arg(arg, &mut take)
            .map_err(|e| anyhow::anyhow!("{e}"))?
        {
            continue;
        }
        // `take` moved `i` only when it was called.
        let value = args.get(i);
        let mut consumed = true;
        match arg {
            "--pt" => {
                let v = value.context("--pt: missing argument")?;
                if have_pt {
                    bail!("duplicate pt sources: {v}");
                }
                if let CpuArg::Model(family, model) = cpu {
                    match Errata::for_model(family, model) {
                        Ok(e) => o.config.errata = e,
                        Err(e) => o.preamble.push(format!("[0, 0: config error: {e}]")),
                    }
                }
                o.config.time.skl168 = o.config.errata.skl168;
                o.trace = load_trace(v)?;
                have_pt = true;
            }
            "--raw" => {
                let v = value.context("--raw: missing argument")?;
                let spec = parse_ptxed_raw(v).map_err(|e| anyhow::anyhow!("--raw: {e}"))?;
                o.image
                    .add_raw(None, &spec)
                    .with_context(|| format!("--raw: failed to load '{v}'"))?;
            }
            "--elf" => {
                let v = value.context("--elf: missing argument")?;
                let spec = parse_ptxed_elf(v);
                o.image
                    .add_elf(None, &spec)
                    .with_context(|| format!("--elf: failed to load '{v}'"))?;
            }
            "--cpu" => {
                if have_pt {
                    bail!("please specify cpu before the pt source file");
                }
                cpu = parse_cpu(value.context("--cpu: missing argument")?)?;
            }
            "--mtc-freq" => o.config.time.mtc_freq = narrow(arg, number(arg, value)?)?,
            "--nom-freq" => o.config.time.nom_freq = narrow(arg, number(arg, value)?)?,
            "--cpuid-0x15.eax" => o.config.time.cpuid_0x15_eax = narrow(arg, number(arg, value)?)?,
            "--cpuid-0x15.ebx" => o.config.time.cpuid_0x15_ebx = narrow(arg, number(arg, value)?)?,
            _ => {
                consumed = false;
                if let Some(rest) = arg.strip_prefix("--filter:addr") {
                    if have_pt {
                        bail!("please specify {arg} before --pt");
                    }
                    let (n, what) = rest.split_once('_').context("unknown option")?;
                    let n: usize = n
                        .parse()
                        .ok()
                        .filter(|n| *n < 4)
                        .context("unknown option")?;
                    let v = number(arg, value)?;
                    match what {
                        "cfg" => {
                            if v > 15 {
                                bail!("{arg}: value too big: {v}");
                            }
                            o.config.filter.cfg |= v << (4 * n);
                        }
                        "a" => o.config.filter.a[n] = v,
                        "b" => o.config.filter.b[n] = v,
                        _ => bail!("unknown option: {arg}"),
                    }
                    i += 1;
                    continue;
                }
            }
        }
        if consumed {
            i += 1;
            continue;
        }
        match arg {
            "--no-inst" => o.dont_print_insn = true,
            "--quiet" | "-q" => o.quiet = true,
            "--offset" => o.print_offset = true,
            "--time" => o.print_time = true,
            "--raw-insn" => o.print_raw_insn = true,
            "--att" => {}
            "--check" => o.check = true,
            "--event:time" => o.print_event_time = true,
            "--event:ip" => o.print_event_ip = true,
            "--event:tick" => o.config.tick_events = true,
            "--event:iflags" => o.config.iflags_events = true,
            "--stat" => o.print_stats = true,
            "--stat:insn" => {
                o.print_stats = true;
                o.stat_insn = true;
            }
            "--stat:blocks" => {
                o.print_stats = true;
                o.stat_blocks = true;
            }
            "--insn-decoder" => o.decoder = DecoderKind::Insn,
            "--block-decoder" => o.decoder = DecoderKind::Block,
            "--insn:keep-tcal-on-ovf" | "--block:keep-tcal-on-ovf" => {
                o.config.keep_tcal_on_ovf = true;
            }
            "--block:show-blocks" => o.track_blocks = true,
            "--block:end-on-call" => o.config.end_on_call = true,
            "--block:end-on-jump" => o.config.end_on_jump = true,
            "--resync-on-error" => o.resync_on_error = true,
            "--verbose" | "-v" => {}
            _ => bail!("unknown option: {arg}"),
        }
    }
    if !have_pt {
        bail!("no pt file");
    }
    if o.print_stats && !o.stat_insn && !o.stat_blocks {
        o.stat_insn = true;
        o.stat_blocks = o.decoder == DecoderKind::Block;
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn trace_file() -> tempfile_path::Path {
        tempfile_path::Path::new(&[0x02, 0x82])
    }

    /// A file in the temp directory that is removed on drop.
    mod tempfile_path {
        pub struct Path(pub std::path::PathBuf);
        impl Path {
            pub fn new(bytes: &[u8]) -> Self {
                use std::sync::atomic::{AtomicUsize, Ordering};
                static N: AtomicUsize = AtomicUsize::new(0);
                let p = std::env::temp_dir().join(format!(
                    "hwtrace-ptxed-opt-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::write(&p, bytes).expect("temp file");
                Self(p)
            }
            pub fn arg(&self) -> String {
                self.0.display().to_string()
            }
        }
        impl Drop for Path {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
    }

    #[test]
    fn cpu_forms() {
        assert!(matches!(parse_cpu("none"), Ok(CpuArg::None)));
        assert!(matches!(parse_cpu("6/142"), Ok(CpuArg::Model(6, 142))));
        assert!(matches!(
            parse_cpu("0x6/0x8e/3"),
            Ok(CpuArg::Model(6, 0x8e))
        ));
        assert!(parse_cpu("6").is_err());
        assert!(parse_cpu("6/300").is_err());
    }

    #[test]
    fn trace_ranges() {
        assert_eq!(parse_range("0x10"), Some((0x10, None)));
        assert_eq!(parse_range("0x10-0x20"), Some((0x10, Some(0x20))));
        assert_eq!(parse_range("x"), None);
    }

    #[test]
    fn errata_and_unknown_cpu() {
        let pt = trace_file();
        let o = parse(&args(&["--cpu", "6/142", "--pt", &pt.arg()])).unwrap();
        assert!(o.config.errata.skd010 && o.config.time.skl168);
        assert!(o.preamble.is_empty());
        let o = parse(&args(&["--cpu", "0/0", "--pt", &pt.arg()])).unwrap();
        assert_eq!(o.preamble, ["[0, 0: config error: unknown cpu]"]);
        assert!(parse(&args(&["--pt", &pt.arg(), "--cpu", "6/142"])).is_err());
    }

    #[test]
    fn filters_and_flags() {
        let pt = trace_file();
        let o = parse(&args(&[
            "--filter:addr1_cfg",
            "1",
            "--filter:addr1_a",
            "0x1000",
            "--filter:addr1_b",
            "0x10ff",
            "--insn-decoder",
            "--stat",
            "--event:tick",
            "--resync-on-error",
            "--pt",
            &pt.arg(),
        ]))
        .unwrap();
        assert_eq!(o.config.filter.cfg, 0x10);
        assert_eq!(
            (o.config.filter.a[1], o.config.filter.b[1]),
            (0x1000, 0x10ff)
        );
        assert!(o.config.filter.contains(0x1080));
        assert_eq!(o.decoder, DecoderKind::Insn);
        // --stat alone selects the instruction count (and blocks only for
        // the block decoder).
        assert!(o.print_stats && o.stat_insn && !o.stat_blocks);
        assert!(o.config.tick_events && o.resync_on_error);
        assert!(parse(&args(&["--filter:addr0_cfg", "16", "--pt", &pt.arg()])).is_err());
    }

    #[test]
    fn errors() {
        assert!(parse(&args(&[])).is_err(), "no pt file");
        assert!(parse(&args(&["--bogus"])).is_err());
        let pt = trace_file();
        assert!(parse(&args(&["--pt", &pt.arg(), "--pt", &pt.arg()])).is_err());
        assert!(parse(&args(&["--mtc-freq", "300", "--pt", &pt.arg()])).is_err());
        assert!(
            parse(&args(&[
                "--raw",
                "nonexistent.bin:0x1000",
                "--pt",
                &pt.arg()
            ]))
            .is_err()
        );
    }
}
