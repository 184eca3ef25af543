//! The call/return structure of an executed flow, and the answers built on
//! it: an indented call trace, folded stacks (for flame graphs), function
//! profiles, and (in [`crate::timeline`]) Perfetto timelines.
//!
//! [`CallTracker`] turns the [`Exec`](crate::exec::Exec) stream into frame
//! entries and exits, per thread, and hands them to a [`CallSink`]. Every
//! output is a sink, so one decode can feed several outputs at once
//! ([`Sinks`]) and nothing but the open frames of each thread is kept in
//! memory by the tracker itself.
//!
//! How the stack is rebuilt (the rules every output shares):
//!
//! * A call (near or far) pushes a frame whose return address is the
//!   instruction after the call; a call to the very next instruction (the
//!   `call 1f; 1: pop` idiom that reads the IP) is not a call.
//! * A return pops to the frame whose return address it goes to. When that
//!   is not the top frame, the frames above it are *unwound* (longjmp,
//!   exceptions, a stack switched under the tracer): they end there.
//! * A return that matches no frame is a jump (a retpoline, code that
//!   rewrites its return address), except when the only frame left is the
//!   one the trace began in: then it returns to that frame's caller, which
//!   was entered before the trace began and gets a synthetic frame
//!   ([`FrameKind::Caller`]) covering everything seen so far.
//! * A trace that begins (or resumes after lost data) mid-function starts
//!   with a frame for the function it is in ([`FrameKind::Resumed`]).
//! * Tracing disabled and enabled again (system calls in a user-mode trace,
//!   filters) keeps the stack: the flow goes on where it stopped. Lost
//!   data (overflow, decode error, perf losses) ends every open frame,
//!   because any number of calls and returns may have gone unseen.
//! * Tail calls (a jump into another function) are not calls: the code
//!   runs in the frame that jumped.
//!
//! Functions are named through a [`Symbolize`] implementation (the
//! symboliser of the command line, or [`HexNames`]), once per distinct
//! address.

mod folded;
mod functions;
mod json;
mod profile;
pub(crate) mod timemap;
pub(crate) mod tracker;
mod tree;

pub use folded::FoldedStacks;
pub use functions::{CodeAddr, FuncId, FunctionName, Functions, HexNames, Symbolize};
pub use json::JsonLines;
pub use profile::{FunctionStats, Profile, ThreadStats};
pub use timemap::TimeMap;
pub use tracker::{
    CallSink, CallTracker, Context, ExitHow, Frame, FrameKind, MAX_DEPTH, Sinks, Stamp, ThreadKey,
};
pub(crate) use tree::gap_words;
pub use tree::{TreeWriter, TscRate};
