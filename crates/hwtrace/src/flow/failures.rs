//! [`FailureLines`]: `--quiet`'s report of each error and endless loop,
//! one line on stderr, as `eprintln!("hwtrace: {trace}: error at {e}")`
//! would write it.
//!
//! A trace can have thousands of errors (the real traces of the benchmark
//! have 48 in every 185 KB, PSB+ written with tracing on where it was
//! off), and writing each line through `format_args!` took as many
//! instructions as decoding 60 bytes of trace: the trace's name is
//! written out once, the hexadecimal numbers by hand.

use super::Item;
use super::disasm::push_hex;
use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;

/// Writes the failure lines of one trace.
#[derive(Debug)]
pub struct FailureLines {
    /// `hwtrace: <trace>: `.
    prefix: String,
    /// The line being written.
    line: String,
}

impl FailureLines {
    /// The lines of failures decoding `trace`.
    pub fn new(trace: &Path) -> Self {
        Self {
            prefix: format!("hwtrace: {}: ", trace.display()),
            line: String::with_capacity(128),
        }
    }

    /// Writes `item`'s line to `err` if it is an error or an endless
    /// loop. A failure to write is not an error: stderr going away must
    /// not lose the decode's result.
    pub fn write(&mut self, item: &Item, err: &mut impl Write) {
        let line = &mut self.line;
        line.clear();
        line.push_str(&self.prefix);
        match item {
            Item::Error(e) => {
                line.push_str("error at ");
                push_hex(line, e.offset.0);
                if let Some(ip) = e.ip {
                    line.push_str(", ip ");
                    push_hex(line, ip);
                }
                let _ = writeln!(line, ": {}", e.kind);
            }
            Item::Stuck { offset, ip, insns } => {
                let _ = writeln!(
                    line,
                    "error at {offset:#x}, ip {ip:#x}: {insns} instructions without trace: an endless loop"
                );
            }
            _ => return,
        }
        let _ = err.write_all(line.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hwtrace_flow::{Error, ErrorKind};
    use hwtrace_types::TraceOffset;

    fn line(item: &Item) -> String {
        let mut out = Vec::new();
        FailureLines::new(Path::new("dir/trace.pt")).write(item, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn lines_are_what_format_writes() {
        for offset in [0, 1, 0xf, 0x10, 0x88c4, 0x1fb_57b4, u64::MAX] {
            for ip in [None, Some(0), Some(0x40_c859), Some(0xffff_ffff_c038_103c)] {
                for kind in [
                    ErrorKind::BadStatusUpdate,
                    ErrorKind::BadContext,
                    ErrorKind::NoMap,
                ] {
                    let e = Error {
                        offset: TraceOffset(offset),
                        ip,
                        kind,
                    };
                    assert_eq!(
                        line(&Item::Error(e)),
                        format!("hwtrace: dir/trace.pt: error at {e}\n")
                    );
                }
            }
        }
        assert_eq!(
            line(&Item::Stuck {
                offset: 0x40,
                ip: 0x1000,
                insns: 16
            }),
            "hwtrace: dir/trace.pt: error at 0x40, ip 0x1000: 16 instructions without trace: an endless loop\n"
        );
        assert_eq!(line(&Item::Resync { from: 0, to: None }), "");
    }
}
