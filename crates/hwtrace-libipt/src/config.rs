//! Decoder configuration: the subset of `struct pt_config` that hwtrace's checks vary.

use core::ptr;

use crate::error::{OracleError, Stage};
use crate::ffi;

/// Where decoding starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SyncMode {
    /// At the first PSB (`pt_*_sync_forward`), like ptdump and ptxed by default.
    #[default]
    Forward,
    /// Assume the trace is in sync at offset 0 (`pt_pkt_sync_set(0)`, ptdump's `--no-sync`).
    /// Only the packet decoder supports this; the instruction and block decoders always sync
    /// forward.
    AssumeAtStart,
}

/// The CPU the trace was recorded on, which selects libipt's errata workarounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cpu {
    /// CPUID family, e.g. 6.
    pub family: u16,
    /// CPUID model (extended model folded in), e.g. 142.
    pub model: u8,
    /// CPUID stepping.
    pub stepping: u8,
}

/// Decoder configuration. `Config::default()` is `pt_config_init`'s: no CPU (no errata), no
/// timing calibration, sync at the first PSB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Config {
    /// CPU for errata (`--cpu F/M[/S]`); `None` leaves errata off.
    pub cpu: Option<Cpu>,
    /// Where packet decoding starts.
    pub sync: SyncMode,
    /// `IA32_RTIT_CTL.MTCFreq`.
    pub mtc_freq: u8,
    /// Nominal frequency (`MSR_PLATFORM_INFO[15:8]`).
    pub nom_freq: u8,
    /// CPUID leaf 0x15 EAX (TSC/core crystal clock denominator).
    pub cpuid_0x15_eax: u32,
    /// CPUID leaf 0x15 EBX (numerator).
    pub cpuid_0x15_ebx: u32,
}

impl Config {
    /// The raw `struct pt_config` for `trace`. The returned value points into `trace`: the
    /// decoder built from it must not outlive the borrow (the decoder types carry the lifetime).
    pub(crate) fn to_raw(self, trace: &[u8]) -> Result<ffi::PtConfig, OracleError> {
        let range = trace.as_ptr_range();
        let mut raw = ffi::PtConfig {
            size: core::mem::size_of::<ffi::PtConfig>(),
            // libipt only reads the trace; the pointers are `uint8_t *` for historical reasons.
            begin: range.start.cast_mut(),
            end: range.end.cast_mut(),
            decode_callback: ptr::null(),
            decode_context: ptr::null_mut(),
            cpu: ffi::PtCpu::default(),
            errata: ffi::PtErrata::default(),
            cpuid_0x15_eax: self.cpuid_0x15_eax,
            cpuid_0x15_ebx: self.cpuid_0x15_ebx,
            mtc_freq: self.mtc_freq,
            nom_freq: self.nom_freq,
            _pad: [0; 2],
            flags: [0; 4],
            _pad2: 0,
            addr_filter: [0; 17],
        };
        if let Some(cpu) = self.cpu {
            raw.cpu = ffi::PtCpu {
                vendor: ffi::PCV_INTEL,
                family: cpu.family,
                model: cpu.model,
                stepping: cpu.stepping,
            };
            // SAFETY: both pointers are to live, properly laid out values (see ffi.rs); the
            // function only writes `errata`.
            let status = unsafe { ffi::pt_cpu_errata(&mut raw.errata, &raw.cpu) };
            if status < 0 {
                return Err(OracleError::from_status(status, 0, Stage::Setup));
            }
        }
        Ok(raw)
    }
}
