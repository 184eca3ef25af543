//! `hwtrace cpuid`: decode CPUID leaves 07H and 14H (Intel PT enumeration),
//! from values given on the command line or read from this processor.

use anyhow::{Result, anyhow, bail};
use hwtrace_regs::cpuid::{
    CPUID_07_0_EBX, CPUID_14_0_EAX, CPUID_14_0_EBX, CPUID_14_0_ECX, CPUID_14_1_EAX, CPUID_14_1_EBX,
    CpuidRegs, PtCaps, has_intel_pt, vendor,
};
use hwtrace_regs::explain::{Explanation, parse_number};
use hwtrace_regs::field::RegisterDef;
use std::io::{BufWriter, Write};
use std::process::ExitCode;

/// Decode the Intel PT CPUID leaves (07H, 14H): given values, or this processor's.
#[derive(Debug, clap::Args)]
pub struct CpuidArgs {
    /// Leaf to decode: 0x7 or 0x14. Without register values, read from this CPU.
    #[arg(long)]
    leaf: Option<String>,
    /// Sub-leaf (ECX input).
    #[arg(long, default_value = "0")]
    subleaf: String,
    /// EAX output value to decode.
    #[arg(long)]
    eax: Option<String>,
    /// EBX output value to decode.
    #[arg(long)]
    ebx: Option<String>,
    /// ECX output value to decode.
    #[arg(long)]
    ecx: Option<String>,
    /// EDX output value to decode.
    #[arg(long)]
    edx: Option<String>,
}

fn num32(name: &str, s: &Option<String>) -> Result<Option<u32>> {
    s.as_deref()
        .map(|v| {
            let n = parse_number(v).ok_or_else(|| anyhow!("--{name} `{v}` is not a number"))?;
            u32::try_from(n).map_err(|_| anyhow!("--{name} {n:#x} does not fit 32 bits"))
        })
        .transpose()
}

/// Runs `hwtrace cpuid`.
pub fn run(args: CpuidArgs) -> Result<ExitCode> {
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let leaf = num32("leaf", &args.leaf)?;
    let subleaf = num32("subleaf", &Some(args.subleaf.clone()))?.unwrap_or(0);
    let given = [
        num32("eax", &args.eax)?,
        num32("ebx", &args.ebx)?,
        num32("ecx", &args.ecx)?,
        num32("edx", &args.edx)?,
    ];
    if given.iter().any(Option::is_some) {
        let leaf =
            leaf.ok_or_else(|| anyhow!("give --leaf (0x7 or 0x14) with the register values"))?;
        let regs = CpuidRegs {
            eax: given[0].unwrap_or(0),
            ebx: given[1].unwrap_or(0),
            ecx: given[2].unwrap_or(0),
            edx: given[3].unwrap_or(0),
        };
        let present = [
            given[0].is_some(),
            given[1].is_some(),
            given[2].is_some(),
            given[3].is_some(),
        ];
        print_leaf(&mut out, leaf, subleaf, &regs, present)?;
    } else {
        read_this_cpu(&mut out, leaf, subleaf)?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// The layouts of a leaf's registers, in EAX, EBX, ECX, EDX order.
fn layouts(leaf: u32, subleaf: u32) -> Result<[Option<&'static RegisterDef>; 4]> {
    Ok(match (leaf, subleaf) {
        (0x7, 0) => [None, Some(&CPUID_07_0_EBX), None, None],
        (0x14, 0) => [
            Some(&CPUID_14_0_EAX),
            Some(&CPUID_14_0_EBX),
            Some(&CPUID_14_0_ECX),
            None,
        ],
        (0x14, 1) => [Some(&CPUID_14_1_EAX), Some(&CPUID_14_1_EBX), None, None],
        _ => bail!(
            "hwtrace decodes CPUID leaf 07H sub-leaf 0 and leaf 14H sub-leaves 0 and 1, not leaf {leaf:#x} sub-leaf {subleaf}"
        ),
    })
}

fn print_leaf(
    out: &mut dyn Write,
    leaf: u32,
    subleaf: u32,
    regs: &CpuidRegs,
    present: [bool; 4],
) -> Result<()> {
    let values = [regs.eax, regs.ebx, regs.ecx, regs.edx];
    for ((def, value), given) in layouts(leaf, subleaf)?.into_iter().zip(values).zip(present) {
        let Some(def) = def else { continue };
        if !given {
            continue;
        }
        let e = Explanation::new(def, u64::from(value));
        writeln!(out, "{} = {value:#010x}", def.name)?;
        for f in e.fields() {
            writeln!(
                out,
                "  {:<6} {:<20} {:>10}  {}",
                f.bits.to_string(),
                f.name,
                format!("{:#x}", f.value),
                f.meaning
            )?;
        }
        let reserved: Vec<String> = e.reserved_ranges().map(|r| r.to_string()).collect();
        if !reserved.is_empty() {
            writeln!(
                out,
                "  bits {} are reserved in the SDM but set",
                reserved.join(", ")
            )?;
        }
    }
    Ok(())
}

#[cfg(target_arch = "x86_64")]
fn cpuid(leaf: u32, subleaf: u32) -> CpuidRegs {
    let r = core::arch::x86_64::__cpuid_count(leaf, subleaf);
    CpuidRegs {
        eax: r.eax,
        ebx: r.ebx,
        ecx: r.ecx,
        edx: r.edx,
    }
}

#[cfg(target_arch = "x86_64")]
fn read_this_cpu(out: &mut dyn Write, leaf: Option<u32>, subleaf: u32) -> Result<()> {
    let leaf0 = cpuid(0, 0);
    let vendor = vendor(&leaf0);
    let vendor = String::from_utf8_lossy(&vendor);
    writeln!(out, "vendor: {vendor} (max basic leaf {:#x})", leaf0.eax)?;
    if let Some(leaf) = leaf {
        if leaf > leaf0.eax {
            bail!(
                "this processor's highest basic CPUID leaf is {:#x}; leaf {leaf:#x} is not available",
                leaf0.eax
            );
        }
        return print_leaf(out, leaf, subleaf, &cpuid(leaf, subleaf), [true; 4]);
    }
    let leaf7 = if leaf0.eax >= 7 {
        cpuid(7, 0)
    } else {
        CpuidRegs::default()
    };
    if !has_intel_pt(&leaf7) {
        let why = if vendor == "GenuineIntel" {
            "this Intel processor does not report it".to_string()
        } else {
            format!(
                "this is an {vendor} processor, and Intel Processor Trace exists only on Intel processors"
            )
        };
        writeln!(
            out,
            "Intel PT: no Intel PT here — CPUID.(EAX=07H,ECX=0):EBX[25] = 0; {why}"
        )?;
        return Ok(());
    }
    writeln!(
        out,
        "Intel PT: supported (CPUID.(EAX=07H,ECX=0):EBX[25] = 1)"
    )?;
    if leaf0.eax < 0x14 {
        writeln!(
            out,
            "but CPUID leaf 14H is not available (max basic leaf {:#x})",
            leaf0.eax
        )?;
        return Ok(());
    }
    let sub0 = cpuid(0x14, 0);
    let sub1 = if sub0.eax >= 1 {
        cpuid(0x14, 1)
    } else {
        CpuidRegs::default()
    };
    print_leaf(out, 0x14, 0, &sub0, [true, true, true, false])?;
    if sub0.eax >= 1 {
        print_leaf(out, 0x14, 1, &sub1, [true, true, false, false])?;
    }
    let caps = PtCaps::new(sub0, sub1);
    writeln!(out, "address ranges: {}", caps.num_address_ranges())?;
    Ok(())
}

#[cfg(not(target_arch = "x86_64"))]
fn read_this_cpu(_out: &mut dyn Write, _leaf: Option<u32>, _subleaf: u32) -> Result<()> {
    bail!(
        "reading CPUID needs an x86-64 host; give --leaf and --eax/--ebx/--ecx/--edx to decode values"
    )
}
