//! Arbitrary bytes as an Intel PT trace over a fixed code image: the
//! instruction decoder must never panic, never loop without consuming trace
//! (bounded steps), and every resync must move forward.
#![no_main]

use hwtrace_flow::Config;
use hwtrace_flow::insn::{InsnDecoder, Step};
use hwtrace_mem::image::Image;
use hwtrace_types::Ip;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

/// Code with every kind of branch the decoder follows, at 0x1000 (and a
/// copy at 0xffff_ffff_8000_1000 for kernel-looking IPs):
///
/// ```text
/// 1000: 74 05             je   1007          ; conditional
/// 1002: e8 09 00 00 00    call 1010          ; direct call
/// 1007: ff e0             jmp  rax           ; indirect jump
/// 1009: 0f 05             syscall            ; far transfer
/// 100b: eb f3             jmp  1000          ; direct jump (loop)
/// 100d: 90 90 90          nop x3
/// 1010: 48 01 c8          add  rax, rcx
/// 1013: 75 fb             jne  1010          ; backward conditional
/// 1015: ff d0             call rax           ; indirect call
/// 1017: c3                ret                ; (compressed) return
/// 1018: cf                iret
/// ```
const CODE: &[u8] = &[
    0x74, 0x05, 0xe8, 0x09, 0x00, 0x00, 0x00, 0xff, 0xe0, 0x0f, 0x05, 0xeb, 0xf3, 0x90, 0x90, 0x90, 0x48, 0x01,
    0xc8, 0x75, 0xfb, 0xff, 0xd0, 0xc3, 0xcf,
];

fn image() -> &'static Image {
    static IMAGE: OnceLock<Image> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let mut image = Image::new();
        for base in [0x1000u64, 0xffff_ffff_8000_1000] {
            image.add_bytes(None, Ip(base), CODE.to_vec(), "fuzz-code").expect("fixed image loads");
        }
        image
    })
}

fuzz_target!(|data: &[u8]| {
    let mut d = InsnDecoder::new(data, Config::default(), image());
    if d.sync_forward().is_err() {
        return;
    }
    // The decoder stops code that consumes no trace after a few million
    // instructions; allow that, but no more.
    let budget = 8_000_000usize + 64 * data.len();
    let mut last_resync = d.sync_offset();
    for _ in 0..budget {
        match d.next() {
            Ok(Some(Step::Insn(_) | Step::Event(_))) => {}
            Ok(None) => return,
            Err(_) => match d.sync_forward() {
                Ok(_) => {
                    let now = d.sync_offset();
                    assert!(now > last_resync, "resync did not move forward: {last_resync:?} -> {now:?}");
                    last_resync = now;
                }
                Err(_) => return,
            },
        }
    }
    panic!("decoder did not finish within {budget} steps");
});
