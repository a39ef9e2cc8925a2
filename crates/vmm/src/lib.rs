//! faultline's VMM: `run`, `restore`, `incoming` and `calibrate`, the
//! summary and the report, as a library. The `faultline` binary adds the
//! command line and the benchmarks (`src/bench/`), which use this
//! library and are never used by it.

pub mod calibrate;
pub mod config;
pub mod costs;
pub mod linux;
pub mod memslot_churn;
pub mod migrate;
pub mod options;
pub mod report;
pub mod run;
pub mod session;
pub mod signals;
pub mod units;

pub use options::*;
pub use run::RunArgs;

/// Exit status of a configuration error.
pub const EXIT_CONFIG: u8 = 2;
/// Exit status of a VM error.
pub const EXIT_VM_ERROR: u8 = 3;
/// Exit status when a limit ended the run (as `timeout(1)`).
pub const EXIT_LIMIT: u8 = 124;
