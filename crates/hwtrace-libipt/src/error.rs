//! The one error type of this crate: where libipt stopped and what it said.

use core::ffi::{CStr, c_int};
use core::fmt;

use crate::ffi;

/// What the crate was doing when libipt (or this crate's glue) failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stage {
    /// Allocating a decoder, an image or a section cache, or applying the configuration.
    Setup,
    /// Synchronizing onto a PSB (or onto the assumed sync point at offset 0).
    Sync,
    /// `pt_pkt_next`.
    Packet,
    /// `pt_insn_next` / `pt_insn_event`.
    Insn,
    /// `pt_blk_next` / `pt_blk_event`.
    Block,
    /// Adding a section to an image.
    Image,
}

/// An error reported by libipt: the trace offset, libipt's error code (the positive
/// `enum pt_error_code` value) and `pt_errstr` for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OracleError {
    /// Trace offset at which the failing call started (0 for setup and image errors).
    pub offset: u64,
    /// `enum pt_error_code` value, e.g. 4 for `pte_bad_opc`.
    pub code: u32,
    /// `pt_errstr(code)`, e.g. "unknown opcode".
    pub message: &'static str,
    /// What was being done.
    pub stage: Stage,
}

impl OracleError {
    /// Build from a negative libipt status (`-pte_*`).
    pub(crate) fn from_status(status: c_int, offset: u64, stage: Stage) -> Self {
        let code = status.unsigned_abs();
        OracleError {
            offset,
            code,
            message: errstr(status.saturating_neg()),
            stage,
        }
    }

    /// `pte_eos`: the decoder ran off the end of the trace.
    pub fn is_eos(&self) -> bool {
        self.code == ffi::PTE_EOS.unsigned_abs()
    }

    /// The line libipt's `ptdump` prints for this error, without the brackets' surroundings:
    /// `[17: error decoding packet: unknown opcode]`.
    pub fn ptdump_line(&self) -> String {
        let what = match self.stage {
            Stage::Sync => "sync error",
            Stage::Packet => "error decoding packet",
            _ => "error",
        };
        format!("[{:x}: {what}: {}]", self.offset, self.message)
    }
}

impl fmt::Display for OracleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "libipt {:?} error at trace offset {:#x}: {} (pte code {})",
            self.stage, self.offset, self.message, self.code
        )
    }
}

impl std::error::Error for OracleError {}

/// `pt_errstr`: libipt returns pointers to string literals, valid for the program's lifetime.
fn errstr(code: c_int) -> &'static str {
    // SAFETY: pt_errstr accepts any value (unknown codes map to "bad error code") and returns a
    // pointer to a NUL-terminated static string literal inside libipt, never NULL and never freed,
    // so borrowing it for 'static is sound.
    let text = unsafe { CStr::from_ptr(ffi::pt_errstr(code)) };
    text.to_str().unwrap_or("<non-UTF-8 libipt error string>")
}
