//! The call stack state machine: [`Exec`] records in, frame entries and
//! exits out (to a [`CallSink`]). The rules are in the module docs of
//! [`crate::calls`].

use super::functions::{CodeAddr, FuncId, Functions, Symbolize};
use crate::exec::{Exec, ExecRun, GapKind};
use hwtrace_flow::insn::InsnClass;
use hwtrace_types::hash::BuildIntHasher;
use hwtrace_types::{Cr3, Ip, TraceOffset, Tsc};
use std::collections::HashMap;
use std::io;

/// The deepest stack kept per thread. A flow whose calls never return
/// (returns hidden by filters, or code that calls without returning)
/// would otherwise grow without bound; when a call would go deeper, every
/// frame ends ([`ExitHow::DepthLimit`]) and the stack starts again from
/// the called function.
pub const MAX_DEPTH: usize = 16_384;

/// A thread as the trace names it, or the CPU when the trace does not
/// say which thread ran (per-CPU recordings without switch records).
/// Records before the first [`Exec::Thread`] belong to
/// `ThreadKey::default()` (nothing known).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ThreadKey {
    /// Process id, if known.
    pub pid: Option<u32>,
    /// Thread id, if known.
    pub tid: Option<u32>,
    /// The CPU, when the thread is not known (a thread known by its id is
    /// one stack wherever it ran).
    pub cpu: Option<u32>,
}

impl ThreadKey {
    /// The key of an [`Exec::Thread`] record.
    pub fn new(pid: Option<u32>, tid: Option<u32>, cpu: Option<u32>) -> Self {
        Self {
            pid,
            tid,
            cpu: if tid.is_some() { None } else { cpu },
        }
    }
}

impl std::fmt::Display for ThreadKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.pid, self.tid, self.cpu) {
            (Some(pid), Some(tid), _) => write!(f, "thread {pid}/{tid}"),
            (None, Some(tid), _) => write!(f, "thread {tid}"),
            (_, None, Some(cpu)) => write!(f, "cpu {cpu}"),
            (Some(pid), None, None) => write!(f, "process {pid}"),
            (None, None, None) => f.write_str("trace"),
        }
    }
}

/// A point of the flow: how many instructions had executed before it (in
/// all threads, in trace order) and the latest time the trace gave.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Stamp {
    /// Instructions executed before this point, all threads together
    /// (for BTS/LBR input, branch records).
    pub insns: u64,
    /// The latest timestamp seen, if the trace has any.
    pub tsc: Option<Tsc>,
}

/// How a frame came to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// Entered by a call the trace shows.
    Called,
    /// The function the trace began (or resumed after lost data) inside:
    /// its entry was not seen.
    Resumed,
    /// A caller the flow returned into above the outermost frame: entered
    /// before the trace began; it encloses everything seen before.
    Caller,
}

/// Where a return to this frame's caller must go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RetAddr {
    /// Not known (the frame was not entered by a call we saw).
    Unknown,
    /// Exactly here (the instruction after the call).
    Exact(Ip),
    /// Just after the call instruction at this address, whose length is
    /// not known (branch-only input: BTS, LBR).
    After(Ip),
}

impl RetAddr {
    fn matches(self, to: Ip) -> bool {
        match self {
            RetAddr::Unknown => false,
            RetAddr::Exact(ip) => ip == to,
            // x86 instructions are at most 15 bytes long.
            RetAddr::After(call) => to.0 > call.0 && to.0 - call.0 <= 15,
        }
    }
}

/// One open frame of a thread's stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The function.
    pub func: FuncId,
    /// Its entry address ([`FrameKind::Called`]), or the first address
    /// seen in it.
    pub ip: Ip,
    /// How the frame came to be.
    pub kind: FrameKind,
    /// When it was entered (for [`FrameKind::Resumed`] and
    /// [`FrameKind::Caller`], when the trace began showing it).
    pub entered: Stamp,
    ret: RetAddr,
    /// The thread's instruction count when it was entered.
    thread_insns_at_entry: u64,
    /// Instructions executed in frames above it that have ended.
    child_insns: u64,
}

impl Frame {
    /// Instructions executed in this frame and the frames it called, up
    /// to `now_thread_insns` (the thread's count, [`Context::thread_insns`]).
    pub fn total_insns(&self, now_thread_insns: u64) -> u64 {
        now_thread_insns.saturating_sub(self.thread_insns_at_entry)
    }

    /// Instructions executed in this frame itself.
    pub fn self_insns(&self, now_thread_insns: u64) -> u64 {
        self.total_insns(now_thread_insns)
            .saturating_sub(self.child_insns)
    }
}

/// Why a frame ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExitHow {
    /// Its function returned.
    Return,
    /// A return to a frame further down skipped it (longjmp, exception
    /// unwinding).
    Unwound,
    /// Trace data was lost here: what happened next is unknown.
    Gap(GapKind),
    /// The trace ended with the frame open.
    End,
    /// The stack reached [`MAX_DEPTH`].
    DepthLimit,
}

/// What a sink is told along with each event.
#[derive(Debug)]
pub struct Context<'a> {
    /// The thread.
    pub thread: ThreadKey,
    /// The function names.
    pub funcs: &'a Functions,
    /// Now.
    pub now: Stamp,
    /// The thread's instruction count now.
    pub thread_insns: u64,
}

/// Receives the call structure as it is rebuilt. `stack` is the thread's
/// stack, outermost frame first, at the moment of the event.
pub trait CallSink {
    /// A thread's first record.
    fn thread(&mut self, _cx: &Context<'_>) -> io::Result<()> {
        Ok(())
    }
    /// A stack begins: `stack` holds one [`FrameKind::Resumed`] frame.
    fn begin(&mut self, _cx: &Context<'_>, _stack: &[Frame]) -> io::Result<()> {
        Ok(())
    }
    /// The top frame of `stack` was just entered by a call.
    fn enter(&mut self, _cx: &Context<'_>, _stack: &[Frame]) -> io::Result<()> {
        Ok(())
    }
    /// The top frame of `stack` ends now.
    fn exit(&mut self, _cx: &Context<'_>, _stack: &[Frame], _how: ExitHow) -> io::Result<()> {
        Ok(())
    }
    /// The flow returned above the outermost frame: `stack` holds one new
    /// [`FrameKind::Caller`] frame, which encloses everything this stack
    /// showed before.
    fn caller(&mut self, _cx: &Context<'_>, _stack: &[Frame]) -> io::Result<()> {
        Ok(())
    }
    /// The flow breaks here (after the exits a lost-data gap causes).
    fn gap(&mut self, _cx: &Context<'_>, _offset: TraceOffset, _why: GapKind) -> io::Result<()> {
        Ok(())
    }
    /// A timestamp: `now.tsc` is the time from here on (the instructions
    /// counted in `now.insns` are before it).
    fn time(&mut self, _now: Stamp) -> io::Result<()> {
        Ok(())
    }
    /// The flow is over (after the exits of the frames left open).
    fn finish(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Several sinks fed from one decode, in order.
#[derive(Default)]
pub struct Sinks<'a>(pub Vec<&'a mut dyn CallSink>);

impl std::fmt::Debug for Sinks<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sinks({})", self.0.len())
    }
}

impl CallSink for Sinks<'_> {
    fn thread(&mut self, cx: &Context<'_>) -> io::Result<()> {
        self.0.iter_mut().try_for_each(|s| s.thread(cx))
    }
    fn begin(&mut self, cx: &Context<'_>, stack: &[Frame]) -> io::Result<()> {
        self.0.iter_mut().try_for_each(|s| s.begin(cx, stack))
    }
    fn enter(&mut self, cx: &Context<'_>, stack: &[Frame]) -> io::Result<()> {
        self.0.iter_mut().try_for_each(|s| s.enter(cx, stack))
    }
    fn exit(&mut self, cx: &Context<'_>, stack: &[Frame], how: ExitHow) -> io::Result<()> {
        self.0.iter_mut().try_for_each(|s| s.exit(cx, stack, how))
    }
    fn caller(&mut self, cx: &Context<'_>, stack: &[Frame]) -> io::Result<()> {
        self.0.iter_mut().try_for_each(|s| s.caller(cx, stack))
    }
    fn gap(&mut self, cx: &Context<'_>, offset: TraceOffset, why: GapKind) -> io::Result<()> {
        self.0.iter_mut().try_for_each(|s| s.gap(cx, offset, why))
    }
    fn time(&mut self, now: Stamp) -> io::Result<()> {
        self.0.iter_mut().try_for_each(|s| s.time(now))
    }
    fn finish(&mut self) -> io::Result<()> {
        self.0.iter_mut().try_for_each(|s| s.finish())
    }
}

/// What the previous instruction of a thread leaves to do once the next
/// one shows where the flow went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pending {
    None,
    Call(Ip),
    Return,
    /// Tracing was disabled: if it resumes at a frame's return address,
    /// that frame returned while it was off (a call out of the traced
    /// range, or into the kernel, that came back).
    Resume,
}

#[derive(Debug)]
struct ThreadState {
    key: ThreadKey,
    stack: Vec<Frame>,
    pending: Pending,
    insns: u64,
}

/// Rebuilds call stacks from [`Exec`] records, per thread.
#[derive(Debug)]
pub struct CallTracker {
    funcs: Functions,
    threads: Vec<ThreadState>,
    index: HashMap<ThreadKey, usize, BuildIntHasher>,
    current: Option<usize>,
    now: Stamp,
}

impl CallTracker {
    /// A tracker naming functions with `symbolize`.
    pub fn new(symbolize: Box<dyn Symbolize>) -> Self {
        Self {
            funcs: Functions::new(symbolize),
            threads: Vec::new(),
            index: HashMap::default(),
            current: None,
            now: Stamp::default(),
        }
    }

    /// The function names seen so far.
    pub fn functions(&self) -> &Functions {
        &self.funcs
    }

    /// Now: instructions so far and the latest time.
    pub fn now(&self) -> Stamp {
        self.now
    }

    /// Feeds one record.
    pub fn feed(&mut self, exec: &Exec, sink: &mut dyn CallSink) -> io::Result<()> {
        match *exec {
            Exec::Insn(insn) => self.run(&ExecRun::from(insn), sink),
            Exec::Run(ref run) | Exec::Stretch(ref run) => self.run(run, sink),
            Exec::Branch { from, to, class } => self.branch(from, to, class, sink),
            Exec::Gap { offset, why } => self.gap(offset, why, sink),
            Exec::Time(tsc) => {
                self.now.tsc = Some(Tsc(tsc));
                sink.time(self.now)
            }
            Exec::Thread { pid, tid, cpu } => {
                self.switch(ThreadKey::new(pid, tid, cpu), sink)?;
                Ok(())
            }
        }
    }

    /// Ends every open frame of every thread ([`ExitHow::End`]).
    pub fn finish(&mut self, sink: &mut dyn CallSink) -> io::Result<()> {
        for t in 0..self.threads.len() {
            self.unwind_all(t, ExitHow::End, sink)?;
        }
        sink.finish()
    }

    /// The index of `key`'s state, made current (telling the sink about
    /// a thread seen for the first time).
    fn switch(&mut self, key: ThreadKey, sink: &mut dyn CallSink) -> io::Result<usize> {
        if let Some(&t) = self.index.get(&key) {
            self.current = Some(t);
            return Ok(t);
        }
        let t = self.threads.len();
        self.threads.push(ThreadState {
            key,
            stack: Vec::new(),
            pending: Pending::None,
            insns: 0,
        });
        self.index.insert(key, t);
        self.current = Some(t);
        sink.thread(&self.cx(t))?;
        Ok(t)
    }

    fn current(&mut self, sink: &mut dyn CallSink) -> io::Result<usize> {
        match self.current {
            Some(t) => Ok(t),
            None => self.switch(ThreadKey::default(), sink),
        }
    }

    fn cx(&self, t: usize) -> Context<'_> {
        let state = &self.threads[t];
        Context {
            thread: state.key,
            funcs: &self.funcs,
            now: self.now,
            thread_insns: state.insns,
        }
    }

    /// Instructions in a row (one, or a run): the first settles what the
    /// one before it left pending, all are counted, and the last leaves its
    /// own (those between are plain: they change nothing else).
    fn run(&mut self, run: &ExecRun, sink: &mut dyn CallSink) -> io::Result<()> {
        let t = self.current(sink)?;
        let (cr3, ip) = (run.space.cr3, run.ip);
        let pending = std::mem::replace(&mut self.threads[t].pending, Pending::None);
        match pending {
            Pending::None => {}
            // A call to the next instruction only reads the IP.
            Pending::Call(ret) if ret == ip => {}
            Pending::Call(ret) => self.push(t, cr3, ip, RetAddr::Exact(ret), sink)?,
            Pending::Return => self.ret(t, cr3, ip, sink)?,
            Pending::Resume => self.resume(t, ip, sink)?,
        }
        if self.threads[t].stack.is_empty() {
            self.begin(t, cr3, ip, sink)?;
        }
        let n = u64::from(run.insns);
        let state = &mut self.threads[t];
        state.insns += n;
        self.now.insns += n;
        state.pending = match run.last_class {
            InsnClass::Call | InsnClass::FarCall if run.last_size > 0 => {
                Pending::Call(run.last_ip.add(u64::from(run.last_size)))
            }
            InsnClass::Return | InsnClass::FarReturn => Pending::Return,
            _ => Pending::None,
        };
        Ok(())
    }

    fn branch(
        &mut self,
        from: Ip,
        to: Ip,
        class: InsnClass,
        sink: &mut dyn CallSink,
    ) -> io::Result<()> {
        let t = self.current(sink)?;
        self.threads[t].pending = Pending::None;
        if self.threads[t].stack.is_empty() {
            self.begin(t, None, from, sink)?;
        }
        self.threads[t].insns += 1;
        self.now.insns += 1;
        match class {
            InsnClass::Call | InsnClass::FarCall => {
                self.push(t, None, to, RetAddr::After(from), sink)
            }
            InsnClass::Return | InsnClass::FarReturn => self.ret(t, None, to, sink),
            _ => Ok(()),
        }
    }

    fn gap(
        &mut self,
        offset: TraceOffset,
        why: GapKind,
        sink: &mut dyn CallSink,
    ) -> io::Result<()> {
        let t = self.current(sink)?;
        if why.flow_goes_on() {
            self.threads[t].pending = Pending::Resume;
        } else {
            self.unwind_all(t, ExitHow::Gap(why), sink)?;
        }
        sink.gap(&self.cx(t), offset, why)
    }

    /// The function at `ip` in thread `t`'s process and `cr3`.
    fn func(&mut self, t: usize, cr3: Option<Cr3>, ip: Ip) -> FuncId {
        let pid = self.threads[t].key.pid;
        self.funcs.at(CodeAddr { pid, cr3, ip })
    }

    fn begin(
        &mut self,
        t: usize,
        cr3: Option<Cr3>,
        ip: Ip,
        sink: &mut dyn CallSink,
    ) -> io::Result<()> {
        let func = self.func(t, cr3, ip);
        let state = &mut self.threads[t];
        state.stack.push(Frame {
            func,
            ip,
            kind: FrameKind::Resumed,
            entered: self.now,
            ret: RetAddr::Unknown,
            thread_insns_at_entry: state.insns,
            child_insns: 0,
        });
        sink.begin(&self.cx(t), &self.threads[t].stack)
    }

    fn push(
        &mut self,
        t: usize,
        cr3: Option<Cr3>,
        ip: Ip,
        ret: RetAddr,
        sink: &mut dyn CallSink,
    ) -> io::Result<()> {
        if self.threads[t].stack.len() >= MAX_DEPTH {
            self.unwind_all(t, ExitHow::DepthLimit, sink)?;
            return self.begin(t, cr3, ip, sink);
        }
        let func = self.func(t, cr3, ip);
        let state = &mut self.threads[t];
        state.stack.push(Frame {
            func,
            ip,
            kind: FrameKind::Called,
            entered: self.now,
            ret,
            thread_insns_at_entry: state.insns,
            child_insns: 0,
        });
        sink.enter(&self.cx(t), &self.threads[t].stack)
    }

    /// A return (or a return-like branch) went to `to`.
    fn ret(
        &mut self,
        t: usize,
        cr3: Option<Cr3>,
        to: Ip,
        sink: &mut dyn CallSink,
    ) -> io::Result<()> {
        let stack = &self.threads[t].stack;
        if let Some(k) = stack.iter().rposition(|f| f.ret.matches(to)) {
            while self.threads[t].stack.len() > k + 1 {
                self.pop(t, ExitHow::Unwound, sink)?;
            }
            return self.pop(t, ExitHow::Return, sink);
        }
        match stack.as_slice() {
            [only] if only.kind != FrameKind::Called => {
                let (start, thread_start) = (only.entered, only.thread_insns_at_entry);
                self.pop(t, ExitHow::Return, sink)?;
                let func = self.func(t, cr3, to);
                let state = &mut self.threads[t];
                state.stack.push(Frame {
                    func,
                    ip: to,
                    kind: FrameKind::Caller,
                    entered: start,
                    ret: RetAddr::Unknown,
                    thread_insns_at_entry: thread_start,
                    child_insns: state.insns - thread_start,
                });
                sink.caller(&self.cx(t), &self.threads[t].stack)
            }
            // Returned somewhere no frame expects: a jump.
            _ => Ok(()),
        }
    }

    /// Tracing resumed at `at` after being disabled: returns that happened
    /// meanwhile end the frames they left.
    fn resume(&mut self, t: usize, at: Ip, sink: &mut dyn CallSink) -> io::Result<()> {
        let stack = &self.threads[t].stack;
        if let Some(k) = stack.iter().rposition(|f| f.ret.matches(at)) {
            while self.threads[t].stack.len() > k {
                self.pop(t, ExitHow::Return, sink)?;
            }
        }
        Ok(())
    }

    fn pop(&mut self, t: usize, how: ExitHow, sink: &mut dyn CallSink) -> io::Result<()> {
        sink.exit(&self.cx(t), &self.threads[t].stack, how)?;
        let state = &mut self.threads[t];
        if let Some(done) = state.stack.pop() {
            let total = done.total_insns(state.insns);
            if let Some(parent) = state.stack.last_mut() {
                parent.child_insns += total;
            }
        }
        Ok(())
    }

    fn unwind_all(&mut self, t: usize, how: ExitHow, sink: &mut dyn CallSink) -> io::Result<()> {
        while !self.threads[t].stack.is_empty() {
            self.pop(t, how, sink)?;
        }
        self.threads[t].pending = Pending::None;
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::calls::HexNames;
    use crate::exec::ExecInsn;
    use hwtrace_types::AddressSpace;

    /// Builds Exec streams from a tiny program description.
    #[derive(Default)]
    pub(crate) struct Flow(pub Vec<Exec>);

    impl Flow {
        pub fn insn(mut self, ip: u64, class: InsnClass, size: u8) -> Self {
            self.0.push(Exec::Insn(ExecInsn {
                space: AddressSpace::UNKNOWN,
                ip: Ip(ip),
                size,
                class,
            }));
            self
        }
        /// `n` straight-line 1-byte instructions from `ip`.
        pub fn run(mut self, ip: u64, n: u64) -> Self {
            for k in 0..n {
                self = self.insn(ip + k, InsnClass::Other, 1);
            }
            self
        }
        /// A 5-byte call at `ip`.
        pub fn call(self, ip: u64) -> Self {
            self.insn(ip, InsnClass::Call, 5)
        }
        pub fn ret(self, ip: u64) -> Self {
            self.insn(ip, InsnClass::Return, 1)
        }
        pub fn jmp(self, ip: u64) -> Self {
            self.insn(ip, InsnClass::Jump, 2)
        }
        pub fn gap(mut self, why: GapKind) -> Self {
            self.0.push(Exec::Gap {
                offset: TraceOffset(0x40),
                why,
            });
            self
        }
        pub fn time(mut self, tsc: u64) -> Self {
            self.0.push(Exec::Time(tsc));
            self
        }
        pub fn thread(mut self, tid: u32) -> Self {
            self.0.push(Exec::Thread {
                pid: Some(1),
                tid: Some(tid),
                cpu: None,
            });
            self
        }
    }

    /// Records events as text lines.
    #[derive(Default)]
    struct Log(Vec<String>);

    impl CallSink for Log {
        fn begin(&mut self, cx: &Context<'_>, stack: &[Frame]) -> io::Result<()> {
            let f = stack[stack.len() - 1];
            self.0.push(format!("begin {}", cx.funcs.name(f.func)));
            Ok(())
        }
        fn enter(&mut self, cx: &Context<'_>, stack: &[Frame]) -> io::Result<()> {
            let f = stack[stack.len() - 1];
            self.0
                .push(format!("enter {} d{}", cx.funcs.name(f.func), stack.len()));
            Ok(())
        }
        fn exit(&mut self, cx: &Context<'_>, stack: &[Frame], how: ExitHow) -> io::Result<()> {
            let f = stack[stack.len() - 1];
            self.0.push(format!(
                "exit {} {:?} total {} self {}",
                cx.funcs.name(f.func),
                how,
                f.total_insns(cx.thread_insns),
                f.self_insns(cx.thread_insns)
            ));
            Ok(())
        }
        fn caller(&mut self, cx: &Context<'_>, stack: &[Frame]) -> io::Result<()> {
            self.0
                .push(format!("caller {}", cx.funcs.name(stack[0].func)));
            Ok(())
        }
        fn gap(&mut self, _: &Context<'_>, offset: TraceOffset, why: GapKind) -> io::Result<()> {
            self.0.push(format!("gap {offset} {why:?}"));
            Ok(())
        }
    }

    /// The events of `flow`, the same with its instructions gathered
    /// into runs (of every length up to 5, and whole).
    fn events(flow: Flow) -> Vec<String> {
        let feed = |execs: &[Exec]| {
            let mut tracker = CallTracker::new(Box::new(HexNames));
            let mut log = Log::default();
            for e in execs {
                tracker.feed(e, &mut log).unwrap();
            }
            tracker.finish(&mut log).unwrap();
            log.0
        };
        let one_by_one = feed(&flow.0);
        for max in [1, 2, 3, 5, u32::MAX] {
            let runs = crate::exec::as_runs(&flow.0, max);
            assert_eq!(feed(&runs), one_by_one, "runs of at most {max}: {runs:?}");
            let stretches = crate::exec::as_stretches(&flow.0, max);
            assert_eq!(feed(&stretches), one_by_one, "stretches: {stretches:?}");
        }
        one_by_one
    }

    #[test]
    fn calls_and_returns_nest() {
        // main at 0x100 calls f (0x200) which calls g (0x300).
        let flow = Flow::default()
            .run(0x100, 2)
            .call(0x102)
            .run(0x200, 1)
            .call(0x201)
            .run(0x300, 2)
            .ret(0x302)
            .run(0x206, 1)
            .ret(0x207)
            .run(0x107, 3);
        assert_eq!(
            events(flow),
            [
                "begin 0x100",
                "enter 0x200 d2",
                "enter 0x300 d3",
                "exit 0x300 Return total 3 self 3",
                "exit 0x200 Return total 7 self 4",
                "exit 0x100 End total 13 self 6",
            ]
        );
    }

    #[test]
    fn a_call_to_the_next_instruction_is_not_a_call() {
        let flow = Flow::default().call(0x100).run(0x105, 2);
        assert_eq!(
            events(flow),
            ["begin 0x100", "exit 0x100 End total 3 self 3"]
        );
    }

    #[test]
    fn a_return_deeper_down_unwinds_the_frames_above() {
        // main calls f, f calls g, g "returns" (longjmp then ret) to main.
        let flow = Flow::default()
            .call(0x100)
            .call(0x200)
            .run(0x300, 1)
            .ret(0x301)
            .run(0x105, 1);
        assert_eq!(
            events(flow),
            [
                "begin 0x100",
                "enter 0x200 d2",
                "enter 0x300 d3",
                "exit 0x300 Unwound total 2 self 2",
                "exit 0x200 Return total 3 self 1",
                "exit 0x100 End total 5 self 2",
            ]
        );
    }

    #[test]
    fn returns_above_the_first_frame_make_synthetic_callers() {
        // The trace begins inside f, which returns into its caller (at
        // 0x1234), which returns into its own caller (at 0x5678).
        let flow = Flow::default()
            .run(0x200, 2)
            .ret(0x202)
            .run(0x1234, 1)
            .call(0x1235)
            .ret(0x400)
            .run(0x123a, 1)
            .ret(0x123b)
            .run(0x5678, 1);
        assert_eq!(
            events(flow),
            [
                "begin 0x200",
                "exit 0x200 Return total 3 self 3",
                "caller 0x1234",
                "enter 0x400 d2",
                "exit 0x400 Return total 1 self 1",
                "exit 0x1234 Return total 8 self 4",
                "caller 0x5678",
                "exit 0x5678 End total 9 self 1",
            ]
        );
    }

    #[test]
    fn tail_calls_stay_in_the_frame_that_jumped() {
        let flow = Flow::default()
            .call(0x100)
            .jmp(0x200)
            .run(0x600, 1)
            .ret(0x601)
            .run(0x105, 1);
        assert_eq!(
            events(flow),
            [
                "begin 0x100",
                "enter 0x200 d2",
                "exit 0x200 Return total 3 self 3",
                "exit 0x100 End total 5 self 2",
            ]
        );
    }

    #[test]
    fn returns_while_tracing_is_off_end_their_frames() {
        // main calls a stub (0x300) that jumps out of the traced range;
        // tracing resumes at the stub's return address.
        let flow = Flow::default()
            .call(0x100)
            .jmp(0x300)
            .gap(GapKind::Disabled)
            .run(0x105, 1)
            .ret(0x106)
            .run(0x900, 1);
        assert_eq!(
            events(flow),
            [
                "begin 0x100",
                "enter 0x300 d2",
                "gap 0x40 Disabled",
                "exit 0x300 Return total 1 self 1",
                "exit 0x100 Return total 4 self 3",
                "caller 0x900",
                "exit 0x900 End total 5 self 1",
            ]
        );
    }

    #[test]
    fn unexpected_returns_are_jumps() {
        // f is called, and returns somewhere no frame expects (a
        // retpoline): the flow stays in f's frame.
        let flow = Flow::default()
            .call(0x100)
            .run(0x200, 1)
            .ret(0x201)
            .run(0x900, 1)
            .ret(0x901)
            .run(0x105, 1);
        assert_eq!(
            events(flow),
            [
                "begin 0x100",
                "enter 0x200 d2",
                "exit 0x200 Return total 4 self 4",
                "exit 0x100 End total 6 self 2",
            ]
        );
    }

    #[test]
    fn lost_data_ends_the_stack_and_disabled_tracing_keeps_it() {
        let flow = Flow::default()
            .call(0x100)
            .run(0x200, 1)
            .insn(0x201, InsnClass::FarCall, 2)
            .gap(GapKind::Disabled)
            .run(0x203, 1)
            .gap(GapKind::Overflow)
            .run(0x500, 1)
            .ret(0x501)
            .run(0x105, 1);
        assert_eq!(
            events(flow),
            [
                "begin 0x100",
                "enter 0x200 d2",
                "gap 0x40 Disabled",
                "exit 0x200 Gap(Overflow) total 3 self 3",
                "exit 0x100 Gap(Overflow) total 4 self 1",
                "gap 0x40 Overflow",
                "begin 0x500",
                "exit 0x500 Return total 2 self 2",
                "caller 0x105",
                "exit 0x105 End total 3 self 1",
            ]
        );
    }

    #[test]
    fn threads_have_their_own_stacks() {
        let flow = Flow::default()
            .thread(1)
            .call(0x100)
            .thread(2)
            .call(0x700)
            .thread(1)
            .run(0x200, 1)
            .ret(0x201)
            .thread(2)
            .run(0x800, 1)
            .thread(1)
            .run(0x105, 1);
        assert_eq!(
            events(flow),
            [
                "begin 0x100",
                "begin 0x700",
                "enter 0x200 d2",
                "enter 0x800 d2",
                "exit 0x200 Return total 2 self 2",
                "exit 0x100 End total 4 self 2",
                "exit 0x800 End total 1 self 1",
                "exit 0x700 End total 2 self 1",
            ]
        );
    }

    #[test]
    fn branch_records_nest_calls_and_returns() {
        let mut flow = Flow::default();
        for (from, to, class) in [
            (0x100, 0x200, InsnClass::Call),
            (0x210, 0x220, InsnClass::CondJump),
            (0x230, 0x104, InsnClass::Return),
        ] {
            flow.0.push(Exec::Branch {
                from: Ip(from),
                to: Ip(to),
                class,
            });
        }
        assert_eq!(
            events(flow),
            [
                "begin 0x100",
                "enter 0x200 d2",
                "exit 0x200 Return total 2 self 2",
                "exit 0x100 End total 3 self 1",
            ]
        );
    }

    #[test]
    fn the_depth_limit_restarts_the_stack() {
        let mut flow = Flow::default();
        for k in 0..=MAX_DEPTH as u64 {
            flow = flow.call(0x1000 + k * 8);
        }
        let log = events(flow);
        let limited = log.iter().filter(|l| l.contains("DepthLimit")).count();
        assert_eq!(limited, MAX_DEPTH);
        assert_eq!(
            log.iter().filter(|l| l.starts_with("begin")).count(),
            2,
            "one stack, then one more after the limit"
        );
    }
}
