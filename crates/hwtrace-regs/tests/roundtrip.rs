//! Every register round-trips: build from named fields → raw value →
//! explain → the same named fields, under every context that changes the layout.

use hwtrace_regs::field::{FieldDef, FieldKind};
use hwtrace_regs::lbr::LbrFormat;
use hwtrace_regs::{Context, RegisterId, Uarch, build, explain};

const UARCHES: [Uarch; 11] = [
    Uarch::NetBurst,
    Uarch::Core2,
    Uarch::Nehalem,
    Uarch::Westmere,
    Uarch::SandyBridge,
    Uarch::IvyBridge,
    Uarch::Haswell,
    Uarch::Broadwell,
    Uarch::Skylake,
    Uarch::Goldmont,
    Uarch::GoldmontPlus,
];

fn contexts() -> Vec<Context> {
    let mut v = vec![Context::default()];
    v.extend(UARCHES.iter().map(|u| Context {
        uarch: Some(*u),
        lbr_format: None,
    }));
    v.extend((0..8).map(|e| Context {
        uarch: None,
        lbr_format: LbrFormat::from_encoding(e).ok(),
    }));
    v
}

/// Values worth trying for a field: the smallest, the largest and one in
/// between, in the form `FieldDef::value` reports.
fn candidates(f: &FieldDef) -> Vec<u64> {
    let mask = f.bits.mask();
    let width_max = f.bits.get(u64::MAX);
    match f.kind {
        FieldKind::Enum(table) => table.iter().map(|(v, _)| *v).collect(),
        FieldKind::Address | FieldKind::SignedAddress => {
            vec![
                0,
                1 << f.bits.lo,
                mask,
                mask & 0x5555_5555_5555_5555 & !((1u64 << f.bits.lo) - 1),
            ]
        }
        _ => vec![0, 1, width_max, width_max / 3],
    }
}

#[test]
fn every_field_of_every_register_round_trips_alone_and_together() {
    let mut checked = 0;
    for ctx in contexts() {
        for id in RegisterId::ALL {
            let Ok(def) = id.def(&ctx) else { continue };
            for field in def.fields {
                for v in candidates(field) {
                    let raw = build(id, &ctx, [(field.name, v)])
                        .unwrap_or_else(|e| panic!("{id}.{} = {v:#x}: {e}", field.name));
                    let e = explain(id, raw, &ctx).expect("resolved above");
                    assert_eq!(
                        e.reserved_set(),
                        0,
                        "{id}.{} = {v:#x} set reserved bits",
                        field.name
                    );
                    for got in e.fields() {
                        let want = if got.name == field.name { v } else { 0 };
                        assert_eq!(
                            got.value, want,
                            "{id}.{} = {v:#x}: {} read back",
                            field.name, got.name
                        );
                    }
                    checked += 1;
                }
            }
            // All fields at once, at their largest candidate.
            let settings: Vec<(&str, u64)> = def
                .fields
                .iter()
                .map(|f| (f.name, candidates(f).into_iter().max().unwrap_or(0)))
                .collect();
            let raw = build(id, &ctx, settings.iter().copied()).expect("largest candidates fit");
            let back: Vec<(&str, u64)> = explain(id, raw, &ctx)
                .expect("resolved")
                .fields()
                .map(|f| (f.name, f.value))
                .collect();
            assert_eq!(back, settings, "{id} under {ctx:?}");
        }
    }
    assert!(checked > 500, "only {checked} field values checked");
}

#[test]
fn typed_rtit_ctl_and_named_build_agree() {
    use hwtrace_regs::rtit::{AddrCfg, RtitCtl};
    let typed = RtitCtl::new()
        .with_trace_en(true)
        .with_user(true)
        .with_branch_en(true)
        .with_tsc_en(true)
        .with_mtc_freq(9)
        .and_then(|c| c.with_cyc_thresh(2))
        .and_then(|c| c.with_psb_freq(5))
        .expect("fits")
        .with_addr_cfg(1, AddrCfg::TraceStop)
        .expect("range 1 exists")
        .with_dis_tnt(true);
    let named = build(
        RegisterId::RtitCtl,
        &Context::default(),
        [
            ("TraceEn", 1),
            ("User", 1),
            ("BranchEn", 1),
            ("TSCEn", 1),
            ("MTCFreq", 9),
            ("CYCThresh", 2),
            ("PSBFreq", 5),
            ("ADDR1_CFG", 2),
            ("DisTNT", 1),
        ],
    );
    assert_eq!(named, Ok(typed.raw()));
}

#[test]
fn typed_lbr_records_and_named_build_agree() {
    use hwtrace_regs::lbr::{LbrFrom, LbrInfo};
    use hwtrace_types::Ip;
    let ctx = Context {
        uarch: Some(Uarch::Haswell),
        lbr_format: None,
    };
    let from = LbrFrom {
        ip: Ip(0xFFFF_FFFF_8100_0000),
        mispredicted: Some(true),
        in_tsx: Some(false),
        tsx_abort: Some(true),
    };
    let typed = from.encode(LbrFormat::EipWithFlagsTsx).expect("canonical");
    let named = build(
        RegisterId::LastBranchFromIp(2),
        &ctx,
        [
            ("FROM_IP", 0xFFFF_FFFF_8100_0000),
            ("MISPRED", 1),
            ("TSX_ABORT", 1),
        ],
    );
    assert_eq!(named, Ok(typed));
    let info = LbrInfo {
        mispredicted: true,
        in_tsx: true,
        tsx_abort: false,
        cycles: 1234,
    };
    let skl = Context {
        uarch: Some(Uarch::Skylake),
        lbr_format: None,
    };
    assert_eq!(
        build(
            RegisterId::LbrInfo(0),
            &skl,
            [("CYC_CNT", 1234), ("IN_TSX", 1), ("MISPRED", 1)]
        ),
        Ok(info.encode())
    );
}
