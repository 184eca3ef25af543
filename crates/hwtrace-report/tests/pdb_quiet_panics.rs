//! [`quiet_caught_panics`]: the panic hook stays silent for the panics the
//! PDB reader catches and reports as a corrupt PDB, and only for those.
//! Alone in its test binary: a panic hook is the whole process's.

use hwtrace_report::symbols::{SymbolError, pdb_functions, quiet_caught_panics};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

static REPORTED: AtomicUsize = AtomicUsize::new(0);

#[test]
fn the_hook_is_silent_for_caught_pdb_panics_only() {
    // What would print the panic message: counted instead.
    std::panic::set_hook(Box::new(|_| {
        REPORTED.fetch_add(1, Ordering::SeqCst);
    }));
    quiet_caught_panics();
    quiet_caught_panics();
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/fuzz/object_files/pdb-dbi-sizes-overflow");
    let input = std::fs::read(&path).unwrap();
    // The first byte picks the fuzz target's check; the PDB follows.
    let e = pdb_functions(Path::new("bad.pdb"), &input[1..], 0).unwrap_err();
    assert!(matches!(e, SymbolError::Pdb { .. }), "{e:?}");
    assert_eq!(
        REPORTED.load(Ordering::SeqCst),
        0,
        "the caught panic was reported"
    );
    // Any other panic still reaches the hook before it (installed once).
    let other = std::panic::catch_unwind(|| panic!("not the PDB reader"));
    assert!(other.is_err());
    assert_eq!(REPORTED.load(Ordering::SeqCst), 1);
}
