//! x86-64 paging: walking the paging structures of a dump (Intel SDM
//! vol. 3A, ch. 4 "Paging", §4.5 for 4-level and 5-level paging).
//!
//! [`PageTables`] is one address space (physical memory + CR3 +
//! [`PagingConfig`]); [`PageTables::translate`] walks one address and keeps
//! the [`Path`]; [`PageTables::mappings`] visits every page mapped, and
//! [`Merged`] turns those into ranges as QEMU's `info mem` prints them.

mod builder;
mod config;
pub mod entry;
mod error;
mod level;
mod maps;
mod scan;
mod walk;

#[cfg(test)]
mod tests;

pub use builder::{BuildError, PageTableBuilder};
pub use config::PagingConfig;
pub use entry::{Entry, Flags, Perms};
pub use error::{Step, WalkError, WalkErrorKind};
pub use level::{Level, PageSize, PagingMode, VaIndices};
pub use maps::{DEFAULT_MAX_TABLES, Mapping, Mappings, MergeBy, Merged, Range};
pub use scan::{
    DEFAULT_MAX_TABLES_FOUND, Scan, ScanError, TopTable, TopTableKind, UserSummary,
    find_top_tables, region_pages, summarize_user,
};
pub use walk::{PageTables, Path, Translation};
