//! [`Disassembler`]: Intel-syntax text of instructions, each instruction
//! formatted once and its text kept while it stays hot, and the fixed-width
//! hex numbers the printed lines start with.
//!
//! Printing a trace's instructions disassembled spent ~1,300 instructions
//! a line decoding and formatting the same few thousand instructions again
//! and again (a loop prints its body once per iteration), and ~650 writing
//! the address through `{:016x}` (callgrind, `hwtrace flow` on 10 copies
//! of the real trace foo: 2,650 a line in all). A direct-mapped cache keyed
//! by everything the text depends on (the address, which relative targets
//! are printed from, the bytes and the mode) gives the same text for a
//! lookup.

use hwtrace_packet::ExecMode;
use iced_x86::{Decoder, DecoderOptions, Formatter, IntelFormatter};

/// Slots of the cache (a power of two): more than the hot instructions of
/// the benchmark's real traces; an instruction that shares a slot with a
/// hotter one is formatted again, never wrong.
const SLOTS: usize = 1 << 14;

/// The slot of the instruction at `ip`: the high bits of a multiplicative
/// hash, so neighbouring instructions spread over the slots.
fn slot_of(ip: u64) -> usize {
    (ip.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - SLOTS.trailing_zeros())) as usize
}

/// The longest x86 instruction.
const MAX_BYTES: usize = 15;

/// What a cached text shares the line with before it: the address as 16
/// hex digits and two spaces (`hwtrace flow`'s and ptxed's lines).
const ADDRESS: usize = 18;

/// One cached text and what it was made from.
#[derive(Clone, Debug, Default)]
struct Slot {
    ip: u64,
    bitness: u32,
    len: u8,
    /// The bytes, zero-padded: compared as one number.
    code: u128,
    /// Whether the bytes decode.
    valid: bool,
    /// The address ([`ADDRESS`] characters), then the text (none when the
    /// bytes do not decode).
    line: String,
}

/// How numbers are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Syntax {
    /// As objdump and perf write them: `0x1f`, lower case (`hwtrace flow`).
    #[default]
    Objdump,
    /// iced-x86's defaults: `1Fh`, upper case (`hwtrace ptxed`, as it has
    /// always printed).
    Iced,
}

/// Disassembles instructions into Intel syntax, from a cache of recent
/// texts.
#[derive(Default)]
pub struct Disassembler {
    syntax: Syntax,
    /// Made at the first instruction: making one runs ~5 M instructions
    /// (its tables), as much as decoding 500 KB of trace, which a count
    /// (`--quiet --stats`) would pay for nothing.
    formatter: Option<IntelFormatter>,
    /// Allocated at the first instruction too.
    slots: Vec<Slot>,
}

impl std::fmt::Debug for Disassembler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Disassembler")
            .field("slots", &self.slots.len())
            .finish_non_exhaustive()
    }
}

/// An Intel-syntax formatter writing numbers in `syntax`.
fn intel_formatter(syntax: Syntax) -> IntelFormatter {
    let mut formatter = IntelFormatter::new();
    if syntax == Syntax::Objdump {
        let options = formatter.options_mut();
        options.set_uppercase_hex(false);
        options.set_hex_prefix("0x");
        options.set_hex_suffix("");
    }
    formatter
}

impl Disassembler {
    /// A disassembler writing numbers in `syntax`.
    pub fn new(syntax: Syntax) -> Self {
        Self {
            syntax,
            ..Self::default()
        }
    }

    /// The text of the instruction `bytes` at `ip` in `mode`; `None` when
    /// they do not decode.
    pub fn text(&mut self, ip: u64, mode: Option<ExecMode>, bytes: &[u8]) -> Option<&str> {
        let slot = self.slot(ip, mode, bytes);
        slot.valid.then(|| &slot.line[ADDRESS..])
    }

    /// `ip` as 16 hex digits, two spaces and [`text`](Self::text): a line
    /// of printed flow in one piece; `None` when the bytes do not decode.
    pub fn line(&mut self, ip: u64, mode: Option<ExecMode>, bytes: &[u8]) -> Option<&str> {
        let slot = self.slot(ip, mode, bytes);
        slot.valid.then_some(slot.line.as_str())
    }

    /// The slot of the instruction, filled.
    fn slot(&mut self, ip: u64, mode: Option<ExecMode>, bytes: &[u8]) -> &Slot {
        let bitness = match mode {
            Some(ExecMode::Bits16) => 16,
            Some(ExecMode::Bits32) => 32,
            _ => 64,
        };
        let bytes = &bytes[..bytes.len().min(MAX_BYTES)];
        let mut padded = [0u8; 16];
        padded[..bytes.len()].copy_from_slice(bytes);
        let code = u128::from_le_bytes(padded);
        if self.slots.is_empty() {
            self.slots = vec![Slot::default(); SLOTS];
        }
        let at = slot_of(ip);
        let Self {
            syntax,
            formatter,
            slots,
        } = self;
        let slot = &mut slots[at];
        let hit = slot.ip == ip
            && slot.bitness == bitness
            && usize::from(slot.len) == bytes.len()
            && slot.code == code
            // Never used: no address either.
            && !slot.line.is_empty();
        if !hit {
            slot.ip = ip;
            slot.bitness = bitness;
            slot.len = bytes.len() as u8;
            slot.code = code;
            slot.line.clear();
            push_hex16(&mut slot.line, ip);
            slot.line.push_str("  ");
            let mut decoder = Decoder::with_ip(bitness, bytes, ip, DecoderOptions::NONE);
            let instr = decoder.decode();
            slot.valid = !instr.is_invalid();
            if slot.valid {
                formatter
                    .get_or_insert_with(|| intel_formatter(*syntax))
                    .format(&instr, &mut slot.line);
            }
        }
        slot
    }
}

/// Lower-case hex digits.
const HEX: &[u8; 16] = b"0123456789abcdef";

/// Each byte's two lower-case hex digits.
const HEX_PAIRS: [[u8; 2]; 256] = {
    let mut pairs = [[0u8; 2]; 256];
    let mut b = 0;
    while b < 256 {
        pairs[b] = [HEX[b >> 4], HEX[b & 0xf]];
        b += 1;
    }
    pairs
};

/// `v` as 16 lower-case hex digits, as `{:016x}` writes it (a line of
/// printed flow starts with one: a byte at a time from a table).
pub fn push_hex16(out: &mut String, v: u64) {
    let mut digits = [0u8; 16];
    for (pair, b) in digits.chunks_exact_mut(2).zip(v.to_be_bytes()) {
        pair.copy_from_slice(&HEX_PAIRS[usize::from(b)]);
    }
    // The digits are ASCII.
    out.push_str(std::str::from_utf8(&digits).unwrap_or_default());
}

/// `v` as `0x` and its lower-case hex digits without leading zeros, as
/// `{:#x}` writes it.
pub fn push_hex(out: &mut String, v: u64) {
    let mut digits = [0u8; 18];
    let n = (16 - v.leading_zeros() as usize / 4).max(1);
    digits[0] = b'0';
    digits[1] = b'x';
    for i in 0..n {
        digits[2 + i] = HEX[((v >> (4 * (n - 1 - i))) & 0xf) as usize];
    }
    out.push_str(std::str::from_utf8(&digits[..2 + n]).unwrap_or_default());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_what_the_format_strings_write() {
        for v in [
            0,
            1,
            0xf,
            0x10,
            0x1234_5678,
            0x7fff_f7a3_2b10,
            0xffff_ffff_8100_0041,
            u64::MAX,
        ] {
            let (mut a, mut b) = (String::new(), String::new());
            push_hex16(&mut a, v);
            push_hex(&mut b, v);
            assert_eq!(a, format!("{v:016x}"));
            assert_eq!(b, format!("{v:#x}"));
        }
    }

    /// The text of `bytes` at `ip` formatted afresh, without the cache.
    fn fresh(syntax: Syntax, ip: u64, mode: Option<ExecMode>, bytes: &[u8]) -> Option<String> {
        let bitness = if mode == Some(ExecMode::Bits32) {
            32
        } else {
            64
        };
        let instr = Decoder::with_ip(bitness, bytes, ip, DecoderOptions::NONE).decode();
        let mut text = String::new();
        intel_formatter(syntax).format(&instr, &mut text);
        (!instr.is_invalid()).then_some(text)
    }

    #[test]
    fn cached_text_is_the_text_of_those_bytes_at_that_address() {
        // jz -3: its target is printed from the address.
        let jz = [0x74, 0xfd];
        // The same slot's neighbours: addresses that share it.
        let a = 0x40_1001u64;
        let b = (1..u64::MAX)
            .map(|k| a + k * 0x1000)
            .find(|&b| slot_of(b) == slot_of(a))
            .unwrap();
        let cases: [(u64, Option<ExecMode>, &[u8]); 11] = [
            (0x1001, None, &jz),
            (0x2001, None, &jz),
            (0x1001, None, &jz),
            // Other bytes at the same address (code that changed), another
            // mode, a prefix, bytes that do not decode, none.
            (0x1001, None, &[0x90]),
            (0x1001, Some(ExecMode::Bits32), &[0x40]),
            (0x1001, None, &[0x40, 0x90]),
            (0x1001, None, &[0x0f]),
            (0x1001, None, &[]),
            // Addresses sharing a slot: each formatted when it comes.
            (a, None, &jz),
            (b, None, &jz),
            (a, None, &jz),
        ];
        for syntax in [Syntax::Objdump, Syntax::Iced] {
            let mut d = Disassembler::new(syntax);
            for (ip, mode, bytes) in cases {
                assert_eq!(
                    d.text(ip, mode, bytes).map(str::to_owned),
                    fresh(syntax, ip, mode, bytes),
                    "{syntax:?} {ip:#x} {bytes:x?}"
                );
            }
        }
        let mut d = Disassembler::new(Syntax::Objdump);
        assert_eq!(
            d.text(0x1001, None, &jz),
            Some("je short 0x0000000000001000")
        );
        assert_eq!(d.text(0x1001, None, &[0x90]), Some("nop"));
        assert_eq!(d.text(0x1001, None, &[]), None);
        assert_eq!(d.line(0x1001, None, &[0x90]), Some("0000000000001001  nop"));
        assert_eq!(d.line(0x1001, None, &[0x0f]), None);
        let mut d = Disassembler::new(Syntax::Iced);
        assert_eq!(
            d.text(0x1001, None, &jz),
            Some("je short 0000000000001000h")
        );
    }
}
