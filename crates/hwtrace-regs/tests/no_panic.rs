//! Random register values, configurations, tables, byte buffers and names:
//! every entry point answers with a value or a typed error, never a panic.

use hwtrace_regs::bts::BtsRecord;
use hwtrace_regs::cpuid::{CpuidRegs, PtCaps};
use hwtrace_regs::debugctl::{BtsMode, DebugCtl, DebugCtlLayout};
use hwtrace_regs::ds::{DsFormat, DsManagementArea};
use hwtrace_regs::explain::parse_number;
use hwtrace_regs::field::{ComposeError, Meaning};
use hwtrace_regs::lbr::{LbrFormat, LbrFrom, LbrTo};
use hwtrace_regs::lbr_select::{BranchClass, LbrSelect};
use hwtrace_regs::output::{SingleRange, TopaPosition};
use hwtrace_regs::pt_config::PtConfig;
use hwtrace_regs::rtit::*;
use hwtrace_regs::topa::{TopaEntry, validate_table};
use hwtrace_regs::{BuildError, Context, RegisterId, Uarch, build, explain};
use hwtrace_types::PhysAddr;
use proptest::prelude::*;

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

fn context() -> impl Strategy<Value = Context> {
    (
        proptest::option::of(0..UARCHES.len()),
        proptest::option::of(0u8..64),
    )
        .prop_map(|(u, f)| Context {
            uarch: u.map(|i| UARCHES[i]),
            lbr_format: f.and_then(|e| LbrFormat::from_encoding(e).ok()),
        })
}

fn caps() -> impl Strategy<Value = PtCaps> {
    (any::<[u32; 3]>(), any::<[u32; 2]>()).prop_map(|(a, b)| {
        PtCaps::new(
            CpuidRegs {
                eax: a[0],
                ebx: a[1],
                ecx: a[2],
                edx: 0,
            },
            CpuidRegs {
                eax: b[0],
                ebx: b[1],
                ecx: 0,
                edx: 0,
            },
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Explaining any value of any register under any context, then
    /// building it back from its fields, gives the same field bits.
    #[test]
    fn explain_then_build_round_trips(raw in any::<u64>(), index in 0u8..64, ctx in context()) {
        for id in RegisterId::ALL {
            let id = match id {
                RegisterId::RtitAddrA(_) => RegisterId::RtitAddrA(index % 4),
                RegisterId::LastBranchFromIp(_) => RegisterId::LastBranchFromIp(index % 32),
                RegisterId::ArchLbrInfo(_) => RegisterId::ArchLbrInfo(index),
                other => other,
            };
            let Ok(e) = explain(id, raw, &ctx) else { continue };
            let mut any_reserved_encoding = false;
            let mut field_bits = 0u64;
            for f in e.fields() {
                let text = format!("{} [{}] = {:#x}: {}", f.name, f.bits, f.value, f.meaning);
                prop_assert!(!text.is_empty());
                any_reserved_encoding |= matches!(f.meaning, Meaning::Reserved(_));
                field_bits |= f.bits.mask();
            }
            prop_assert_eq!(e.reserved_ranges().fold(0, |a, r| a | r.mask()), e.reserved_set());
            let fields: Vec<(&str, u64)> = e.fields().map(|f| (f.name, f.value)).collect();
            match build(id, &ctx, fields.iter().copied()) {
                Ok(v) => prop_assert_eq!(v, raw & field_bits, "{}", id),
                Err(BuildError::Field(ComposeError::ReservedEncoding { .. })) => prop_assert!(any_reserved_encoding),
                Err(other) => prop_assert!(false, "{}: {}", id, other),
            }
        }
    }

    #[test]
    fn pt_configuration_validation_never_panics(
        msrs in any::<[u64; 5]>(),
        addrs in any::<[u64; 8]>(),
        caps in caps(),
        max_phys_addr in 0u8..=70,
    ) {
        let mut config = PtConfig {
            ctl: RtitCtl::from_raw(msrs[0]),
            output_base: RtitOutputBase::from_raw(msrs[1]),
            output_mask_ptrs: RtitOutputMaskPtrs::from_raw(msrs[2]),
            cr3_match: RtitCr3Match::from_raw(msrs[3]),
            addr: Default::default(),
        };
        for n in 0..4 {
            config.addr[n] = (RtitAddr::from_raw(addrs[2 * n]), RtitAddr::from_raw(addrs[2 * n + 1]));
        }
        if let Err(e) = config.validate(&caps, max_phys_addr) {
            let text = format!("{e}");
            prop_assert!(!text.is_empty());
        }
        let _ = SingleRange::from_msrs(config.output_base, config.output_mask_ptrs).map(|r| r.advance(msrs[4]).write_address());
        if let Ok(p) = TopaPosition::from_msrs(config.output_base, config.output_mask_ptrs) {
            let _ = p.write_address(TopaEntry::from_raw(msrs[4]));
        }
    }

    #[test]
    fn topa_validation_never_panics(entries in proptest::collection::vec(any::<u64>(), 0..12), base in any::<u64>(), caps in caps(), max in 0u8..=70) {
        let entries: Vec<TopaEntry> = entries.into_iter().map(TopaEntry::from_raw).collect();
        if let Err(e) = validate_table(PhysAddr(base), &entries, &caps, max) {
            let text = format!("{e}");
            prop_assert!(!text.is_empty());
        }
    }

    #[test]
    fn ds_and_bts_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..96), mode in 0u8..4) {
        let mode = [BtsMode::Off, BtsMode::BusMessages, BtsMode::CircularBuffer, BtsMode::InterruptOnThreshold][usize::from(mode)];
        for format in [DsFormat::Bits32, DsFormat::Bits64] {
            if let Ok(area) = DsManagementArea::parse(&bytes, format) {
                let _ = area.check_bts(format, mode);
                let mut out = [0u8; 0x48];
                if area.write(format, &mut out).is_ok() {
                    prop_assert_eq!(DsManagementArea::parse(&out, format), Ok(area));
                }
            }
            if let Ok(r) = BtsRecord::parse(&bytes, format) {
                let mut out = [0u8; 24];
                prop_assert!(r.write(format, &mut out).is_ok());
                prop_assert_eq!(BtsRecord::parse(&out, format), Ok(r));
            }
        }
    }

    #[test]
    fn lbr_and_debugctl_values_never_panic(raw in any::<u64>(), cpl in any::<u8>()) {
        for enc in 0..8 {
            let f = LbrFormat::from_encoding(enc).expect("defined");
            let from = LbrFrom::decode(raw, f);
            let again = from.encode(f).map(|v| LbrFrom::decode(v, f));
            prop_assert_eq!(again, Ok(from));
            let to = LbrTo::decode(raw, f);
            prop_assert_eq!(to.encode(f).map(|v| LbrTo::decode(v, f)), Ok(to));
        }
        for layout in [DebugCtlLayout::Modern, DebugCtlLayout::NetBurst] {
            let _ = DebugCtl::from_raw(raw, layout).validate();
        }
        for u in UARCHES {
            let _ = LbrSelect::from_raw(raw).records(BranchClass::NearRet, cpl, u);
        }
    }

    #[test]
    fn names_never_panic(s in "\\PC{0,40}") {
        let _ = RegisterId::parse(&s);
        let _ = Uarch::from_name(&s);
        let _ = parse_number(&s);
        let _ = build(RegisterId::RtitCtl, &Context::default(), [(s.as_str(), 1)]);
    }
}
