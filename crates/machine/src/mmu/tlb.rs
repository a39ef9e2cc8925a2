//! The TLB.
//!
//! STUB: to be implemented (see the helper task).
#![allow(unused_variables)]

use crate::addr::Gva;
use crate::vmx::{InveptKind, InvvpidKind};

/// TLB geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TlbConfig {
    /// Total entries (a power of two, multiple of `ways`).
    pub entries: usize,
    /// Associativity.
    pub ways: usize,
}

impl Default for TlbConfig {
    /// 1536-entry unified STLB on Skylake, rounded to a power of two.
    fn default() -> Self {
        TlbConfig {
            entries: 1024,
            ways: 8,
        }
    }
}

/// Hit/miss/flush counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TlbStats {
    pub hits: u64,
    pub misses: u64,
    pub flushes: u64,
}

/// A VPID-tagged translation lookaside buffer.
#[derive(Debug, Clone)]
pub struct Tlb {}

impl Tlb {
    pub fn new(config: TlbConfig) -> Self {
        todo!()
    }
    /// INVLPG: drop entries of `vpid` covering `gva`, global or not.
    pub fn invlpg(&mut self, vpid: u16, gva: Gva) {
        todo!()
    }
    /// MOV to CR3 (without PCID): drop the non-global entries of `vpid`.
    pub fn flush_non_global(&mut self, vpid: u16) {
        todo!()
    }
    /// Drop all entries of `vpid` (e.g. CR4.PGE toggled).
    pub fn flush_vpid(&mut self, vpid: u16) {
        todo!()
    }
    /// Drop everything.
    pub fn flush_all(&mut self) {
        todo!()
    }
    /// INVVPID.
    pub fn invvpid(&mut self, kind: InvvpidKind) {
        todo!()
    }
    /// INVEPT.
    pub fn invept(&mut self, kind: InveptKind) {
        todo!()
    }
    /// Counters.
    pub fn stats(&self) -> TlbStats {
        todo!()
    }
}
