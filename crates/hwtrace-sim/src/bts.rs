//! Branch Trace Store simulated: branches written as BTS records into a DS
//! buffer, as the processor writes them.
//!
//! The model follows SDM Vol. 3B §18.4.5 “Branch Trace Store (BTS)”,
//! §18.4.9 “BTS and DS Save Area” and §18.4.9.4 “Setting Up CPL-Qualified
//! BTS”:
//!
//! * A branch is stored only when DEBUGCTL has TR = 1 and BTS = 1, and is
//!   skipped when BTS_OFF_OS is set and it executes at CPL 0, or
//!   BTS_OFF_USR is set and it executes at CPL > 0.
//! * The record (from, to, predicted flag in bit 4 of the third field) is
//!   written at the BTS index, which then advances by one record (12 bytes
//!   in the 32-bit layout, 24 in the 64-bit one).
//! * When the index reaches the interrupt threshold, a PMI is raised. The
//!   SDM warns that this happens even with BTINT clear, which is why a
//!   circular buffer must have its threshold beyond the absolute maximum;
//!   the simulator raises it in both modes.
//! * BTINT = 0 (circular): when the next record would pass the absolute
//!   maximum, the index goes back to the buffer base and old records are
//!   overwritten.
//! * BTINT = 1: the buffer does not wrap. A record that would pass the
//!   absolute maximum is not written (the SDM leaves that case undefined,
//!   which is why the threshold must be “several records short” of the
//!   end); the simulator counts it as lost.
//! * The PMI handler (seed 001's ISR) runs [`BtsConfig::pmi_latency`]
//!   branches after the PMI is raised; the usual handler copies the records
//!   out and puts the index back at the base ([`BtsSim::drain`]).
//!
//! [`BtsSim::area_bytes`] and [`BtsSim::buffer`] are what memory holds
//! afterwards, in the layout `hwtrace_regs::dump::BtsDump` reads back.

use hwtrace_regs::bts::{BtsError, BtsRecord};
use hwtrace_regs::debugctl::{BtsMode, DebugCtl, DebugCtlFlag};
use hwtrace_regs::ds::{DsError, DsFormat, DsManagementArea};

use crate::branch::Branch;

/// The largest BTS buffer the simulator allocates (256 MiB).
pub const MAX_BUFFER_BYTES: u64 = 256 << 20;

/// What the simulated processor was programmed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BtsConfig {
    /// 32- or 64-bit DS layout.
    pub format: DsFormat,
    /// The DS buffer management area (its BTS fields; the index is where
    /// writing starts).
    pub area: DsManagementArea,
    /// IA32_DEBUGCTL (either layout).
    pub debugctl: DebugCtl,
    /// Branches executed between the PMI and its handler (interrupt
    /// delivery latency); 0 runs the handler right after the record that
    /// reached the threshold.
    pub pmi_latency: u32,
}

/// Why a configuration cannot be simulated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BtsSimError {
    /// The DS area's BTS fields are inconsistent.
    #[error("DS area")]
    Area(#[from] DsError),
    /// The buffer is larger than the simulator allocates.
    #[error(
        "BTS buffer of {bytes} bytes is larger than the simulator's limit of {MAX_BUFFER_BYTES}"
    )]
    BufferTooLarge {
        /// Bytes between base and absolute maximum.
        bytes: u64,
    },
    /// A record cannot be written (an address too wide for the 32-bit layout).
    #[error("branch {branch}: {error}")]
    Record {
        /// Index of the branch in the input stream.
        branch: usize,
        /// The record error.
        error: BtsError,
    },
}

/// What happened to one branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BtsStep {
    /// Not stored: TR or BTS clear, or its CPL is filtered out.
    Skipped,
    /// Stored in record `slot` (counted from the base).
    Written {
        /// The record number.
        slot: u64,
        /// The index reached the interrupt threshold: a PMI is raised.
        pmi: bool,
        /// The index went back to the base (circular mode).
        wrapped: bool,
    },
    /// BTINT = 1 and the buffer is full: the record was lost.
    Lost,
}

/// A PMI raised by the BTS threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BtsPmi {
    /// The branch whose record reached the threshold.
    pub branch: usize,
    /// Records in the buffer at that moment.
    pub records: u64,
    /// Records in the buffer when the handler ran.
    pub records_at_handler: u64,
}

/// Counts of one run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BtsReport {
    /// Records written.
    pub written: u64,
    /// Branches not stored (DEBUGCTL or CPL filter).
    pub skipped: u64,
    /// Records lost to a full buffer (BTINT = 1).
    pub lost: u64,
    /// Times the index went back to the base (BTINT = 0).
    pub wraps: u64,
    /// Every PMI, in order.
    pub pmis: Vec<BtsPmi>,
}

/// A processor writing BTS records.
#[derive(Debug, Clone)]
pub struct BtsSim {
    config: BtsConfig,
    mode: BtsMode,
    buffer: Vec<u8>,
    /// The BTS index, as an offset from the base.
    index: u64,
}

impl BtsSim {
    /// A processor programmed with `config`, its buffer zero-filled.
    ///
    /// The BTS fields are checked as `DsManagementArea::check_bts` does,
    /// except that a circular buffer with its threshold inside the buffer is
    /// simulated (it interrupts, as the SDM warns) rather than refused.
    pub fn new(config: BtsConfig) -> Result<Self, BtsSimError> {
        let mode = config.debugctl.bts_mode();
        let area = config.area;
        match area.check_bts(config.format, mode) {
            Ok(_) | Err(DsError::CircularWithThreshold { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        // With BTS off, check_bts does not look at the geometry; the buffer
        // is still allocated as described.
        let bytes = area
            .bts_absolute_maximum
            .checked_sub(area.bts_buffer_base)
            .ok_or(DsError::BufferTooSmall {
                base: area.bts_buffer_base,
                max: area.bts_absolute_maximum,
                record: config.format.bts_record_size(),
            })?;
        if bytes > MAX_BUFFER_BYTES {
            return Err(BtsSimError::BufferTooLarge { bytes });
        }
        let index = area
            .bts_index
            .saturating_sub(area.bts_buffer_base)
            .min(bytes);
        Ok(Self {
            config,
            mode,
            buffer: vec![0; bytes as usize],
            index,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &BtsConfig {
        &self.config
    }

    /// The BTS index (a linear address), as the DS area holds it now.
    pub fn index(&self) -> u64 {
        self.config.area.bts_buffer_base + self.index
    }

    /// Records between the base and the index.
    pub fn records_before_index(&self) -> u64 {
        self.index / self.config.format.bts_record_size()
    }

    fn stores(&self, branch: &Branch) -> bool {
        let ctl = self.config.debugctl;
        let on = matches!(
            self.mode,
            BtsMode::CircularBuffer | BtsMode::InterruptOnThreshold
        );
        let cpl_off = if branch.from_cpl == 0 {
            ctl.get(DebugCtlFlag::BtsOffOs)
        } else {
            ctl.get(DebugCtlFlag::BtsOffUsr)
        };
        on && !cpl_off
    }

    /// Executes one branch (number `n` of the stream, for error messages).
    pub fn step(&mut self, n: usize, branch: &Branch) -> Result<BtsStep, BtsSimError> {
        if !self.stores(branch) {
            return Ok(BtsStep::Skipped);
        }
        let size = self.config.format.bts_record_size();
        let end = self.buffer.len() as u64;
        if self.index + size > end {
            if self.mode != BtsMode::CircularBuffer {
                return Ok(BtsStep::Lost);
            }
            // Armed with the index at the very end: circular mode goes
            // back to the base before writing.
            self.index = 0;
        }
        let record = BtsRecord {
            from: branch.from,
            to: branch.to,
            predicted: !branch.mispredicted.unwrap_or(false),
        };
        let at = self.index as usize;
        record
            .write(self.config.format, &mut self.buffer[at..])
            .map_err(|error| BtsSimError::Record { branch: n, error })?;
        let slot = self.index / size;
        self.index += size;
        let pmi = self.index() == self.config.area.bts_interrupt_threshold;
        let wrapped = self.mode == BtsMode::CircularBuffer && self.index + size > end;
        if wrapped {
            self.index = 0;
        }
        Ok(BtsStep::Written { slot, pmi, wrapped })
    }

    /// What seed 001's interrupt handler does: copy the records between
    /// base and index out (oldest first, raw bytes) and put the index back
    /// at the base.
    pub fn drain(&mut self) -> Vec<u8> {
        let out = self.buffer[..self.index as usize].to_vec();
        self.index = 0;
        out
    }

    /// Runs `branches` through the processor. `on_pmi` is the interrupt
    /// handler, called [`BtsConfig::pmi_latency`] branches after each PMI
    /// (or at the end of the stream if it comes first).
    pub fn run(
        &mut self,
        branches: &[Branch],
        mut on_pmi: impl FnMut(&mut Self, &BtsPmi),
    ) -> Result<BtsReport, BtsSimError> {
        let mut report = BtsReport::default();
        // (PMI, branches left before the handler runs)
        let mut pending: Option<(BtsPmi, u32)> = None;
        for (n, branch) in branches.iter().enumerate() {
            match self.step(n, branch)? {
                BtsStep::Skipped => report.skipped += 1,
                BtsStep::Lost => report.lost += 1,
                BtsStep::Written { pmi, wrapped, .. } => {
                    report.written += 1;
                    report.wraps += u64::from(wrapped);
                    if pmi && pending.is_none() {
                        let p = BtsPmi {
                            branch: n,
                            records: self.records_before_index(),
                            records_at_handler: 0,
                        };
                        pending = Some((p, self.config.pmi_latency));
                    }
                }
            }
            if let Some((p, left)) = pending.as_mut() {
                if *left == 0 {
                    let mut p = *p;
                    p.records_at_handler = self.records_before_index();
                    pending = None;
                    on_pmi(self, &p);
                    report.pmis.push(p);
                } else {
                    *left -= 1;
                }
            }
        }
        if let Some((mut p, _)) = pending {
            p.records_at_handler = self.records_before_index();
            on_pmi(self, &p);
            report.pmis.push(p);
        }
        Ok(report)
    }

    /// Runs `branches` with the draining handler; returns the report and
    /// every record drained, oldest first, as raw bytes (what
    /// `BtsDump::raw` reads). Records still in the buffer at the end stay
    /// there ([`buffer`](Self::buffer), up to [`index`](Self::index)).
    pub fn run_draining(
        &mut self,
        branches: &[Branch],
    ) -> Result<(BtsReport, Vec<u8>), BtsSimError> {
        let mut drained = Vec::new();
        let report = self.run(branches, |sim, _| drained.extend(sim.drain()))?;
        Ok((report, drained))
    }

    /// The DS management area as memory holds it now (the index updated).
    pub fn area(&self) -> DsManagementArea {
        DsManagementArea {
            bts_index: self.index(),
            ..self.config.area
        }
    }

    /// The DS management area's bytes in the configured layout (an error
    /// only if a pointer is too wide for the 32-bit layout).
    pub fn area_bytes(&self) -> Result<Vec<u8>, DsError> {
        let mut out = vec![0; self.config.format.area_size()];
        self.area().write(self.config.format, &mut out)?;
        Ok(out)
    }

    /// The BTS buffer's bytes, base to absolute maximum.
    pub fn buffer(&self) -> &[u8] {
        &self.buffer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::branch::BranchKind;
    use hwtrace_regs::debugctl::DebugCtlLayout;
    use hwtrace_types::Ip;

    fn ctl(layout: DebugCtlLayout, flags: &[DebugCtlFlag]) -> DebugCtl {
        flags.iter().fold(DebugCtl::new(layout), |c, f| {
            c.with(*f, true).expect("flag exists")
        })
    }

    fn config(capacity: u64, threshold: u64, flags: &[DebugCtlFlag]) -> BtsConfig {
        let base = 0x1000;
        BtsConfig {
            format: DsFormat::Bits64,
            area: DsManagementArea {
                bts_buffer_base: base,
                bts_index: base,
                bts_absolute_maximum: base + capacity * 24,
                bts_interrupt_threshold: base + threshold * 24,
                ..DsManagementArea::default()
            },
            debugctl: ctl(DebugCtlLayout::Modern, flags),
            pmi_latency: 0,
        }
    }

    fn b(i: u64, cpl: u8) -> Branch {
        Branch {
            from_cpl: cpl,
            to_cpl: cpl,
            ..Branch::user(Ip(0x100 + i), Ip(0x200 + i), BranchKind::Jcc)
        }
    }

    use DebugCtlFlag as F;

    #[test]
    fn cpl_filters_and_disabled_bts_skip() {
        let mut sim = BtsSim::new(config(8, 9, &[F::Tr, F::Bts, F::BtsOffOs])).expect("valid");
        assert_eq!(sim.step(0, &b(0, 0)), Ok(BtsStep::Skipped));
        assert!(matches!(
            sim.step(1, &b(1, 3)),
            Ok(BtsStep::Written { slot: 0, .. })
        ));
        let mut sim = BtsSim::new(config(8, 9, &[F::Tr, F::Bts, F::BtsOffUsr])).expect("valid");
        assert_eq!(sim.step(0, &b(0, 3)), Ok(BtsStep::Skipped));
        assert!(matches!(sim.step(1, &b(1, 0)), Ok(BtsStep::Written { .. })));
        // TR alone sends messages on the bus: nothing stored.
        let mut sim = BtsSim::new(config(8, 9, &[F::Tr])).expect("valid");
        assert_eq!(sim.step(0, &b(0, 3)), Ok(BtsStep::Skipped));
    }

    #[test]
    fn circular_buffer_armed_at_its_end_writes_at_the_base() {
        let mut c = config(3, 4, &[F::Tr, F::Bts]);
        c.area.bts_index = c.area.bts_absolute_maximum;
        let mut sim = BtsSim::new(c).expect("index at the maximum is allowed");
        assert!(matches!(
            sim.step(0, &b(0, 3)),
            Ok(BtsStep::Written { slot: 0, .. })
        ));
    }

    #[test]
    fn circular_wraps_and_interrupt_mode_loses() {
        let mut sim = BtsSim::new(config(3, 4, &[F::Tr, F::Bts])).expect("valid");
        let steps: Vec<_> = (0..4).map(|i| sim.step(i as usize, &b(i, 3))).collect();
        assert_eq!(
            steps[2],
            Ok(BtsStep::Written {
                slot: 2,
                pmi: false,
                wrapped: true
            })
        );
        assert!(matches!(steps[3], Ok(BtsStep::Written { slot: 0, .. })));
        let mut sim = BtsSim::new(config(3, 2, &[F::Tr, F::Bts, F::Btint])).expect("valid");
        let steps: Vec<_> = (0..4).map(|i| sim.step(i as usize, &b(i, 3))).collect();
        assert_eq!(
            steps[1],
            Ok(BtsStep::Written {
                slot: 1,
                pmi: true,
                wrapped: false
            })
        );
        assert_eq!(steps[3], Ok(BtsStep::Lost));
    }

    #[test]
    fn circular_buffer_with_threshold_inside_still_interrupts() {
        let mut sim = BtsSim::new(config(4, 2, &[F::Tr, F::Bts])).expect("simulated, not refused");
        let report = sim
            .run(&(0..6).map(|i| b(i, 3)).collect::<Vec<_>>(), |_, _| {})
            .expect("runs");
        // Records 1 and 5 reach the threshold (slot 2 is next each time).
        assert_eq!(
            report.pmis.iter().map(|p| p.branch).collect::<Vec<_>>(),
            vec![1, 5]
        );
        assert_eq!(report.wraps, 1);
    }

    #[test]
    fn bad_geometry_and_wide_addresses_are_errors() {
        let mut c = config(8, 6, &[F::Tr, F::Bts, F::Btint]);
        c.area.bts_index += 3;
        assert!(matches!(
            BtsSim::new(c),
            Err(BtsSimError::Area(DsError::NotOnRecordBoundary { .. }))
        ));
        let mut c = config(8, 6, &[F::Tr, F::Bts, F::Btint]);
        c.area.bts_absolute_maximum = c.area.bts_buffer_base + 24 * (1 << 24);
        assert!(matches!(
            BtsSim::new(c),
            Err(BtsSimError::BufferTooLarge { .. })
        ));
        let mut c = config(8, 6, &[F::Tr, F::Bts, F::Btint]);
        c.format = DsFormat::Bits32;
        c.area.bts_absolute_maximum = c.area.bts_buffer_base + 8 * 12;
        c.area.bts_interrupt_threshold = c.area.bts_buffer_base + 6 * 12;
        let mut sim = BtsSim::new(c).expect("valid");
        let wide = Branch::user(Ip(0xFFFF_8000_0000_1000), Ip(0x10), BranchKind::NearRet);
        assert!(matches!(
            sim.step(7, &wide),
            Err(BtsSimError::Record { branch: 7, .. })
        ));
    }
}
