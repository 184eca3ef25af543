//! Zstd-compressed perf.data (`perf record -z`): `PERF_RECORD_COMPRESSED`
//! (81, `{ header; char data[]; }`), `PERF_RECORD_COMPRESSED2` (83,
//! `{ header; u64 data_size; char data[]; }` padded to 8 bytes) and the
//! `HEADER_COMPRESSED` feature (`u32 version, type, level, ratio, mmap_len`).
//!
//! perf compresses what it reads from each ring buffer with one zstd stream
//! for the whole session: it flushes after every read but never ends the
//! frame, and cuts the output into records of at most 64 KiB. So one
//! decompression context lives across all COMPRESSED records of a file,
//! and a record of the inner stream may begin in one COMPRESSED record and
//! end in the next (perf keeps the unfinished tail, and so does this reader).
//!
//! # Why libzstd (through `zstd-safe`), not a pure-Rust decoder
//!
//! `ruzstd` 0.9 hands out decoded bytes only once they are older than the
//! frame's window, or when the frame ends. perf's frame never ends, so the
//! last window (512 KiB at perf's default level) of every file would never
//! come out, and every other record would come out up to a window late,
//! after the uncompressed records that follow it. libzstd returns
//! everything a flush made decodable, is what perf itself links, and
//! applies the same window limit (`windowLogMax` 27, 128 MiB) perf's reads
//! do. Its C build (`zstd-sys`, bundled source) measured 9 s of CPU on
//! this machine in debug.
//!
//! # Memory
//!
//! The decompression buffer holds at most one unfinished inner record
//! (< 64 KiB, `header.size` is a u16) plus one [`CHUNK`] of fresh output;
//! records are handed out one at a time, borrowed from it. libzstd keeps
//! the frame's window besides (512 KiB at perf's default level; a frame
//! asking for more than 128 MiB is refused). Each COMPRESSED
//! record may expand to at most the ring-buffer size perf recorded with
//! (`HEADER_COMPRESSED.mmap_len`, within [`CHUNK`] and [`MAX_LIMIT`]), as
//! in perf, which decompresses each record into a buffer of that size: a
//! decompression bomb is an error, not gigabytes of records.

use std::ops::Range;

use super::bytes::le16;
use super::error::{Error, ErrorKind};

/// `PERF_RECORD_COMPRESSED`.
pub const COMPRESSED: u32 = 81;
/// `PERF_RECORD_COMPRESSED2` (perf 6.15 and later: 8-byte aligned).
pub const COMPRESSED2: u32 = 83;
/// `PERF_COMP_ZSTD`, the only `HEADER_COMPRESSED` type perf knows.
pub const COMP_ZSTD: u32 = 1;

/// Fresh output decoded per step.
pub const CHUNK: usize = 64 * 1024;
/// The expansion limit per COMPRESSED record when the file has no
/// `HEADER_COMPRESSED` (a recording cut short loses its feature sections).
pub const DEFAULT_LIMIT: u64 = 16 << 20;
/// The largest expansion limit any `mmap_len` can ask for.
pub const MAX_LIMIT: u64 = 128 << 20;
/// libzstd's default (and perf's) largest window: 2^27 bytes.
const WINDOW_LOG_MAX: u32 = 27;

/// `HEADER_COMPRESSED`: how the records were compressed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Compression {
    /// `comp_ver`: the layout version of this feature (perf writes 0).
    pub version: u32,
    /// `comp_type`: [`COMP_ZSTD`].
    pub kind: u32,
    /// `comp_level` (`-z`/`--compression-level`).
    pub level: u32,
    /// `comp_ratio`: perf's rounded compression ratio.
    pub ratio: u32,
    /// `comp_mmap_len`: the ring buffer's size; no COMPRESSED record
    /// expands to more.
    pub mmap_len: u32,
}

/// A `PERF_RECORD_COMPRESSED`/`COMPRESSED2` record: its part of the zstd
/// stream, borrowed from the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compressed<'a> {
    /// The zstd bytes.
    pub data: &'a [u8],
}

/// Parses a COMPRESSED or COMPRESSED2 record (`raw` with its header).
pub(crate) fn parse_compressed(
    raw: &[u8],
    kind: u32,
    offset: u64,
) -> Result<Compressed<'_>, Error> {
    if kind == COMPRESSED {
        return Ok(Compressed { data: &raw[8..] });
    }
    let short = || {
        Error::at(
            offset,
            ErrorKind::RecordTooShort {
                record_type: kind,
                needed: 16,
                size: raw.len().min(u16::MAX as usize) as u16,
            },
        )
    };
    let size = super::bytes::le64_at(raw, 8).ok_or_else(short)?;
    let body = &raw[16..];
    if size > body.len() as u64 {
        return Err(Error::at(
            offset,
            ErrorKind::Truncated {
                what: "COMPRESSED2 data",
                needed: size,
                available: body.len() as u64,
            },
        ));
    }
    Ok(Compressed {
        data: &body[..size as usize],
    })
}

/// The decompression state of one file: a zstd context that lives across
/// COMPRESSED records, the compressed bytes of the current record not yet
/// fed, and the decompressed bytes not yet handed out.
pub(crate) struct Inflate<'a> {
    dctx: zstd_safe::DCtx<'static>,
    /// The current COMPRESSED record's bytes not yet decoded.
    input: &'a [u8],
    /// Its file offset.
    record_offset: u64,
    /// Decompressed bytes; `buf[start..]` not yet handed out.
    buf: Vec<u8>,
    start: usize,
    /// Bytes of the inner stream handed out or dropped before `buf[start]`.
    stream_pos: u64,
    /// What the current COMPRESSED record has expanded to so far.
    produced: u64,
    limit: u64,
    /// The last step filled all its room: libzstd may hold more output
    /// for the bytes it already took.
    pending_output: bool,
}

impl core::fmt::Debug for Inflate<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Inflate")
            .field("record_offset", &self.record_offset)
            .field("input_left", &self.input.len())
            .field("buffered", &(self.buf.len() - self.start))
            .field("stream_pos", &self.stream_pos)
            .finish()
    }
}

impl<'a> Inflate<'a> {
    pub(crate) fn new() -> Self {
        let mut dctx = zstd_safe::DCtx::create();
        // The default already, said explicitly: the window bounds memory.
        let _ = dctx.set_parameter(zstd_safe::DParameter::WindowLogMax(WINDOW_LOG_MAX));
        Self {
            dctx,
            input: &[],
            record_offset: 0,
            buf: Vec::new(),
            start: 0,
            stream_pos: 0,
            produced: 0,
            limit: DEFAULT_LIMIT,
            pending_output: false,
        }
    }

    /// The expansion limit per COMPRESSED record for a file described by
    /// `c`: perf's `mmap_len`, within [[`CHUNK`], [`MAX_LIMIT`]].
    pub(crate) fn limit_for(c: Option<&Compression>) -> u64 {
        match c {
            Some(c) if c.mmap_len != 0 => u64::from(c.mmap_len).clamp(CHUNK as u64, MAX_LIMIT),
            _ => DEFAULT_LIMIT,
        }
    }

    /// Starts on the next COMPRESSED record.
    pub(crate) fn feed(&mut self, data: &'a [u8], record_offset: u64, limit: u64) {
        self.input = data;
        self.record_offset = record_offset;
        self.produced = 0;
        self.limit = limit;
    }

    /// The file offset of the COMPRESSED record being expanded.
    pub(crate) fn record_offset(&self) -> u64 {
        self.record_offset
    }

    /// The decompressed bytes.
    pub(crate) fn buf(&self) -> &[u8] {
        &self.buf
    }

    /// Drops what is left of the current record and of the inner stream
    /// after an error, so the next COMPRESSED record starts afresh (and
    /// the caller sees at most one error per record).
    fn fail(&mut self, kind: ErrorKind) -> Error {
        let _ = self.dctx.reset(zstd_safe::ResetDirective::SessionOnly);
        self.input = &[];
        self.pending_output = false;
        self.stream_pos += (self.buf.len() - self.start) as u64;
        self.buf.clear();
        self.start = 0;
        Error::at(self.record_offset, kind)
    }

    /// An error in an inner record at `stream_offset`, at the COMPRESSED
    /// record's file offset.
    pub(crate) fn inner_error(record_offset: u64, stream_offset: u64, e: Error) -> Error {
        Error::at(
            record_offset,
            ErrorKind::InCompressed {
                stream_offset,
                kind: Box::new(e.kind),
            },
        )
    }

    /// The next complete inner record: its range in [`Self::buf`] and its
    /// position in the inner stream; `Ok(None)` when the current
    /// COMPRESSED record is used up (an unfinished record waits for the
    /// next one).
    pub(crate) fn next_record(&mut self) -> Result<Option<(Range<usize>, u64)>, Error> {
        loop {
            let avail = &self.buf[self.start..];
            if avail.len() >= 8 {
                let size = usize::from(le16(&avail[6..8]));
                if size < 8 {
                    let at = self.stream_pos;
                    return Err(self.fail(ErrorKind::InCompressed {
                        stream_offset: at,
                        kind: Box::new(ErrorKind::BadSize {
                            what: "decompressed record size",
                            value: size as u64,
                        }),
                    }));
                }
                if avail.len() >= size {
                    let range = self.start..self.start + size;
                    let at = self.stream_pos;
                    self.start += size;
                    self.stream_pos += size as u64;
                    return Ok(Some((range, at)));
                }
            }
            if self.input.is_empty() && !self.pending_output {
                return Ok(None);
            }
            self.decode_chunk()?;
        }
    }

    /// Decodes up to [`CHUNK`] more bytes of the current record.
    fn decode_chunk(&mut self) -> Result<(), Error> {
        self.buf.drain(..self.start);
        self.start = 0;
        let filled = self.buf.len();
        // Exactly CHUNK bytes of room (zeroed: a memset is cheap next to
        // decompression, and keeps this free of `unsafe`).
        self.buf.resize(filled + CHUNK, 0);
        let (read, written, result) = {
            let mut out = zstd_safe::OutBuffer::around_pos(&mut self.buf[..], filled);
            let mut input = zstd_safe::InBuffer::around(self.input);
            let r = self.dctx.decompress_stream(&mut out, &mut input);
            (input.pos(), out.pos() - filled, r)
        };
        self.buf.truncate(filled + written);
        if let Err(code) = result {
            return Err(self.fail(ErrorKind::Zstd {
                reason: zstd_safe::get_error_name(code),
            }));
        }
        self.input = &self.input[read..];
        self.pending_output = written == CHUNK;
        self.produced += written as u64;
        if self.produced > self.limit {
            let limit = self.limit;
            return Err(self.fail(ErrorKind::CompressedTooLarge { limit }));
        }
        if read == 0 && written == 0 && !self.input.is_empty() {
            return Err(self.fail(ErrorKind::Zstd {
                reason: "no progress",
            }));
        }
        Ok(())
    }

    /// Bytes of an unfinished record left when the stream ends, and where.
    pub(crate) fn leftover(&mut self) -> Option<Error> {
        let left = self.buf.len() - self.start;
        if left == 0 {
            return None;
        }
        let at = self.stream_pos;
        Some(
            self.fail(ErrorKind::InCompressed {
                stream_offset: at,
                kind: Box::new(ErrorKind::Truncated {
                    what: "record at the end of the compressed stream",
                    needed: self
                        .buf
                        .get(self.start + 6..self.start + 8)
                        .map_or(8, |s| u64::from(le16(s))),
                    available: left as u64,
                }),
            }),
        )
    }
}
