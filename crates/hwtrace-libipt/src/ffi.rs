//! Hand-written declarations for the parts of libipt 2.0.5 (`/usr/include/intel-pt.h`) we use.
//!
//! Structures with C bit-fields or unions are mirrored as plain integer/byte fields of the same
//! size and alignment; the accessors in the safe modules pick the bits out. The layouts below were
//! measured with gcc on x86-64 against the 2.0.5 header (`sizeof`/`offsetof`, and by setting each
//! bit-field and looking at which byte changed); the `const` assertions pin the sizes, and
//! `build.rs` refuses any header that is not libipt 2.0.

use core::ffi::{c_char, c_int, c_void};

/// `enum pt_error_code` values we test for.
pub const PTE_INTERNAL: c_int = 1;
pub const PTE_EOS: c_int = 7;
pub const PTE_NOMAP: c_int = 13;

/// `enum pt_status_flag`.
pub const PTS_EVENT_PENDING: c_int = 1 << 0;
pub const PTS_EOS: c_int = 1 << 2;

/// `enum pt_cpu_vendor::pcv_intel`.
pub const PCV_INTEL: c_int = 1;

/// `enum pt_insn_class::ptic_error`.
pub const PTIC_ERROR: c_int = 0;

/// `struct pt_cpu`: 8 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PtCpu {
    pub vendor: c_int,
    pub family: u16,
    pub model: u8,
    pub stepping: u8,
}

/// `struct pt_errata`: one `uint32_t` of flag bits and 15 reserved words; only filled by
/// `pt_cpu_errata`, never read by us.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PtErrata {
    pub bits: [u32; 16],
}

/// `struct pt_config` (280 bytes). `flags` (`struct pt_conf_flags`, 16 bytes at offset 124) and
/// `addr_filter` (`struct pt_conf_addr_filter`, 136 bytes at offset 144) stay zero: no block
/// flags, no address filter.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PtConfig {
    pub size: usize,
    pub begin: *mut u8,
    pub end: *mut u8,
    pub decode_callback: *const c_void,
    pub decode_context: *mut c_void,
    pub cpu: PtCpu,
    pub errata: PtErrata,
    pub cpuid_0x15_eax: u32,
    pub cpuid_0x15_ebx: u32,
    pub mtc_freq: u8,
    pub nom_freq: u8,
    pub _pad: [u8; 2],
    pub flags: [u32; 4],
    pub _pad2: u32,
    pub addr_filter: [u64; 17],
}

/// `struct pt_packet` (24 bytes): `type` at 0, `size` at 4, the payload union at 8.
/// Bit-field positions inside the payload (byte, bit): mode.exec csl (4,0) csd (4,1);
/// mode.tsx intx (4,0) abrt (4,1); pip.nr (8,0); exstop.ip (0,0); pwre.hw (2,0);
/// pwrx interrupt/store/autonomous (2,0/1/2); ptw.plc byte 8, ptw.ip (9,0).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PtPacket {
    pub kind: u32,
    pub size: u8,
    pub payload: [u64; 2],
}

/// `struct pt_event` (64 bytes): the variant union at 40 (three `u64`s);
/// flag bits at 4: ip_suppressed (bit 0), status_update (1), has_tsc (2).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PtEvent {
    pub kind: u32,
    pub flags: u32,
    pub tsc: u64,
    pub lost_mtc: u32,
    pub lost_cyc: u32,
    pub reserved: [u64; 2],
    pub variant: [u64; 3],
}

/// `struct pt_insn` (40 bytes); speculative/truncated bits at byte 36.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PtInsn {
    pub ip: u64,
    pub isid: c_int,
    pub mode: c_int,
    pub iclass: c_int,
    pub raw: [u8; 15],
    pub size: u8,
    pub flags: u32,
}

/// `struct pt_block` (48 bytes); speculative/truncated bits at byte 46.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PtBlock {
    pub ip: u64,
    pub end_ip: u64,
    pub isid: c_int,
    pub mode: c_int,
    pub iclass: c_int,
    pub ninsn: u16,
    pub raw: [u8; 15],
    pub size: u8,
    pub flags: u16,
}

/// `struct pt_asid` (24 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PtAsid {
    pub size: usize,
    pub cr3: u64,
    pub vmcs: u64,
}

const _: () = {
    assert!(core::mem::size_of::<PtCpu>() == 8);
    assert!(core::mem::size_of::<PtErrata>() == 64);
    assert!(core::mem::size_of::<PtConfig>() == 280);
    assert!(core::mem::offset_of!(PtConfig, cpu) == 40);
    assert!(core::mem::offset_of!(PtConfig, errata) == 48);
    assert!(core::mem::offset_of!(PtConfig, cpuid_0x15_eax) == 112);
    assert!(core::mem::offset_of!(PtConfig, mtc_freq) == 120);
    assert!(core::mem::offset_of!(PtConfig, flags) == 124);
    assert!(core::mem::offset_of!(PtConfig, addr_filter) == 144);
    assert!(core::mem::size_of::<PtPacket>() == 24);
    assert!(core::mem::offset_of!(PtPacket, payload) == 8);
    assert!(core::mem::size_of::<PtEvent>() == 64);
    assert!(core::mem::offset_of!(PtEvent, variant) == 40);
    assert!(core::mem::size_of::<PtInsn>() == 40);
    assert!(core::mem::offset_of!(PtInsn, raw) == 20);
    assert!(core::mem::offset_of!(PtInsn, size) == 35);
    assert!(core::mem::size_of::<PtBlock>() == 48);
    assert!(core::mem::offset_of!(PtBlock, ninsn) == 28);
    assert!(core::mem::offset_of!(PtBlock, size) == 45);
    assert!(core::mem::size_of::<PtAsid>() == 24);
};

/// Opaque libipt objects.
#[repr(C)]
pub struct PtPacketDecoder {
    _private: [u8; 0],
}
#[repr(C)]
pub struct PtInsnDecoder {
    _private: [u8; 0],
}
#[repr(C)]
pub struct PtBlockDecoder {
    _private: [u8; 0],
}
#[repr(C)]
pub struct PtImage {
    _private: [u8; 0],
}
#[repr(C)]
pub struct PtImageSectionCache {
    _private: [u8; 0],
}

/// `read_memory_callback_t`.
pub type ReadMemoryCallback = unsafe extern "C" fn(
    buffer: *mut u8,
    size: usize,
    asid: *const PtAsid,
    ip: u64,
    context: *mut c_void,
) -> c_int;

unsafe extern "C" {
    pub fn pt_errstr(code: c_int) -> *const c_char;
    pub fn pt_cpu_errata(errata: *mut PtErrata, cpu: *const PtCpu) -> c_int;

    pub fn pt_pkt_alloc_decoder(config: *const PtConfig) -> *mut PtPacketDecoder;
    pub fn pt_pkt_free_decoder(decoder: *mut PtPacketDecoder);
    pub fn pt_pkt_sync_forward(decoder: *mut PtPacketDecoder) -> c_int;
    pub fn pt_pkt_sync_set(decoder: *mut PtPacketDecoder, offset: u64) -> c_int;
    pub fn pt_pkt_get_offset(decoder: *const PtPacketDecoder, offset: *mut u64) -> c_int;
    pub fn pt_pkt_next(decoder: *mut PtPacketDecoder, packet: *mut PtPacket, size: usize) -> c_int;

    pub fn pt_iscache_alloc(name: *const c_char) -> *mut PtImageSectionCache;
    pub fn pt_iscache_free(iscache: *mut PtImageSectionCache);
    pub fn pt_iscache_add_file(
        iscache: *mut PtImageSectionCache,
        filename: *const c_char,
        offset: u64,
        size: u64,
        vaddr: u64,
    ) -> c_int;

    pub fn pt_image_alloc(name: *const c_char) -> *mut PtImage;
    pub fn pt_image_free(image: *mut PtImage);
    pub fn pt_image_add_file(
        image: *mut PtImage,
        filename: *const c_char,
        offset: u64,
        size: u64,
        asid: *const PtAsid,
        vaddr: u64,
    ) -> c_int;
    pub fn pt_image_add_cached(
        image: *mut PtImage,
        iscache: *mut PtImageSectionCache,
        isid: c_int,
        asid: *const PtAsid,
    ) -> c_int;
    pub fn pt_image_set_callback(
        image: *mut PtImage,
        callback: Option<ReadMemoryCallback>,
        context: *mut c_void,
    ) -> c_int;

    pub fn pt_insn_alloc_decoder(config: *const PtConfig) -> *mut PtInsnDecoder;
    pub fn pt_insn_free_decoder(decoder: *mut PtInsnDecoder);
    pub fn pt_insn_sync_forward(decoder: *mut PtInsnDecoder) -> c_int;
    pub fn pt_insn_get_offset(decoder: *const PtInsnDecoder, offset: *mut u64) -> c_int;
    pub fn pt_insn_set_image(decoder: *mut PtInsnDecoder, image: *mut PtImage) -> c_int;
    pub fn pt_insn_next(decoder: *mut PtInsnDecoder, insn: *mut PtInsn, size: usize) -> c_int;
    pub fn pt_insn_event(decoder: *mut PtInsnDecoder, event: *mut PtEvent, size: usize) -> c_int;

    pub fn pt_blk_alloc_decoder(config: *const PtConfig) -> *mut PtBlockDecoder;
    pub fn pt_blk_free_decoder(decoder: *mut PtBlockDecoder);
    pub fn pt_blk_sync_forward(decoder: *mut PtBlockDecoder) -> c_int;
    pub fn pt_blk_get_offset(decoder: *const PtBlockDecoder, offset: *mut u64) -> c_int;
    pub fn pt_blk_set_image(decoder: *mut PtBlockDecoder, image: *mut PtImage) -> c_int;
    pub fn pt_blk_next(decoder: *mut PtBlockDecoder, block: *mut PtBlock, size: usize) -> c_int;
    pub fn pt_blk_event(decoder: *mut PtBlockDecoder, event: *mut PtEvent, size: usize) -> c_int;
}
