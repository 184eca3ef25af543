//! The `fast_decode` fuzz target's checks, shared with hwtrace-flow's
//! `tests/fast_fuzz_regressions.rs`, which runs them on the inputs the
//! fuzzer once broke us with (`testdata/fuzz/fast_decode/`): a trace over
//! a code image decoded four ways that must agree item for item — the
//! instruction decoder, the block-cached `FastDecoder` with its runs
//! expanded into instructions, the `FastDecoder` counting whole runs and
//! bursts (`Flow::skip_runs`, what `hwtrace flow --quiet` does, passing
//! over disables, enables and PSB+ status updates), and the
//! `FastDecoder` handing whole runs to a visitor (`Flow::visit_runs`, what
//! the answers do), each run standing for exactly the instruction
//! decoder's instructions there. Inputs of odd length decode with
//! `lenient_status` (perf's reading of tracing's status). Only the
//! hwtrace-flow API is used, so both crates build it.

use hwtrace_flow::Config;
use hwtrace_flow::event::{EventKind, passable_status};
use hwtrace_flow::insn::InsnClass;
use hwtrace_flow::insn::{FastDecoder, InsnDecoder};
use hwtrace_flow::parallel::{FastSource, Flow, FlowItem, PassedRun, StepSource};
use hwtrace_types::{ReadMemory, TraceOffset};

/// Endless loops are given up after this many instructions without trace
/// (small, so that inputs stay fast).
const MAX_STALL: u64 = 1 << 12;

/// A stall limit bursts are taken under. The block-cached decoder only
/// takes runs a burst at a time (and so through its counting chains,
/// their sprints and their passes over disable/enable pairs) where no
/// endless-loop report can fall inside a burst: a burst's 256 runs of up
/// to 1,024 instructions must stay below the limit, which `MAX_STALL` is
/// far from. Inputs whose decode never stalls for `MAX_STALL` decode to
/// the same items under this limit, so they are checked again with it.
const BURST_STALL: u64 = 1 << 19;

/// The most items compared per input.
const MAX_ITEMS: usize = 1 << 18;

/// Decodes `data` over `image` the four ways and panics, naming `name`,
/// where they differ.
pub fn check<M: ReadMemory + Copy>(name: &str, data: &[u8], image: M) {
    let config = Config {
        lenient_status: data.len() % 2 == 1,
        ..Config::default()
    };
    let insn = || Flow::new(InsnDecoder::new(data, config, image)).with_max_stall(MAX_STALL);
    let (want, ended) = items(insn());
    let (got, _) = items(
        Flow::new(FastSource::new(FastDecoder::new(data, config, image))).with_max_stall(MAX_STALL),
    );
    // Compared as far as the reference went.
    let n = want.len().min(got.len());
    assert!(
        got[..n] == want[..n],
        "{name}: expanded runs differ from the instruction decoder\n{}\n---\n{}",
        short(&got),
        short(&want)
    );
    check_runs(name, data, config, image, &want, ended, MAX_STALL);
    let stalled = want.iter().any(|i| matches!(i, FlowItem::Stuck { .. }));
    if ended && !stalled {
        check_runs(name, data, config, image, &want, ended, BURST_STALL);
    }
    if ended {
        assert_eq!(
            got.len(),
            want.len(),
            "{name}: expanded runs end elsewhere\n{}\n---\n{}",
            short(&got),
            short(&want)
        );
        let reference = counted(insn(), false).expect("the reference ended");
        let stalls: &[u64] = if stalled {
            &[MAX_STALL]
        } else {
            &[MAX_STALL, BURST_STALL]
        };
        for &stall in stalls {
            let source = FastSource::counting(FastDecoder::new(data, config, image), stall);
            if let Some(fast) = counted(Flow::new(source).with_max_stall(stall), true) {
                // Items that are not instructions carry what the
                // reference's carry, instruction counts between them
                // included.
                assert_eq!(
                    fast.insns, reference.insns,
                    "{name}: counted whole runs (stall limit {stall}): instruction count differs"
                );
                assert_eq!(
                    fast.others, reference.others,
                    "{name}: counted whole runs (stall limit {stall}): events or errors differ"
                );
                assert_eq!(
                    (fast.toggles, fast.statuses),
                    (reference.toggles, reference.statuses),
                    "{name}: counted whole runs (stall limit {stall}): disables and enables, or status updates, differ"
                );
            }
        }
    }
}

/// One line per item (instructions by offset and IP), for failures.
fn short(items: &[FlowItem]) -> String {
    items
        .iter()
        .map(|i| match i {
            FlowItem::Insn { offset, insn } => format!("I {offset} {:#x}", insn.ip),
            FlowItem::Event { offset, event } => format!("E {offset} {:?}", event.kind),
            other => format!("{other:?}"),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every item, up to `MAX_ITEMS`; whether the flow ended before.
fn items<S: StepSource>(mut flow: Flow<S>) -> (Vec<FlowItem>, bool) {
    let mut out = Vec::new();
    while out.len() < MAX_ITEMS {
        match flow.next() {
            Some(item) => out.push(item),
            None => return (out, true),
        }
    }
    (out, false)
}

/// What a decode reports once its instructions are counted.
#[derive(Debug, PartialEq)]
struct Counted {
    /// The items other than instructions and the disable and enable
    /// events (which a counting decode may pass over), each with how many
    /// instructions came before it.
    others: Vec<(u64, FlowItem)>,
    /// The instructions in all.
    insns: u64,
    /// The disables and enables, passed over or not.
    toggles: u64,
    /// The status updates of the kinds a counting decode may pass over
    /// (`hwtrace_flow::event::passable_status`), passed over or not.
    statuses: u64,
}

/// `flow` counted ([`Counted`]), passing whole runs over with
/// `Flow::skip_runs` when `skip`; `None` past `MAX_ITEMS`.
fn counted<S: StepSource>(mut flow: Flow<S>, skip: bool) -> Option<Counted> {
    let mut insns = 0u64;
    let mut toggles = 0u64;
    let mut statuses = 0u64;
    let mut others = Vec::new();
    for _ in 0..MAX_ITEMS {
        if skip {
            let skipped = flow.skip_runs(TraceOffset(u64::MAX));
            insns += skipped.insns;
            toggles += skipped.events;
            statuses += skipped.status_updates;
        }
        match flow.next() {
            Some(FlowItem::Insn { .. }) => insns += 1,
            Some(FlowItem::Event { event, .. })
                if !event.status_update
                    && matches!(
                        event.kind,
                        EventKind::Disabled { .. } | EventKind::Enabled { .. }
                    ) =>
            {
                toggles += 1;
            }
            Some(FlowItem::Event { event, .. }) if passable_status(&event) => statuses += 1,
            Some(other) => others.push((insns, other)),
            None => {
                return Some(Counted {
                    others,
                    insns,
                    toggles,
                    statuses,
                });
            }
        }
    }
    None
}

/// The runs-keeping decode, under the stall limit `stall`, against
/// `want`, the instruction decoder's items (`ended`: all of them): each visited run stands for as many of
/// them, contiguous, at the run's offset, plain but the last, which is the
/// run's; every other item is the reference's own.
fn check_runs<M: ReadMemory>(
    name: &str,
    data: &[u8],
    config: Config,
    image: M,
    want: &[FlowItem],
    ended: bool,
    stall: u64,
) {
    let source = FastSource::runs(FastDecoder::new(data, config, image), stall);
    let mut flow = Flow::new(source).with_max_stall(stall);
    let mut at = 0;
    while at < want.len() {
        let mut runs: Vec<PassedRun> = Vec::new();
        flow.visit_runs(TraceOffset(u64::MAX), &mut |r| runs.push(*r));
        for r in runs {
            let n = r.run.insns as usize;
            let mut ip = r.run.ip.0;
            for (i, item) in want.iter().skip(at).take(n).enumerate() {
                let FlowItem::Insn { offset, insn } = item else {
                    panic!("{name}: item {} inside run {r:?}: {item:?}", at + i);
                };
                let last = i + 1 == n;
                assert_eq!(
                    (*offset, insn.ip, insn.mode),
                    (r.before, ip, r.run.mode),
                    "{name}: run {r:?}"
                );
                if last {
                    assert_eq!(
                        (insn.class, insn.size),
                        (r.run.end_class, r.run.end_size),
                        "{name}: run {r:?}"
                    );
                } else {
                    assert!(
                        matches!(insn.class, InsnClass::Other | InsnClass::Ptwrite),
                        "{name}: run {r:?}"
                    );
                }
                ip = ip.wrapping_add(u64::from(insn.size));
            }
            at += n;
        }
        match flow.next() {
            Some(item) => {
                if let Some(w) = want.get(at) {
                    assert_eq!(&item, w, "{name}: item {at} after visited runs");
                }
                at += 1;
            }
            None => break,
        }
    }
    if ended {
        assert_eq!(at, want.len(), "{name}: visited runs end elsewhere");
    }
}
