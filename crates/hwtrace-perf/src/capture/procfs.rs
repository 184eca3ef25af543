//! What a running process already has, read from `/proc/PID` so an attached
//! capture starts with the sideband perf would synthesize: a COMM per
//! thread and an MMAP2 per executable file mapping.

use std::path::Path;

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapEntry {
    /// Start address.
    pub start: u64,
    /// End address (exclusive).
    pub end: u64,
    /// `PROT_*` bits.
    pub prot: u32,
    /// `MAP_SHARED` (1) or `MAP_PRIVATE` (2).
    pub flags: u32,
    /// File offset.
    pub pgoff: u64,
    /// Device major and minor.
    pub dev: (u32, u32),
    /// Inode.
    pub inode: u64,
    /// Path or pseudo-name (`[vdso]`), empty for anonymous memory.
    pub path: String,
}

/// `line` without its first `n` whitespace-separated fields.
fn after_fields(line: &str, n: usize) -> &str {
    let mut s = line.trim_start();
    for _ in 0..n {
        match s.find(char::is_whitespace) {
            Some(i) => s = s[i..].trim_start(),
            None => return "",
        }
    }
    s
}

/// Parses `start-end perms offset maj:min inode [path]`.
pub fn parse_maps_line(line: &str) -> Option<MapEntry> {
    let mut f = line.split_whitespace();
    let (start, end) = f.next()?.split_once('-')?;
    let perms = f.next()?.as_bytes();
    let pgoff = u64::from_str_radix(f.next()?, 16).ok()?;
    let (maj, min) = f.next()?.split_once(':')?;
    let inode = f.next()?.parse().ok()?;
    // The path may contain spaces: it is the rest of the line.
    let path = after_fields(line, 5).trim_end().to_string();
    let bit = |i: usize, c: u8, v: u32| if perms.get(i) == Some(&c) { v } else { 0 };
    Some(MapEntry {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        prot: bit(0, b'r', 1) | bit(1, b'w', 2) | bit(2, b'x', 4),
        flags: if perms.get(3) == Some(&b's') { 1 } else { 2 },
        pgoff,
        dev: (
            u32::from_str_radix(maj, 16).ok()?,
            u32::from_str_radix(min, 16).ok()?,
        ),
        inode,
        path,
    })
}

/// The executable mappings of `pid` (files and `[vdso]`).
pub fn exec_maps(procfs_root: &Path, pid: u32) -> Vec<MapEntry> {
    let text =
        std::fs::read_to_string(procfs_root.join(pid.to_string()).join("maps")).unwrap_or_default();
    text.lines()
        .filter_map(parse_maps_line)
        .filter(|m| m.prot & 4 != 0 && (m.path.starts_with('/') || m.path == "[vdso]"))
        .collect()
}

/// The threads of `pid` with their names.
pub fn threads(procfs_root: &Path, pid: u32) -> Vec<(u32, String)> {
    let dir = procfs_root.join(pid.to_string()).join("task");
    let mut out: Vec<(u32, String)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let tid: u32 = e.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            Some((tid, comm.trim_end_matches('\n').to_string()))
        })
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines() {
        let m = parse_maps_line("55d0c4a2e000-55d0c4a32000 r-xp 00002000 fd:01 1311243                    /usr/bin/true").unwrap();
        assert_eq!(
            (m.start, m.end, m.prot, m.flags, m.pgoff),
            (0x55d0c4a2e000, 0x55d0c4a32000, 5, 2, 0x2000)
        );
        assert_eq!(
            (m.dev, m.inode, m.path.as_str()),
            ((0xfd, 1), 1311243, "/usr/bin/true")
        );
        let m = parse_maps_line(
            "7ffd1b5f0000-7ffd1b5f2000 r-xp 00000000 00:00 0                          [vdso]",
        )
        .unwrap();
        assert_eq!(m.path, "[vdso]");
        let m = parse_maps_line("7f0000000000-7f0000001000 rw-s 00000000 00:05 42 /tmp/a file")
            .unwrap();
        assert_eq!((m.prot, m.flags, m.path.as_str()), (3, 1, "/tmp/a file"));
        let m = parse_maps_line("7f0000000000-7f0000001000 rw-p 00000000 00:00 0").unwrap();
        assert!(m.path.is_empty());
        assert_eq!(parse_maps_line("garbage"), None);
    }

    #[test]
    fn this_process_has_its_executable_mapped() {
        let me = std::process::id();
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let maps = exec_maps(Path::new("/proc"), me);
        assert!(maps.iter().any(|m| Path::new(&m.path) == exe), "{maps:?}");
        let t = threads(Path::new("/proc"), me);
        assert!(t.iter().any(|(tid, _)| *tid == me));
    }
}
