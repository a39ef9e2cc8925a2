//! The fast page fault (seed 001): a fault on a present spte whose fix
//! only restores an access bit (W on an MMU-writable spte, or R/X taken
//! by access tracking) is fixed by compare-and-exchange on the spte,
//! without `mmu_lock` and before any memslot lookup or host page-table
//! work.
//!
//! - [`protocol`]: the spte state machine over an atomic cell, shared by
//!   the hv, the loom model and the host-thread stress test.

// Until every user is wired in, only the tests call some of it.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) mod protocol;

#[cfg(test)]
mod model;
#[cfg(test)]
mod stress;
