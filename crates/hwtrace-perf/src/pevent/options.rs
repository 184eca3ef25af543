//! The `--sb:*` and `--pevent:*` command-line options of libipt's ptdump and
//! ptxed, for front-ends that accept their command lines.
//!
//! As in libipt, `--pevent:*` settings apply to the files named *after* them:
//! each `--pevent:primary FILE` takes a copy of the settings in effect.

use thiserror::Error;

use super::session::{ChannelConfig, LoadError, OutputOptions, Session, parse_c_u64};
use hwtrace_types::Ip;

/// A sideband option was given a bad value.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("{option}: {kind}")]
pub struct OptionError {
    /// The option.
    pub option: String,
    /// What was wrong.
    pub kind: OptionErrorKind,
}

/// What was wrong with an option's value.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum OptionErrorKind {
    /// No value followed (or the next argument is an option).
    #[error("missing argument")]
    MissingArgument,
    /// The value is not a number.
    #[error("bad argument: {0}")]
    BadArgument(String),
    /// The value does not fit the field.
    #[error("value too big: {0}")]
    ValueTooBig(String),
}

/// Sideband options collected from a command line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SidebandOptions {
    /// `--sb:*` output options.
    pub output: OutputOptions,
    /// The `--pevent:*` settings in effect for the next file.
    pub channel: ChannelConfig,
    /// `--pevent:kcore FILE` (the kernel image; loading it is the image
    /// layer's job).
    pub kcore: Option<String>,
    /// Files in command-line order, each with the settings in effect when it
    /// was named.
    pub files: Vec<(String, ChannelConfig)>,
}

impl SidebandOptions {
    /// Handles `arg` if it is a sideband option, taking its value (if it has
    /// one) from `value`. Returns `Ok(false)` for other arguments.
    pub fn parse_arg(
        &mut self,
        arg: &str,
        value: &mut dyn FnMut() -> Option<String>,
    ) -> Result<bool, OptionError> {
        let records = &mut self.output.records;
        match arg {
            "--sb:compact" | "--sb" => {
                records.verbose = false;
                records.compact = true;
            }
            "--sb:verbose" => {
                records.compact = false;
                records.verbose = true;
            }
            "--sb:filename" => records.filename = true,
            "--sb:offset" => records.offset = true,
            "--sb:time" => records.time = true,
            "--sb:warn" => self.output.warnings = true,
            "--sb:no-warn" => self.output.warnings = false,
            "--sb:switch" => self.output.switches = true,
            "--pevent" | "--pevent:primary" | "--pevent:secondary" => {
                let file = string_arg(arg, value)?;
                let mut config = self.channel.clone();
                config.primary = arg != "--pevent:secondary";
                self.files.push((file, config));
            }
            "--pevent:sample-type" => self.channel.sample_type = number(arg, value, u64::MAX)?,
            "--pevent:time-zero" => self.channel.time.zero = number(arg, value, u64::MAX)?,
            "--pevent:time-shift" => {
                self.channel.time.shift = narrow(arg, number(arg, value, u16::MAX.into())?)?;
            }
            "--pevent:time-mult" => {
                self.channel.time.mult = narrow(arg, number(arg, value, u32::MAX.into())?)?;
            }
            "--pevent:tsc-offset" => self.channel.tsc_offset = number(arg, value, u64::MAX)?,
            "--pevent:kernel-start" => {
                self.channel.kernel_start = Ip(number(arg, value, u64::MAX)?);
            }
            "--pevent:sysroot" => self.channel.sysroot = Some(string_arg(arg, value)?),
            "--pevent:vdso-x64" => self.channel.vdso_x64 = Some(string_arg(arg, value)?),
            "--pevent:vdso-x32" => self.channel.vdso_x32 = Some(string_arg(arg, value)?),
            "--pevent:vdso-ia32" => self.channel.vdso_ia32 = Some(string_arg(arg, value)?),
            "--pevent:kcore" => self.kcore = Some(string_arg(arg, value)?),
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// A session over the files, loaded in command-line order.
    pub fn into_session(self) -> Result<Session, LoadError> {
        let mut session = Session::new(self.output);
        for (file, config) in self.files {
            session.add_file(&file, config)?;
        }
        Ok(session)
    }
}

fn string_arg(
    option: &str,
    value: &mut dyn FnMut() -> Option<String>,
) -> Result<String, OptionError> {
    value().ok_or_else(|| OptionError {
        option: option.to_owned(),
        kind: OptionErrorKind::MissingArgument,
    })
}

/// A number the way libipt's `get_arg_uint64` and friends take it.
fn number(
    option: &str,
    value: &mut dyn FnMut() -> Option<String>,
    max: u64,
) -> Result<u64, OptionError> {
    let err = |kind| OptionError {
        option: option.to_owned(),
        kind,
    };
    let text = value()
        .filter(|v| !v.starts_with("--"))
        .ok_or(err(OptionErrorKind::MissingArgument))?;
    let n = parse_c_u64(&text).ok_or_else(|| err(OptionErrorKind::BadArgument(text.clone())))?;
    if n > max {
        return Err(err(OptionErrorKind::ValueTooBig(text)));
    }
    Ok(n)
}

fn narrow<T: TryFrom<u64>>(option: &str, n: u64) -> Result<T, OptionError> {
    T::try_from(n).map_err(|_| OptionError {
        option: option.to_owned(),
        kind: OptionErrorKind::ValueTooBig(n.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<SidebandOptions, OptionError> {
        let mut opts = SidebandOptions::default();
        let mut it = args.iter().map(|s| s.to_string());
        while let Some(arg) = it.next() {
            assert!(opts.parse_arg(&arg, &mut || it.next())?, "{arg}");
        }
        Ok(opts)
    }

    #[test]
    fn settings_apply_to_later_files() {
        let o = parse(&[
            "--pevent:sample-type",
            "0x4",
            "--pevent:secondary",
            "a.sb",
            "--pevent:time-mult",
            "3",
            "--pevent:tsc-offset",
            "-2",
            "--pevent:primary",
            "b.sb:0x10-0x20",
            "--sb:verbose",
            "--sb:offset",
            "--sb:warn",
        ])
        .unwrap();
        assert_eq!(o.files.len(), 2);
        assert_eq!(o.files[0].1.sample_type, 4);
        assert!(!o.files[0].1.primary);
        assert_eq!(o.files[0].1.time.mult, 1);
        assert_eq!(o.files[1].1.time.mult, 3);
        assert_eq!(o.files[1].1.tsc_offset, (-2i64) as u64);
        assert!(o.files[1].1.primary);
        assert_eq!(o.files[1].0, "b.sb:0x10-0x20");
        assert!(o.output.records.verbose && o.output.records.offset && o.output.warnings);
    }

    #[test]
    fn bad_values_are_reported() {
        let e = parse(&["--pevent:time-shift", "0x10000"]).unwrap_err();
        assert_eq!(e.kind, OptionErrorKind::ValueTooBig("0x10000".into()));
        let e = parse(&["--pevent:time-zero", "12z"]).unwrap_err();
        assert_eq!(e.kind, OptionErrorKind::BadArgument("12z".into()));
        let e = parse(&["--pevent:time-zero", "--sb"]).unwrap_err();
        assert_eq!(e.kind, OptionErrorKind::MissingArgument);
        let e = parse(&["--pevent:primary"]).unwrap_err();
        assert_eq!(e.to_string(), "--pevent:primary: missing argument");
    }

    #[test]
    fn other_arguments_are_left_alone() {
        let mut o = SidebandOptions::default();
        assert!(!o.parse_arg("--cpu", &mut || None).unwrap());
    }
}
