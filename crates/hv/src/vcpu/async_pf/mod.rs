//! What a vCPU does about asynchronous page faults (the state is
//! `crate::apf`'s): the policy, and KVM's two guest protocols.
//! - [`policy`]: when the vCPU stalls, halts or tells the guest (consumes
//!   the fault path's `WaitForPage` outcome), and what happens when a page
//!   arrives (prefault, page-ready);
//! - [`x86`]: KVM's x86 protocol (MSRs, #PF with the token in CR2,
//!   page-ready as an interrupt);
//! - [`event`]: the event protocol (hypercalls, both notifications as
//!   interrupts).

pub(crate) mod event;
pub(crate) mod policy;
pub(crate) mod x86;
