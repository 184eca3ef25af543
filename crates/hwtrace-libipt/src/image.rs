//! The traced memory image libipt's instruction and block decoders read code from
//! (`struct pt_image`): files (`pt_image_add_file`, or through a section cache with
//! `pt_image_add_cached`) and, for everything else, a Rust callback (`pt_image_set_callback`).

use core::ffi::{c_int, c_void};
use core::ptr::{self, NonNull};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use crate::error::{OracleError, Stage};
use crate::ffi;

/// Code memory the decoder reads through a callback.
pub trait ReadMemory {
    /// Copy the bytes at `addr..addr + buf.len()` into `buf` as far as they are mapped
    /// contiguously; return how many were copied (0: nothing mapped at `addr`).
    fn read_memory(&self, addr: u64, buf: &mut [u8]) -> usize;
}

impl<F: Fn(u64, &mut [u8]) -> usize> ReadMemory for F {
    fn read_memory(&self, addr: u64, buf: &mut [u8]) -> usize {
        self(addr, buf)
    }
}

/// Non-overlapping byte slices at virtual addresses (e.g. a page cache).
#[derive(Debug, Clone, Default)]
pub struct Sections<'a> {
    /// Sorted by address, non-overlapping.
    sections: Vec<(u64, &'a [u8])>,
}

/// [`Sections::insert`] was given a section that overlaps one already present.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SectionOverlap {
    /// Start address of the rejected section.
    pub addr: u64,
    /// Start address of the section it overlaps.
    pub existing: u64,
}

impl core::fmt::Display for SectionOverlap {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "section at {:#x} overlaps the section at {:#x}",
            self.addr, self.existing
        )
    }
}

impl std::error::Error for SectionOverlap {}

impl<'a> Sections<'a> {
    /// An empty set.
    pub fn new() -> Self {
        Sections::default()
    }

    /// Map `bytes` at `addr`. Empty slices are ignored.
    pub fn insert(&mut self, addr: u64, bytes: &'a [u8]) -> Result<(), SectionOverlap> {
        if bytes.is_empty() {
            return Ok(());
        }
        let end = addr.saturating_add(bytes.len() as u64);
        let at = self.sections.partition_point(|(a, _)| *a < addr);
        let overlaps = |&(a, b): &(u64, &[u8])| a < end && addr < a.saturating_add(b.len() as u64);
        for neighbour in [at.checked_sub(1), Some(at)].into_iter().flatten() {
            if let Some(s) = self.sections.get(neighbour).filter(|s| overlaps(s)) {
                return Err(SectionOverlap {
                    addr,
                    existing: s.0,
                });
            }
        }
        self.sections.insert(at, (addr, bytes));
        Ok(())
    }

    /// Number of sections.
    pub fn len(&self) -> usize {
        self.sections.len()
    }

    /// True if no section is mapped.
    pub fn is_empty(&self) -> bool {
        self.sections.is_empty()
    }
}

impl ReadMemory for Sections<'_> {
    fn read_memory(&self, addr: u64, buf: &mut [u8]) -> usize {
        let at = self.sections.partition_point(|(a, _)| *a <= addr);
        let Some(&(start, bytes)) = at.checked_sub(1).and_then(|i| self.sections.get(i)) else {
            return 0;
        };
        let Some(avail) = usize::try_from(addr - start)
            .ok()
            .and_then(|o| bytes.get(o..))
        else {
            return 0;
        };
        let n = avail.len().min(buf.len());
        buf[..n].copy_from_slice(&avail[..n]);
        n
    }
}

/// A libipt image. Files added with [`Image::add_file`]/[`Image::add_file_cached`] take
/// precedence; addresses they do not cover are read through the [`ReadMemory`] given to
/// [`Image::with_memory`], which must outlive the image (`'m`).
pub struct Image<'m> {
    raw: NonNull<ffi::PtImage>,
    iscache: Option<NonNull<ffi::PtImageSectionCache>>,
    /// The callback's context. libipt takes a thin `void *`, so the fat `&dyn ReadMemory` lives
    /// in a box whose address stays stable while libipt holds it.
    memory: Option<Box<CallbackContext<'m>>>,
}

impl core::fmt::Debug for Image<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Image")
            .field("cached", &self.iscache.is_some())
            .field("memory", &self.memory.is_some())
            .finish()
    }
}

impl<'m> Image<'m> {
    /// An empty image.
    pub fn new() -> Result<Self, OracleError> {
        // SAFETY: a NULL name is allowed (the image is then unnamed).
        let raw = unsafe { ffi::pt_image_alloc(ptr::null()) };
        let raw = NonNull::new(raw).ok_or_else(|| setup_error(-ffi::PTE_INTERNAL))?;
        Ok(Image {
            raw,
            iscache: None,
            memory: None,
        })
    }

    /// An image that reads all code through `memory`.
    pub fn with_memory(memory: &'m dyn ReadMemory) -> Result<Self, OracleError> {
        let mut image = Image::new()?;
        image.set_memory(memory)?;
        Ok(image)
    }

    /// Read addresses no file section covers through `memory` (`pt_image_set_callback`).
    pub fn set_memory(&mut self, memory: &'m dyn ReadMemory) -> Result<(), OracleError> {
        let context = Box::new(CallbackContext(memory));
        let context_ptr = (&*context as *const CallbackContext<'m>)
            .cast_mut()
            .cast::<c_void>();
        // SAFETY: the image is live; `read_callback` matches `read_memory_callback_t`; the
        // context points into a Box we keep in `self.memory` until the image is freed, and it
        // refers to a `&'m dyn ReadMemory` that outlives the image.
        let status = unsafe {
            ffi::pt_image_set_callback(self.raw.as_ptr(), Some(read_callback), context_ptr)
        };
        if status < 0 {
            return Err(OracleError::from_status(status, 0, Stage::Image));
        }
        self.memory = Some(context);
        Ok(())
    }

    /// Map `size` bytes of the file at `path` from file `offset` at `vaddr`, in any address
    /// space (`pt_image_add_file`). libipt reads the file lazily.
    pub fn add_file(
        &mut self,
        path: &Path,
        offset: u64,
        size: u64,
        vaddr: u64,
    ) -> Result<(), OracleError> {
        let name = c_path(path)?;
        // SAFETY: live image; NUL-terminated path that libipt copies; NULL asid = any.
        let status = unsafe {
            ffi::pt_image_add_file(
                self.raw.as_ptr(),
                name.as_ptr(),
                offset,
                size,
                ptr::null(),
                vaddr,
            )
        };
        if status < 0 {
            return Err(OracleError::from_status(status, 0, Stage::Image));
        }
        Ok(())
    }

    /// Like [`Image::add_file`], but through an image section cache owned by this image
    /// (`pt_iscache_add_file` + `pt_image_add_cached`), the path ptxed takes for `--raw`/`--elf`.
    pub fn add_file_cached(
        &mut self,
        path: &Path,
        offset: u64,
        size: u64,
        vaddr: u64,
    ) -> Result<(), OracleError> {
        let name = c_path(path)?;
        let iscache = match self.iscache {
            Some(cache) => cache,
            None => {
                // SAFETY: a NULL name is allowed.
                let raw = unsafe { ffi::pt_iscache_alloc(ptr::null()) };
                let cache = NonNull::new(raw).ok_or_else(|| setup_error(-ffi::PTE_INTERNAL))?;
                self.iscache = Some(cache);
                cache
            }
        };
        // SAFETY: live cache; libipt copies the NUL-terminated path.
        let isid = unsafe {
            ffi::pt_iscache_add_file(iscache.as_ptr(), name.as_ptr(), offset, size, vaddr)
        };
        if isid < 0 {
            return Err(OracleError::from_status(isid, 0, Stage::Image));
        }
        // SAFETY: live image and cache; `isid` came from this cache; NULL asid = any.
        let status = unsafe {
            ffi::pt_image_add_cached(self.raw.as_ptr(), iscache.as_ptr(), isid, ptr::null())
        };
        if status < 0 {
            return Err(OracleError::from_status(status, 0, Stage::Image));
        }
        Ok(())
    }

    pub(crate) fn as_ptr(&self) -> *mut ffi::PtImage {
        self.raw.as_ptr()
    }
}

impl Drop for Image<'_> {
    fn drop(&mut self) {
        // SAFETY: both pointers came from their alloc functions and are freed once. The image
        // goes first: its cached sections hold references into the cache.
        unsafe {
            ffi::pt_image_free(self.raw.as_ptr());
            if let Some(cache) = self.iscache {
                ffi::pt_iscache_free(cache.as_ptr());
            }
        }
    }
}

/// What `read_callback` receives as its context.
struct CallbackContext<'m>(&'m dyn ReadMemory);

fn setup_error(status: c_int) -> OracleError {
    OracleError::from_status(status, 0, Stage::Setup)
}

fn c_path(path: &Path) -> Result<CString, OracleError> {
    // A path with an interior NUL cannot name a file; libipt's own word for that is "invalid".
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| OracleError::from_status(-2, 0, Stage::Image))
}

/// `read_memory_callback_t` over a `&dyn ReadMemory`.
unsafe extern "C" fn read_callback(
    buffer: *mut u8,
    size: usize,
    _asid: *const ffi::PtAsid,
    ip: u64,
    context: *mut c_void,
) -> c_int {
    if buffer.is_null() || context.is_null() {
        return -ffi::PTE_INTERNAL;
    }
    // SAFETY: `context` is the pointer `Image::set_memory` registered: a live
    // `Box<CallbackContext>` owned by the image that is calling us. libipt passes a writable
    // buffer of `size` bytes that nothing else touches during the call.
    let (memory, buf) = unsafe {
        (
            &*(context as *const CallbackContext<'_>),
            core::slice::from_raw_parts_mut(buffer, size),
        )
    };
    // A panic must not unwind into C; report it as an internal error instead.
    match catch_unwind(AssertUnwindSafe(|| memory.0.read_memory(ip, buf))) {
        Ok(0) => -ffi::PTE_NOMAP,
        Ok(n) => c_int::try_from(n.min(size)).unwrap_or(c_int::MAX),
        Err(_) => -ffi::PTE_INTERNAL,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_read_within_one_section_and_stop_at_its_end() {
        let a = [1u8, 2, 3, 4];
        let b = [9u8; 4];
        let mut s = Sections::new();
        s.insert(0x1000, &a).unwrap();
        s.insert(0x1004, &b).unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(s.read_memory(0x1002, &mut buf), 2);
        assert_eq!(&buf[..2], &[3, 4]);
        assert_eq!(s.read_memory(0x1004, &mut buf), 4);
        assert_eq!(s.read_memory(0xfff, &mut buf), 0);
        assert_eq!(s.read_memory(0x1008, &mut buf), 0);
    }

    #[test]
    fn sections_reject_overlap() {
        let a = [0u8; 16];
        let mut s = Sections::new();
        s.insert(0x1000, &a).unwrap();
        assert_eq!(
            s.insert(0x100f, &a),
            Err(SectionOverlap {
                addr: 0x100f,
                existing: 0x1000
            })
        );
        assert_eq!(
            s.insert(0xff1, &a),
            Err(SectionOverlap {
                addr: 0xff1,
                existing: 0x1000
            })
        );
        s.insert(0xff0, &a).unwrap();
        assert_eq!(s.len(), 2);
    }
}
