//! The code the flow targets decode over, shared by `branchy_image.rs`
//! (an `hwtrace-mem` image of it, for the fuzz targets) and hwtrace-flow's
//! `tests/fast_fuzz_regressions.rs` (which keeps what the fuzzer found):
//! every kind of branch the decoder follows.
//!
//! ```text
//! 1000: 74 05             je   1007          ; conditional
//! 1002: e8 09 00 00 00    call 1010          ; direct call
//! 1007: ff e0             jmp  rax           ; indirect jump
//! 1009: 0f 05             syscall            ; far transfer
//! 100b: eb f3             jmp  1000          ; direct jump (loop)
//! 100d: 90 90 90          nop x3
//! 1010: 48 01 c8          add  rax, rcx
//! 1013: 75 fb             jne  1010          ; backward conditional
//! 1015: ff d0             call rax           ; indirect call
//! 1017: c3                ret                ; (compressed) return
//! 1018: cf                iret
//! ```

/// The bytes above.
pub const CODE: &[u8] = &[
    0x74, 0x05, 0xe8, 0x09, 0x00, 0x00, 0x00, 0xff, 0xe0, 0x0f, 0x05, 0xeb, 0xf3, 0x90, 0x90, 0x90,
    0x48, 0x01, 0xc8, 0x75, 0xfb, 0xff, 0xd0, 0xc3, 0xcf,
];

/// Where the code is: at 0x1000 and at a kernel-looking copy.
pub const BASES: [u64; 2] = [0x1000, 0xffff_ffff_8000_1000];
