//! The `parallel_decode` fuzz target's checks
//! (`fuzz/fuzz_targets/parallel_compare.rs`, included here) over the inputs
//! kept under `testdata/fuzz/parallel_decode/` (named after what broke)
//! and over every other saved fuzz input of the flow targets: the
//! parallel decode by PSB units must hand out the sequential decode's
//! items, times included, over the target's code image.

use std::path::Path;

#[path = "../../../fuzz/fuzz_targets/parallel_compare.rs"]
mod parallel_compare;

#[path = "../../../fuzz/fuzz_targets/branchy_image.rs"]
mod branchy_image;

#[test]
fn every_saved_fuzz_input_decodes_the_same_in_parallel() {
    let image = branchy_image::image();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/fuzz");
    let mut seen = 0;
    for target in ["parallel_decode", "fast_decode"] {
        let dir = root.join(target);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("directory entry").path();
            let data = std::fs::read(&path).expect("readable input");
            parallel_compare::check(&path.display().to_string(), &data, image);
            seen += 1;
        }
    }
    assert!(seen > 0, "no inputs under {}", root.display());
}

/// The timed seeds (`fuzz/make_seeds.py`'s `timed_loop`) are what they
/// are there for: decoded from the start, their disables are stamped from
/// CYC packets through a measured calibration (none lost), which a unit
/// starting at a PSB only has with its clock warmed.
#[test]
fn the_timed_seeds_stamp_disables_from_cyc_packets() {
    use hwtrace_flow::event::EventKind;
    use hwtrace_flow::insn::InsnDecoder;
    use hwtrace_flow::parallel::{Flow, FlowItem};

    let image = branchy_image::image();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/fuzz/parallel_decode");
    let mut seeds = 0;
    for entry in std::fs::read_dir(&dir).expect("testdata/fuzz/parallel_decode is there") {
        let path = entry.expect("directory entry").path();
        if !path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("timed-"))
        {
            continue;
        }
        let data = std::fs::read(&path).expect("readable input");
        let config = parallel_compare::config(&data);
        let disables: Vec<(u64, u32)> = Flow::new(InsnDecoder::new(&data, config, image))
            .filter_map(|item| match item {
                FlowItem::Event { event, .. }
                    if matches!(event.kind, EventKind::Disabled { .. }) =>
                {
                    Some((event.tsc, event.lost_cyc))
                }
                _ => None,
            })
            .collect();
        let timed = disables.iter().filter(|&&(_, lost)| lost == 0).count();
        assert!(
            timed * 2 > disables.len() && disables.len() > 10,
            "{}: {disables:?}",
            path.display()
        );
        seeds += 1;
    }
    assert_eq!(seeds, 3);
}
