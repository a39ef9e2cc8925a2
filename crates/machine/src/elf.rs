//! Parsing and loading static ELF64 x86-64 executables.
//!
//! STUB: to be implemented (see the helper task).
