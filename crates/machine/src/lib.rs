//! faultline's machine: a deterministic x86-64 CPU with a VMX-like
//! virtualization interface.
//!
//! The machine knows no hypervisor policy. It offers what VT-x offers a
//! hypervisor: guest mode with EPT, an exception bitmap, CR3-load exiting with
//! a CR3-target list, CR0/CR4 guest/host masks, HLT/I/O/MSR/VMCALL/CPUID
//! exits, event injection, a VPID-tagged TLB with INVEPT/INVVPID, and a cycle
//! counter that advances in virtual time only. Everything else (memory
//! virtualization, scheduling, devices) is the hypervisor's job (`crates/hv`).
//!
//! Layout:
//! - [`addr`]: address-space newtypes (`Gva`, `Gpa`, `Hpa`, `Gfn`, `Hfn`).
//! - [`memory`]: the machine's host-physical memory (an mmap region).
//! - [`cost`]: the virtual-time cost table.
//! - [`cpu`]: architectural state and the interpreter.
//! - [`alu`]: pure integer-instruction semantics with exact flags.
//! - [`mmu`]: guest paging walker, EPT walker and the TLB.
//! - [`apic`]: the local APIC in x2APIC mode.
//! - [`vmx`]: VM-execution controls, VM exits and event injection.
//! - [`elf`]: loading an ELF.
//! - [`jit`]: the translator to host code (the `jit` engine).
//!
//! With the `tools` feature, the testing tools' modules too: `bare`
//! (running an ELF with no hypervisor), `programs` (its test programs) and
//! `difftest` (differential testing and fuzzing).

pub mod addr;
pub mod alu;
pub mod apic;
#[cfg(feature = "tools")]
pub mod bare;
pub mod cost;
pub mod cpu;
#[cfg(feature = "tools")]
pub mod difftest;
pub mod elf;
pub mod jit;
pub mod memory;
pub mod mmu;
mod prefault;
#[cfg(any(test, feature = "tools"))]
pub mod programs;
pub mod vmx;

pub use addr::{Gfn, Gpa, Gva, Hfn, Hpa};
pub use cost::{CycleCosts, NamedCosts};
pub use cpu::{Cpu, CpuConfig};
pub use jit::Engine;
pub use memory::{MemError, PhysMemory};
pub use vmx::{EventInjection, EventKind, VmExit, VmxControls};
