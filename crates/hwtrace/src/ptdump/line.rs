//! One line of ptdump output: fixed-width columns.
//!
//! ptdump keeps each column in a fixed-size text field and pads it when
//! printing: offset (16 characters, padded to 17), raw bytes (32, padded to
//! 33), opcode (9, padded to 10 when a payload follows), payload (24,
//! padded to 25 when tracking follows), tracking name (4, padded to 5) and
//! tracking value (16). Text longer than a field is cut, as ptdump does.

use std::fmt::Write as _;
use std::io::{self, Write};

/// Field capacities in characters.
const OFFSET: usize = 16;
const RAW: usize = 32;
const OPCODE: usize = 9;
const PAYLOAD: usize = 24;
/// The TNT payload uses the wider field.
const TNT_PAYLOAD: usize = 47;
const TRACKING_NAME: usize = 4;
const TRACKING_VALUE: usize = 16;

/// The columns of one packet line.
#[derive(Debug, Default)]
pub struct Line {
    pub offset: Option<u64>,
    raw: String,
    opcode: &'static str,
    payload: String,
    tracking_name: &'static str,
    tracking_value: String,
    /// Do not print this line (e.g. `--no-pad`).
    pub skip: bool,
    /// No time column at this packet (CBR).
    pub skip_time: bool,
    /// No calibration column at this packet (TMA, CYC).
    pub skip_tcal: bool,
}

fn cut(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

impl Line {
    pub fn new(offset: Option<u64>) -> Self {
        Self {
            offset,
            ..Self::default()
        }
    }

    /// Sets the raw bytes column.
    pub fn set_raw(&mut self, bytes: &[u8]) {
        self.raw.clear();
        for b in bytes.iter().take(RAW / 2) {
            let _ = write!(self.raw, "{b:02x}");
        }
    }

    pub fn set_opcode(&mut self, opcode: &'static str) {
        self.opcode = opcode;
    }

    pub fn set_payload(&mut self, payload: String) {
        self.payload = cut(payload, PAYLOAD);
    }

    /// A TNT payload, which may be longer than the standard field.
    pub fn set_tnt_payload(&mut self, payload: String) {
        self.payload = cut(payload, TNT_PAYLOAD);
    }

    pub fn set_tracking(&mut self, name: &'static str, value: String) {
        self.tracking_name = name;
        self.tracking_value = cut(value, TRACKING_VALUE);
    }

    /// Whether a tracking column is set.
    pub fn has_tracking(&self) -> bool {
        !self.tracking_name.is_empty()
    }

    /// Writes the line (unless skipped) with ptdump's column layout.
    pub fn write(&self, out: &mut dyn Write) -> io::Result<()> {
        if self.skip {
            return Ok(());
        }
        let mut text = String::with_capacity(128);
        let mut sep = "";
        if let Some(offset) = self.offset {
            let _ = write!(
                text,
                "{:<w$}",
                cut(format!("{offset:016x}"), OFFSET),
                w = OFFSET + 1
            );
            sep = " ";
        }
        if !self.raw.is_empty() {
            let _ = write!(text, "{sep}{:<w$}", self.raw, w = RAW + 1);
            sep = " ";
        }
        if self.payload.is_empty() {
            let _ = write!(text, "{sep}{}", self.opcode);
        } else {
            let _ = write!(text, "{sep}{:<w$}", self.opcode, w = OPCODE + 1);
        }
        if self.has_tracking() {
            let _ = write!(
                text,
                " {:<pw$} {:<tw$}{}",
                self.payload,
                self.tracking_name,
                self.tracking_value,
                pw = PAYLOAD + 1,
                tw = TRACKING_NAME + 1
            );
        } else if !self.payload.is_empty() {
            let _ = write!(text, " {}", self.payload);
        }
        text.push('\n');
        out.write_all(text.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(line: &Line) -> String {
        let mut out = Vec::new();
        line.write(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn opcode_only() {
        let mut line = Line::new(Some(0x10));
        line.set_opcode("psbend");
        assert_eq!(render(&line), "0000000000000010  psbend\n");
    }

    #[test]
    fn payload_and_tracking_columns() {
        let mut line = Line::new(Some(0));
        line.set_opcode("pip");
        line.set_payload("a00".into());
        line.set_tracking("cr3", "0000000000000a00".into());
        assert_eq!(
            render(&line),
            "0000000000000000  pip        a00                       cr3  0000000000000a00\n"
        );
    }

    #[test]
    fn raw_without_offset() {
        let mut line = Line::new(None);
        line.set_raw(&[0x02, 0x23]);
        line.set_opcode("psbend");
        assert_eq!(render(&line), format!("{:<33} psbend\n", "0223"));
    }

    #[test]
    fn long_payload_is_cut_and_skip_prints_nothing() {
        let mut line = Line::new(None);
        line.set_opcode("trig");
        line.set_payload("a1, ip, mult, icnt: 65535".into());
        assert_eq!(render(&line), "trig       a1, ip, mult, icnt: 6553\n");
        line.skip = true;
        assert_eq!(render(&line), "");
    }
}
