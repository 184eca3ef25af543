//! The lines of a qemu-user log written with `-d exec,nochain,in_asm`.
//!
//! Formats as printed by qemu 7.2 (Debian bookworm), checked by running it:
//!
//! ```text
//! Trace 0: 0x7f7444000100 [0000000000000000/0000004002825b70/1040c0b3/00000201] [symbol]
//! Stopped execution of TB chain before 0x7f7444000100 [0000004002825b70] [symbol]
//! IN: [symbol]
//! 0x4002825b73:  e8 f8 0b 00 00           callq    0x4002826770
//! 0x4002825b7b:  00 00                                  (continuation of a long instruction)
//! ```
//!
//! * `Trace CPU: HOSTPTR [CS_BASE/PC/FLAGS/CFLAGS]` is printed each time a
//!   translation block starts executing (`-d exec`; `nochain` makes qemu
//!   return to its main loop between blocks, so no block is left out, and
//!   `-singlestep` makes every block one instruction). Older qemus print
//!   three fields (no CFLAGS); both are accepted. FLAGS are the x86 `hflags`:
//!   bit 15 `HF_CS64`, bit 4 `HF_CS32`, bits 1:0 the CPL.
//! * `Stopped execution of TB chain before HOSTPTR [PC]` means the block
//!   whose `Trace` line was just printed did not run after all (an exit was
//!   requested first); it will be logged again when it does run.
//! * `-d in_asm` prints each block once, when it is translated, before its
//!   first `Trace` line: one line per instruction with its address, its bytes
//!   (at most 8 per line, the rest on continuation lines holding only
//!   bytes) and capstone's disassembly.
//!
//! Every other line (page maps, strace output, qemu's notes) is not ours and
//! is skipped.

use hwtrace_packet::ExecMode;
use hwtrace_types::Ip;

/// What was wrong with a log line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LineError {
    /// A `Trace` line without the `[cs_base/pc/flags(/cflags)]` part.
    #[error("`Trace` line without a `[cs_base/pc/flags]` field")]
    NoBracket,
    /// A field that should be hexadecimal is not.
    #[error("field `{field}` is not a hexadecimal number: `{text}`")]
    BadHex {
        /// Which field.
        field: &'static str,
        /// What was there.
        text: String,
    },
    /// A `Trace` line's CPU index is not a number.
    #[error("bad CPU index `{0}`")]
    BadCpu(String),
    /// An `in_asm` line with no instruction bytes (a qemu without capstone
    /// prints none; then no code image can be built from the log).
    #[error("`in_asm` line with no instruction bytes (qemu built without capstone?)")]
    NoBytes,
    /// The line is not valid UTF-8 although it starts like one of ours.
    #[error("line is not valid UTF-8")]
    NotUtf8,
}

/// One parsed line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Line {
    /// A block started executing at `pc`.
    Exec { cpu: u32, pc: Ip, mode: ExecMode },
    /// The block at `pc` whose `Trace` line came last did not run.
    Stopped { pc: Ip },
    /// An `in_asm` block header (`IN:`).
    AsmHeader,
    /// Code bytes at `addr` from an `in_asm` listing.
    Code { addr: Ip, bytes: CodeBytes },
    /// Anything else.
    Other,
}

/// At most 16 bytes of one `in_asm` line (qemu prints at most 8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CodeBytes {
    buf: [u8; 16],
    len: usize,
}

impl CodeBytes {
    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// Parses one line (without its line break). `in_asm` tells whether an
/// `IN:` header was seen since the last non-listing line, which is what
/// makes `0x...:` lines code listings.
pub(crate) fn parse_line(raw: &[u8], in_asm: bool) -> Result<Line, LineError> {
    let ours = raw.starts_with(b"Trace ")
        || raw.starts_with(b"Stopped execution of TB chain before ")
        || raw.starts_with(b"IN:")
        || (in_asm && raw.starts_with(b"0x"));
    if !ours {
        return Ok(Line::Other);
    }
    let line = std::str::from_utf8(raw).map_err(|_| LineError::NotUtf8)?;
    let line = line.trim_end_matches('\r');
    if let Some(rest) = line.strip_prefix("Trace ") {
        return parse_exec(rest);
    }
    if let Some(rest) = line.strip_prefix("Stopped execution of TB chain before ") {
        let fields = bracket(rest)?;
        let pc = hex(fields, "pc")?;
        return Ok(Line::Stopped { pc: Ip(pc) });
    }
    if line.starts_with("IN:") {
        return Ok(Line::AsmHeader);
    }
    parse_code(line)
}

fn parse_exec(rest: &str) -> Result<Line, LineError> {
    let (cpu, rest) = rest.split_once(':').ok_or(LineError::NoBracket)?;
    let cpu = cpu
        .trim()
        .parse::<u32>()
        .map_err(|_| LineError::BadCpu(cpu.to_string()))?;
    let inner = bracket(rest)?;
    let mut fields = inner.split('/');
    let _cs_base = hex(fields.next().unwrap_or(""), "cs_base")?;
    let pc = hex(fields.next().unwrap_or(""), "pc")?;
    let flags = hex(fields.next().unwrap_or(""), "flags")?;
    Ok(Line::Exec {
        cpu,
        pc: Ip(pc),
        mode: mode_from_hflags(flags),
    })
}

/// The execution mode from qemu's x86 `hflags` (`HF_CS64_MASK` = bit 15,
/// `HF_CS32_MASK` = bit 4), the CS.L/CS.D pair MODE.Exec reports.
pub(crate) fn mode_from_hflags(flags: u64) -> ExecMode {
    if flags & (1 << 15) != 0 {
        ExecMode::Bits64
    } else if flags & (1 << 4) != 0 {
        ExecMode::Bits32
    } else {
        ExecMode::Bits16
    }
}

/// The text between the first `[` and the following `]`.
fn bracket(s: &str) -> Result<&str, LineError> {
    let open = s.find('[').ok_or(LineError::NoBracket)?;
    let rest = &s[open + 1..];
    let close = rest.find(']').ok_or(LineError::NoBracket)?;
    Ok(&rest[..close])
}

fn hex(text: &str, field: &'static str) -> Result<u64, LineError> {
    let t = text.trim();
    let t = t.strip_prefix("0x").unwrap_or(t);
    if t.is_empty() {
        return Err(LineError::BadHex {
            field,
            text: text.to_string(),
        });
    }
    u64::from_str_radix(t, 16).map_err(|_| LineError::BadHex {
        field,
        text: text.to_string(),
    })
}

/// `0xADDR:  b0 b1 ...  mnemonic operands`: the byte column is 8 groups of
/// `xx ` (24 characters) after the two spaces following the colon.
fn parse_code(line: &str) -> Result<Line, LineError> {
    let (addr, rest) = line.split_once(':').ok_or(LineError::NoBytes)?;
    let addr = hex(addr, "address")?;
    let rest = rest.strip_prefix("  ").unwrap_or(rest);
    let column: String = rest.chars().take(24).collect();
    let mut out = CodeBytes {
        buf: [0; 16],
        len: 0,
    };
    for token in column.split(' ') {
        if token.is_empty() {
            break;
        }
        let valid = token.len() == 2 && token.bytes().all(|b| b.is_ascii_hexdigit());
        if !valid || out.len == out.buf.len() {
            break;
        }
        out.buf[out.len] = u8::from_str_radix(token, 16).map_err(|_| LineError::BadHex {
            field: "code byte",
            text: token.to_string(),
        })?;
        out.len += 1;
    }
    if out.len == 0 {
        return Err(LineError::NoBytes);
    }
    Ok(Line::Code {
        addr: Ip(addr),
        bytes: out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_lines_of_qemu_7_2_and_older() {
        let l = b"Trace 0: 0x7f7444000100 [0000000000000000/0000004002825b70/1040c0b3/00000201] ";
        assert_eq!(
            parse_line(l, false),
            Ok(Line::Exec {
                cpu: 0,
                pc: Ip(0x40_0282_5b70),
                mode: ExecMode::Bits64
            })
        );
        let l = b"Trace 1: 0x7f00 [00000000/08048000/000000b3] main";
        assert_eq!(
            parse_line(l, false),
            Ok(Line::Exec {
                cpu: 1,
                pc: Ip(0x804_8000),
                mode: ExecMode::Bits32
            })
        );
    }

    #[test]
    fn broken_exec_lines_say_what_is_wrong() {
        assert_eq!(
            parse_line(b"Trace 0: 0x7f00 [0/zz/0/0]", false),
            Err(LineError::BadHex {
                field: "pc",
                text: "zz".into()
            })
        );
        assert_eq!(
            parse_line(b"Trace 0: 0x7f00", false),
            Err(LineError::NoBracket)
        );
        assert_eq!(
            parse_line(b"Trace x: 0x7f00 [0/1/2]", false),
            Err(LineError::BadCpu("x".into()))
        );
        assert_eq!(
            parse_line(b"Trace 0: 0x7f00 [0/1]", false),
            Err(LineError::BadHex {
                field: "flags",
                text: String::new()
            })
        );
    }

    #[test]
    fn code_lines_with_continuations() {
        let l = b"0x4002825b73:  e8 f8 0b 00 00           callq    0x4002826770";
        let Ok(Line::Code { addr, bytes }) = parse_line(l, true) else {
            panic!("not code");
        };
        assert_eq!(addr, Ip(0x40_0282_5b73));
        assert_eq!(bytes.as_slice(), &[0xe8, 0xf8, 0x0b, 0, 0]);
        let l = b"0x401000:  48 b8 88 77 66 55 44 33  movabsq  $0x1122334455667788, %rax";
        let Ok(Line::Code { bytes, .. }) = parse_line(l, true) else {
            panic!("not code");
        };
        assert_eq!(bytes.as_slice().len(), 8);
        let l = b"0x401008:  22 11 ";
        let Ok(Line::Code { addr, bytes }) = parse_line(l, true) else {
            panic!("not code");
        };
        assert_eq!(
            (addr, bytes.as_slice()),
            (Ip(0x401008), &[0x22u8, 0x11][..])
        );
        assert_eq!(
            parse_line(b"0x401000:  movq %rsp, %rdi", true),
            Err(LineError::NoBytes)
        );
        // Outside an in_asm listing, `0x` lines are not ours.
        assert_eq!(parse_line(b"0x401000: whatever", false), Ok(Line::Other));
    }

    #[test]
    fn stopped_and_other_lines() {
        assert_eq!(
            parse_line(
                b"Stopped execution of TB chain before 0x7f00 [0000000000401000] ",
                false
            ),
            Ok(Line::Stopped { pc: Ip(0x401000) })
        );
        assert_eq!(
            parse_line(b"page layout changed following mmap", false),
            Ok(Line::Other)
        );
        assert_eq!(parse_line(b"IN: main", false), Ok(Line::AsmHeader));
    }
}
