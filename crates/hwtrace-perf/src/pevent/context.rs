//! Process contexts: which file is mapped where, for which pid.
//!
//! This is the state ptxed keeps to decode user-space code: every process
//! (pid) has a context with an image made of the kernel mappings plus the
//! MMAP records seen for it. `COMM.EXEC` replaces a pid's context with a fresh
//! one (the old one stays alive while it is still in use), `FORK` of a new
//! process starts the child with a copy of the parent's mappings. Contexts
//! live in an arena and are named by [`ContextId`], so "the same context"
//! means the same id, never merely the same pid.

use std::path::Path;

use hwtrace_types::Ip;

/// A context in a [`Contexts`] arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ContextId(usize);

/// One mapped file section (libipt: `pt_image_add_file`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// The file, sysroot already prepended, vDSO already substituted.
    pub filename: String,
    /// Offset of the section in the file.
    pub offset: u64,
    /// Size of the section.
    pub size: u64,
    /// Where the section is loaded.
    pub vaddr: Ip,
}

impl Mapping {
    /// Whether `ip` lies inside this mapping.
    pub fn contains(&self, ip: Ip) -> bool {
        ip.0.wrapping_sub(self.vaddr.0) < self.size
    }
}

/// The ABI of a process, from the ELF header of the first file mapped into it
/// (decides which vDSO file stands for `[vdso]`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Abi {
    /// Not known yet.
    #[default]
    Unknown,
    /// 64-bit (ELFCLASS64).
    X64,
    /// x32 (ELFCLASS32, EM_X86_64).
    X32,
    /// ia32 (ELFCLASS32, EM_386).
    Ia32,
}

/// Reads the ABI of an ELF file from its header; anything unreadable or not
/// ELF is [`Abi::Unknown`].
pub fn elf_abi(path: &Path) -> Abi {
    use std::io::Read;
    let mut header = [0u8; 20];
    let Ok(mut file) = std::fs::File::open(path) else {
        return Abi::Unknown;
    };
    if file.read_exact(&mut header).is_err() {
        return Abi::Unknown;
    }
    elf_abi_from_header(&header)
}

/// [`elf_abi`] on the first bytes of a file: `e_ident` (16 bytes), `e_type`,
/// `e_machine`.
pub fn elf_abi_from_header(header: &[u8]) -> Abi {
    const EV_CURRENT: u8 = 1;
    const ELFCLASS32: u8 = 1;
    const ELFCLASS64: u8 = 2;
    const EM_386: u16 = 3;
    const EM_X86_64: u16 = 62;
    if header.len() < 20 || &header[..4] != b"\x7fELF" || header[6] != EV_CURRENT {
        return Abi::Unknown;
    }
    match header[4] {
        ELFCLASS64 => Abi::X64,
        ELFCLASS32 => match u16::from_le_bytes([header[18], header[19]]) {
            EM_386 => Abi::Ia32,
            EM_X86_64 => Abi::X32,
            _ => Abi::Unknown,
        },
        _ => Abi::Unknown,
    }
}

/// One process context.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Context {
    pid: u32,
    abi: Abi,
    mappings: Vec<Mapping>,
}

impl Context {
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The image name libipt gives it (`pid-%x`), as ptxed prints it in
    /// `[context: pid-1]`.
    pub fn name(&self) -> String {
        format!("pid-{:x}", self.pid)
    }

    /// The ABI, once a file was mapped.
    pub fn abi(&self) -> Abi {
        self.abi
    }

    /// All mappings, oldest first (kernel mappings first).
    pub fn mappings(&self) -> &[Mapping] {
        &self.mappings
    }

    /// The mapping `ip` falls into; a newer mapping shadows older ones where
    /// they overlap, as in a libipt image.
    pub fn lookup(&self, ip: Ip) -> Option<&Mapping> {
        self.mappings.iter().rev().find(|m| m.contains(ip))
    }
}

/// All contexts of a session, plus the kernel mappings every new context
/// starts with.
#[derive(Clone, Debug, Default)]
pub struct Contexts {
    arena: Vec<Context>,
    by_pid: std::collections::HashMap<u32, ContextId>,
    kernel: Vec<Mapping>,
}

impl Contexts {
    /// The context with this id.
    pub fn get(&self, id: ContextId) -> Option<&Context> {
        self.arena.get(id.0)
    }

    /// The live context of `pid`, if any.
    pub fn find(&self, pid: u32) -> Option<ContextId> {
        self.by_pid.get(&pid).copied()
    }

    /// The live context of `pid`, created (with the kernel mappings) if
    /// there is none.
    pub fn get_or_create(&mut self, pid: u32) -> ContextId {
        if let Some(id) = self.find(pid) {
            return id;
        }
        let id = ContextId(self.arena.len());
        self.arena.push(Context {
            pid,
            abi: Abi::Unknown,
            mappings: self.kernel.clone(),
        });
        self.by_pid.insert(pid, id);
        id
    }

    /// Forgets `pid`'s live context; the context itself stays valid for
    /// whoever still uses it.
    pub fn remove_pid(&mut self, pid: u32) {
        self.by_pid.remove(&pid);
    }

    /// Adds a kernel mapping (e.g. from kcore); contexts created afterwards
    /// start with it.
    pub fn add_kernel_mapping(&mut self, mapping: Mapping) {
        self.kernel.push(mapping);
    }

    /// Adds a mapping to a context.
    pub fn map(&mut self, id: ContextId, mapping: Mapping) {
        if let Some(ctx) = self.arena.get_mut(id.0) {
            ctx.mappings.push(mapping);
        }
    }

    /// Sets a context's ABI unless it is already known.
    pub fn track_abi(&mut self, id: ContextId, abi: impl FnOnce() -> Abi) {
        if let Some(ctx) = self.arena.get_mut(id.0)
            && ctx.abi == Abi::Unknown
        {
            ctx.abi = abi();
        }
    }

    /// Starts `child` with the mappings of `parent` (fork of a new process).
    pub fn copy_image(&mut self, child: ContextId, parent: ContextId) {
        let Some(parent_maps) = self.arena.get(parent.0).map(|p| p.mappings.clone()) else {
            return;
        };
        if let Some(ctx) = self.arena.get_mut(child.0) {
            for m in parent_maps {
                if !ctx.mappings.contains(&m) {
                    ctx.mappings.push(m);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(name: &str, vaddr: u64, size: u64) -> Mapping {
        Mapping {
            filename: name.into(),
            offset: 0,
            size,
            vaddr: Ip(vaddr),
        }
    }

    #[test]
    fn newer_mapping_shadows_older() {
        let mut c = Contexts::default();
        let id = c.get_or_create(1);
        c.map(id, map("a", 0x1000, 0x100));
        c.map(id, map("b", 0x1080, 0x10));
        let ctx = c.get(id).unwrap();
        assert_eq!(ctx.lookup(Ip(0x1000)).unwrap().filename, "a");
        assert_eq!(ctx.lookup(Ip(0x1088)).unwrap().filename, "b");
        assert!(ctx.lookup(Ip(0x1100)).is_none());
        assert_eq!(ctx.name(), "pid-1");
    }

    #[test]
    fn removed_pid_gets_a_new_context_with_kernel_mappings() {
        let mut c = Contexts::default();
        c.add_kernel_mapping(map("kcore", 0xffff_0000, 0x1000));
        let old = c.get_or_create(5);
        c.map(old, map("user", 0x1000, 0x10));
        c.remove_pid(5);
        let new = c.get_or_create(5);
        assert_ne!(old, new);
        assert_eq!(c.get(new).unwrap().mappings().len(), 1);
        assert_eq!(c.get(old).unwrap().mappings().len(), 2);
    }

    #[test]
    fn abi_from_elf_header() {
        let mut h = [0u8; 20];
        h[..4].copy_from_slice(b"\x7fELF");
        h[6] = 1;
        h[4] = 2;
        assert_eq!(elf_abi_from_header(&h), Abi::X64);
        h[4] = 1;
        h[18] = 3;
        assert_eq!(elf_abi_from_header(&h), Abi::Ia32);
        h[18] = 62;
        assert_eq!(elf_abi_from_header(&h), Abi::X32);
        assert_eq!(elf_abi_from_header(b"garbage"), Abi::Unknown);
    }
}
