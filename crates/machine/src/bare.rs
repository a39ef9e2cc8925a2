//! Bare mode: run an ELF in ring 0 long mode with no hypervisor.
//!
//! STUB: to be implemented (see the helper task).
