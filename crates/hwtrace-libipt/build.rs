//! Link the system libipt (Debian `libipt-dev`, 2.0.5) and refuse to build
//! against anything else: `src/ffi.rs` mirrors the 2.0.5 struct layouts by hand.

use std::path::{Path, PathBuf};

const HELP: &str =
    "install it with `bash scripts/setup.sh` (Debian packages libipt-dev and libipt2)";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=LIBIPT_INCLUDE_DIR");
    println!("cargo:rerun-if-env-changed=LIBIPT_LIB_DIR");

    let include_dir = std::env::var_os("LIBIPT_INCLUDE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/include"));
    let header = include_dir.join("intel-pt.h");
    println!("cargo:rerun-if-changed={}", header.display());
    let text = std::fs::read_to_string(&header).unwrap_or_else(|e| {
        fail(&format!(
            "libipt header {} not readable ({e})",
            header.display()
        ))
    });
    check_version(&header, &text);

    let lib_dirs: Vec<PathBuf> = match std::env::var_os("LIBIPT_LIB_DIR") {
        Some(dir) => vec![PathBuf::from(dir)],
        None => [
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib64",
            "/usr/lib",
            "/usr/local/lib",
        ]
        .iter()
        .map(PathBuf::from)
        .collect(),
    };
    let Some(dir) = lib_dirs.iter().find(|d| has_libipt(d)) else {
        fail(&format!(
            "libipt shared library (libipt.so) not found in {}",
            lib_dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    };
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=ipt");
}

fn has_libipt(dir: &Path) -> bool {
    dir.join("libipt.so").exists()
}

/// The FFI layouts are written for libipt 2.0; a 2.1 header changes `struct pt_packet`,
/// `struct pt_config` and the event structure, so a mismatch must stop the build.
fn check_version(header: &Path, text: &str) {
    let field = |name: &str| -> Option<u32> {
        text.lines().find_map(|l| {
            l.trim()
                .strip_prefix("#define ")?
                .strip_prefix(name)?
                .trim()
                .parse()
                .ok()
        })
    };
    match (field("LIBIPT_VERSION_MAJOR"), field("LIBIPT_VERSION_MINOR")) {
        (Some(2), Some(0)) => {}
        (major, minor) => fail(&format!(
            "{} is libipt {major:?}.{minor:?}; hwtrace-libipt binds the 2.0 ABI (Debian's libipt 2.0.5)",
            header.display()
        )),
    }
}

fn fail(what: &str) -> ! {
    eprintln!("error: hwtrace-libipt: {what}; {HELP}");
    println!("cargo:warning=hwtrace-libipt: {what}; {HELP}");
    std::process::exit(1);
}
