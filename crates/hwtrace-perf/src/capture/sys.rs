//! The kernel boundary: `perf_event_open`, the ring-buffer mmaps, ioctls.
//! Every `unsafe` block says why it is sound.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use perf_event_open_sys as sys;

use super::error::CaptureError;
use super::ring::{self, RawData};
use crate::data::attr::Attr;
use crate::data::auxtrace::TscConversion;

/// `PERF_FLAG_FD_CLOEXEC`.
pub const FLAG_FD_CLOEXEC: u64 = 1 << 3;

/// An open perf event.
#[derive(Debug)]
pub struct PerfEvent {
    fd: OwnedFd,
}

/// The processor's time-stamp counter now, the clock the trace's TSC
/// packets count: what perf writes as each AUXTRACE record's `reference`
/// (`intel_pt_reference`, `intel_bts_reference`: RDTSC when the AUX data
/// is read). perf's timed decoding (the `tsc` term) starts a buffer's
/// clock from it; with a zero reference `perf script` 6.1 decodes nothing
/// of a timed Intel PT recording and dies (SIGSEGV).
pub fn tsc_now() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: RDTSC reads a counter into registers: no memory is touched,
    // and every x86-64 processor has the instruction.
    let tsc = unsafe { core::arch::x86_64::_rdtsc() };
    #[cfg(not(target_arch = "x86_64"))]
    let tsc = 0;
    tsc
}

fn last_error() -> io::Error {
    io::Error::last_os_error()
}

impl PerfEvent {
    /// `perf_event_open(attr, pid, cpu, -1, PERF_FLAG_FD_CLOEXEC)`.
    pub fn open(attr: &Attr, pid: i32, cpu: i32) -> io::Result<Self> {
        let bytes = attr.to_bytes();
        let mut raw = sys::bindings::perf_event_attr::default();
        let n = bytes
            .len()
            .min(std::mem::size_of::<sys::bindings::perf_event_attr>());
        // SAFETY: `perf_event_attr` is a `repr(C)` struct of integers and
        // unions of integers (bindgen output), so every byte pattern is a
        // valid value; we copy at most its size from a buffer at least that
        // long, and the two do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), (&raw mut raw).cast::<u8>(), n);
        }
        // SAFETY: the kernel reads `attr.size` bytes from a valid, initialised
        // `perf_event_attr` that lives across the call (and writes back only
        // `size` on E2BIG, which the struct has room for).
        let fd = unsafe { sys::perf_event_open(&mut raw, pid, cpu, -1, FLAG_FD_CLOEXEC as _) };
        if fd < 0 {
            return Err(last_error());
        }
        // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
        Ok(Self {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// `PERF_EVENT_IOC_ENABLE`.
    pub fn enable(&self) -> io::Result<()> {
        // SAFETY: an ioctl on a perf fd we own, with an integer argument.
        let r = unsafe { sys::ioctls::ENABLE(self.fd.as_raw_fd(), 0) };
        if r < 0 { Err(last_error()) } else { Ok(()) }
    }

    /// `PERF_EVENT_IOC_DISABLE`.
    pub fn disable(&self) -> io::Result<()> {
        // SAFETY: as for `enable`.
        let r = unsafe { sys::ioctls::DISABLE(self.fd.as_raw_fd(), 0) };
        if r < 0 { Err(last_error()) } else { Ok(()) }
    }

    /// `PERF_EVENT_IOC_SET_FILTER` (address filters for AUX PMUs).
    pub fn set_filter(&self, filter: &str) -> io::Result<()> {
        let c = CString::new(filter).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: the kernel reads a NUL-terminated string from `c`, which
        // outlives the call; it does not write through the pointer.
        let r = unsafe { sys::ioctls::SET_FILTER(self.fd.as_raw_fd(), c.as_ptr().cast_mut()) };
        if r < 0 { Err(last_error()) } else { Ok(()) }
    }

    /// `PERF_EVENT_IOC_ID`.
    pub fn id(&self) -> io::Result<u64> {
        let mut id = 0u64;
        // SAFETY: the kernel writes one u64 through a pointer to a live local.
        let r = unsafe { sys::ioctls::ID(self.fd.as_raw_fd(), &mut id) };
        if r < 0 { Err(last_error()) } else { Ok(id) }
    }
}

/// A shared mapping of a perf fd, unmapped on drop.
#[derive(Debug)]
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl Mapping {
    fn new(fd: &OwnedFd, len: usize, offset: u64, writable: bool) -> io::Result<Self> {
        let prot = libc::PROT_READ | if writable { libc::PROT_WRITE } else { 0 };
        let off = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: a fresh shared mapping chosen by the kernel (no address
        // hint), of a perf fd we own; nothing else refers to that memory.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                off,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(last_error());
        }
        let ptr =
            NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::from(io::ErrorKind::Other))?;
        Ok(Self { ptr, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `new` made; no slice into it
        // outlives `self` (they borrow the owning `Rings`).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

// Offsets in `struct perf_event_mmap_page` (include/uapi/linux/perf_event.h).
const CAPABILITIES: usize = 40;
const TIME_SHIFT: usize = 50;
const TIME_MULT: usize = 52;
const TIME_ZERO: usize = 64;
const DATA_HEAD: usize = 1024;
const DATA_TAIL: usize = 1032;
const DATA_OFFSET: usize = 1040;
const DATA_SIZE: usize = 1048;
const AUX_HEAD: usize = 1056;
const AUX_TAIL: usize = 1064;
const AUX_OFFSET: usize = 1072;
const AUX_SIZE: usize = 1080;

/// The data ring (and optionally the AUX area) of one event.
#[derive(Debug)]
pub struct Rings {
    base: Mapping,
    data_offset: usize,
    data_size: usize,
    aux: Option<Mapping>,
    aux_snapshot: bool,
}

/// The system page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).unwrap_or(4096)
}

impl Rings {
    /// Maps the header page and `data_size` bytes of data ring (a power of
    /// two number of pages).
    pub fn map(ev: &PerfEvent, data_size: usize) -> io::Result<Self> {
        let page = page_size();
        let base = Mapping::new(&ev.fd, page + data_size, 0, true)?;
        let mut r = Self {
            base,
            data_offset: page,
            data_size,
            aux: None,
            aux_snapshot: false,
        };
        // Kernels since 4.1 publish where the data is.
        let (off, size) = (
            r.word(DATA_OFFSET).load(Ordering::Relaxed),
            r.word(DATA_SIZE).load(Ordering::Relaxed),
        );
        if size != 0 && off as usize + size as usize <= r.base.len {
            r.data_offset = off as usize;
            r.data_size = size as usize;
        }
        Ok(r)
    }

    /// Maps an AUX area of `size` bytes (a power of two number of pages)
    /// after the data ring. Read-only in snapshot mode: the kernel then
    /// overwrites old data instead of stopping.
    pub fn map_aux(
        &mut self,
        ev: &PerfEvent,
        size: usize,
        snapshot: bool,
    ) -> Result<(), CaptureError> {
        let offset = (self.base.len as u64).next_multiple_of(page_size() as u64);
        self.word(AUX_OFFSET).store(offset, Ordering::Relaxed);
        self.word(AUX_SIZE).store(size as u64, Ordering::Release);
        let m =
            Mapping::new(&ev.fd, size, offset, !snapshot).map_err(|e| CaptureError::AuxMmap {
                size: size as u64,
                errno_text: e.to_string(),
            })?;
        self.aux = Some(m);
        self.aux_snapshot = snapshot;
        Ok(())
    }

    /// A u64 field of the header page, as an atomic.
    fn word(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset.is_multiple_of(8) && offset + 8 <= self.base.len);
        // SAFETY: the header page is mapped for the life of `self`, page
        // aligned (so `offset`, a multiple of 8, is aligned for u64), and the
        // kernel accesses these fields concurrently: an atomic is the right
        // type for shared memory another agent writes.
        unsafe { &*self.base.ptr.as_ptr().add(offset).cast::<AtomicU64>() }
    }

    fn header_bytes(&self, offset: usize, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        // SAFETY: reads `n` bytes inside the mapped header page into a local
        // buffer; a plain copy of fields the kernel updates under its seqlock
        // (a torn read gives a wrong value, never unsoundness for bytes).
        unsafe {
            std::ptr::copy_nonoverlapping(self.base.ptr.as_ptr().add(offset), v.as_mut_ptr(), n)
        };
        v
    }

    /// The TSC conversion the kernel publishes (`time_shift`, `time_mult`,
    /// `time_zero`, `cap_user_time_zero`).
    pub fn tsc_conversion(&self) -> TscConversion {
        let b = self.header_bytes(CAPABILITIES, TIME_ZERO + 8 - CAPABILITIES);
        let at = |o: usize| o - CAPABILITIES;
        let caps = u64::from_le_bytes(
            b[at(CAPABILITIES)..at(CAPABILITIES) + 8]
                .try_into()
                .unwrap_or([0; 8]),
        );
        TscConversion {
            time_shift: u16::from_le_bytes([b[at(TIME_SHIFT)], b[at(TIME_SHIFT) + 1]]),
            time_mult: u32::from_le_bytes(
                b[at(TIME_MULT)..at(TIME_MULT) + 4]
                    .try_into()
                    .unwrap_or([0; 4]),
            ),
            time_zero: u64::from_le_bytes(
                b[at(TIME_ZERO)..at(TIME_ZERO) + 8]
                    .try_into()
                    .unwrap_or([0; 8]),
            ),
            cap_user_time_zero: caps & (1 << 4) != 0,
        }
    }

    /// The readable data-ring bytes, the tail they start at and the head
    /// they end at.
    pub fn data(&self) -> Result<(RawData<'_>, u64, u64), CaptureError> {
        let head = self.word(DATA_HEAD).load(Ordering::Acquire);
        let tail = self.word(DATA_TAIL).load(Ordering::Relaxed);
        // SAFETY: the data ring is mapped for the life of `self`; the kernel
        // does not write into [tail, head) until we move tail past it, so
        // the slices `readable` takes of this range do not change under us.
        let buf = unsafe {
            std::slice::from_raw_parts(self.base.ptr.as_ptr().add(self.data_offset), self.data_size)
        };
        Ok((ring::readable(buf, tail, head)?, tail, head))
    }

    /// Tells the kernel the data ring was consumed up to `tail`.
    pub fn consume_data(&self, tail: u64) {
        self.word(DATA_TAIL).store(tail, Ordering::Release);
    }

    /// The readable AUX bytes, the stream position they start at, and the
    /// head. In snapshot mode, call with the event disabled.
    pub fn aux(&self) -> Result<Option<(RawData<'_>, u64, u64)>, CaptureError> {
        let Some(m) = &self.aux else { return Ok(None) };
        let head = self.word(AUX_HEAD).load(Ordering::Acquire);
        let tail = if self.aux_snapshot {
            ring::snapshot_range(m.len as u64, head).0
        } else {
            self.word(AUX_TAIL).load(Ordering::Relaxed)
        };
        // SAFETY: the AUX area is mapped for the life of `self`. Outside
        // snapshot mode the kernel does not write into [tail, head) until
        // aux_tail moves past it; in snapshot mode the caller has disabled
        // the event, so nothing writes at all.
        let buf = unsafe { std::slice::from_raw_parts(m.ptr.as_ptr(), m.len) };
        Ok(Some((ring::readable(buf, tail, head)?, tail, head)))
    }

    /// Tells the kernel the AUX area was consumed up to `tail`.
    pub fn consume_aux(&self, tail: u64) {
        if self.aux.is_some() && !self.aux_snapshot {
            self.word(AUX_TAIL).store(tail, Ordering::Release);
        }
    }
}
