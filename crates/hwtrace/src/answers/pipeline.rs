//! Decoding beside answering: [`run_beside`] decodes a [`Source`] on a
//! thread of its own and hands its records to the answer on the caller's,
//! in batches, in order.
//!
//! An answer (report, calls, coverage, timeline) spends about half its
//! time decoding runs of instructions and the other half on its own work
//! per run (the call tracker, function lookups, coverage maps): on two
//! cores the two halves overlap. The records are the same, in the same
//! order, as [`Source::run_here`] hands them out, so every answer is
//! identical with or without the second thread. Memory stays bounded: at
//! most [`IN_FLIGHT`] batches of [`BATCH`] records exist at once, their
//! buffers passed back and forth instead of allocated per batch.

use super::source::{Sink, Source, SourceReport};
use anyhow::{Result, anyhow};
use hwtrace_report::exec::{Detail, Exec};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

/// Records per batch: enough that handing a batch over (a lock, a wake-up)
/// is a small share of the work its records stand for.
pub const BATCH: usize = 4096;

/// Batches between the decoder and the answer at most: the decoder runs
/// ahead of the answer by this much and then waits.
pub const IN_FLIGHT: usize = 4;

/// What the decoding thread's sink returns once the answer has stopped
/// taking records (the answer's own error is the one reported).
fn answer_stopped<T>(_: T) -> anyhow::Error {
    anyhow!("the answer stopped taking records")
}

/// [`Source::run_here`] on a thread of its own, its records handed to
/// `sink` on this one as they come. The first error of `sink` stops the
/// decode and is returned; a decoding error is returned as
/// [`Source::run_here`] would return it.
pub fn run_beside(source: &Source, detail: Detail, sink: Sink<'_>) -> Result<SourceReport> {
    let (full_tx, full_rx) = sync_channel::<Vec<Exec>>(IN_FLIGHT);
    let (empty_tx, empty_rx) = sync_channel::<Vec<Exec>>(IN_FLIGHT + 1);
    std::thread::scope(|scope| {
        let decoder = std::thread::Builder::new()
            .name("hwtrace-decode".into())
            .spawn_scoped(scope, move || decode(source, detail, &full_tx, &empty_rx))
            .map_err(|e| anyhow!("cannot start the decoding thread: {e}"))?;
        let answered = answer(&full_rx, &empty_tx, sink);
        // Wakes a decoder waiting to hand over a batch: it sees the answer
        // gone and stops.
        drop(full_rx);
        let decoded = match decoder.join() {
            Ok(decoded) => decoded,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        match (answered, decoded) {
            (Err(e), _) => Err(e),
            (Ok(()), decoded) => decoded,
        }
    })
}

/// The decoding thread: records into batches, each full one handed over.
fn decode(
    source: &Source,
    detail: Detail,
    full: &SyncSender<Vec<Exec>>,
    empty: &Receiver<Vec<Exec>>,
) -> Result<SourceReport> {
    let fresh = |empty: &Receiver<Vec<Exec>>| {
        empty
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(BATCH))
    };
    let mut batch = fresh(empty);
    let report = source.run_here(detail, &mut |e| {
        batch.push(e);
        if batch.len() >= BATCH {
            let next = fresh(empty);
            full.send(std::mem::replace(&mut batch, next))
                .map_err(answer_stopped)?;
        }
        Ok(())
    })?;
    if !batch.is_empty() {
        full.send(batch).map_err(answer_stopped)?;
    }
    Ok(report)
}

/// The answering side: every record of every batch to `sink`, in order,
/// the emptied buffers handed back.
fn answer(full: &Receiver<Vec<Exec>>, empty: &SyncSender<Vec<Exec>>, sink: Sink<'_>) -> Result<()> {
    for mut batch in full {
        for e in batch.drain(..) {
            sink(e)?;
        }
        // A decoder that has finished takes no more buffers.
        let _ = empty.try_send(batch);
    }
    Ok(())
}
