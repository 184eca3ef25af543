//! Memory the traced code ran over: images, physical dumps, and x86-64
//! page-table walking.
//!
//! - [`image`]: code images (raw, ELF, PE sections and page caches, per
//!   CR3) behind [`hwtrace_types::ReadMemory`], and their command-line forms;
//! - [`phys`]: physical memory sources (raw dumps, QEMU ELF cores, sparse
//!   memory) behind [`hwtrace_types::PhysMemory`];
//! - [`paging`]: the page-table walker (SDM vol. 3A, ch. 4);
//! - [`selfmap`]: the self-referencing PML4 entry and the table bases it
//!   gives (Windows' page-table self-map);
//! - [`virt`]: virtual memory read through the page tables of a dump, per
//!   CR3, as [`hwtrace_types::ReadMemory`];
//! - [`pagecache`]: the `pages.addr` + `pages.dump` page caches of kAFL and
//!   libxdc traces, as [`hwtrace_types::ReadMemory`].
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

mod backing;
pub mod image;
pub mod pagecache;
pub mod paging;
pub mod phys;
pub mod selfmap;
pub mod virt;
