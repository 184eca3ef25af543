//! `hwtrace msr` and `hwtrace cpuid`, run as the built binary.

mod common;
use common::{fails, ok};

/// The line of field `name`, split into columns: bits, name, value, meaning...
fn field_line<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cols| cols.get(1) == Some(&name))
        .unwrap_or_else(|| panic!("no field {name} in:\n{text}"))
}

#[test]
fn explain_rtit_ctl_0x2500_names_every_field() {
    let text = ok(&["msr", "explain", "IA32_RTIT_CTL", "0x2500"]);
    assert!(
        text.starts_with("IA32_RTIT_CTL (MSR 0x570) = 0x0000000000002500"),
        "{text}"
    );
    for (field, value) in [
        ("ToPA", "0x1"),
        ("TSCEn", "0x1"),
        ("BranchEn", "0x1"),
        ("TraceEn", "0x0"),
        ("DisTNT", "0x0"),
    ] {
        assert_eq!(field_line(&text, field)[2], value, "{field}");
    }
    assert_eq!(field_line(&text, "ADDR3_CFG")[0], "47:44");
    assert!(text.contains("reserved bits: none set"));
}

#[test]
fn explain_by_number_flags_reserved_bits() {
    let text = ok(&["msr", "explain", "0x570", "0x40000"]);
    assert!(
        text.contains("reserved bits set: 18 (mask 0x40000)"),
        "{text}"
    );
}

#[test]
fn lbr_select_meaning_depends_on_uarch() {
    let wsm = ok(&[
        "msr",
        "explain",
        "MSR_LBR_SELECT",
        "0xC4",
        "--uarch",
        "westmere",
    ]);
    assert!(wsm.contains("also drops near relative CALLs"), "{wsm}");
    let snb = ok(&[
        "msr",
        "explain",
        "msr_lbr_select",
        "0xC4",
        "--uarch",
        "sandybridge",
    ]);
    assert!(!snb.contains("also drops"), "{snb}");
    assert_eq!(field_line(&snb, "NEAR_REL_JMP")[2], "0x1");
    assert!(
        fails(&["msr", "explain", "MSR_LBR_SELECT", "0", "--uarch", "core2"])
            .contains("does not exist on core2")
    );
}

#[test]
fn debugctl_netburst_0x1c_is_seed_001s_bts_setup() {
    let text = ok(&[
        "msr",
        "explain",
        "IA32_DEBUGCTL",
        "0x1c",
        "--uarch",
        "netburst",
    ]);
    for f in ["TR", "BTS", "BTINT"] {
        assert_eq!(field_line(&text, f)[2], "0x1", "{f}");
    }
    assert!(text.contains("interrupt when it is nearly full"), "{text}");
    let modern = ok(&["msr", "explain", "IA32_DEBUGCTL", "0x1c"]);
    assert!(modern.contains("reserved bits set: 4:3"), "{modern}");
}

#[test]
fn lbr_records_need_a_format() {
    let err = fails(&[
        "msr",
        "explain",
        "MSR_LASTBRANCH_0_FROM_IP",
        "0x8000000000401000",
    ]);
    assert!(err.contains("LBR format"), "{err}");
    let text = ok(&[
        "msr",
        "explain",
        "MSR_LASTBRANCH_0_FROM_IP",
        "0xffffffff81000000",
        "--lbr-format",
        "3",
    ]);
    assert!(text.contains("address 0xffffffff81000000"), "{text}");
    assert_eq!(field_line(&text, "MISPRED")[2], "0x1");
}

#[test]
fn build_composes_and_explains() {
    let text = ok(&[
        "msr",
        "build",
        "IA32_RTIT_CTL",
        "--set",
        "TraceEn=1",
        "--set",
        "branchen=true",
        "--set",
        "ToPA=1",
        "--set",
        "MTCFreq=3",
    ]);
    assert_eq!(text.lines().next(), Some("0xe101"));
    assert_eq!(field_line(&text, "MTCFreq")[2], "0x3");
    let topa = ok(&[
        "msr",
        "build",
        "TOPA_ENTRY",
        "--set",
        "OutputRegionBase=0x9f000",
        "--set",
        "INT=1",
        "--set",
        "STOP=1",
    ]);
    assert_eq!(topa.lines().next(), Some("0x9f014"));
}

#[test]
fn build_and_explain_errors_say_why() {
    assert!(
        fails(&["msr", "build", "IA32_RTIT_CTL", "--set", "ADDR0_CFG=3"])
            .contains("reserved encoding")
    );
    assert!(
        fails(&["msr", "build", "IA32_RTIT_CTL", "--set", "MTCFreq=16"]).contains("4 bit(s) wide")
    );
    assert!(
        fails(&["msr", "build", "IA32_RTIT_CTL", "--set", "Bogus=1"])
            .contains("no field named `Bogus`")
    );
    assert!(fails(&["msr", "explain", "IA32_NOPE", "1"]).contains("no register named"));
    assert!(fails(&["msr", "explain", "0x10", "1"]).contains("MSR 0x10 is not a register"));
    assert!(fails(&["msr", "explain", "IA32_RTIT_CTL", "zz"]).contains("not a number"));
    assert!(
        fails(&["msr", "explain", "IA32_DEBUGCTL", "1", "--uarch", "zen4"])
            .contains("unknown micro-architecture")
    );
}

#[test]
fn list_names_the_registers() {
    let text = ok(&["msr", "list"]);
    assert!(text.contains("0x1c8  MSR_LBR_SELECT"), "{text}");
    assert!(text.contains("memory  TOPA_ENTRY"), "{text}");
}

#[test]
fn cpuid_decodes_given_values() {
    // Seed 000: CPUID.(EAX=14H,ECX=1):EAX = 0x02490002.
    let text = ok(&[
        "cpuid",
        "--leaf",
        "0x14",
        "--subleaf",
        "1",
        "--eax",
        "0x02490002",
    ]);
    assert_eq!(field_line(&text, "NumAddressRanges")[2], "0x2");
    assert_eq!(field_line(&text, "MtcPeriodBitmap")[2], "0x249");
    let leaf7 = ok(&["cpuid", "--leaf", "7", "--ebx", "0x02942607"]);
    assert!(leaf7.contains("Intel Processor Trace supported"), "{leaf7}");
    assert!(fails(&["cpuid", "--leaf", "0x15", "--eax", "1"]).contains("decodes CPUID leaf 07H"));
    assert!(fails(&["cpuid", "--eax", "1"]).contains("give --leaf"));
}

#[cfg(target_arch = "x86_64")]
#[test]
fn cpuid_reads_this_processor_and_says_plainly_when_there_is_no_pt() {
    let text = ok(&["cpuid"]);
    assert!(text.starts_with("vendor: "), "{text}");
    if text.contains("AuthenticAMD") {
        assert!(text.contains("no Intel PT here"), "{text}");
        assert!(text.contains("exists only on Intel processors"), "{text}");
    } else {
        assert!(text.contains("Intel PT: "), "{text}");
    }
}
