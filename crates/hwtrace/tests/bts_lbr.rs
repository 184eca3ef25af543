//! `hwtrace bts decode` and `hwtrace lbr decode`, run as the built binary
//! on dumps written here with hwtrace-regs' record writers.

use hwtrace_regs::bts::BtsRecord;
use hwtrace_regs::ds::{DsFormat, DsManagementArea};
use hwtrace_regs::lbr::{LbrFormat, LbrFrom, LbrTo};
use hwtrace_types::Ip;
use std::path::PathBuf;
use std::process::Command;

mod common;
use common::{fails, ok};

/// A scratch file unique to this test process and `name`.
fn scratch(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("hwtrace-bts-lbr-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write scratch file");
    path
}

fn rec(i: u64) -> BtsRecord {
    BtsRecord {
        from: Ip(0x8000_1240 + 0x10 * i),
        to: Ip(0x8000_2000 + 0x10 * i),
        predicted: !i.is_multiple_of(5),
    }
}

/// A BTS buffer of `capacity` records after `n` branches, written the way
/// the processor writes them (wrapping to the base in circular mode).
fn buffer(format: DsFormat, capacity: u64, n: u64, threshold: u64) -> (Vec<u8>, Vec<u8>) {
    let size = format.bts_record_size();
    let base = 0x8100_0000;
    let mut buf = vec![0u8; (capacity * size) as usize];
    for i in 0..n {
        let at = ((i % capacity) * size) as usize;
        rec(i).write(format, &mut buf[at..]).expect("room");
    }
    let area = DsManagementArea {
        bts_buffer_base: base,
        bts_index: base + (n % capacity) * size,
        bts_absolute_maximum: base + capacity * size,
        bts_interrupt_threshold: base + threshold * size,
        ..DsManagementArea::default()
    };
    let mut ds = vec![0u8; format.area_size()];
    area.write(format, &mut ds).expect("fits");
    (ds, buf)
}

fn line(r: &BtsRecord) -> String {
    let flag = if r.predicted {
        "predicted"
    } else {
        "mispredicted"
    };
    format!("{:#x} -> {:#x} {flag}", r.from.0, r.to.0)
}

/// Seed 001: a 2000-record buffer (Pentium 4, 32-bit layout) with the
/// interrupt threshold at record 1900, read when the interrupt fires.
#[test]
fn bts_seed_001_buffer_at_the_interrupt() {
    let (ds, buf) = buffer(DsFormat::Bits32, 2000, 1900, 1900);
    let ds = scratch("seed001.ds", &ds);
    let buf = scratch("seed001.buf", &buf);
    let text = ok(&[
        "bts",
        "decode",
        "--ds",
        ds.to_str().expect("utf-8"),
        "--buffer",
        buf.to_str().expect("utf-8"),
        "--format",
        "32",
    ]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1900);
    assert_eq!(lines[0], "0x80001240 -> 0x80002000 mispredicted");
    assert_eq!(lines[1899], line(&rec(1899)));
}

/// A circular 64-bit buffer (threshold beyond the maximum) that wrapped:
/// the oldest record is at the index.
#[test]
fn bts_circular_buffer_is_read_from_the_index() {
    let (ds, buf) = buffer(DsFormat::Bits64, 8, 21, 9);
    let ds = scratch("circ.ds", &ds);
    let buf = scratch("circ.buf", &buf);
    let args = [
        "bts",
        "decode",
        "--ds",
        ds.to_str().expect("utf-8"),
        "--buffer",
        buf.to_str().expect("utf-8"),
    ];
    let text = ok(&args);
    let want: Vec<String> = (13..21).map(|i| line(&rec(i))).collect();
    assert_eq!(text.lines().collect::<Vec<_>>(), want);
    // Forced linear, the same dump reads base..index: records 16..21.
    let mut linear = args.to_vec();
    linear.extend(["--order", "linear"]);
    let text = ok(&linear);
    let want: Vec<String> = (16..21).map(|i| line(&rec(i))).collect();
    assert_eq!(text.lines().collect::<Vec<_>>(), want);
}

#[test]
fn bts_raw_records_json_and_errors() {
    let mut raw = vec![0u8; 3 * 24];
    for i in 0..3 {
        rec(i)
            .write(DsFormat::Bits64, &mut raw[i as usize * 24..])
            .expect("room");
    }
    let path = scratch("raw.bts", &raw);
    let text = ok(&[
        "bts",
        "decode",
        "--records",
        path.to_str().expect("utf-8"),
        "--json",
    ]);
    let objs: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert_eq!(objs.len(), 3);
    assert_eq!(objs[1]["from"], "0x80001250");
    assert_eq!(objs[1]["to"], "0x80002010");
    assert_eq!(objs[1]["predicted"], true);
    assert_eq!(objs[0]["predicted"], false);

    raw.extend([1, 2, 3]);
    let bad = scratch("bad.bts", &raw);
    let err = fails(&["bts", "decode", "--records", bad.to_str().expect("utf-8")]);
    assert!(err.contains("offset 0x48"), "{err}");

    let err = fails(&["bts", "decode", "--buffer", bad.to_str().expect("utf-8")]);
    assert!(err.contains("--ds"), "{err}");
}

#[test]
fn bts_index_between_records_is_refused_with_its_value() {
    let (mut ds, buf) = buffer(DsFormat::Bits32, 4, 1, 3);
    ds[4] += 1; // BTS index one byte past a record boundary
    let ds = scratch("skew.ds", &ds);
    let buf = scratch("skew.buf", &buf);
    let err = fails(&[
        "bts",
        "decode",
        "--ds",
        ds.to_str().expect("utf-8"),
        "--buffer",
        buf.to_str().expect("utf-8"),
        "--format",
        "32",
    ]);
    assert!(err.contains("BTS index 0x8100000d"), "{err}");
}

/// An MSR dump of a 16-entry stack (format 000011b, FROM bit 63 =
/// mispredicted) after `n` branches; entry k of the history went to slot
/// (k + 1) % 16 (TOS increments, then writes).
fn lbr_dump(n: u64, with_tos: bool) -> String {
    let f = LbrFormat::EipWithFlags;
    let mut from = [0u64; 16];
    let mut to = [0u64; 16];
    for k in 0..n {
        let slot = ((k + 1) % 16) as usize;
        from[slot] = LbrFrom {
            ip: Ip(0x40_1000 + 0x10 * k),
            mispredicted: Some(k % 4 == 0),
            in_tsx: None,
            tsx_abort: None,
        }
        .encode(f)
        .expect("fits");
        to[slot] = LbrTo {
            ip: Ip(0x40_2000 + 0x10 * k),
            cycles: None,
        }
        .encode(f)
        .expect("fits");
    }
    let mut text = String::from("# test dump\n");
    if with_tos {
        text.push_str(&format!("MSR_LASTBRANCH_TOS {}\n", n % 16));
    }
    for i in 0..16 {
        // Numbers for FROM, names for TO: both are accepted.
        text.push_str(&format!("{:#x} {:#x}\n", 0x680 + i, from[i]));
        text.push_str(&format!("MSR_LASTBRANCH_{i}_TO_IP {:#x}\n", to[i]));
    }
    text
}

#[test]
fn lbr_dump_prints_oldest_first_with_flags() {
    // 20 branches on a 16-deep stack: branches 4..20 remain.
    let path = scratch("lbr.txt", lbr_dump(20, true).as_bytes());
    let text = ok(&[
        "lbr",
        "decode",
        path.to_str().expect("utf-8"),
        "--uarch",
        "westmere",
    ]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 16);
    assert_eq!(lines[0], "0x401040 -> 0x402040 mispredicted");
    assert_eq!(lines[1], "0x401050 -> 0x402050 predicted");
    assert_eq!(lines[15], "0x401130 -> 0x402130 predicted");

    // A partly filled stack: slot 0 and 11..15 never written.
    let path = scratch("lbr10.txt", lbr_dump(10, false).as_bytes());
    let text = ok(&[
        "lbr",
        "decode",
        path.to_str().expect("utf-8"),
        "--tos",
        "10",
        "--format",
        "3",
        "--json",
    ]);
    let objs: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert_eq!(objs.len(), 10);
    assert_eq!(objs[0]["slot"], 1);
    assert_eq!(objs[0]["from"], "0x401000");
    assert_eq!(objs[9]["slot"], 10);
    assert_eq!(objs[0]["mispredicted"], true);
    assert!(objs[0]["cycles"].is_null());
}

#[test]
fn lbr_dump_errors_name_what_is_missing() {
    let path = scratch("notos.txt", lbr_dump(3, false).as_bytes());
    let p = path.to_str().expect("utf-8");
    let err = fails(&["lbr", "decode", p, "--format", "3"]);
    assert!(err.contains("no TOS"), "{err}");
    let err = fails(&["lbr", "decode", p, "--tos", "3"]);
    assert!(err.contains("no LBR format"), "{err}");
    let err = fails(&["lbr", "decode", p, "--tos", "16", "--format", "3"]);
    assert!(err.contains("TOS 16"), "{err}");
    let err = fails(&[
        "lbr", "decode", p, "--tos", "1", "--format", "3", "--uarch", "core2",
    ]);
    assert!(err.contains("core2 has 4 LBR entries"), "{err}");
    let bad = scratch(
        "bad.txt",
        b"MSR_LASTBRANCH_TOS 1\nMSR_LASTBRANCH_0_FROM_IP nope\n",
    );
    let err = fails(&[
        "lbr",
        "decode",
        bad.to_str().expect("utf-8"),
        "--format",
        "3",
    ]);
    assert!(err.contains("line 2"), "{err}");
}

/// `readelf ARGS` (binutils): the oracle the symbols are checked against.
fn readelf(args: &[&str]) -> String {
    let out = Command::new("readelf")
        .args(args)
        .output()
        .expect("readelf (binutils) runs");
    assert!(out.status.success(), "readelf {args:?} failed");
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

fn hex(s: &str) -> u64 {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).expect("hex")
}

/// An ELF file's entry point and lowest PT_LOAD address, per readelf.
fn entry_and_base(path: &str) -> (u64, u64) {
    let header = readelf(&["-hW", path]);
    let entry = header
        .lines()
        .find_map(|l| l.trim().strip_prefix("Entry point address:"))
        .map(|v| hex(v.trim()))
        .expect("an entry point");
    let base = readelf(&["-lW", path])
        .lines()
        .filter(|l| l.trim_start().starts_with("LOAD"))
        .map(|l| hex(l.split_whitespace().nth(2).expect("p_vaddr")))
        .min()
        .expect("a PT_LOAD");
    (entry, base)
}

/// `(value, size, name)` of every defined function symbol, per readelf.
fn functions(path: &str) -> Vec<(u64, u64, String)> {
    readelf(&["-sW", "--dyn-syms", path])
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let is_func = f.len() >= 8 && (f[3] == "FUNC" || f[3] == "IFUNC") && f[6] != "UND";
            is_func.then(|| {
                let name = f[7].split('@').next().expect("a name").to_owned();
                (hex(f[1]), f[2].parse().expect("a size"), name)
            })
        })
        .collect()
}

const TRUE_BIAS: u64 = 0x5555_5555_4000;
const LIBC_BIAS: u64 = 0x7fff_f7dd_0000;

/// The libc images and one of its functions that no other function
/// symbol shares an address with or starts just after: `(path, value,
/// name)`.
fn libc_function() -> (String, u64, String) {
    let libc = [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists())
    .expect("libc.so.6");
    let funcs = functions(libc);
    let (value, _, name) = funcs
        .iter()
        .find(|(value, size, name)| {
            *size >= 8
                && funcs
                    .iter()
                    .filter(|(v, _, _)| *v >= *value && *v <= *value + 4)
                    .all(|(v, _, n)| v == value && n == name)
        })
        .expect("a libc function without aliases")
        .clone();
    (libc.to_owned(), value, name)
}

#[test]
fn bts_decode_names_the_symbols_of_elf_images() {
    let (entry, base) = entry_and_base("/bin/true");
    assert!(
        !functions("/bin/true")
            .iter()
            .any(|(v, s, _)| *v <= entry && entry < v + (*s).max(1)),
        "/bin/true is expected stripped: no symbol at its entry"
    );
    let (libc, value, name) = libc_function();
    let records = [
        BtsRecord {
            from: Ip(TRUE_BIAS + entry),
            to: Ip(LIBC_BIAS + value),
            predicted: true,
        },
        BtsRecord {
            from: Ip(LIBC_BIAS + value + 4),
            to: Ip(0x1234),
            predicted: false,
        },
    ];
    let mut bytes = vec![0u8; 48];
    for (i, r) in records.iter().enumerate() {
        r.write(DsFormat::Bits64, &mut bytes[i * 24..])
            .expect("room");
    }
    let path = scratch("sym.bin", &bytes);
    let p = path.to_str().expect("utf-8");
    let true_elf = format!("/bin/true@{TRUE_BIAS:x}");
    let libc_elf = format!("{libc}@{LIBC_BIAS:x}");
    let args = [
        "bts",
        "decode",
        "--records",
        p,
        "--elf",
        &true_elf,
        "--elf",
        &libc_elf,
    ];
    let text = ok(&args);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        [
            format!(
                "{:#x} (true+{:#x}) -> {:#x} ({name}+0x0) predicted",
                TRUE_BIAS + entry,
                entry - base,
                LIBC_BIAS + value
            ),
            format!(
                "{:#x} ({name}+0x4) -> 0x1234 mispredicted",
                LIBC_BIAS + value + 4
            ),
        ]
    );
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let objs: Vec<serde_json::Value> = ok(&json_args)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert_eq!(objs[0]["from_sym"], format!("true+{:#x}", entry - base));
    assert_eq!(objs[0]["to_sym"], format!("{name}+0x0"));
    assert_eq!(objs[1]["from_sym"], format!("{name}+0x4"));
    assert!(objs[1]["to_sym"].is_null());
    // Without --elf, no symbol fields.
    let plain = ok(&["bts", "decode", "--records", p, "--json"]);
    assert!(!plain.contains("from_sym"), "{plain}");
    // A file that is not ELF is named.
    let err = fails(&["bts", "decode", "--records", p, "--elf", p]);
    assert!(
        err.contains(&format!("--elf: {p}: not an ELF file")),
        "{err}"
    );
}

#[test]
fn lbr_decode_names_the_symbols_of_elf_images() {
    let (entry, base) = entry_and_base("/bin/true");
    let (libc, value, name) = libc_function();
    let f = LbrFormat::EipWithFlags;
    let from = LbrFrom {
        ip: Ip(LIBC_BIAS + value + 2),
        mispredicted: Some(false),
        in_tsx: None,
        tsx_abort: None,
    }
    .encode(f)
    .expect("fits");
    let to = LbrTo {
        ip: Ip(TRUE_BIAS + entry),
        cycles: None,
    }
    .encode(f)
    .expect("fits");
    let dump = format!("MSR_LASTBRANCH_TOS 0\n0x680 {from:#x}\nMSR_LASTBRANCH_0_TO_IP {to:#x}\n");
    let path = scratch("lbr-sym.txt", dump.as_bytes());
    let p = path.to_str().expect("utf-8");
    let true_elf = format!("/bin/true@{TRUE_BIAS:x}");
    let libc_elf = format!("{libc}@{LIBC_BIAS:x}");
    let args = [
        "lbr", "decode", p, "--format", "3", "--elf", &libc_elf, "--elf", &true_elf,
    ];
    assert_eq!(
        ok(&args),
        format!(
            "{:#x} ({name}+0x2) -> {:#x} (true+{:#x}) predicted\n",
            LIBC_BIAS + value + 2,
            TRUE_BIAS + entry,
            entry - base
        )
    );
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let obj: serde_json::Value = serde_json::from_str(ok(&json_args).trim()).expect("JSON");
    assert_eq!(obj["from_sym"], format!("{name}+0x2"));
    assert_eq!(obj["to_sym"], format!("true+{:#x}", entry - base));
}
