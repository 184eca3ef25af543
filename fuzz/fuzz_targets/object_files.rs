//! Arbitrary bytes as the ELF and PE files the image options load, the
//! object files and DWARF the symboliser reads, and the image options'
//! syntax (checks in `object_check.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

mod object_check;

fuzz_target!(
    init: {
        // The `pdb` crate panics on some crafted PDBs; hwtrace-report
        // catches that and reports a corrupt PDB, so a panic in it is not
        // a crash of ours. Every other panic still aborts (libfuzzer-sys's
        // hook, called from this one).
        let abort = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let in_pdb = info
                .location()
                .is_some_and(|l| l.file().contains("/pdb-0."));
            if !in_pdb {
                abort(info);
            }
        }));
    },
    |data: &[u8]| {
        object_check::check(data);
    }
);
