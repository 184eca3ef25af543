//! What the fast decoder's tests decode: the libipt corpus's cases with
//! their images, and the real hardware traces over their page caches.

use hwtrace_flow::{Config, Errata};
use hwtrace_types::{AddressSpace, Ip, MemoryError, ReadMemory};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// `../shared/corpus`.
pub fn shared() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus")
}

/// A case's image files, each at its load address.
#[derive(Debug)]
pub struct Files(pub Vec<(u64, Vec<u8>)>);

impl ReadMemory for &Files {
    fn read_memory(&self, _: AddressSpace, addr: Ip, buf: &mut [u8]) -> Result<usize, MemoryError> {
        for (base, bytes) in &self.0 {
            let Some(off) = addr.0.checked_sub(*base) else {
                continue;
            };
            let Some(rest) = usize::try_from(off).ok().and_then(|o| bytes.get(o..)) else {
                continue;
            };
            if rest.is_empty() {
                continue;
            }
            let n = rest.len().min(buf.len());
            buf[..n].copy_from_slice(&rest[..n]);
            return Ok(n);
        }
        Err(MemoryError::Unmapped { addr })
    }
}

/// A page cache: 4 KiB pages at the addresses of `pages.addr`.
#[derive(Debug)]
pub struct Pages {
    at: HashMap<u64, usize>,
    data: Vec<u8>,
}

impl ReadMemory for &Pages {
    fn read_memory(&self, _: AddressSpace, addr: Ip, buf: &mut [u8]) -> Result<usize, MemoryError> {
        let page = addr.0 & !0xfff;
        let off = (addr.0 & 0xfff) as usize;
        let Some(&start) = self.at.get(&page) else {
            return Err(MemoryError::Unmapped { addr });
        };
        let bytes = &self.data[start + off..start + 4096];
        let n = bytes.len().min(buf.len());
        buf[..n].copy_from_slice(&bytes[..n]);
        Ok(n)
    }
}

/// The real trace `name` (`../shared/corpus/real/NAME`) and its pages.
pub fn real(name: &str) -> (Vec<u8>, Pages) {
    let dir = shared().join("real").join(name);
    let trace = std::fs::read(dir.join("trace.pt")).expect("trace.pt");
    let addrs = std::fs::read(dir.join("pages.addr")).expect("pages.addr");
    let data = std::fs::read(dir.join("pages.dump")).expect("pages.dump");
    let mut at = HashMap::new();
    for (i, chunk) in addrs.chunks_exact(8).enumerate() {
        let mut le = [0u8; 8];
        le.copy_from_slice(chunk);
        at.insert(u64::from_le_bytes(le), i * 4096);
    }
    assert!(data.len() >= at.len() * 4096, "{name}: short pages.dump");
    (trace, Pages { at, data })
}

/// The configuration of a case's `cpu` (family/model): its errata.
fn cpu_config(cpu: Option<&str>) -> Config {
    let Some(cpu) = cpu else {
        return Config::default();
    };
    let mut parts = cpu.split('/');
    let family = parts.next().and_then(|f| f.parse::<u16>().ok());
    let model = parts.next().and_then(|m| m.parse::<u8>().ok());
    match (family, model) {
        (Some(f), Some(m)) => Config {
            errata: Errata::for_model(f, m).unwrap_or_default(),
            ..Config::default()
        },
        _ => Config::default(),
    }
}

fn parse_addr(text: &str) -> u64 {
    let t = text.trim();
    match t.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).expect("hex load address"),
        None => t.parse().expect("load address"),
    }
}

/// One case of the libipt corpus.
#[derive(Debug)]
pub struct Case {
    pub name: String,
    pub trace: Vec<u8>,
    pub files: Files,
    /// The configuration for its CPU (errata).
    pub config: Config,
}

/// Every case of `../shared/corpus/libipt` with a trace, in name order.
pub fn corpus_cases() -> Vec<Case> {
    let dir = shared().join("libipt");
    let mut dirs: Vec<_> = std::fs::read_dir(&dir)
        .expect("../shared/corpus/libipt")
        .flatten()
        .map(|d| d.path())
        .collect();
    dirs.sort();
    let mut cases = Vec::new();
    for path in dirs {
        let Ok(text) = std::fs::read_to_string(path.join("case.json")) else {
            continue;
        };
        let case: serde_json::Value = serde_json::from_str(&text).expect("case.json");
        let Some(trace) = case["trace"].as_str() else {
            continue;
        };
        let Ok(trace) = std::fs::read(path.join(trace)) else {
            continue;
        };
        let mut files = Vec::new();
        for image in case["images"].as_array().into_iter().flatten() {
            let (Some(file), Some(at)) = (image["file"].as_str(), image["load_address"].as_str())
            else {
                continue;
            };
            if let Ok(bytes) = std::fs::read(path.join(file)) {
                files.push((parse_addr(at), bytes));
            }
        }
        cases.push(Case {
            name: path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned(),
            trace,
            files: Files(files),
            config: cpu_config(case["cpu"].as_str()),
        });
    }
    cases
}
