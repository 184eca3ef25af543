//! Memory the traced code ran over: images, physical dumps, and x86-64 page-table walking.
#![cfg_attr(not(test), warn(clippy::unwrap_used))]
