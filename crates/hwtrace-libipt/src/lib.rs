//! Test-only bindings to Intel's libipt (Debian libipt-dev), the reference decoder hwtrace is checked against. Never needed to run hwtrace.
#![cfg_attr(not(test), warn(clippy::unwrap_used))]
