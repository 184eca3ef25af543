//! One Intel PT AUX queue as decoder items, over the right code at each
//! point: the one implementation behind `hwtrace perf decode` (which
//! prints the items, [`super::stream`]) and the answers front end (which
//! maps them to `Exec` records).
//!
//! A queue's thread is the per-thread queue's own, or on a per-CPU queue
//! the one thread that ever ran there. Where several processes ran on the
//! CPU (timed switch records say when), or a process exec'd another
//! program, the code image follows the program running at each timed
//! event (PSB+, TSC packets at enables): two programs may map different
//! code at one address. Image 0 holds the code of every process that may
//! run here: the fallback before the first timed event and for threads of
//! unknown process.

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::rc::Rc;

use anyhow::Result;
use hwtrace_flow::insn::{FastDecoder, InsnDecoder};
use hwtrace_flow::parallel::FastSource;
use hwtrace_mem::image::Image;
use hwtrace_perf::data::{AuxQueue, QueueKey, TscConversion};

use super::drive::{Driver, Switcher};
use super::image::{self, BuildIdCache, ImageOptions, Missing, ProcessImage};
use super::kernel::Kernel;
use super::sideband::Sideband;
use super::stream::{MAX_JOIN, PtSettings, perf_time};

/// The thread and image at each timed event: on a per-CPU queue the
/// thread switched in last at the event's perf time runs (per-thread
/// queues have theirs), with the image of its process's program at that
/// time (an exec starts a new one).
struct Timeline<'s> {
    sb: &'s Sideband,
    cpu: u32,
    /// The queue's thread, on per-thread queues.
    fixed_tid: Option<u32>,
    tsc: TscConversion,
    /// Image index per process and program (see
    /// [`Sideband::generation_at`]).
    image_of: &'s BTreeMap<(u32, usize), usize>,
    tid: Rc<Cell<Option<u32>>>,
    current: Rc<Cell<usize>>,
}

impl Switcher for Timeline<'_> {
    fn at_tsc(&mut self, tsc: u64) -> Option<usize> {
        let time = perf_time(&self.tsc, tsc);
        let tid = match self.fixed_tid {
            Some(t) => t,
            None => self.sb.thread_at(self.cpu, time)?,
        };
        self.tid.set(Some(tid));
        let &pid = self.sb.pid_of.get(&tid)?;
        let generation = self.sb.generation_at(pid, time);
        let i = *self.image_of.get(&(pid, generation))?;
        (i != self.current.get()).then(|| {
            self.current.set(i);
            i
        })
    }
}

/// No timeline (a queue with one thread, or none known): nothing
/// switches.
impl Switcher for Option<Timeline<'_>> {
    fn at_tsc(&mut self, tsc: u64) -> Option<usize> {
        self.as_mut()?.at_tsc(tsc)
    }
}

/// One queue's images and time line, ready to decode its runs.
pub struct QueueFlow<'s> {
    key: QueueKey,
    settings: PtSettings,
    /// The thread running (changed by the time line at timed events).
    tid: Rc<Cell<Option<u32>>>,
    /// Queues with a time line (per-CPU queues with timed switch records,
    /// processes that exec'd): the sideband, and the queue's own thread on
    /// per-thread queues.
    timeline: Option<(&'s Sideband, Option<u32>)>,
    /// Image 0: every process that may run here; with a time line, image
    /// `i > 0` holds one program's.
    images: Vec<ProcessImage>,
    image_of: BTreeMap<(u32, usize), usize>,
    /// The image decoding uses now.
    current: Rc<Cell<usize>>,
    /// Threads that ran on this per-CPU queue when no timed switch records
    /// tell them apart (their instructions cannot be attributed).
    unattributed: Option<usize>,
}

impl<'s> QueueFlow<'s> {
    /// Works out the queue's thread and time line and builds the images
    /// (files found as `opts` says, build ids read through `build_ids`,
    /// kernel code from `kernel`).
    pub fn new(
        key: QueueKey,
        sb: &'s Sideband,
        settings: PtSettings,
        opts: &ImageOptions,
        kernel: &Kernel,
        build_ids: &mut BuildIdCache,
    ) -> Result<Self> {
        let has_time = settings.tsc.cap_user_time_zero || settings.tsc.time_mult != 0;
        let switched = key.tid == u32::MAX
            && key.cpu != u32::MAX
            && sb.switches.contains_key(&key.cpu)
            && has_time;
        let mut unattributed = None;
        let tid = if key.tid != u32::MAX {
            Some(key.tid)
        } else if key.cpu != u32::MAX {
            let t = sb.only_thread_on(key.cpu);
            if t.is_none() && !switched {
                unattributed = Some(sb.thread_count_on(key.cpu));
            }
            t
        } else {
            None
        };
        // The processes that may run here: those switched in on this CPU,
        // or the queue's thread's.
        let pids: Option<BTreeSet<u32>> = if switched {
            Some(sb.pids_switched_in(key.cpu))
        } else {
            tid.and_then(|t| sb.pid_of.get(&t))
                .map(|&p| BTreeSet::from([p]))
        };
        let execs = has_time && pids.iter().flatten().any(|&p| sb.generations(p) > 1);
        let timed = switched || execs;
        let mut images = vec![image::build_with_kernel(
            sb,
            pids.as_ref(),
            opts,
            kernel,
            build_ids,
        )?];
        let mut image_of = BTreeMap::new();
        if timed {
            for &pid in pids.iter().flatten() {
                for generation in 0..sb.generations(pid) {
                    image_of.insert((pid, generation), images.len());
                    images.push(image::build_program(
                        sb, pid, generation, opts, kernel, build_ids,
                    )?);
                }
            }
        }
        Ok(Self {
            key,
            settings,
            tid: Rc::new(Cell::new(tid)),
            timeline: timed.then_some((sb, tid.filter(|_| !switched))),
            images,
            image_of,
            current: Rc::new(Cell::new(0)),
            unattributed,
        })
    }

    /// The queue.
    pub fn key(&self) -> QueueKey {
        self.key
    }

    /// The thread running at the last item (`None`: not known).
    pub fn tid(&self) -> Option<u32> {
        self.tid.get()
    }

    /// How many threads ran on this per-CPU queue when no timed switch
    /// records say which ran when (`None`: the thread is known, or a time
    /// line tells).
    pub fn unattributed_threads(&self) -> Option<usize> {
        self.unattributed
    }

    /// The image decoding uses at the last item (to blame an error on
    /// the missing mapping it fell in).
    pub fn image(&self) -> &ProcessImage {
        &self.images[self.current.get().min(self.images.len() - 1)]
    }

    /// The mappings that could not be loaded, over all images (the same
    /// mapping may be listed twice).
    pub fn missing(&self) -> impl Iterator<Item = &Missing> {
        self.images.iter().flat_map(|i| &i.missing)
    }

    /// The one code image of a queue without a time line (a queue of one
    /// process that never exec'd, or of threads no timed switch records
    /// tell apart): then nothing switches, and a counted decode may split
    /// the queue's runs among threads. `None` where the image follows
    /// timed events.
    pub fn fixed_image(&self) -> Option<&Image> {
        self.timeline.is_none().then(|| &self.images[0].image)
    }

    /// The decoder configuration the recording's settings give.
    pub fn config(&self) -> hwtrace_flow::Config {
        self.settings.config
    }

    /// The items of one run's `trace` ([`runs`]), the image switched at
    /// each timed event. Each run starts over with the image of every
    /// process that ran here, until a timed event says which one runs;
    /// [`Self::tid`] and [`Self::image`] follow the items.
    pub fn items<'t>(
        &'t self,
        trace: &'t [u8],
    ) -> Driver<'t, InsnDecoder<'t, &'t Image>, impl Switcher + 't> {
        let dec = InsnDecoder::new(trace, self.settings.config, &self.images[0].image);
        Driver::new(dec, &self.images, self.switcher())
    }

    /// [`Self::items`], runs of plain code to be handed out whole
    /// ([`Driver::visit_runs`], [`Driver::skip_runs`]).
    pub fn runs<'t>(
        &'t self,
        trace: &'t [u8],
    ) -> Driver<'t, FastSource<'t, &'t Image>, impl Switcher + 't> {
        let dec = FastDecoder::new(trace, self.settings.config, &self.images[0].image);
        Driver::runs(dec, &self.images, self.switcher())
    }

    /// What picks the image at each timed event (each run starts over with
    /// the first).
    fn switcher(&self) -> Option<Timeline<'_>> {
        self.current.set(0);
        self.timeline.map(|(sb, fixed_tid)| Timeline {
            sb,
            cpu: self.key.cpu,
            fixed_tid,
            tsc: self.settings.tsc,
            image_of: &self.image_of,
            tid: Rc::clone(&self.tid),
            current: Rc::clone(&self.current),
        })
    }
}

/// A stretch of a queue decoded as one trace: contiguous AUXTRACE buffers
/// joined (a packet may straddle two).
#[derive(Debug)]
pub struct Run<'q> {
    /// Where it starts in the queue's stream.
    pub start: u64,
    /// The bytes (borrowed from the file when the run is one buffer).
    pub trace: Cow<'q, [u8]>,
}

/// The runs of `queue`, split at gaps and at [`MAX_JOIN`] bytes; each is
/// joined only when it is reached, so one run at a time is in memory.
pub fn runs<'q>(queue: &AuxQueue<'q>) -> impl Iterator<Item = Run<'q>> {
    let chunks = &queue.chunks;
    run_ranges(queue).into_iter().map(move |r| {
        let start = chunks[r.start].stream_offset;
        let trace = if r.len() == 1 {
            Cow::Borrowed(chunks[r.start].data)
        } else {
            Cow::Owned(
                chunks[r]
                    .iter()
                    .flat_map(|c| c.data.iter().copied())
                    .collect(),
            )
        };
        Run { start, trace }
    })
}

/// Index ranges of `queue.chunks` to decode as one trace.
fn run_ranges(queue: &AuxQueue<'_>) -> Vec<Range<usize>> {
    let gap_at: BTreeSet<_> = queue.gaps.iter().map(|g| g.record_offset).collect();
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 0usize;
    for (i, c) in queue.chunks.iter().enumerate() {
        if i > start && (gap_at.contains(&c.record_offset) || bytes + c.data.len() > MAX_JOIN) {
            out.push(start..i);
            start = i;
            bytes = 0;
        }
        bytes += c.data.len();
    }
    if start < queue.chunks.len() {
        out.push(start..queue.chunks.len());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use hwtrace_perf::data::{AuxChunk, AuxGap, FileOffset};

    fn chunk(n: u64, data: &'static [u8], stream_offset: u64) -> AuxChunk<'static> {
        AuxChunk {
            record_offset: FileOffset(n * 0x100),
            aux_offset: stream_offset,
            stream_offset,
            data,
        }
    }

    #[test]
    fn runs_split_at_gaps_only() {
        static A: [u8; 8] = [1; 8];
        static B: [u8; 8] = [2; 8];
        let queue = AuxQueue {
            chunks: vec![
                chunk(1, &A, 0),
                chunk(2, &B, 8),
                chunk(3, &A, 16),
                chunk(4, &B, 24),
            ],
            gaps: vec![AuxGap {
                stream_offset: 16,
                record_offset: FileOffset(0x300),
                expected_aux_offset: 16,
                found_aux_offset: 48,
            }],
        };
        assert_eq!(run_ranges(&queue), [0..2, 2..4]);
        let all: Vec<Run<'_>> = runs(&queue).collect();
        assert_eq!(all.len(), 2);
        assert_eq!((all[0].start, all[1].start), (0, 16));
        assert_eq!(&all[0].trace[..], [[1u8; 8], [2; 8]].concat());
        assert_eq!(runs(&AuxQueue::default()).count(), 0);
    }
}
