//! Capture up to the kernel boundary: PMU discovery against fake sysfs
//! trees shaped like Skylake, Ice Lake and Sapphire Rapids (and none),
//! config terms, privilege checks against fake procfs trees, filters.

use std::path::{Path, PathBuf};

use super::access::{self, Needs};
use super::error::{CaptureError, Tracer};
use super::plan::{RecordOptions, default_pt_terms, kernel_filter, parse_size, plan};
use super::pmu::{ConfigWord, Format, Pmu, cpu_description};
use crate::data::attr::{branch, flag, sample};

/// A temporary directory removed on drop.
struct TempTree(PathBuf);

impl TempTree {
    fn new(tag: &str) -> Self {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p =
            std::env::temp_dir().join(format!("hwtrace-capture-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
    fn file(&self, rel: &str, text: &str) {
        let p = self.0.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempTree {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

/// The intel_pt `format` files Linux has exposed since 4.x.
const PT_FORMATS: &[(&str, &str)] = super::pmu::LINUX_INTEL_PT_FORMATS;

#[derive(Clone, Copy)]
enum Cpu {
    Skylake,
    IceLake,
    SapphireRapids,
}

/// A fake `/sys` with an intel_pt PMU whose caps match `cpu`, and a fake
/// `/proc` for a GenuineIntel CPU with the given paranoid level and caps.
fn intel_machine(cpu: Cpu, paranoid: i32, cap_eff: u64) -> (TempTree, TempTree) {
    let sys = TempTree::new("sys");
    let d = "bus/event_source/devices/intel_pt";
    sys.file(&format!("{d}/type"), "8\n");
    for (t, f) in PT_FORMATS {
        sys.file(&format!("{d}/format/{t}"), &format!("{f}\n"));
    }
    let (ranges, ptw, pwr, evt) = match cpu {
        Cpu::Skylake => ("2", "0", "0", None),
        Cpu::IceLake => ("2", "1", "1", None),
        Cpu::SapphireRapids => ("4", "1", "1", Some("1")),
    };
    if evt.is_some() {
        sys.file(&format!("{d}/format/event"), "config:31\n");
        sys.file(&format!("{d}/format/notnt"), "config:55\n");
    }
    let caps = [
        ("psb_cyc", "1"),
        ("mtc", "1"),
        ("cr3_filtering", "1"),
        ("ip_filtering", "1"),
        ("num_address_ranges", ranges),
        ("topa_output", "1"),
        ("single_range_output", "1"),
        ("mtc_periods", "249"),
        ("cycle_thresholds", "3fff"),
        ("psb_periods", "3f"),
        ("ptwrite", ptw),
        ("power_event_trace", pwr),
        ("event_trace", evt.unwrap_or("0")),
    ];
    for (c, v) in caps {
        sys.file(&format!("{d}/caps/{c}"), &format!("{v}\n"));
    }
    sys.file("bus/event_source/devices/intel_bts/type", "9\n");
    (sys, intel_proc(paranoid, cap_eff))
}

fn intel_proc(paranoid: i32, cap_eff: u64) -> TempTree {
    let proc_ = TempTree::new("proc");
    proc_.file(
        "cpuinfo",
        "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 85\nmodel name\t: Intel(R) Xeon(R) Gold 6130\nstepping\t: 4\n",
    );
    proc_.file("sys/kernel/perf_event_paranoid", &format!("{paranoid}\n"));
    proc_.file(
        "self/status",
        &format!("Name:\thwtrace\nCapEff:\t{cap_eff:016x}\n"),
    );
    proc_
}

fn opts(sys: &TempTree, proc_: &TempTree) -> RecordOptions {
    RecordOptions {
        sysfs_root: sys.path().to_path_buf(),
        procfs_root: proc_.path().to_path_buf(),
        ..RecordOptions::default()
    }
}

#[test]
fn format_files_parse_and_scatter_values() {
    let f = Format::parse("config:14-17\n").unwrap();
    assert_eq!((f.word, f.width()), (ConfigWord::Config, 4));
    assert_eq!(f.encode(3), Some(3 << 14));
    assert_eq!(f.encode(16), None);
    // Split fields take the low value bits first.
    let f = Format::parse("config1:0-1,8-9").unwrap();
    assert_eq!(f.word, ConfigWord::Config1);
    assert_eq!(f.encode(0b1101), Some(0b01 | 0b11 << 8));
    let f = Format::parse("config2:0-63").unwrap();
    assert_eq!(f.encode(u64::MAX), Some(u64::MAX));
    for bad in [
        "config",
        "config:",
        "config:5-3",
        "config:64",
        "bogus:1",
        "config:a",
    ] {
        assert!(Format::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn format_values_gather_back_from_the_word() {
    for (text, value) in [
        ("config:14-17", 3),
        ("config1:0-1,8-9", 0b1101),
        ("config2:0-63", u64::MAX),
    ] {
        let f = Format::parse(text).unwrap();
        // Other terms' bits set around the field change nothing.
        let ones = u64::MAX >> (64 - f.width());
        let around = !f.encode(ones).unwrap() & 0x5555_5555_5555_5555;
        assert_eq!(f.decode(f.encode(value).unwrap() | around), value, "{text}");
    }
    let pmu = Pmu::linux_intel_pt(8);
    let values = pmu
        .build_config("pt,tsc,mtc_period=5,psb_period=2")
        .unwrap();
    let got: Vec<u64> = ["pt", "tsc", "mtc_period", "psb_period", "cyc", "bogus"]
        .iter()
        .map(|t| pmu.term_value(&values, t))
        .collect();
    assert_eq!(got, [1, 1, 5, 2, 0, 0]);
}

#[test]
fn pmu_discovery_per_cpu_generation() {
    for cpu in [Cpu::Skylake, Cpu::IceLake, Cpu::SapphireRapids] {
        let (sys, _proc) = intel_machine(cpu, 2, 0);
        let p = Pmu::load(sys.path(), "intel_pt").unwrap().unwrap();
        assert_eq!(p.kind, 8);
        assert_eq!(p.cap("mtc_periods"), Some(0x249));
        assert_eq!(p.cap("cycle_thresholds"), Some(0x3fff));
        let c = p
            .build_config("pt,tsc,mtc,mtc_period=3,cyc,noretcomp,branch")
            .unwrap();
        // Bits from the format files above: pt 0, cyc 1, mtc 9, tsc 10,
        // noretcomp 11, branch 13, mtc_period 14-17.
        assert_eq!(
            c.config,
            1 | 1 << 1 | 1 << 9 | 1 << 10 | 1 << 11 | 1 << 13 | 3 << 14
        );
        assert_eq!(p.term_bits("mtc_period"), 0xf << 14);
        assert_eq!(p.term_bits("nope"), 0);
        match cpu {
            Cpu::Skylake => {
                assert_eq!(p.cap("ptwrite"), Some(0));
                assert!(matches!(
                    p.build_config("event"),
                    Err(CaptureError::UnknownTerm { .. })
                ));
            }
            Cpu::IceLake => assert_eq!(p.cap("power_event_trace"), Some(1)),
            Cpu::SapphireRapids => {
                assert_eq!(p.cap("num_address_ranges"), Some(4));
                assert_eq!(
                    p.build_config("event,notnt").unwrap().config,
                    1 << 31 | 1 << 55
                );
            }
        }
        assert_eq!(default_pt_terms(&p), "pt,branch,tsc,mtc,mtc_period=3");
    }
}

#[test]
fn bad_terms_are_typed_errors() {
    let (sys, _proc) = intel_machine(Cpu::Skylake, 2, 0);
    let p = Pmu::load(sys.path(), "intel_pt").unwrap().unwrap();
    let e = p.build_config("tsc,bogus").unwrap_err();
    assert!(matches!(&e, CaptureError::UnknownTerm { term, .. } if term == "bogus"));
    assert!(
        e.to_string().contains("noretcomp"),
        "lists the known terms: {e}"
    );
    let e = p.build_config("mtc_period=16").unwrap_err();
    assert!(matches!(
        e,
        CaptureError::TermValue {
            bits: 4,
            value: 16,
            ..
        }
    ));
    assert!(matches!(
        p.build_config("mtc_period=x"),
        Err(CaptureError::BadOption(_))
    ));
    // A broken format file is reported with its path.
    sys.file(
        "bus/event_source/devices/intel_pt/format/tsc",
        "config:99\n",
    );
    let e = Pmu::load(sys.path(), "intel_pt").unwrap_err();
    assert!(
        matches!(&e, CaptureError::BadFormat { path, .. } if path.ends_with("format/tsc")),
        "{e}"
    );
}

#[test]
fn plan_builds_the_pt_attribute() {
    let (sys, proc_) = intel_machine(Cpu::IceLake, 2, 0);
    let o = RecordOptions {
        terms: Some("pt,tsc,noretcomp,branch".into()),
        ..opts(&sys, &proc_)
    };
    let p = plan(&o, 4096).unwrap();
    assert_eq!(p.attr.kind, 8);
    assert_eq!(p.attr.config, 1 | 1 << 10 | 1 << 11 | 1 << 13);
    assert!(p.attr.has(flag::EXCLUDE_KERNEL) && !p.attr.has(flag::EXCLUDE_USER));
    assert!(p.attr.sample_id_all() && p.attr.has(flag::MMAP2) && p.attr.has(flag::CONTEXT_SWITCH));
    assert_eq!(p.attr.sample_type & sample::TIME, sample::TIME);
    assert_eq!(p.aux_size, 4 << 20);
    assert_eq!(p.cpu, "GenuineIntel, Intel(R) Xeon(R) Gold 6130");
    // BTS uses its own PMU.
    let p = plan(
        &RecordOptions {
            tracer: Tracer::IntelBts,
            ..opts(&sys, &proc_)
        },
        4096,
    )
    .unwrap();
    assert_eq!(p.attr.kind, 9);
    // LBR: cycles samples with branch stacks, filtered to user space.
    let o = RecordOptions {
        tracer: Tracer::Lbr,
        branch_filter: Some("any_call,any_ret".into()),
        ..opts(&sys, &proc_)
    };
    let p = plan(&o, 4096).unwrap();
    assert_eq!(
        p.attr.sample_type & sample::BRANCH_STACK,
        sample::BRANCH_STACK
    );
    assert_eq!(p.attr.branch_sample_type, 1 << 4 | 1 << 5 | branch::USER);
    let o = RecordOptions {
        branch_filter: Some("any,warp".into()),
        ..o
    };
    assert!(matches!(plan(&o, 4096), Err(CaptureError::BadOption(m)) if m.contains("warp")));
}

#[test]
fn no_pmu_says_which_cpu_and_what_to_do() {
    let sys = TempTree::new("empty-sys");
    let proc_ = TempTree::new("amd-proc");
    proc_.file(
        "cpuinfo",
        "vendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n",
    );
    let o = opts(&sys, &proc_);
    for tracer in [Tracer::IntelPt, Tracer::IntelBts] {
        let e = plan(
            &RecordOptions {
                tracer,
                ..o.clone()
            },
            4096,
        )
        .unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, CaptureError::NoPmu { .. }), "{msg}");
        assert!(msg.contains("AuthenticAMD, AMD EPYC 7B13"), "{msg}");
        assert!(msg.contains("--portable"), "{msg}");
        assert!(msg.contains(tracer.pmu_name().unwrap()), "{msg}");
    }
    assert_eq!(cpu_description(Path::new("/nonexistent")), "unknown CPU");
}

#[test]
fn paranoid_and_capabilities() {
    // Debian's 3 forbids everything unprivileged.
    let (sys, proc_) = intel_machine(Cpu::Skylake, 3, 0);
    let e = plan(&opts(&sys, &proc_), 4096).unwrap_err();
    assert!(
        matches!(
            e,
            CaptureError::Paranoid {
                value: 3,
                needed: 2,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("perf_event_paranoid=2"), "{e}");
    // Kernel tracing needs 1.
    let (sys, proc_) = intel_machine(Cpu::Skylake, 2, 0);
    let o = RecordOptions {
        kernel: true,
        ..opts(&sys, &proc_)
    };
    assert!(matches!(
        plan(&o, 4096),
        Err(CaptureError::Paranoid {
            value: 2,
            needed: 1,
            ..
        })
    ));
    // CAP_PERFMON bypasses it.
    let (sys, proc_) = intel_machine(Cpu::Skylake, 3, 1 << access::CAP_PERFMON);
    assert!(
        plan(
            &RecordOptions {
                kernel: true,
                ..opts(&sys, &proc_)
            },
            4096
        )
        .is_ok()
    );
    assert!(
        access::check(
            proc_.path(),
            Needs {
                kernel: true,
                cpu_wide: true
            }
        )
        .is_ok()
    );
    // No readable paranoid file: the kernel decides.
    let empty = TempTree::new("empty-proc");
    assert!(access::check(empty.path(), Needs::default()).is_ok());
}

#[test]
fn filters_and_sizes() {
    assert_eq!(
        kernel_filter("0x1000/0x200@/usr/bin/true").unwrap(),
        "filter 0x1000/512@/usr/bin/true"
    );
    assert_eq!(
        kernel_filter("0xffffffff81000000/4096").unwrap(),
        "filter 0xffffffff81000000/4096"
    );
    for bad in [
        "0x1000@/bin/true",
        "x/0x10@/bin/true",
        "0x1000/0@/bin/true",
        "0x1000/0x10@bin/true",
    ] {
        assert!(
            matches!(
                kernel_filter(bad),
                Err(CaptureError::UnsupportedFilter { .. })
            ),
            "{bad}"
        );
    }
    let (sys, proc_) = intel_machine(Cpu::Skylake, 2, 0);
    let o = RecordOptions {
        filter: Some("0x1000/0x200@/usr/bin/true".into()),
        ..opts(&sys, &proc_)
    };
    assert_eq!(
        plan(&o, 4096).unwrap().filter.as_deref(),
        Some("filter 0x1000/512@/usr/bin/true")
    );
    // A PMU without address ranges cannot filter; BTS never can.
    sys.file(
        "bus/event_source/devices/intel_pt/caps/num_address_ranges",
        "0\n",
    );
    let e = plan(&o, 4096).unwrap_err();
    assert!(
        matches!(&e, CaptureError::UnsupportedFilter { reason, .. } if reason.contains("num_address_ranges = 0")),
        "{e}"
    );
    let bts = RecordOptions {
        tracer: Tracer::IntelBts,
        ..o.clone()
    };
    assert!(matches!(
        plan(&bts, 4096),
        Err(CaptureError::UnsupportedFilter { .. })
    ));
    // Sizes.
    assert_eq!(parse_size("4M", 4096), Some(4 << 20));
    assert_eq!(parse_size("16p", 4096), Some(16 * 4096));
    assert_eq!(parse_size("0x2000", 4096), Some(0x2000));
    assert_eq!(parse_size("lots", 4096), None);
    let o = RecordOptions {
        filter: None,
        aux_size: 3 * 4096,
        ..o
    };
    assert!(
        matches!(plan(&o, 4096), Err(CaptureError::BadOption(m)) if m.contains("power-of-two"))
    );
    let o = RecordOptions {
        aux_size: 4096,
        user: false,
        ..o
    };
    assert!(matches!(plan(&o, 4096), Err(CaptureError::BadOption(_))));
}

/// The AUXTRACE reference the capture writes is the TSC now: never zero
/// (perf's timed decoding dies on a zero one) and moving on.
#[test]
fn aux_references_are_the_tsc_now() {
    let a = super::sys::tsc_now();
    std::thread::sleep(std::time::Duration::from_millis(2));
    let b = super::sys::tsc_now();
    assert!(a != 0 && b > a, "{a} then {b}");
}
