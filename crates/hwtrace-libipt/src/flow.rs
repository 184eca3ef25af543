//! libipt's instruction (`pt_insn_*`) and block (`pt_blk_*`) decoders, driven the way ptxed
//! drives them: sync at the first PSB, drain pending events before each step, report an error
//! and resync at the next PSB after it, stop at the end of the trace.

use core::ffi::c_int;
use core::marker::PhantomData;
use core::ptr::NonNull;

use crate::config::Config;
use crate::error::{OracleError, Stage};
use crate::event::OracleEvent;
use crate::ffi;
use crate::image::Image;

/// One step of an instruction-level decode, in trace order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InsnItem {
    /// An executed instruction at this IP.
    Insn(u64),
    /// An event (enable, disable, mode change, overflow, …) before the next instruction.
    Event(OracleEvent),
    /// A decode error; decoding resumed at the next PSB.
    Error(OracleError),
}

/// Totals of a block-level decode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockCount {
    /// Blocks with at least one instruction.
    pub blocks: u64,
    /// Instructions in those blocks.
    pub insns: u64,
    /// Errors (each followed by a resync).
    pub errors: u64,
}

/// The libipt calls one decoder layer provides; implemented for the instruction and block
/// decoders so that one driver serves both.
trait Layer {
    /// `struct pt_insn` / `struct pt_block`.
    type Item: Default;
    /// Which [`Stage`] errors of this layer are reported under.
    const STAGE: Stage;

    /// # Safety
    /// `cfg` must be a valid 2.0.5 `struct pt_config` whose trace outlives the decoder.
    unsafe fn alloc(cfg: &ffi::PtConfig) -> *mut Self;
    /// # Safety (for all below)
    /// `d` must be a live decoder from `alloc`; the image passed to `set_image` must outlive it.
    unsafe fn free(d: *mut Self);
    unsafe fn set_image(d: *mut Self, image: *mut ffi::PtImage) -> c_int;
    unsafe fn sync_forward(d: *mut Self) -> c_int;
    unsafe fn get_offset(d: *const Self, offset: &mut u64) -> c_int;
    unsafe fn next(d: *mut Self, item: &mut Self::Item) -> c_int;
    unsafe fn event(d: *mut Self, event: &mut ffi::PtEvent) -> c_int;
}

impl Layer for ffi::PtInsnDecoder {
    type Item = ffi::PtInsn;
    const STAGE: Stage = Stage::Insn;
    unsafe fn alloc(cfg: &ffi::PtConfig) -> *mut Self {
        // SAFETY: forwarded contract.
        unsafe { ffi::pt_insn_alloc_decoder(cfg) }
    }
    unsafe fn free(d: *mut Self) {
        // SAFETY: forwarded contract.
        unsafe { ffi::pt_insn_free_decoder(d) }
    }
    unsafe fn set_image(d: *mut Self, image: *mut ffi::PtImage) -> c_int {
        // SAFETY: forwarded contract.
        unsafe { ffi::pt_insn_set_image(d, image) }
    }
    unsafe fn sync_forward(d: *mut Self) -> c_int {
        // SAFETY: forwarded contract.
        unsafe { ffi::pt_insn_sync_forward(d) }
    }
    unsafe fn get_offset(d: *const Self, offset: &mut u64) -> c_int {
        // SAFETY: forwarded contract; `offset` is a valid out-pointer.
        unsafe { ffi::pt_insn_get_offset(d, offset) }
    }
    unsafe fn next(d: *mut Self, item: &mut ffi::PtInsn) -> c_int {
        // SAFETY: forwarded contract; `item` is a writable struct of the size passed.
        unsafe { ffi::pt_insn_next(d, item, core::mem::size_of::<ffi::PtInsn>()) }
    }
    unsafe fn event(d: *mut Self, event: &mut ffi::PtEvent) -> c_int {
        // SAFETY: forwarded contract; `event` is a writable struct of the size passed.
        unsafe { ffi::pt_insn_event(d, event, core::mem::size_of::<ffi::PtEvent>()) }
    }
}

impl Layer for ffi::PtBlockDecoder {
    type Item = ffi::PtBlock;
    const STAGE: Stage = Stage::Block;
    unsafe fn alloc(cfg: &ffi::PtConfig) -> *mut Self {
        // SAFETY: forwarded contract.
        unsafe { ffi::pt_blk_alloc_decoder(cfg) }
    }
    unsafe fn free(d: *mut Self) {
        // SAFETY: forwarded contract.
        unsafe { ffi::pt_blk_free_decoder(d) }
    }
    unsafe fn set_image(d: *mut Self, image: *mut ffi::PtImage) -> c_int {
        // SAFETY: forwarded contract.
        unsafe { ffi::pt_blk_set_image(d, image) }
    }
    unsafe fn sync_forward(d: *mut Self) -> c_int {
        // SAFETY: forwarded contract.
        unsafe { ffi::pt_blk_sync_forward(d) }
    }
    unsafe fn get_offset(d: *const Self, offset: &mut u64) -> c_int {
        // SAFETY: forwarded contract; `offset` is a valid out-pointer.
        unsafe { ffi::pt_blk_get_offset(d, offset) }
    }
    unsafe fn next(d: *mut Self, item: &mut ffi::PtBlock) -> c_int {
        // SAFETY: forwarded contract; `item` is a writable struct of the size passed.
        unsafe { ffi::pt_blk_next(d, item, core::mem::size_of::<ffi::PtBlock>()) }
    }
    unsafe fn event(d: *mut Self, event: &mut ffi::PtEvent) -> c_int {
        // SAFETY: forwarded contract; `event` is a writable struct of the size passed.
        unsafe { ffi::pt_blk_event(d, event, core::mem::size_of::<ffi::PtEvent>()) }
    }
}

/// What the driver reports; implemented by the collecting and the counting front ends.
trait Sink<I> {
    /// A successfully (possibly partially, on error) decoded instruction or block.
    fn item(&mut self, item: &I);
    fn event(&mut self, event: &ffi::PtEvent);
    fn error(&mut self, error: OracleError);
}

/// A decoder of layer `L` over a trace borrowed for `'t`, reading code from an image borrowed
/// for `'i`.
struct FlowDecoder<'t, 'i, L: Layer> {
    raw: NonNull<L>,
    _borrows: PhantomData<(&'t [u8], &'i Image<'i>)>,
}

impl<'t, 'i, L: Layer> FlowDecoder<'t, 'i, L> {
    fn new(trace: &'t [u8], cfg: &Config, image: &'i Image<'_>) -> Result<Self, OracleError> {
        let raw_cfg = cfg.to_raw(trace)?;
        // SAFETY: a valid config over `trace`, which outlives the decoder ('t).
        let raw = NonNull::new(unsafe { L::alloc(&raw_cfg) })
            .ok_or_else(|| OracleError::from_status(-ffi::PTE_INTERNAL, 0, Stage::Setup))?;
        let decoder = FlowDecoder {
            raw,
            _borrows: PhantomData,
        };
        // SAFETY: live decoder; the image outlives the decoder ('i) and is only read by it.
        let status = unsafe { L::set_image(raw.as_ptr(), image.as_ptr()) };
        if status < 0 {
            return Err(OracleError::from_status(status, 0, Stage::Setup));
        }
        Ok(decoder)
    }

    fn offset(&self) -> u64 {
        let mut offset = 0;
        // SAFETY: live decoder. A failure (not yet synced) leaves 0, which is what we report.
        unsafe { L::get_offset(self.raw.as_ptr(), &mut offset) };
        offset
    }

    fn run(&mut self, sink: &mut impl Sink<L::Item>, has_insns: impl Fn(&L::Item) -> bool) {
        let d = self.raw.as_ptr();
        loop {
            // SAFETY (all calls in this loop): `d` is live for as long as `self`.
            let mut status = unsafe { L::sync_forward(d) };
            if status < 0 {
                if status != -ffi::PTE_EOS {
                    // libipt may fail again at the same spot; stop instead of spinning.
                    sink.error(OracleError::from_status(status, self.offset(), Stage::Sync));
                }
                return;
            }
            loop {
                while status >= 0 && status & ffi::PTS_EVENT_PENDING != 0 {
                    let mut event = ffi::PtEvent::default();
                    status = unsafe { L::event(d, &mut event) };
                    if status >= 0 {
                        sink.event(&event);
                    }
                }
                if status < 0 {
                    break;
                }
                if status & ffi::PTS_EOS != 0 {
                    status = -ffi::PTE_EOS;
                    break;
                }
                // Zeroed: iclass 0 is `ptic_error`, which marks "nothing decoded" on failure.
                let mut item = L::Item::default();
                status = unsafe { L::next(d, &mut item) };
                if status < 0 {
                    // On error, libipt may still have decoded this step (ptxed prints it too).
                    if has_insns(&item) {
                        sink.item(&item);
                    }
                    break;
                }
                sink.item(&item);
            }
            if status == -ffi::PTE_EOS {
                return;
            }
            sink.error(OracleError::from_status(status, self.offset(), L::STAGE));
        }
    }
}

impl<L: Layer> Drop for FlowDecoder<'_, '_, L> {
    fn drop(&mut self) {
        // SAFETY: allocated by `L::alloc`, freed once, here.
        unsafe { L::free(self.raw.as_ptr()) }
    }
}

fn insn_decoded(insn: &ffi::PtInsn) -> bool {
    insn.iclass != ffi::PTIC_ERROR
}

fn block_decoded(block: &ffi::PtBlock) -> bool {
    block.ninsn > 0
}

/// Decode `trace` to instructions and events with libipt's instruction decoder, code read
/// from `image`.
pub fn insn_trace(
    trace: &[u8],
    cfg: &Config,
    image: &Image<'_>,
) -> Result<Vec<InsnItem>, OracleError> {
    struct Collect(Vec<InsnItem>);
    impl Sink<ffi::PtInsn> for Collect {
        fn item(&mut self, insn: &ffi::PtInsn) {
            self.0.push(InsnItem::Insn(insn.ip));
        }
        fn event(&mut self, event: &ffi::PtEvent) {
            self.0.push(InsnItem::Event(OracleEvent::from_raw(event)));
        }
        fn error(&mut self, error: OracleError) {
            self.0.push(InsnItem::Error(error));
        }
    }
    let mut decoder = FlowDecoder::<ffi::PtInsnDecoder>::new(trace, cfg, image)?;
    let mut sink = Collect(Vec::new());
    decoder.run(&mut sink, insn_decoded);
    Ok(sink.0)
}

/// The IPs of all executed instructions, and the errors met on the way.
pub fn insn_addresses(
    trace: &[u8],
    cfg: &Config,
    image: &Image<'_>,
) -> Result<(Vec<u64>, Vec<OracleError>), OracleError> {
    let mut ips = Vec::new();
    let mut errors = Vec::new();
    for item in insn_trace(trace, cfg, image)? {
        match item {
            InsnItem::Insn(ip) => ips.push(ip),
            InsnItem::Error(e) => errors.push(e),
            InsnItem::Event(_) => {}
        }
    }
    Ok((ips, errors))
}

/// Benchmark loop over `pt_insn_next`: returns (instructions, errors); nothing is allocated
/// per instruction.
pub fn count_insns(
    trace: &[u8],
    cfg: &Config,
    image: &Image<'_>,
) -> Result<(u64, u64), OracleError> {
    #[derive(Default)]
    struct Count(u64, u64);
    impl Sink<ffi::PtInsn> for Count {
        fn item(&mut self, _: &ffi::PtInsn) {
            self.0 += 1;
        }
        fn event(&mut self, _: &ffi::PtEvent) {}
        fn error(&mut self, _: OracleError) {
            self.1 += 1;
        }
    }
    let mut decoder = FlowDecoder::<ffi::PtInsnDecoder>::new(trace, cfg, image)?;
    let mut sink = Count::default();
    decoder.run(&mut sink, insn_decoded);
    Ok((sink.0, sink.1))
}

/// Benchmark loop over `pt_blk_next`: blocks, instructions in them, and errors.
pub fn count_blocks(
    trace: &[u8],
    cfg: &Config,
    image: &Image<'_>,
) -> Result<BlockCount, OracleError> {
    struct Count(BlockCount);
    impl Sink<ffi::PtBlock> for Count {
        fn item(&mut self, block: &ffi::PtBlock) {
            if block.ninsn > 0 {
                self.0.blocks += 1;
                self.0.insns += u64::from(block.ninsn);
            }
        }
        fn event(&mut self, _: &ffi::PtEvent) {}
        fn error(&mut self, _: OracleError) {
            self.0.errors += 1;
        }
    }
    let mut decoder = FlowDecoder::<ffi::PtBlockDecoder>::new(trace, cfg, image)?;
    let mut sink = Count(BlockCount::default());
    decoder.run(&mut sink, block_decoded);
    Ok(sink.0)
}
