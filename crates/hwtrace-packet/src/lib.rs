//! Intel PT packets: a zero-copy decoder over borrowed bytes, an encoder, PSB synchronisation and ptdump-style printing.
#![cfg_attr(not(test), warn(clippy::unwrap_used))]
