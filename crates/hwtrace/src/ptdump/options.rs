//! libipt ptdump's command line, parsed by hand so that existing scripts
//! (option order, C-style numbers, `file:from-to` ranges) keep working.
//!
//! Options are taken in order up to the first argument that does not start
//! with `-`: that is the trace file, and it must be the last argument.
//! `--pevent*` files take the perf_event settings given *before* them.

use std::fmt;
use std::path::PathBuf;

use hwtrace_perf::pevent::{OptionError, PrintFlags, SidebandOptions};

use super::cpu::{BadCpu, Cpu};

/// Which processor to decode for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuChoice {
    /// The architecture as specified, no errata workarounds (the default).
    #[default]
    None,
    /// The processor this runs on.
    Auto,
    /// A given family/model.
    Model(Cpu),
}

/// A file argument with an optional `:from[-to]` byte range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRange {
    /// The file.
    pub path: PathBuf,
    /// The first byte to use.
    pub from: u64,
    /// One past the last byte to use; `None` for the end of the file.
    pub to: Option<u64>,
}

/// Everything the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub show_offset: bool,
    pub show_raw: bool,
    pub show_last_ip: bool,
    pub show_exec_mode: bool,
    /// Time is tracked (for `--time`, `--tcal` or sideband).
    pub track_time: bool,
    pub show_time: bool,
    pub show_tcal: bool,
    pub time_delta: bool,
    pub keep_tcal_on_ovf: bool,
    pub quiet: bool,
    pub no_pad: bool,
    pub no_sync: bool,
    pub no_tcal: bool,
    pub no_wall_clock: bool,
    pub no_timing: bool,
    pub no_cyc: bool,
    pub cpu: CpuChoice,
    pub mtc_freq: u8,
    pub nom_freq: u8,
    pub cpuid_0x15_eax: u32,
    pub cpuid_0x15_ebx: u32,
    /// `--sb:*` and `--pevent:*`, parsed by `hwtrace-perf`.
    pub sideband: SidebandOptions,
    /// The trace file.
    pub trace: FileRange,
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invocation {
    /// Dump a trace.
    Dump(Box<Options>),
    /// `--help`/`-h`.
    Help,
    /// `--version`.
    Version,
}

/// A command line ptdump would reject.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ArgError {
    /// An option that needs a value had none.
    MissingArgument(String),
    /// An option's value is not a number.
    BadArgument { option: String, value: String },
    /// An option's value does not fit the field.
    ValueTooBig { option: String, value: String },
    /// An option ptdump does not know.
    UnknownOption(String),
    /// `--time` and `--tcal` together.
    TimeAndTcal,
    /// A bad `--cpu` value.
    BadCpu(BadCpu),
    /// A bad `--sb:*`/`--pevent:*` value.
    Sideband(OptionError),
    /// A bad `:from-to` range.
    BadRange(String),
    /// No trace file.
    NoFile,
    /// Arguments after the trace file.
    TrailingArguments,
}

impl fmt::Display for ArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArgError::MissingArgument(o) => write!(f, "{o}: missing argument"),
            ArgError::BadArgument { option, value } => write!(f, "{option}: bad argument: {value}"),
            ArgError::ValueTooBig { option, value } => {
                write!(f, "{option}: value too big: {value}")
            }
            ArgError::UnknownOption(o) => write!(f, "unknown option: {o}"),
            ArgError::TimeAndTcal => f.write_str("specify either --time or --tcal"),
            ArgError::BadCpu(e) => e.fmt(f),
            ArgError::Sideband(e) => e.fmt(f),
            ArgError::BadRange(a) => write!(f, "bad file range: {a}"),
            ArgError::NoFile => f.write_str("no processor trace file specified"),
            ArgError::TrailingArguments => {
                f.write_str("the trace file must be the last argument: [<options>] <ptfile>")
            }
        }
    }
}

impl std::error::Error for ArgError {}

/// Parses a number the way C's `strtoull(s, &end, 0)` does when the whole
/// string must be consumed: `0x` hex, leading `0` octal, else decimal.
pub fn parse_c_number(text: &str) -> Option<u64> {
    let text = text.strip_prefix('+').unwrap_or(text);
    if let Some(hex) = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        return u64::from_str_radix(hex, 16).ok();
    }
    if text.len() > 1
        && let Some(oct) = text.strip_prefix('0')
    {
        return u64::from_str_radix(oct, 8).ok();
    }
    text.parse().ok()
}

/// Splits `file[:from[-to]]`. A suffix that does not parse as a range is
/// taken as part of the file name (e.g. a drive letter).
pub fn parse_file_range(arg: &str) -> Result<FileRange, ArgError> {
    let whole = FileRange {
        path: PathBuf::from(arg),
        from: 0,
        to: None,
    };
    let Some((path, range)) = arg.rsplit_once(':') else {
        return Ok(whole);
    };
    let (from, to) = match range.split_once('-') {
        None => (parse_c_number(range), None),
        Some((f, t)) => (parse_c_number(f), Some(parse_c_number(t))),
    };
    match (from, to) {
        (Some(from), None) => Ok(FileRange {
            path: PathBuf::from(path),
            from,
            to: None,
        }),
        (Some(from), Some(Some(to))) if to > from => Ok(FileRange {
            path: PathBuf::from(path),
            from,
            to: Some(to),
        }),
        (Some(_), Some(Some(_))) => Err(ArgError::BadRange(arg.to_string())),
        _ => Ok(whole),
    }
}

/// Walks the arguments.
struct Args<'a> {
    args: &'a [String],
    next: usize,
}

impl<'a> Args<'a> {
    /// The value of `option`: the next argument, which must not look like an
    /// option itself.
    fn value(&mut self, option: &str) -> Result<&'a str, ArgError> {
        let value = self.args.get(self.next).map(String::as_str);
        self.next += 1;
        match value {
            Some(v) if !v.is_empty() && !v.starts_with("--") => Ok(v),
            _ => Err(ArgError::MissingArgument(option.to_string())),
        }
    }

    /// Like [`Args::value`], but any string is accepted (file names).
    fn raw_value(&mut self, option: &str) -> Result<&'a str, ArgError> {
        let value = self.args.get(self.next).map(String::as_str);
        self.next += 1;
        value.ok_or_else(|| ArgError::MissingArgument(option.to_string()))
    }

    fn number<T: TryFrom<u64>>(&mut self, option: &str) -> Result<T, ArgError> {
        let value = self.value(option)?;
        let n = parse_c_number(value).ok_or_else(|| ArgError::BadArgument {
            option: option.to_string(),
            value: value.to_string(),
        })?;
        T::try_from(n).map_err(|_| ArgError::ValueTooBig {
            option: option.to_string(),
            value: value.to_string(),
        })
    }
}

/// Parses ptdump's arguments (without the program name).
pub fn parse(args: &[String]) -> Result<Invocation, ArgError> {
    let mut o = Options {
        show_offset: true,
        show_raw: false,
        show_last_ip: false,
        show_exec_mode: false,
        track_time: false,
        show_time: false,
        show_tcal: false,
        time_delta: false,
        keep_tcal_on_ovf: false,
        quiet: false,
        no_pad: false,
        no_sync: false,
        no_tcal: false,
        no_wall_clock: false,
        no_timing: false,
        no_cyc: false,
        cpu: CpuChoice::None,
        mtc_freq: 0,
        nom_freq: 0,
        cpuid_0x15_eax: 0,
        cpuid_0x15_ebx: 0,
        sideband: SidebandOptions::default(),
        trace: FileRange {
            path: PathBuf::new(),
            from: 0,
            to: None,
        },
    };
    let mut trace = None;
    let mut it = Args { args, next: 0 };

    while let Some(arg) = args.get(it.next) {
        it.next += 1;
        // The trace file (`-`: standard input).
        if !arg.starts_with('-') || arg == "-" {
            if it.next < args.len() {
                return Err(ArgError::TrailingArguments);
            }
            trace = Some(parse_file_range(arg)?);
            break;
        }
        let files = o.sideband.files.len();
        let mut value = || {
            let v = args.get(it.next).cloned();
            it.next += 1;
            v
        };
        if o.sideband
            .parse_arg(arg, &mut value)
            .map_err(ArgError::Sideband)?
        {
            // Sideband is printed by time, so time must be tracked.
            if o.sideband.files.len() > files {
                o.track_time = true;
            }
            continue;
        }
        match arg.as_str() {
            "-h" | "--help" => return Ok(Invocation::Help),
            "--version" => return Ok(Invocation::Version),
            "--no-sync" => o.no_sync = true,
            "--quiet" => {
                o.quiet = true;
                o.sideband.output.records = PrintFlags::default();
            }
            "--no-pad" => o.no_pad = true,
            "--no-timing" => o.no_timing = true,
            "--no-cyc" => o.no_cyc = true,
            "--no-offset" => o.show_offset = false,
            "--raw" => o.show_raw = true,
            "--lastip" => o.show_last_ip = true,
            "--exec-mode" => o.show_exec_mode = true,
            "--time" | "--tcal" => {
                let time = arg == "--time";
                if (time && o.show_tcal) || (!time && o.show_time) {
                    return Err(ArgError::TimeAndTcal);
                }
                o.track_time = true;
                if time {
                    o.show_time = true;
                } else {
                    o.show_tcal = true;
                }
            }
            "--time-delta" => o.time_delta = true,
            "--no-tcal" => o.no_tcal = true,
            "--no-wall-clock" => o.no_wall_clock = true,
            "--keep-tcal-on-ovf" => o.keep_tcal_on_ovf = true,
            "--cpu" => {
                let value = it.raw_value(arg)?;
                o.cpu = match value {
                    "none" => CpuChoice::None,
                    "auto" => CpuChoice::Auto,
                    _ => CpuChoice::Model(Cpu::parse(value).map_err(ArgError::BadCpu)?),
                };
            }
            "--mtc-freq" => o.mtc_freq = it.number(arg)?,
            "--nom-freq" => o.nom_freq = it.number(arg)?,
            "--cpuid-0x15.eax" => o.cpuid_0x15_eax = it.number(arg)?,
            "--cpuid-0x15.ebx" => o.cpuid_0x15_ebx = it.number(arg)?,
            _ => return Err(ArgError::UnknownOption(arg.clone())),
        }
    }

    o.trace = trace.ok_or(ArgError::NoFile)?;
    Ok(Invocation::Dump(Box::new(o)))
}

/// ptdump's usage text.
pub const HELP: &str = "\
usage: hwtrace ptdump [<options>] <ptfile>[:<from>[-<to>]]

options:
  --help|-h                 this text.
  --version                 display version information and exit.
  --no-sync                 don't try to sync to the first PSB, assume a valid
                            sync point at the beginning of the trace.
  --quiet                   don't print anything but errors.
  --no-pad                  don't show PAD packets.
  --no-timing               don't show timing packets.
  --no-cyc                  don't show CYC packets and ignore them when tracking time.
  --no-offset               don't show the offset as the first column.
  --raw                     show raw packet bytes.
  --lastip                  show last IP updates on packets with IP payloads.
  --exec-mode               show the current execution mode on mode.exec packets.
  --time                    show the estimated TSC on timing packets.
  --tcal                    show time calibration information.
  --time-delta              show timing information as delta.
  --no-tcal                 skip timing calibration.
                            this will result in errors when CYC packets are encountered.
  --no-wall-clock           suppress the no-time error and print relative time.
  --keep-tcal-on-ovf        preserve timing calibration on overflow.
  --sb:compact | --sb       show sideband records in compact format.
  --sb:verbose              show sideband records in verbose format.
  --sb:filename             show the filename on sideband records.
  --sb:offset               show the offset on sideband records.
  --sb:time                 show the time on sideband records.
  --sb:warn | --sb:no-warn  show (don't show) sideband warnings.
  --pevent[:primary/:secondary] <file>[:<from>[-<to>]]
                              load a perf_event sideband stream from <file>.
  --pevent:sample-type <val>  set perf_event_attr.sample_type (default: 0).
  --pevent:time-zero <val>    set perf_event_mmap_page.time_zero (default: 0).
  --pevent:time-shift <val>   set perf_event_mmap_page.time_shift (default: 0).
  --pevent:time-mult <val>    set perf_event_mmap_page.time_mult (default: 1).
  --pevent:tsc-offset <val>   show perf events <val> ticks earlier.
  --pevent:kernel-start <val> the start address of the kernel.
  --pevent:sysroot|kcore|vdso-x64|vdso-x32|vdso-ia32 <path>  ignored.
  --cpu none|auto|f/m[/s]   decode for no particular cpu (default), this cpu,
                            or family/model[/stepping] (enables its errata).
  --mtc-freq <n>            set the MTC frequency (IA32_RTIT_CTL[17:14]) to <n>.
  --nom-freq <n>            set the nominal frequency (MSR_PLATFORM_INFO[15:8]) to <n>.
  --cpuid-0x15.eax <n>      set the value of cpuid[0x15].eax.
  --cpuid-0x15.ebx <n>      set the value of cpuid[0x15].ebx.
  <ptfile>[:<from>[-<to>]]  load the processor trace data from <ptfile>.
";

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn dump(list: &[&str]) -> Options {
        match parse(&args(list)) {
            Ok(Invocation::Dump(o)) => *o,
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn c_numbers() {
        assert_eq!(parse_c_number("10"), Some(10));
        assert_eq!(parse_c_number("0x1f"), Some(31));
        assert_eq!(parse_c_number("010"), Some(8));
        assert_eq!(parse_c_number("0"), Some(0));
        assert_eq!(parse_c_number("1x"), None);
        assert_eq!(parse_c_number(""), None);
    }

    #[test]
    fn file_ranges() {
        let r = parse_file_range("a.pt:0x10-0x20").unwrap();
        assert_eq!(
            (r.path.to_str(), r.from, r.to),
            (Some("a.pt"), 16, Some(32))
        );
        let r = parse_file_range("a.pt:5").unwrap();
        assert_eq!((r.from, r.to), (5, None));
        let r = parse_file_range("c:a.pt").unwrap();
        assert_eq!(r.path.to_str(), Some("c:a.pt"));
        assert!(parse_file_range("a.pt:5-5").is_err());
    }

    #[test]
    fn defaults_show_offsets_only() {
        let o = dump(&["t.pt"]);
        assert!(o.show_offset && !o.track_time && o.cpu == CpuChoice::None);
        assert_eq!(o.trace.path.to_str(), Some("t.pt"));
    }

    #[test]
    fn timing_options() {
        let o = dump(&[
            "--time",
            "--time-delta",
            "--mtc-freq",
            "9",
            "--cpuid-0x15.eax",
            "1",
            "--cpuid-0x15.ebx",
            "0x4",
            "--cpu",
            "6/142",
            "t.pt",
        ]);
        assert!(o.track_time && o.show_time && o.time_delta);
        assert_eq!((o.mtc_freq, o.cpuid_0x15_eax, o.cpuid_0x15_ebx), (9, 1, 4));
        assert!(matches!(o.cpu, CpuChoice::Model(c) if c.model == 142));
    }

    #[test]
    fn pevent_files_turn_on_time_tracking() {
        let o = dump(&[
            "--sb:compact",
            "--pevent:sample-type",
            "0x4",
            "--pevent:primary",
            "a.sb",
            "--quiet",
            "t.pt",
        ]);
        assert!(o.track_time && o.quiet);
        assert_eq!(o.sideband.files.len(), 1);
        assert_eq!(o.sideband.files[0].1.sample_type, 4);
        assert!(!o.sideband.output.records.compact);
        assert!(matches!(
            parse(&args(&["--pevent:time-shift", "0x10000", "t"])),
            Err(ArgError::Sideband(_))
        ));
    }

    #[test]
    fn errors() {
        assert_eq!(
            parse(&args(&["--time", "--tcal", "t"])),
            Err(ArgError::TimeAndTcal)
        );
        assert_eq!(parse(&args(&[])), Err(ArgError::NoFile));
        assert_eq!(parse(&args(&["t", "u"])), Err(ArgError::TrailingArguments));
        assert!(matches!(
            parse(&args(&["--bogus", "t"])),
            Err(ArgError::UnknownOption(_))
        ));
        assert!(matches!(
            parse(&args(&["--mtc-freq", "256", "t"])),
            Err(ArgError::ValueTooBig { .. })
        ));
        assert!(matches!(
            parse(&args(&["--mtc-freq", "--raw", "t"])),
            Err(ArgError::MissingArgument(_))
        ));
        assert!(matches!(
            parse(&args(&["--cpu", "6", "t"])),
            Err(ArgError::BadCpu(_))
        ));
        assert_eq!(parse(&args(&["-h"])), Ok(Invocation::Help));
    }
}
