//! Resynchronising after an error at the next IP the trace gives, as
//! libipt 2.3's ptxed does with `--resync-on-error`.

use super::{Flow, InsnDecoder};
use crate::error::{Error, ErrorKind};
use crate::event::{Event, EventKind, Status};
use hwtrace_types::{ReadMemory, TraceOffset};

impl<M: ReadMemory> InsnDecoder<'_, M> {
    /// After an error: goes on at the next IP the trace gives (a TIP, an
    /// asynchronous branch, PSB+, an overflow's FUP) instead of the next
    /// PSB, reporting the events on the way (ptxed's
    /// `--resync-on-error`). TNT bits up to there are dropped.
    pub fn resync(&mut self) -> Result<Status, Error> {
        self.postponed = None;
        self.bound_paging = false;
        self.bound_vmcs = false;
        self.bound_ptwrite = false;
        self.resyncing = true;
        if self.process_event {
            // The event that was waiting goes first; a status report that
            // failed fails again.
            if self.event.status_update && !matches!(self.event.kind, EventKind::Enabled { .. }) {
                self.process_event().map_err(|k| self.err(k))?;
            }
            self.process_event = false;
            let (ev, offset) = (self.event, self.event_offset);
            if let Some(status) = self.resync_at(ev, offset).map_err(|k| self.err(k))? {
                return Ok(status);
            }
        }
        self.resync_step().map_err(|k| self.err(k))
    }

    /// Resynchronising, looks at one event: `Some` when decoding (or
    /// event reporting) can go on.
    pub(super) fn resync_at(&mut self, ev: Event, offset: TraceOffset) -> Flow<Option<Status>> {
        match ev.kind {
            EventKind::Tnt { .. } => Ok(None),
            EventKind::Tip { ip } => {
                if ev.ip_suppressed {
                    return Ok(None);
                }
                self.ip = ip;
                self.enabled = true;
                self.resyncing = false;
                self.icount = 0;
                self.check_ip_event(None).map(Some)
            }
            EventKind::Enabled { ip, .. } if ev.status_update && !ev.ip_suppressed => {
                self.ip = ip;
                self.enabled = true;
                self.resyncing = false;
                self.check_ip_event(None).map(Some)
            }
            EventKind::Enabled { .. } if self.enabled => {
                // Tracing was on as far as we knew: it must have been
                // disabled in what the error skipped. Say so first.
                self.stashed = Some((ev, offset));
                let mut disabled = ev;
                disabled.kind = EventKind::Disabled { ip: 0 };
                disabled.ip_suppressed = true;
                self.event = disabled;
                self.event_offset = offset;
                self.process_event = true;
                self.resyncing = true;
                Ok(Some(self.insn_status(true)))
            }
            kind => {
                match kind {
                    EventKind::AsyncBranch { from, .. } => {
                        // Take the branch from wherever the error left us.
                        self.ip = from;
                        self.enabled = true;
                        self.resyncing = false;
                    }
                    EventKind::Enabled { .. } => {
                        self.enabled = false;
                        self.resyncing = false;
                    }
                    EventKind::Overflow { .. }
                    | EventKind::Disabled { .. }
                    | EventKind::AsyncDisabled { .. } => self.resyncing = false,
                    _ => {}
                }
                self.event = ev;
                self.event_offset = offset;
                self.process_event = true;
                if let Some(ip) = resume_ip(&ev) {
                    // An event placed by a FUP tells where execution is:
                    // go on from there and let the event bind as usual.
                    self.ip = ip;
                    self.enabled = true;
                    self.resyncing = false;
                    return self.check_ip_event(None).map(Some);
                }
                Ok(Some(self.insn_status(true)))
            }
        }
    }

    pub(super) fn resync_step(&mut self) -> Flow<Status> {
        self.resyncing = true;
        loop {
            let offset = self.query.offset();
            let (ev, status) = match self.query.next_any() {
                Ok(x) => x,
                Err(ErrorKind::Eos) => {
                    self.resyncing = false;
                    self.status = Status {
                        eos: true,
                        ..Status::default()
                    };
                    return Ok(self.insn_status(false));
                }
                Err(e) => return Err(e),
            };
            self.status = status;
            if let Some(status) = self.resync_at(ev, offset)? {
                return Ok(status);
            }
        }
    }
}

/// The IP an event gives that decoding can resume at after an error.
fn resume_ip(ev: &Event) -> Option<u64> {
    if ev.ip_suppressed || ev.status_update {
        return None;
    }
    match ev.kind {
        EventKind::Tsx { ip, .. }
        | EventKind::ExecMode { ip, .. }
        | EventKind::Iflags { ip, .. }
        | EventKind::Ptwrite { ip, .. }
        | EventKind::Exstop { ip }
        | EventKind::Mwait { ip, .. }
        | EventKind::AsyncPaging { ip, .. }
        | EventKind::AsyncVmcs { ip, .. } => Some(ip),
        _ => None,
    }
}
