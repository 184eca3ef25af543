//! Inputs the `fast_decode` fuzz target (`fuzz/fuzz_targets/fast_decode.rs`)
//! once broke us with, kept under `testdata/fuzz/fast_decode/`, named after
//! what broke. Each is decoded over the target's code image the ways the
//! target compares: the instruction decoder, the block-cached
//! `FastDecoder` with its runs expanded, and the `FastDecoder` counting
//! whole runs and bursts; they must agree item for item (counts between
//! the items that are not instructions, for the counting decode).

use hwtrace_flow::Config;
use hwtrace_flow::event::EventKind;
use hwtrace_flow::insn::{FastDecoder, InsnDecoder};
use hwtrace_flow::parallel::{FastSource, Flow, FlowItem, StepSource};
use hwtrace_types::{AddressSpace, BytesAt, Ip, MemoryError, ReadMemory, TraceOffset};
use std::path::Path;

/// The fuzz target's limits: endless loops given up after this many
/// instructions without trace, and the most items compared.
const MAX_STALL: u64 = 1 << 12;
const MAX_ITEMS: usize = 1 << 18;

/// The fuzz target's image (`fuzz/fuzz_targets/branchy_image.rs`): every
/// kind of branch, at 0x1000 and at a kernel-looking copy.
const CODE: &[u8] = &[
    0x74, 0x05, 0xe8, 0x09, 0x00, 0x00, 0x00, 0xff, 0xe0, 0x0f, 0x05, 0xeb, 0xf3, 0x90, 0x90, 0x90,
    0x48, 0x01, 0xc8, 0x75, 0xfb, 0xff, 0xd0, 0xc3, 0xcf,
];

/// The code at both of its addresses.
struct Image([BytesAt<'static>; 2]);

impl ReadMemory for Image {
    fn read_memory(
        &self,
        space: AddressSpace,
        addr: Ip,
        buf: &mut [u8],
    ) -> Result<usize, MemoryError> {
        self.0[0]
            .read_memory(space, addr, buf)
            .or_else(|_| self.0[1].read_memory(space, addr, buf))
    }
}

fn image() -> Image {
    Image([
        BytesAt::new(Ip(0x1000), CODE),
        BytesAt::new(Ip(0xffff_ffff_8000_1000), CODE),
    ])
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

/// The items other than instructions and the disables and enables (which
/// a counting decode may pass over), each with the instructions before
/// it; the instructions in all; the disables and enables.
fn counted<S: StepSource>(mut flow: Flow<S>, skip: bool) -> (Vec<(u64, FlowItem)>, u64, u64) {
    let (mut insns, mut toggles, mut others) = (0u64, 0u64, Vec::new());
    for _ in 0..MAX_ITEMS {
        if skip {
            let skipped = flow.skip_runs(TraceOffset(u64::MAX));
            insns += skipped.insns;
            toggles += skipped.events;
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
            Some(other) => others.push((insns, other)),
            None => break,
        }
    }
    (others, insns, toggles)
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

fn check(name: &str, data: &[u8]) {
    let config = Config {
        lenient_status: data.len() % 2 == 1,
        ..Config::default()
    };
    let image = image();
    let insn = || Flow::new(InsnDecoder::new(data, config, &image)).with_max_stall(MAX_STALL);
    let (want, ended) = items(insn());
    let fast = FastSource::new(FastDecoder::new(data, config, &image));
    let (got, _) = items(Flow::new(fast).with_max_stall(MAX_STALL));
    let n = want.len().min(got.len());
    assert!(
        got[..n] == want[..n],
        "{name}: expanded runs differ from the instruction decoder\n{}\n---\n{}",
        short(&got),
        short(&want)
    );
    if ended {
        assert_eq!(
            got.len(),
            want.len(),
            "{name}: expanded runs end elsewhere\n{}\n---\n{}",
            short(&got),
            short(&want)
        );
        let reference = counted(insn(), false);
        let source = FastSource::counting(FastDecoder::new(data, config, &image), MAX_STALL);
        let fast = counted(Flow::new(source).with_max_stall(MAX_STALL), true);
        assert_eq!(fast, reference, "{name}: counted whole runs differ");
    }
}

#[test]
fn every_saved_fuzz_input_passes() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/fuzz/fast_decode");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("testdata/fuzz/fast_decode is there") {
        let path = entry.expect("directory entry").path();
        let data = std::fs::read(&path).expect("readable input");
        check(&path.display().to_string(), &data);
        seen += 1;
    }
    assert!(seen > 0, "no inputs in {}", dir.display());
}
