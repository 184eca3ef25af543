//! Where a qemu-user guest's files were mapped, for the MMAP2 records.
//!
//! # How the map is rebuilt
//!
//! The recording runs qemu with `-d page,strace` added
//! ([`hwtrace_sim::QemuRecorder::log_mappings`]), and the map comes from
//! what qemu itself reports, never from guessing where a loader would put
//! things:
//!
//! * The program and its ELF interpreter are mapped by qemu, not by system
//!   calls. The `-d page` header names `start_code` (the program's lowest
//!   executable `PT_LOAD` plus its load bias) and `entry` (the interpreter's
//!   entry point plus its bias, or the program's when it has no
//!   interpreter). With the two files' program headers this gives both
//!   biases exactly; each executable `PT_LOAD` becomes one mapping.
//! * Everything the guest maps itself (shared libraries by ld.so,
//!   `dlopen`) is an `mmap` with `PROT_EXEC` of a file descriptor that an
//!   `openat`/`open` returned: `-d strace` logs both, with their results,
//!   so the file name, the address, the length and the file offset are
//!   all known.
//! * Executed code outside every file mapping gets one mapping per
//!   executed page range. Inside an anonymous executable mapping the guest
//!   made itself (`mmap` or `mprotect` with `PROT_EXEC`, in the strace
//!   lines) it is generated code, `//anon`; in the vsyscall page it is
//!   `[vsyscall]`; anything else was put there by qemu, which is the
//!   vDSO (qemu 8.1 and later give x86-64 guests one): `[vdso]`. These
//!   are the kernel's names; the code is not in any file, so perf cannot
//!   decode it.
//!
//! The log's pid prefix on strace lines is the guest's pid.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};

/// `PF_X` in `p_flags`.
const PF_X: u32 = 1;
const PT_LOAD: u32 = 1;
const PT_INTERP: u32 = 3;
const PAGE: u64 = 4096;
/// The legacy vsyscall page's fixed address.
const VSYSCALL: u64 = 0xffff_ffff_ff60_0000;

/// One executable mapping of the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// First byte (page aligned).
    pub start: u64,
    /// Length in bytes.
    pub len: u64,
    /// File offset of `start`.
    pub pgoff: u64,
    /// The file, or `[vdso]`/`//anon`.
    pub name: String,
    /// What to add to the file's `p_vaddr`s to get run-time addresses
    /// (`None` for memory that is not a file).
    pub bias: Option<u64>,
}

impl Mapping {
    /// Whether `addr` is inside.
    pub fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr - self.start < self.len
    }
}

/// The parts of an ELF64 little-endian file the map needs.
#[derive(Debug, Clone)]
pub struct ElfInfo {
    /// `e_type == ET_DYN` (position independent).
    pub dynamic: bool,
    /// `e_entry`.
    pub entry: u64,
    /// `PT_INTERP`, if any.
    pub interp: Option<PathBuf>,
    /// `PT_LOAD` segments: (p_flags, p_offset, p_vaddr, p_memsz).
    pub loads: Vec<(u32, u64, u64, u64)>,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

impl ElfInfo {
    /// Reads the ELF header and program headers of `path`.
    pub fn read(path: &Path) -> Result<Self> {
        let bytes =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        Self::parse(&bytes).with_context(|| {
            format!(
                "{} is not a 64-bit little-endian x86-64 ELF file qemu-x86_64 can run",
                path.display()
            )
        })
    }

    fn parse(b: &[u8]) -> Result<Self> {
        if b.get(..6) != Some(b"\x7fELF\x02\x01".as_slice()) {
            bail!("no ELF64 little-endian header");
        }
        let short = || anyhow::anyhow!("truncated ELF header or program headers");
        let e_type = u16_at(b, 16).ok_or_else(short)?;
        let entry = u64_at(b, 24).ok_or_else(short)?;
        let phoff = usize::try_from(u64_at(b, 32).ok_or_else(short)?)?;
        let phentsize = usize::from(u16_at(b, 54).ok_or_else(short)?);
        let phnum = usize::from(u16_at(b, 56).ok_or_else(short)?);
        let mut loads = Vec::new();
        let mut interp = None;
        for i in 0..phnum {
            let ph = phoff + i * phentsize;
            let p_type = u32_at(b, ph).ok_or_else(short)?;
            let flags = u32_at(b, ph + 4).ok_or_else(short)?;
            let offset = u64_at(b, ph + 8).ok_or_else(short)?;
            let vaddr = u64_at(b, ph + 16).ok_or_else(short)?;
            let filesz = u64_at(b, ph + 32).ok_or_else(short)?;
            let memsz = u64_at(b, ph + 40).ok_or_else(short)?;
            match p_type {
                PT_LOAD => loads.push((flags, offset, vaddr, memsz)),
                PT_INTERP => {
                    let s = usize::try_from(offset)?;
                    let e = s + usize::try_from(filesz)?;
                    let name = b.get(s..e).ok_or_else(short)?;
                    let name = name.split(|&c| c == 0).next().unwrap_or_default();
                    interp = Some(PathBuf::from(String::from_utf8_lossy(name).into_owned()));
                }
                _ => {}
            }
        }
        Ok(ElfInfo {
            dynamic: e_type == 3,
            entry,
            interp,
            loads,
        })
    }

    fn exec_loads(&self) -> impl Iterator<Item = &(u32, u64, u64, u64)> {
        self.loads.iter().filter(|l| l.0 & PF_X != 0)
    }

    /// One mapping per executable `PT_LOAD`, at `bias`.
    fn mappings(&self, name: &str, bias: u64) -> Vec<Mapping> {
        self.exec_loads()
            .map(|&(_, offset, vaddr, memsz)| {
                let skew = vaddr % PAGE;
                Mapping {
                    start: bias.wrapping_add(vaddr - skew),
                    len: (memsz + skew).next_multiple_of(PAGE),
                    pgoff: offset - offset % PAGE,
                    name: name.to_string(),
                    bias: Some(bias),
                }
            })
            .collect()
    }
}

/// What the `-d page,strace` lines say.
#[derive(Debug, Default)]
pub struct GuestLog {
    /// `start_code` from the page header.
    pub start_code: Option<u64>,
    /// `entry` from the page header.
    pub entry: Option<u64>,
    /// The guest's pid (strace lines' prefix).
    pub pid: Option<u32>,
    /// Executable file mappings made with mmap: (addr, len, offset, file).
    pub mmaps: Vec<(u64, u64, u64, String)>,
    /// Anonymous memory the guest made executable: (addr, len).
    pub anon_exec: Vec<(u64, u64)>,
}

fn hex(s: &str) -> Option<u64> {
    let s = s.trim();
    let s = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    u64::from_str_radix(s, 16).ok()
}

fn number(s: &str) -> Option<i64> {
    let s = s.trim();
    if s.starts_with("0x") {
        return hex(s).map(|v| v as i64);
    }
    s.parse().ok()
}

/// Splits `name(args)` into the name and the top-level arguments.
fn call(text: &str) -> Option<(&str, Vec<&str>)> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let name = text.get(..open)?;
    let inner = text.get(open + 1..close)?;
    let mut args = Vec::new();
    let mut depth = 0i32;
    let mut quoted = false;
    let mut start = 0;
    for (i, c) in inner.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '(' | '{' | '[' if !quoted => depth += 1,
            ')' | '}' | ']' if !quoted => depth -= 1,
            ',' if !quoted && depth == 0 => {
                args.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    args.push(&inner[start..]);
    Some((name, args))
}

impl GuestLog {
    /// Reads the lines [`hwtrace_sim::Recording::mapping_log`] kept.
    pub fn parse(lines: &[String]) -> Self {
        let mut log = GuestLog::default();
        let mut fds: BTreeMap<i64, String> = BTreeMap::new();
        // A syscall line whose result comes on a later line (qemu's page
        // dump interrupts it).
        let mut pending: Option<(String, Vec<String>)> = None;
        for line in lines {
            if let Some(v) = line.strip_prefix("start_code") {
                log.start_code = hex(v);
                continue;
            }
            if let Some(v) = line.strip_prefix("entry") {
                log.entry = hex(v);
                continue;
            }
            if let Some(result) = line.strip_prefix(" = ") {
                if let Some((name, args)) = pending.take() {
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    log.syscall(&name, &args, result, &mut fds);
                }
                continue;
            }
            let Some((pid, rest)) = line.split_once(' ') else {
                continue;
            };
            let Ok(pid) = pid.parse::<u32>() else {
                continue;
            };
            let Some((text, result)) = split_result(rest) else {
                continue;
            };
            let Some((name, args)) = call(text) else {
                continue;
            };
            log.pid.get_or_insert(pid);
            match result {
                Some(result) => log.syscall(name, &args, result, &mut fds),
                None => {
                    pending = Some((
                        name.to_string(),
                        args.iter().map(|a| a.to_string()).collect(),
                    ))
                }
            }
        }
        log
    }

    fn syscall(
        &mut self,
        name: &str,
        args: &[&str],
        result: &str,
        fds: &mut BTreeMap<i64, String>,
    ) {
        let result = result.split_whitespace().next().unwrap_or("");
        let Some(ret) = number(result) else { return };
        let path = |a: Option<&&str>| {
            a.and_then(|a| a.trim().strip_prefix('"'))
                .and_then(|a| a.strip_suffix('"'))
                .map(str::to_string)
        };
        match name {
            "openat" if ret >= 0 => {
                if let Some(p) = path(args.get(1)) {
                    fds.insert(ret, p);
                }
            }
            "open" if ret >= 0 => {
                if let Some(p) = path(args.first()) {
                    fds.insert(ret, p);
                }
            }
            "close" => {
                if let Some(fd) = args.first().and_then(|a| number(a)) {
                    fds.remove(&fd);
                }
            }
            "mmap" if ret >= 0 => {
                let exec = args.get(2).is_some_and(|p| p.contains("PROT_EXEC"));
                let fd = args.get(4).and_then(|a| number(a));
                let len = args.get(1).and_then(|a| number(a));
                let off = args.get(5).and_then(|a| number(a));
                let Some(len) = len.map(|l| (l as u64).next_multiple_of(PAGE)) else {
                    return;
                };
                match (exec, fd.and_then(|fd| fds.get(&fd)), off) {
                    (true, Some(file), Some(off)) => {
                        self.mmaps.push((ret as u64, len, off as u64, file.clone()))
                    }
                    (true, None, _) => self.anon_exec.push((ret as u64, len)),
                    _ => {}
                }
            }
            "mprotect" if ret == 0 => {
                let exec = args.get(2).is_some_and(|p| p.contains("PROT_EXEC"));
                let addr = args.first().and_then(|a| number(a));
                let len = args.get(1).and_then(|a| number(a));
                if let (true, Some(addr), Some(len)) = (exec, addr, len) {
                    self.anon_exec
                        .push((addr as u64, (len as u64).next_multiple_of(PAGE)));
                }
            }
            _ => {}
        }
    }
}

/// `text = result` → (text, Some(result)); a line cut by a page dump
/// (`mmap(...)page layout changed following mmap`) → (text, None).
fn split_result(rest: &str) -> Option<(&str, Option<&str>)> {
    if let Some((text, result)) = rest.rsplit_once(") = ") {
        return Some((&rest[..text.len() + 1], Some(result)));
    }
    let cut = rest.find(")page layout changed")?;
    Some((&rest[..cut + 1], None))
}

/// The guest's executable mappings: program, interpreter, mmapped files,
/// then executed code outside all of them (`executed`: the execution's
/// code segments as (start, end)).
pub fn guest_mappings(
    program: &Path,
    log: &GuestLog,
    executed: &[(u64, u64)],
) -> Result<Vec<Mapping>> {
    let prog = ElfInfo::read(program)?;
    let mut maps = Vec::new();
    let first_x = prog
        .exec_loads()
        .map(|l| l.2)
        .min()
        .with_context(|| format!("{} has no executable segment", program.display()))?;
    let prog_bias = if prog.dynamic {
        let start = log
            .start_code
            .context("qemu's -d page log has no `start_code` line")?;
        start.wrapping_sub(first_x)
    } else {
        0
    };
    maps.extend(prog.mappings(&program.to_string_lossy(), prog_bias));
    if let Some(interp) = &prog.interp {
        let info = ElfInfo::read(interp)?;
        let entry = log
            .entry
            .context("qemu's -d page log has no `entry` line")?;
        let bias = entry.wrapping_sub(info.entry);
        maps.extend(info.mappings(&interp.to_string_lossy(), bias));
    }
    for (addr, len, off, file) in &log.mmaps {
        // The segment this offset maps gives the bias (for --filter).
        let bias = ElfInfo::read(Path::new(file)).ok().and_then(|info| {
            info.exec_loads()
                .find(|l| l.1 - l.1 % PAGE == *off)
                .map(|l| addr.wrapping_sub(l.2 - l.2 % PAGE))
        });
        maps.push(Mapping {
            start: *addr,
            len: *len,
            pgoff: *off,
            name: file.clone(),
            bias,
        });
    }
    // Executed code no file mapping covers.
    let mut extra: Vec<Mapping> = Vec::new();
    for &(start, end) in executed {
        if maps
            .iter()
            .any(|m| m.contains(start) && m.contains(end - 1))
        {
            continue;
        }
        let (s, e) = (start - start % PAGE, end.next_multiple_of(PAGE));
        if let Some(last) = extra.last_mut()
            && last.start + last.len >= s
        {
            last.len = last.len.max(e - last.start);
            continue;
        }
        let anon = log
            .anon_exec
            .iter()
            .any(|&(a, l)| a < e && s < a.saturating_add(l));
        let name = if anon {
            "//anon"
        } else if s == VSYSCALL {
            "[vsyscall]"
        } else {
            "[vdso]"
        };
        extra.push(Mapping {
            start: s,
            len: e - s,
            pgoff: 0,
            name: name.to_string(),
            bias: None,
        });
    }
    maps.extend(extra);
    Ok(maps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strace_lines_cut_by_page_dumps_still_give_their_mmap() {
        let lines: Vec<String> = [
            "start_code  0x0000004000002000",
            "entry       0x0000004002827b70",
            "25841 openat(-100,\"/lib/x86_64-linux-gnu/libc.so.6\",O_RDONLY|O_CLOEXEC) = 4",
            "25841 mmap(0x0000004002875000,1400832,PROT_EXEC|PROT_READ,MAP_PRIVATE|MAP_DENYWRITE|MAP_FIXED,4,0x26000)page layout changed following mmap",
            "0000004000000000-0000004000002000 0000000000002000 r--",
            " = 0x0000004002875000",
            "25841 mmap(NULL,8192,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0)page layout changed following mmap",
            " = 0x000000400284d000",
            "25841 close(4) = 0",
            "25841 mmap(NULL,4096,PROT_EXEC|PROT_READ,MAP_PRIVATE,4,0) = 0x0000004003000000",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let log = GuestLog::parse(&lines);
        assert_eq!(log.start_code, Some(0x40_0000_2000));
        assert_eq!(log.entry, Some(0x40_0282_7b70));
        assert_eq!(log.pid, Some(25841));
        // The last mmap's fd was closed: not a file mapping.
        assert_eq!(
            log.mmaps,
            vec![(
                0x40_0287_5000,
                1_400_832_u64.next_multiple_of(PAGE),
                0x26000,
                "/lib/x86_64-linux-gnu/libc.so.6".to_string()
            )]
        );
    }

    #[test]
    fn code_outside_files_is_named_as_the_kernel_names_it() {
        let true_ = Path::new("/bin/true");
        let lines = vec![
            "start_code  0x0000004000002000".to_string(),
            "9 mmap(NULL,8192,PROT_EXEC|PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0) = 0x0000005000000000".to_string(),
        ];
        let mut log = GuestLog::parse(&lines);
        assert_eq!(log.anon_exec, vec![(0x50_0000_0000, 8192)]);
        // /bin/true has an interpreter: its entry is needed too.
        let interp = ElfInfo::read(true_).unwrap().interp.unwrap();
        log.entry = Some(0x40_1000_0000 + ElfInfo::read(&interp).unwrap().entry);
        let executed = [
            (0x50_0000_0010, 0x50_0000_0020),
            (0x7000_0000_0100, 0x7000_0000_0200),
            (VSYSCALL, VSYSCALL + 9),
        ];
        let maps = guest_mappings(true_, &log, &executed).unwrap();
        let names: Vec<&str> = maps
            .iter()
            .filter(|m| m.bias.is_none())
            .map(|m| m.name.as_str())
            .collect();
        assert_eq!(names, ["//anon", "[vdso]", "[vsyscall]"]);
        let vdso = maps.iter().find(|m| m.name == "[vdso]").unwrap();
        assert_eq!((vdso.start, vdso.len), (0x7000_0000_0000, PAGE));
        // The program itself, at start_code minus its first executable
        // segment's page.
        assert!(maps[0].name.ends_with("true") && maps[0].bias.is_some());
    }

    #[test]
    fn elf_headers_are_checked() {
        assert!(ElfInfo::parse(b"\x7fELF\x01\x01").is_err());
        assert!(ElfInfo::parse(b"\x7fELF\x02\x01\x01\x00").is_err());
    }
}
