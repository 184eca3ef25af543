//! PMU discovery from sysfs: `/sys/bus/event_source/devices/<pmu>/`
//! `type` (the `perf_event_attr.type` number), `format/*` (which config bits
//! each named term sets, e.g. `config:0-5,7`), and `caps/*` (what the
//! hardware can do). Everything takes a root directory so tests run against
//! fake trees.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use super::error::CaptureError;

/// Which `perf_event_attr` word a format term lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ConfigWord {
    /// `config`.
    Config,
    /// `config1`.
    Config1,
    /// `config2`.
    Config2,
    /// `config3`.
    Config3,
}

/// One `format/<term>` file: the bit ranges (inclusive, low bit first) of
/// one config word that the term's value is scattered into.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Format {
    /// The config word.
    pub word: ConfigWord,
    /// Bit ranges `(lo, hi)`, inclusive.
    pub ranges: Vec<(u32, u32)>,
}

impl Format {
    /// Parses `config:0-5,7` / `config1:10` / `config2:0-63`.
    pub fn parse(text: &str) -> Result<Self, &'static str> {
        let text = text.trim();
        let (word, bits) = text.split_once(':').ok_or("no `:`")?;
        let word = match word {
            "config" => ConfigWord::Config,
            "config1" => ConfigWord::Config1,
            "config2" => ConfigWord::Config2,
            "config3" => ConfigWord::Config3,
            _ => return Err("unknown config word (want config, config1, config2 or config3)"),
        };
        let mut ranges = Vec::new();
        for part in bits.split(',') {
            let (lo, hi) = match part.split_once('-') {
                Some((lo, hi)) => (lo, hi),
                None => (part, part),
            };
            let lo: u32 = lo
                .trim()
                .parse()
                .map_err(|_| "bit number is not a number")?;
            let hi: u32 = hi
                .trim()
                .parse()
                .map_err(|_| "bit number is not a number")?;
            if lo > hi || hi > 63 {
                return Err("bit range out of order or past bit 63");
            }
            ranges.push((lo, hi));
        }
        Ok(Self { word, ranges })
    }

    /// The number of value bits.
    pub fn width(&self) -> u32 {
        self.ranges.iter().map(|(lo, hi)| hi - lo + 1).sum()
    }

    /// Scatters `value` into the word's bits; `None` if it does not fit.
    pub fn encode(&self, value: u64) -> Option<u64> {
        if self.width() < 64 && value >> self.width() != 0 {
            return None;
        }
        let mut out = 0u64;
        let mut v = value;
        for &(lo, hi) in &self.ranges {
            let n = hi - lo + 1;
            let mask = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
            out |= (v & mask) << lo;
            v = if n == 64 { 0 } else { v >> n };
        }
        Some(out)
    }

    /// Gathers the value [`encode`](Self::encode) scattered into `word`.
    pub fn decode(&self, word: u64) -> u64 {
        let (mut out, mut at) = (0u64, 0u32);
        for &(lo, hi) in &self.ranges {
            let n = hi - lo + 1;
            let mask = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
            out |= ((word >> lo) & mask).checked_shl(at).unwrap_or(0);
            at += n;
        }
        out
    }
}

/// The four config words of an attribute.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConfigValues {
    /// `config`.
    pub config: u64,
    /// `config1`.
    pub config1: u64,
    /// `config2`.
    pub config2: u64,
    /// `config3`.
    pub config3: u64,
}

impl ConfigValues {
    fn word(&mut self, w: ConfigWord) -> &mut u64 {
        match w {
            ConfigWord::Config => &mut self.config,
            ConfigWord::Config1 => &mut self.config1,
            ConfigWord::Config2 => &mut self.config2,
            ConfigWord::Config3 => &mut self.config3,
        }
    }
}

/// A PMU as sysfs describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pmu {
    /// Its name (`intel_pt`).
    pub name: String,
    /// Its directory.
    pub dir: PathBuf,
    /// `type`.
    pub kind: u32,
    /// `format/*`.
    pub formats: BTreeMap<String, Format>,
    /// `caps/*`, raw text (trimmed). Most are decimal 0/1; `mtc_periods`,
    /// `cycle_thresholds` and `psb_periods` are hex bitmaps.
    pub caps: BTreeMap<String, String>,
}

/// The `format/*` files of Linux's `intel_pt` PMU (since 4.x), term and
/// bits: what a machine's sysfs says, for a PMU that is not there (the
/// portable capture, tests).
pub const LINUX_INTEL_PT_FORMATS: &[(&str, &str)] = &[
    ("pt", "config:0"),
    ("cyc", "config:1"),
    ("pwr_evt", "config:4"),
    ("fup_on_ptw", "config:5"),
    ("mtc", "config:9"),
    ("tsc", "config:10"),
    ("noretcomp", "config:11"),
    ("ptw", "config:12"),
    ("branch", "config:13"),
    ("mtc_period", "config:14-17"),
    ("cyc_thresh", "config:19-22"),
    ("psb_period", "config:24-27"),
];

impl Pmu {
    /// Linux's `intel_pt` PMU as a machine without one would have it:
    /// [`LINUX_INTEL_PT_FORMATS`], type `kind`, no directory, no caps.
    pub fn linux_intel_pt(kind: u32) -> Self {
        let formats = LINUX_INTEL_PT_FORMATS
            .iter()
            .map(|&(name, text)| {
                let format = Format::parse(text).expect("Linux's intel_pt formats parse");
                (name.to_owned(), format)
            })
            .collect();
        Self {
            name: "intel_pt".into(),
            dir: PathBuf::new(),
            kind,
            formats,
            caps: BTreeMap::new(),
        }
    }
}

/// The sysfs directory of PMU `name` under `sysfs_root` (normally `/sys`).
pub fn pmu_dir(sysfs_root: &Path, name: &str) -> PathBuf {
    sysfs_root.join("bus/event_source/devices").join(name)
}

fn read(path: &Path) -> Result<String, CaptureError> {
    fs::read_to_string(path).map_err(|source| CaptureError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn read_dir_files(dir: &Path) -> Result<Vec<(String, PathBuf)>, CaptureError> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        if let Some(name) = e.file_name().to_str() {
            out.push((name.to_string(), e.path()));
        }
    }
    out.sort();
    Ok(out)
}

impl Pmu {
    /// Reads PMU `name`; `Ok(None)` when its directory does not exist.
    pub fn load(sysfs_root: &Path, name: &str) -> Result<Option<Self>, CaptureError> {
        let dir = pmu_dir(sysfs_root, name);
        if !dir.is_dir() {
            return Ok(None);
        }
        let type_path = dir.join("type");
        let text = read(&type_path)?;
        let kind = text.trim().parse().map_err(|_| CaptureError::BadFormat {
            path: type_path.clone(),
            text: text.trim().to_string(),
            reason: "not a PMU type number",
        })?;
        let mut formats = BTreeMap::new();
        for (term, path) in read_dir_files(&dir.join("format"))? {
            let text = read(&path)?;
            let f = Format::parse(&text).map_err(|reason| CaptureError::BadFormat {
                path: path.clone(),
                text: text.trim().to_string(),
                reason,
            })?;
            formats.insert(term, f);
        }
        let mut caps = BTreeMap::new();
        for (cap, path) in read_dir_files(&dir.join("caps"))? {
            caps.insert(cap, read(&path)?.trim().to_string());
        }
        Ok(Some(Self {
            name: name.to_string(),
            dir,
            kind,
            formats,
            caps,
        }))
    }

    /// A capability as a number (decimal, or hex for the bitmap caps).
    pub fn cap(&self, name: &str) -> Option<u64> {
        let text = self.caps.get(name)?;
        let hex = matches!(name, "mtc_periods" | "cycle_thresholds" | "psb_periods");
        if hex {
            u64::from_str_radix(text.trim_start_matches("0x"), 16).ok()
        } else {
            text.parse().ok()
        }
    }

    /// Builds config words from terms: `tsc,mtc,mtc_period=3,noretcomp`
    /// (a term without a value means 1; values may be decimal or 0x-hex).
    pub fn build_config(&self, terms: &str) -> Result<ConfigValues, CaptureError> {
        let mut out = ConfigValues::default();
        for term in terms.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (name, value) = match term.split_once('=') {
                Some((n, v)) => (
                    n.trim(),
                    parse_u64(v.trim()).ok_or_else(|| {
                        CaptureError::BadOption(format!(
                            "{}: `{term}`: value is not a number",
                            self.name
                        ))
                    })?,
                ),
                None => (term, 1),
            };
            let f = self
                .formats
                .get(name)
                .ok_or_else(|| CaptureError::UnknownTerm {
                    pmu: self.name.clone(),
                    term: name.to_string(),
                    known: self.formats.keys().cloned().collect::<Vec<_>>().join(","),
                })?;
            let bits = f.encode(value).ok_or_else(|| CaptureError::TermValue {
                pmu: self.name.clone(),
                term: name.to_string(),
                value,
                bits: f.width(),
            })?;
            *out.word(f.word) |= bits;
        }
        Ok(out)
    }

    /// The value of term `name` in `config` (0 when the PMU has no such
    /// term): what [`build_config`](Self::build_config) put there.
    pub fn term_value(&self, config: &ConfigValues, name: &str) -> u64 {
        self.formats.get(name).map_or(0, |f| {
            f.decode(match f.word {
                ConfigWord::Config => config.config,
                ConfigWord::Config1 => config.config1,
                ConfigWord::Config2 => config.config2,
                ConfigWord::Config3 => config.config3,
            })
        })
    }

    /// The config bits of a single-bit term (for AUXTRACE_INFO's `*_bit`
    /// words), 0 when the PMU has no such term.
    pub fn term_bits(&self, name: &str) -> u64 {
        self.formats
            .get(name)
            .and_then(|f| f.encode((1u64 << f.width().min(63)) - 1))
            .unwrap_or(0)
    }
}

/// Parses decimal or `0x` hex.
pub fn parse_u64(s: &str) -> Option<u64> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// This CPU as `/proc/cpuinfo` names it: "vendor, model name".
pub fn cpu_description(procfs_root: &Path) -> String {
    let text = fs::read_to_string(procfs_root.join("cpuinfo")).unwrap_or_default();
    let field = |key: &str| {
        text.lines()
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == key))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    };
    match (field("vendor_id"), field("model name")) {
        (Some(v), Some(m)) => format!("{v}, {m}"),
        (Some(v), None) => v,
        (None, Some(m)) => m,
        (None, None) => "unknown CPU".to_string(),
    }
}
