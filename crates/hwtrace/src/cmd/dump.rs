//! `hwtrace dump`: list the packets of a raw Intel PT trace.

use crate::input::MappedFile;
use anyhow::{Context, Result, bail};
use hwtrace_packet::{DecodedPacket, LastIp, Packet, PacketDecoder};
use serde_json::{Value, json};
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

/// List the packets of a raw Intel PT trace: offset, packet, payload and the
/// IP it reconstructs.
#[derive(Debug, clap::Args)]
pub struct DumpArgs {
    /// The trace file (raw packet bytes, as perf's AUX area or a ToPA
    /// buffer holds them).
    trace: PathBuf,
    /// One JSON object per line instead of text.
    #[arg(long)]
    json: bool,
    /// Decode from the first byte instead of searching for the first PSB.
    #[arg(long)]
    no_sync: bool,
    /// Start at this byte offset (decimal or 0x-hex).
    #[arg(long, value_parser = parse_u64)]
    from: Option<u64>,
    /// Stop before this byte offset.
    #[arg(long, value_parser = parse_u64)]
    to: Option<u64>,
    /// Print packet counts per kind and the errors at the end.
    #[arg(long)]
    stats: bool,
}

pub(crate) fn parse_u64(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    r.map_err(|e| format!("{s:?} is not a number: {e}"))
}

/// What a dump saw besides packets.
#[derive(Debug, Default)]
struct Health {
    counts: std::collections::BTreeMap<&'static str, u64>,
    errors: u64,
    skipped_bytes: u64,
}

pub fn run(args: DumpArgs) -> Result<ExitCode> {
    let file = MappedFile::open(&args.trace)?;
    let all = file.bytes();
    let from = args.from.unwrap_or(0);
    let to = args.to.unwrap_or(all.len() as u64);
    if from > to || to > all.len() as u64 {
        bail!(
            "range {from:#x}..{to:#x} is outside the trace ({} bytes)",
            all.len()
        );
    }
    let bytes = &all[from as usize..to as usize];
    let out = std::io::stdout().lock();
    let mut out = BufWriter::with_capacity(1 << 16, out);
    let health = dump(bytes, from, &args, &mut out).context("writing the dump")?;
    if args.stats {
        write_stats(&health, args.json, &mut out)?;
    }
    out.flush()?;
    Ok(if health.errors == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}

fn dump(bytes: &[u8], base: u64, args: &DumpArgs, out: &mut dyn Write) -> std::io::Result<Health> {
    let mut health = Health::default();
    let mut d = PacketDecoder::new(bytes);
    let mut last_ip = LastIp::new();
    if !args.no_sync {
        match d.sync_forward() {
            Ok(at) if at.0 > 0 => note(
                out,
                args.json,
                base,
                &format!("no psb before {:#x}: skipped {} bytes", base + at.0, at.0),
            )?,
            Ok(_) => {}
            Err(_) => {
                note(
                    out,
                    args.json,
                    base,
                    "no psb in the trace: nothing decoded (use --no-sync to decode from the first byte)",
                )?;
                health.errors += 1;
                return Ok(health);
            }
        }
    }
    loop {
        match d.next_packet() {
            Ok(Some(p)) => {
                *health.counts.entry(p.packet.kind().name()).or_default() += 1;
                match p.packet {
                    Packet::Psb | Packet::Ovf => last_ip.reset(),
                    _ => {}
                }
                let ip = p.packet.ip_payload().map(|ip| {
                    last_ip.update(ip);
                    last_ip.ip().ok()
                });
                if args.json {
                    writeln!(out, "{}", packet_json(&p, base, ip))?;
                } else {
                    write_text(out, &p, base, ip)?;
                }
            }
            Ok(None) => break,
            Err(e) => {
                health.errors += 1;
                let at = base + e.offset.0;
                match d.resync() {
                    Ok(skipped) => {
                        health.skipped_bytes += skipped.len();
                        let msg = format!(
                            "error: {}; resynced at psb {:#x}, {} bytes skipped",
                            e.kind,
                            base + skipped.to.0,
                            skipped.len()
                        );
                        error_line(out, args.json, at, &msg, Some(base + skipped.to.0))?;
                        last_ip.reset();
                    }
                    Err(_) => {
                        let lost = bytes.len() as u64 - e.offset.0;
                        health.skipped_bytes += lost;
                        let msg = format!(
                            "error: {}; no psb after it: last {lost} bytes not decoded",
                            e.kind
                        );
                        error_line(out, args.json, at, &msg, None)?;
                        break;
                    }
                }
            }
        }
    }
    Ok(health)
}

fn write_text(
    out: &mut dyn Write,
    p: &DecodedPacket,
    base: u64,
    ip: Option<Option<u64>>,
) -> std::io::Result<()> {
    let offset = base + p.offset.0;
    let text = p.packet.to_string();
    match ip {
        Some(Some(ip)) => writeln!(out, "{offset:016x}  {text:<40} ip {ip:016x}"),
        Some(None) => writeln!(out, "{offset:016x}  {text:<40} ip <none>"),
        None => writeln!(out, "{offset:016x}  {text}"),
    }
}

fn note(out: &mut dyn Write, json: bool, at: u64, msg: &str) -> std::io::Result<()> {
    if json {
        writeln!(out, "{}", json!({ "offset": at, "note": msg }))
    } else {
        writeln!(out, "[{at:#x}: {msg}]")
    }
}

fn error_line(
    out: &mut dyn Write,
    json: bool,
    at: u64,
    msg: &str,
    resync: Option<u64>,
) -> std::io::Result<()> {
    if json {
        writeln!(
            out,
            "{}",
            json!({ "offset": at, "error": msg, "resync": resync })
        )
    } else {
        writeln!(out, "[{at:#x}: {msg}]")
    }
}

fn write_stats(h: &Health, json: bool, out: &mut dyn Write) -> Result<()> {
    if json {
        writeln!(
            out,
            "{}",
            json!({ "stats": { "packets": h.counts, "errors": h.errors, "skipped_bytes": h.skipped_bytes } })
        )?;
    } else {
        writeln!(out, "\npackets:")?;
        for (k, n) in &h.counts {
            writeln!(out, "  {k:<10} {n}")?;
        }
        writeln!(
            out,
            "errors: {}, bytes skipped: {}",
            h.errors, h.skipped_bytes
        )?;
    }
    Ok(())
}

/// A packet as JSON: kind, offset, size, its fields, and the reconstructed
/// IP for IP packets (`null` when suppressed or unknown).
fn packet_json(p: &DecodedPacket, base: u64, ip: Option<Option<u64>>) -> Value {
    let hex = |v: u64| Value::String(format!("{v:#x}"));
    let fields = match p.packet {
        Packet::Pad | Packet::Psb | Packet::Psbend | Packet::Ovf | Packet::Stop => json!({}),
        Packet::Tnt(t) => {
            json!({ "bits": t.iter().map(|b| if b { '!' } else { '.' }).collect::<String>() })
        }
        Packet::Tip(i) | Packet::TipPge(i) | Packet::TipPgd(i) | Packet::Fup(i) => {
            json!({ "ipbytes": i.compression.bits(), "payload": hex(i.raw) })
        }
        Packet::ModeExec(m) => json!({ "csl": m.csl, "csd": m.csd, "if": m.iflag }),
        Packet::ModeTsx(m) => json!({ "intx": m.intx, "abort": m.abrt }),
        Packet::Pip(pip) => json!({ "cr3": hex(pip.cr3.0), "nr": pip.nr }),
        Packet::Tsc(v) => json!({ "tsc": hex(v) }),
        Packet::Cbr(v) => json!({ "ratio": v }),
        Packet::Tma(t) => json!({ "ctc": t.ctc, "fc": t.fc }),
        Packet::Mtc(v) => json!({ "ctc": v }),
        Packet::Cyc(v) => json!({ "cycles": v }),
        Packet::Vmcs(v) => json!({ "vmcs": hex(v) }),
        Packet::Mnt(v) => json!({ "payload": hex(v) }),
        Packet::Ptw(w) => {
            json!({ "payload": hex(w.payload), "bytes": if w.eight_bytes { 8 } else { 4 }, "ip": w.ip })
        }
        Packet::Exstop { ip } | Packet::Bep { ip } => json!({ "ip": ip }),
        Packet::Mwait(m) => json!({ "hints": hex(m.hints.into()), "ext": hex(m.ext.into()) }),
        Packet::Pwre(w) => json!({ "state": w.state(), "sub_state": w.sub_state(), "hw": w.hw() }),
        Packet::Pwrx(x) => {
            json!({ "last": x.last(), "deepest": x.deepest(), "wake_reason": x.wake_reason() })
        }
        Packet::Bbp(b) => json!({ "type": b.ty, "item_bytes": if b.four_bytes { 4 } else { 8 } }),
        Packet::Bip { id, value, .. } => json!({ "id": id, "value": hex(value) }),
        Packet::Cfe(c) => {
            json!({ "type": hwtrace_packet::cfe_type_name(c.ty).unwrap_or("reserved"), "type_id": c.ty, "vector": c.vector, "ip": c.ip })
        }
        Packet::Evd(e) => {
            json!({ "type": hwtrace_packet::evd_type_name(e.ty), "type_id": e.ty, "payload": hex(e.payload) })
        }
        Packet::Trig(t) => json!({ "trbv": t.trbv, "ip": t.ip, "mult": t.mult, "icnt": t.icnt }),
    };
    let mut v = json!({
        "offset": base + p.offset.0,
        "size": p.size,
        "kind": p.packet.kind().name(),
        "fields": fields,
    });
    if let Some(ip) = ip {
        v["ip"] = ip.map(hex).unwrap_or(Value::Null);
    }
    v
}
