//! `faultline calibrate`: host micro-benchmarks printed beside the entries
//! of the virtual-time cost tables (`machine::cost::CycleCosts`,
//! `hv::HvCosts`) they inform, with each entry's current value.
//!
//! Nothing here changes a table: the figures are for `docs/costs.md` and
//! whoever revises the tables. Each test repeats a timed batch of
//! operations `--iterations` times and reports the median per operation
//! (with the fastest and the slowest repetition), in nanoseconds and, when
//! the host's TSC frequency can be read, in TSC cycles. The tables' cycles
//! are of a 3 GHz core (`machine::cost::CYCLES_PER_SECOND`); the TSC ticks
//! at the host's nominal frequency whatever the core's clock, so the two
//! agree only where the core runs at 3 GHz.
//!
//! The two-core tests (cache-line transfer, ticket-lock handoff) need two
//! CPUs the process may run on and say so otherwise; their threads are
//! pinned to the first two such CPUs with `sched_setaffinity`. Every spin
//! wait checks, now and then, for SIGINT/SIGTERM and for a timeout, so a
//! partner thread that never runs ends the test instead of hanging it.

use crate::costs::{CostOverride, CostProfile};
use crate::signals::{Signal, StopRequest};
use crate::{EXIT_CONFIG, EXIT_VM_ERROR};
use clap::Args;
use hv::{CycleCosts, HvCosts, NamedCosts};
use serde::Serialize;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// `faultline calibrate`.
#[derive(Args, Debug)]
pub struct CalibrateArgs {
    /// Print one JSON document on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Timed repetitions of each test; the median is reported.
    #[arg(long, default_value_t = 15,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    iterations: u32,
    /// Also write this host's figures as a cost profile for
    /// `--cost-profile` (the entries a test measures one for one; the
    /// rest keep the default table's).
    #[arg(long, value_name = "FILE")]
    write_profile: Option<std::path::PathBuf>,
}

/// The entries a test measures one for one (the operation the entry
/// prices, nothing more), and the test that measures each.
const PROFILE_ENTRIES: &[(&str, &str)] = &[
    ("line_transfer", "line_transfer"),
    ("lock_acquire", "ticket_lock_uncontended"),
    ("locked", "lock_add"),
    ("spte_cmpxchg", "lock_cmpxchg"),
    ("dirty_bit_set", "lock_or"),
    ("zero_4k", "zero_4k"),
    ("copy_4k", "copy_4k"),
];

/// Longest a spin wait may last before its test is given up.
const WAIT_LIMIT: Duration = Duration::from_secs(5);
/// The buffer of the TLB-missing, cache-missing load test: 1 GiB of 4 KiB
/// pages, one line read in each.
const DRAM_BUFFER: usize = 1 << 30;
/// The TLB-missing, cache-hitting test: this many lines, one in each page
/// (64 MiB of address space, 1 MiB of lines), against the same lines
/// packed in 256 pages.
const SPARSE_LINES: usize = 16 * 1024;
const PAGE: usize = 4096;
const LINE: usize = 64;

/// One cost-table entry a test informs.
#[derive(Debug, Clone, Serialize)]
struct Informs {
    /// `machine` (`machine::cost::CycleCosts`) or `hv` (`hv::HvCosts`).
    table: &'static str,
    entry: &'static str,
    /// The entry's current value, in cycles of a 3 GHz core.
    value: u64,
}

/// One test's result.
#[derive(Debug, Clone, Serialize)]
struct TestResult {
    name: &'static str,
    what: &'static str,
    /// `ok`, `skipped` (the host cannot run it) or `failed` (it timed out).
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    /// Operations timed in one repetition.
    ops_per_repetition: u64,
    repetitions: u32,
    /// Per operation: median, fastest and slowest repetition.
    #[serde(skip_serializing_if = "Option::is_none")]
    median_ns: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    min_ns: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_ns: Option<f64>,
    /// `median_ns` in TSC cycles (absent when the TSC frequency is not known).
    #[serde(skip_serializing_if = "Option::is_none")]
    median_cycles: Option<f64>,
    informs: Vec<Informs>,
    note: &'static str,
}

#[derive(Debug, Clone, Serialize)]
struct Host {
    /// CPUs this process may run on.
    cpus: usize,
    /// The TSC frequency, if it could be read.
    tsc_ghz: Option<f64>,
    /// How the TSC frequency was read, or why it was not.
    tsc: String,
    /// Which CPUs the tests' threads were pinned to, or why they were not.
    pinning: String,
    /// Whether this host is itself a virtual machine (/proc/cpuinfo lists
    /// the `hypervisor` flag): its VM exits are then nested ones.
    virtualized: bool,
    /// How this host's /dev/kvm runs a guest: `native` or `emulated` with
    /// the empty guest loop's figure, or why no guest ran.
    kvm: String,
}

#[derive(Debug, Clone, Serialize)]
struct Report {
    host: Host,
    /// Unit of `median_cycles`: TSC cycles; the tables' values are cycles
    /// of a 3 GHz core.
    table_ghz: f64,
    repetitions: u32,
    tests: Vec<TestResult>,
}

/// Why a test stopped early.
enum Abort {
    Signal(Signal),
    Timeout(&'static str),
    Os(String),
}

type Timed = Result<f64, Abort>;

/// What every test needs: the stop request, the CPUs and the deadline
/// check of spin waits.
struct Ctx {
    stop: StopRequest,
    cpus: Vec<usize>,
    /// Set by a thread that gives up, so its partner gives up too.
    abort: AtomicBool,
}

impl Ctx {
    /// Checks the stop request and the deadline; called every 64 Ki spins.
    fn check(&self, start: Instant, what: &'static str) -> Result<(), Abort> {
        if let Some(signal) = self.stop.signal() {
            self.abort.store(true, Ordering::Relaxed);
            return Err(Abort::Signal(signal));
        }
        if self.abort.load(Ordering::Relaxed) {
            return Err(Abort::Timeout(what));
        }
        if start.elapsed() > WAIT_LIMIT {
            self.abort.store(true, Ordering::Relaxed);
            return Err(Abort::Timeout(what));
        }
        Ok(())
    }

    /// Spins until `ready()`, checking now and then.
    fn spin_until(&self, what: &'static str, mut ready: impl FnMut() -> bool) -> Result<(), Abort> {
        let start = Instant::now();
        let mut spins: u32 = 0;
        while !ready() {
            spins = spins.wrapping_add(1);
            if spins & 0xffff == 0 {
                self.check(start, what)?;
            }
        }
        Ok(())
    }
}

/// A value alone in its 64-byte line.
#[repr(align(64))]
struct Line<T>(T);

// ---------------------------------------------------------------------
// CPUs and pinning.

/// The CPUs this process may run on, in order.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is a plain bit array; all-zero is a valid value.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a live cpu_set_t and the size passed is its size;
    // pid 0 is the calling thread.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        return (0..n).collect();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `cpu` is below CPU_SETSIZE, inside the set.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect()
}

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) -> Result<(), String> {
    // SAFETY: as in `allowed_cpus`.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a live cpu_set_t; CPU_SET checks the index itself
    // (and `cpu` came from `allowed_cpus`, below CPU_SETSIZE).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a live cpu_set_t of the size passed; pid 0 is the
    // calling thread.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r == 0 {
        Ok(())
    } else {
        Err(format!(
            "sched_setaffinity(CPU {cpu}): {}",
            std::io::Error::last_os_error()
        ))
    }
}

/// Lets the calling thread run on every CPU of `cpus` again.
fn unpin(cpus: &[usize]) {
    // SAFETY: as in `allowed_cpus`.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        // SAFETY: as in `pin`.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: as in `pin`. A failure leaves the thread pinned, which only
    // narrows where the remaining single-thread tests run.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
}

// ---------------------------------------------------------------------
// The TSC.

/// The TSC's frequency in Hz and how it was found, or why not.
fn tsc_hz() -> Result<(f64, String), String> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo")
        .map_err(|e| format!("TSC frequency not read (/proc/cpuinfo: {e}): figures in ns only"))?;
    let flags = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .unwrap_or_default();
    if !flags.split_whitespace().any(|f| f == "constant_tsc") {
        return Err(
            "TSC frequency not used: /proc/cpuinfo does not list constant_tsc, so the TSC \
             may not tick at a fixed rate; figures in ns only"
                .to_string(),
        );
    }
    let mut rates = Vec::new();
    for _ in 0..3 {
        let t0 = Instant::now();
        // SAFETY: RDTSC reads the time-stamp counter; every x86-64 CPU has
        // it (CPUID.01H:EDX.TSC) and Linux leaves it enabled in user mode.
        let c0 = unsafe { core::arch::x86_64::_rdtsc() };
        std::thread::sleep(Duration::from_millis(20));
        // SAFETY: as above.
        let c1 = unsafe { core::arch::x86_64::_rdtsc() };
        let ns = t0.elapsed().as_nanos() as f64;
        rates.push((c1.wrapping_sub(c0)) as f64 / ns * 1e9);
    }
    let hz = median(&mut rates);
    if !(hz.is_finite() && hz > 1e8) {
        return Err(format!(
            "TSC frequency not used (measured {hz:.0} Hz, implausible): figures in ns only"
        ));
    }
    Ok((
        hz,
        "measured: RDTSC against CLOCK_MONOTONIC over 3 x 20 ms (constant_tsc)".to_string(),
    ))
}

/// Whether /proc/cpuinfo lists `flag`.
fn cpu_flag(flag: &str) -> bool {
    std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|info| {
        info.lines()
            .find(|l| l.starts_with("flags"))
            .is_some_and(|l| l.split_whitespace().any(|f| f == flag))
    })
}

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

// ---------------------------------------------------------------------
// A random-order pointer chase.

/// Memory from mmap, unmapped on drop.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    /// `len` bytes of anonymous memory in 4 KiB pages (transparent huge
    /// pages refused for it, so every page needs its own TLB entry).
    fn new(len: usize) -> Result<Mapping, String> {
        // SAFETY: an anonymous private mapping at an address the kernel
        // picks; no existing memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(format!(
                "mmap of {} MiB: {}",
                len >> 20,
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: `ptr..ptr+len` is the mapping just made. Only advice: a
        // kernel without THP refuses it, which is fine.
        unsafe { libc::madvise(ptr, len, libc::MADV_NOHUGEPAGE) };
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once; no reference
        // into it outlives `self`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// xorshift64*: enough randomness for a chase order, with no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A pointer chase through `slots` (byte offsets of 8-byte-aligned words
/// in `map`): shuffled, then each word holds the address of the next in
/// that order (the last the first's), so one cycle visits every slot in a
/// random order no prefetcher follows.
struct Chase {
    _map: Mapping,
    start: *const usize,
}

impl Chase {
    fn new(map: Mapping, mut slots: Vec<usize>, rng: &mut Rng) -> Chase {
        for i in (1..slots.len()).rev() {
            let j = rng.below(i);
            slots.swap(i, j);
        }
        for (i, &slot) in slots.iter().enumerate() {
            let next = slots[(i + 1) % slots.len()];
            assert!(slot + 8 <= map.len && next + 8 <= map.len && slot % 8 == 0);
            // SAFETY: both offsets are inside the mapping and 8-aligned
            // (checked above); nothing else refers to the mapping yet.
            unsafe {
                let at = map.ptr.add(slot).cast::<usize>();
                at.write(map.ptr.add(next) as usize);
            }
        }
        // SAFETY: slots[0] is inside the mapping (checked above).
        let start = unsafe { map.ptr.add(slots[0]).cast::<usize>() };
        Chase { _map: map, start }
    }

    /// Follows `n` links, each load waiting for the one before.
    fn run(&self, n: u64) -> usize {
        let mut p = self.start;
        for _ in 0..n {
            // SAFETY: every word of the cycle holds the address of another
            // word of the cycle, inside the mapping `self` keeps alive.
            p = unsafe { p.read() } as *const usize;
        }
        black_box(p) as usize
    }
}

/// `lines` words at random line offsets, one in each of `lines` pages
/// (`sparse`), or packed in consecutive lines (`!sparse`).
fn chase_lines(lines: usize, sparse: bool, rng: &mut Rng) -> Result<Chase, String> {
    let len = if sparse { lines * PAGE } else { lines * LINE };
    let map = Mapping::new(len.next_multiple_of(PAGE))?;
    let slots = (0..lines)
        .map(|i| {
            if sparse {
                i * PAGE + rng.below(PAGE / LINE) * LINE
            } else {
                i * LINE
            }
        })
        .collect();
    Ok(Chase::new(map, slots, rng))
}

// ---------------------------------------------------------------------
// A KVM guest whose every CPUID exits to the host kernel.

/// CPUIDs the guest runs per KVM_RUN (one repetition).
const LOOP_CPUIDS: u32 = 1_000;

const KVM_GET_API_VERSION: u64 = 0xae00;
const KVM_CREATE_VM: u64 = 0xae01;
const KVM_GET_VCPU_MMAP_SIZE: u64 = 0xae04;
const KVM_CREATE_VCPU: u64 = 0xae41;
/// _IOW(KVMIO, 0x46, struct kvm_userspace_memory_region): 32 bytes.
const KVM_SET_USER_MEMORY_REGION: u64 = 0x4020_ae46;
const KVM_SET_TSS_ADDR: u64 = 0xae47;
const KVM_CREATE_IRQCHIP: u64 = 0xae60;
const KVM_RUN: u64 = 0xae80;
const KVM_EXIT_IO: u32 = 2;
/// The port of the OUT that ends each pass of the guest's loop: one no
/// device claims, in the kernel or here, so it exits to this process.
const END_PORT: u16 = 0x10;
/// The reset vector's 64 KiB: CS base 0xffff0000, IP 0xfff0.
const GUEST_BASE: u64 = 0xffff_0000;

/// `struct kvm_userspace_memory_region` (linux/kvm.h).
#[repr(C)]
struct KvmRegion {
    slot: u32,
    flags: u32,
    guest_phys_addr: u64,
    memory_size: u64,
    userspace_addr: u64,
}

/// A VM with one vCPU running, in real mode from the reset vector:
/// `mov esi, N; 1: BODY; dec esi; jnz 1b; out 0x10, al; jmp` back to the
/// `mov`. With `xor eax, eax; cpuid` as the body every CPUID exits to KVM,
/// which emulates it in the kernel (as a VMCALL or an RDMSR of the APIC
/// base are); the OUT ends each KVM_RUN, an exit to user space.
///
/// With a vector table ([`KvmGuest::with_vectors`]), guest-physical 0 to
/// 64 KiB is RAM holding the real-mode interrupt vector table (every
/// vector to F000:IRET_AT, an IRET) and the stack (SS:SP = 0:0 from
/// reset, so the first push is at 0xfffe), and the code's 64 KiB is also
/// mapped at 0xf0000: an IRET reloads CS as F000 with base 0xf0000, the
/// same bytes the reset's CS (base 0xffff0000) runs.
///
/// With an in-kernel interrupt controller ([`KvmGuest::with_irqchip`]),
/// KVM_CREATE_IRQCHIP before the vCPU, the 8259 PIC's ports (0x20, 0x21,
/// 0xa0, 0xa1, 0x4d0, 0x4d1) are a device in the host kernel: a port
/// write to one is handled there, without the exit to user space.
struct KvmGuest {
    _sys: std::fs::File,
    _vm: std::os::fd::OwnedFd,
    vcpu: std::os::fd::OwnedFd,
    run: Mapping,
    _mem: Mapping,
    _low: Option<Mapping>,
}

/// Where the guest with a vector table has its handler, an IRET (offset
/// in the code's segment, below the loop at 0xff00).
const IRET_AT: u16 = 0xfe00;
/// The real-mode segment whose base maps the code a second time.
const CODE_ALIAS: u64 = 0xf_0000;

/// An ioctl taking an integer argument (or none).
fn kvm_ioctl(fd: std::os::fd::RawFd, request: u64, arg: u64) -> std::io::Result<i32> {
    // SAFETY: every request passed here (KVM_GET_API_VERSION, CREATE_VM,
    // GET_VCPU_MMAP_SIZE, CREATE_VCPU, SET_TSS_ADDR, RUN) takes an integer
    // argument or none, so no memory is handed to the kernel.
    let r = unsafe { libc::ioctl(fd, request as _, arg as libc::c_ulong) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

impl KvmGuest {
    fn new(body: &[u8], loops: u32) -> Result<KvmGuest, String> {
        KvmGuest::build(body, loops, false, false)
    }

    /// As [`KvmGuest::new`], with the real-mode vector table and stack of
    /// the type's description, so the body may raise interrupts.
    fn with_vectors(body: &[u8], loops: u32) -> Result<KvmGuest, String> {
        KvmGuest::build(body, loops, true, false)
    }

    /// As [`KvmGuest::new`], in a VM with KVM's in-kernel interrupt
    /// controller, so the body may write to a device in the host kernel.
    fn with_irqchip(body: &[u8], loops: u32) -> Result<KvmGuest, String> {
        KvmGuest::build(body, loops, false, true)
    }

    fn build(body: &[u8], loops: u32, vectors: bool, irqchip: bool) -> Result<KvmGuest, String> {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        let sys = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            .map_err(|e| format!("no usable /dev/kvm: {e}"))?;
        let api = kvm_ioctl(sys.as_raw_fd(), KVM_GET_API_VERSION, 0)
            .map_err(|e| format!("KVM_GET_API_VERSION: {e}"))?;
        if api != 12 {
            return Err(format!("KVM API version {api}, not 12"));
        }
        let vm = kvm_ioctl(sys.as_raw_fd(), KVM_CREATE_VM, 0)
            .map_err(|e| format!("KVM_CREATE_VM: {e}"))?;
        // SAFETY: a descriptor KVM_CREATE_VM just returned, owned by no one
        // else.
        let vm = unsafe { OwnedFd::from_raw_fd(vm) };
        let mem = Mapping::new(0x1_0000)?;
        // 0xff00: mov esi, loops
        let mut code = vec![0x66, 0xbe];
        code.extend_from_slice(&loops.to_le_bytes());
        // 0xff06: the body
        code.extend_from_slice(body);
        let back = i8::try_from(-(body.len() as i64 + 4)).map_err(|_| "body too long")?;
        code.extend_from_slice(&[
            0x66,
            0x4e, // dec esi
            0x75,
            back as u8, // jnz 0xff06
            0xe6,
            END_PORT as u8, // out 0x10, al
            0xeb,           // jmp 0xff00
        ]);
        let to_start = i8::try_from(-(code.len() as i64 + 1)).map_err(|_| "body too long")?;
        code.push(to_start as u8);
        let reset = [0xe9, 0x0d, 0xff]; // 0xfff0: jmp 0xff00
                                        // SAFETY: both ranges are inside the 64 KiB mapping just made,
                                        // which nothing else refers to yet.
        unsafe {
            std::ptr::copy_nonoverlapping(code.as_ptr(), mem.ptr.add(0xff00), code.len());
            std::ptr::copy_nonoverlapping(reset.as_ptr(), mem.ptr.add(0xfff0), reset.len());
        }
        let mut regions = vec![(GUEST_BASE, &mem)];
        let low = if vectors {
            let low = Mapping::new(0x1_0000)?;
            let entry = (0xf000u32 << 16) | u32::from(IRET_AT);
            // SAFETY: both inside the mappings just made, which nothing
            // else refers to yet: 256 four-byte vectors at 0, the IRET in
            // the code's 64 KiB.
            unsafe {
                for v in 0..256 {
                    low.ptr.add(v * 4).cast::<u32>().write_unaligned(entry);
                }
                mem.ptr.add(usize::from(IRET_AT)).write(0xcf);
            }
            regions.push((CODE_ALIAS, &mem));
            Some(low)
        } else {
            None
        };
        if let Some(low) = &low {
            regions.push((0, low));
        }
        for (slot, (gpa, map)) in regions.into_iter().enumerate() {
            let region = KvmRegion {
                slot: slot as u32,
                flags: 0,
                guest_phys_addr: gpa,
                memory_size: map.len as u64,
                userspace_addr: map.ptr as u64,
            };
            // SAFETY: the request takes a pointer to a
            // kvm_userspace_memory_region, which `region` is (repr(C), the
            // kernel's layout), read during the call. The memory it names
            // is `_mem` or `_low`, the last fields of the KvmGuest to drop,
            // after every descriptor and mapping that keeps the VM alive.
            let r = unsafe {
                libc::ioctl(
                    vm.as_raw_fd(),
                    KVM_SET_USER_MEMORY_REGION as _,
                    &region as *const KvmRegion,
                )
            };
            if r < 0 {
                return Err(format!(
                    "KVM_SET_USER_MEMORY_REGION: {}",
                    std::io::Error::last_os_error()
                ));
            }
        }
        // Needed for real mode on Intel hosts without unrestricted guest;
        // three pages below the slot. A host that needs none may refuse.
        let _ = kvm_ioctl(vm.as_raw_fd(), KVM_SET_TSS_ADDR, GUEST_BASE - 0x3000);
        if irqchip {
            kvm_ioctl(vm.as_raw_fd(), KVM_CREATE_IRQCHIP, 0)
                .map_err(|e| format!("KVM_CREATE_IRQCHIP: {e}"))?;
        }
        let vcpu = kvm_ioctl(vm.as_raw_fd(), KVM_CREATE_VCPU, 0)
            .map_err(|e| format!("KVM_CREATE_VCPU: {e}"))?;
        // SAFETY: as for the VM's descriptor.
        let vcpu = unsafe { OwnedFd::from_raw_fd(vcpu) };
        let size = kvm_ioctl(sys.as_raw_fd(), KVM_GET_VCPU_MMAP_SIZE, 0)
            .map_err(|e| format!("KVM_GET_VCPU_MMAP_SIZE: {e}"))? as usize;
        // SAFETY: maps the vCPU's kvm_run area, as KVM documents: shared,
        // at offset 0 of the vCPU descriptor, of the size KVM gave.
        let run = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                vcpu.as_raw_fd(),
                0,
            )
        };
        if run == libc::MAP_FAILED {
            return Err(format!(
                "mmap of kvm_run: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(KvmGuest {
            _sys: sys,
            _vm: vm,
            vcpu,
            run: Mapping {
                ptr: run.cast(),
                len: size,
            },
            _mem: mem,
            _low: low,
        })
    }

    /// One KVM_RUN: the guest's loop of CPUIDs up to its OUT.
    fn run(&self, ctx: &Ctx) -> Result<(), Abort> {
        use std::os::fd::AsRawFd;
        loop {
            match kvm_ioctl(self.vcpu.as_raw_fd(), KVM_RUN, 0) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {
                    if let Some(signal) = ctx.stop.signal() {
                        return Err(Abort::Signal(signal));
                    }
                    continue;
                }
                Err(e) => return Err(Abort::Os(format!("KVM_RUN: {e}"))),
            }
            // SAFETY: kvm_run's exit_reason, a u32 at offset 8 (after
            // request_interrupt_window, immediate_exit and 6 bytes of
            // padding), inside the mapping; KVM wrote it before KVM_RUN
            // returned.
            let reason = unsafe { self.run.ptr.add(8).cast::<u32>().read_volatile() };
            if reason != KVM_EXIT_IO {
                return Err(Abort::Os(format!(
                    "KVM exit reason {reason}, not the guest's OUT"
                )));
            }
            // SAFETY: an I/O exit's port, a u16 at offset 34 of kvm_run
            // (the exit union at 32: direction, size, then the port),
            // inside the mapping; KVM wrote it with the exit reason.
            let port = unsafe { self.run.ptr.add(34).cast::<u16>().read_volatile() };
            return if port == END_PORT {
                Ok(())
            } else {
                Err(Abort::Os(format!(
                    "the guest's OUT to port {port:#x} exited to user space, not the loop's end at {END_PORT:#x}"
                )))
            };
        }
    }
}

// ---------------------------------------------------------------------
// The ticket lock.

/// A ticket lock as Linux's was before queued spinlocks: both counters in
/// one line. Its spin has no PAUSE, so a handoff is the line's transfers
/// alone.
#[repr(align(64))]
struct TicketLock {
    next: AtomicU32,
    serving: AtomicU32,
}

impl TicketLock {
    fn new() -> TicketLock {
        TicketLock {
            next: AtomicU32::new(0),
            serving: AtomicU32::new(0),
        }
    }

    fn lock(&self, ctx: &Ctx) -> Result<(), Abort> {
        let ticket = self.next.fetch_add(1, Ordering::Relaxed);
        ctx.spin_until("ticket lock", || {
            self.serving.load(Ordering::Acquire) == ticket
        })
    }

    /// Uncontended (no spinner can be there): no check needed.
    fn lock_uncontended(&self) {
        let ticket = self.next.fetch_add(1, Ordering::Relaxed);
        while self.serving.load(Ordering::Acquire) != ticket {
            std::hint::spin_loop();
        }
    }

    fn unlock(&self) {
        let now = self.serving.load(Ordering::Relaxed);
        self.serving.store(now.wrapping_add(1), Ordering::Release);
    }
}

// ---------------------------------------------------------------------
// The tests.

/// The loop bodies of the KVM exit tests: `xor eax, eax; cpuid`; `xor
/// eax, eax; vmcall` (hypercall 0, which KVM answers -KVM_ENOSYS in the
/// kernel); `mov ecx, 0x1b; rdmsr` (IA32_APIC_BASE, emulated in the
/// kernel).
const CPUID_BODY: [u8; 5] = [0x66, 0x31, 0xc0, 0x0f, 0xa2];
const VMCALL_BODY: [u8; 6] = [0x66, 0x31, 0xc0, 0x0f, 0x01, 0xc1];
const RDMSR_BODY: [u8; 8] = [0x66, 0xb9, 0x1b, 0x00, 0x00, 0x00, 0x0f, 0x32];
/// The body of `kvm_int_iret`: `int 0x40`, through the real-mode vector
/// table to an IRET.
const INT_BODY: [u8; 2] = [0xcd, 0x40];
/// The body of `kvm_pio_kernel_exit`: `mov al, 0xff; out 0x21, al`, all
/// of the master 8259's interrupts masked (its IMR), a port KVM's
/// in-kernel PIC claims; no interrupt is raised, so masking them all is
/// no change to the guest.
const PIO_KERNEL_BODY: [u8; 4] = [0xb0, 0xff, 0xe6, 0x21];
/// Iterations of `kvm_guest_loop` and `kvm_int_iret` per KVM_RUN: enough
/// that the one exit to user space a run ends with is under 1 % of the
/// time where the guest runs on the CPU.
const GUEST_LOOPS: u32 = 100_000;
/// An empty guest loop iteration (`dec esi; jnz`) slower than this means
/// the host's KVM emulates the guest's instructions instead of running
/// them: on the CPU the iteration is a cycle or two (under 2 ns at 1 GHz
/// and more), the run's exit to user space adds well under 1 ns an
/// iteration, and KVM's instruction emulator takes hundreds of ns an
/// instruction. The kvm_* exit tests then time the emulator, not exits,
/// and are skipped.
const EMULATED_LOOP_NS: f64 = 100.0;
/// memslot_lookup: slots in the map (x86 KVM's VMs have a handful to a
/// few dozen: RAM split around holes, ROMs, device BARs).
const MEMSLOTS: usize = 32;
/// spte_write_rmap: sptes in the table (2 MiB of sptes and of rmap heads).
const SPTE_TABLE: usize = 256 * 1024;
/// frame_alloc_free: frames in the pool.
const FRAME_POOL: usize = 64 * 1024;
/// host_read_4k: the file's size.
const READ_FILE: usize = 16 << 20;

/// `rep stosb` of PAGE zero bytes at `dst`, or `rep movsb` of PAGE bytes
/// from `src` to `dst`.
///
/// # Safety
/// `dst` (and, for movsb, `src`) must be valid for PAGE bytes and not
/// overlap.
unsafe fn rep_string(stos: bool, src: *const u8, dst: *mut u8) {
    if stos {
        // SAFETY: the caller's; RCX bytes at RDI are written.
        unsafe {
            std::arch::asm!("rep stosb", inout("rcx") PAGE => _, inout("rdi") dst => _,
                in("al") 0u8, options(nostack, preserves_flags))
        };
    } else {
        // SAFETY: the caller's; RCX bytes are copied from RSI to RDI.
        unsafe {
            std::arch::asm!("rep movsb", inout("rcx") PAGE => _, inout("rsi") src => _,
                inout("rdi") dst => _, options(nostack, preserves_flags))
        };
    }
}

/// One test: what it measures, what it informs, how it runs.
struct Test {
    name: &'static str,
    what: &'static str,
    /// Entries it informs, by name (in either table).
    informs: &'static [&'static str],
    note: &'static str,
    ops: u64,
    /// Needs two CPUs.
    two_cpus: bool,
}

const TESTS: &[Test] = &[
    Test {
        name: "line_transfer",
        what: "cache-line transfer between two cores: ping-pong on one atomic in its own 64-byte line, half the round trip",
        informs: &["line_transfer"],
        note: "each half round trip is one store on one core seen by a load on the other",
        ops: 20_000,
        two_cpus: true,
    },
    Test {
        name: "ticket_lock_handoff",
        what: "contended ticket lock, two threads on two cores taking turns: one acquisition and release",
        informs: &["line_transfer", "lock_acquire"],
        note: "the hv prices a handoff with one spinner at 2 x line_transfer (mmu::lock::handoff_cycles)",
        ops: 20_000,
        two_cpus: true,
    },
    Test {
        name: "ticket_lock_uncontended",
        what: "uncontended ticket lock: lock and unlock on one thread, the line in its cache",
        informs: &["lock_acquire"],
        note: "one LOCK XADD, a load and a store",
        ops: 200_000,
        two_cpus: false,
    },
    Test {
        name: "mutex_uncontended",
        what: "uncontended std::sync::Mutex: lock and unlock on one thread",
        informs: &["lock_acquire"],
        note: "a LOCK CMPXCHG to take it and an XCHG to release it",
        ops: 200_000,
        two_cpus: false,
    },
    Test {
        name: "lock_add",
        what: "LOCK ADD on a line in this core's L1, back to back",
        informs: &["locked", "host_page_release"],
        note: "put_page's refcount decrement is a LOCK-prefixed add/sub like this one",
        ops: 200_000,
        two_cpus: false,
    },
    Test {
        name: "lock_cmpxchg",
        what: "LOCK CMPXCHG (succeeding) on a line in this core's L1, back to back",
        informs: &["spte_cmpxchg", "locked"],
        note: "",
        ops: 200_000,
        two_cpus: false,
    },
    Test {
        name: "lock_or",
        what: "LOCK OR of one bit into a word in this core's L1, back to back",
        informs: &["dirty_bit_set"],
        note: "set_bit's LOCK BTS/OR on the dirty bitmap word",
        ops: 200_000,
        two_cpus: false,
    },
    Test {
        name: "load_l1",
        what: "dependent load hitting L1: random-order pointer chase over 16 KiB",
        informs: &["page_walk_ref", "spte_read", "pml_log_write", "mmu_notifier_check"],
        note: "mmu_notifier_check is priced as two such loads",
        ops: 1_000_000,
        two_cpus: false,
    },
    Test {
        name: "load_l2",
        what: "dependent load hitting L2, TLB hit: random-order chase over 16 Ki lines packed in 1 MiB",
        informs: &[],
        note: "the baseline of load_l2_tlb_miss",
        ops: 200_000,
        two_cpus: false,
    },
    Test {
        name: "load_l2_tlb_miss",
        what: "dependent load, TLB miss, data and paging structures in cache: the same 16 Ki lines, one per 4 KiB page (64 MiB)",
        informs: &["page_walk_ref"],
        note: "minus load_l2: a TLB miss whose walk hits the caches; the machine charges page_walk_ref per memory reference of a walk (4 for a native 4-level walk)",
        ops: 200_000,
        two_cpus: false,
    },
    Test {
        name: "load_dram_tlb_miss",
        what: "dependent load missing TLB and caches: random-order chase over 1 GiB of 4 KiB pages, one line per page",
        informs: &["page_walk_ref"],
        note: "includes the data's DRAM access and the walk's own misses, neither of which the tables charge",
        ops: 20_000,
        two_cpus: false,
    },
    Test {
        name: "zero_4k",
        what: "zeroing a 4 KiB frame (write_bytes) taken in turn from a 64 MiB pool",
        informs: &["zero_4k"],
        note: "",
        ops: 2_048,
        two_cpus: false,
    },
    Test {
        name: "copy_4k",
        what: "copying a 4 KiB frame (copy_nonoverlapping) between frames of two 32 MiB pools",
        informs: &["copy_4k"],
        note: "",
        ops: 2_048,
        two_cpus: false,
    },
    Test {
        name: "syscall",
        what: "a system call: getppid(2), entry and return",
        informs: &["privilege_transition"],
        note: "the machine charges privilege_transition for the SYSCALL and again for the SYSRET; the host's figure adds the kernel's entry code and its mitigations",
        ops: 20_000,
        two_cpus: false,
    },
    Test {
        name: "kvm_cpuid_exit",
        what: "a VM exit handled in the host kernel: a KVM guest (real mode, from the reset vector) runs CPUID in a loop, per exit and entry",
        informs: &["vm_exit", "vm_entry", "exit_base", "cpuid_msr"],
        note: "the model's figure for the same is vm_exit + vm_entry + exit_base + cpuid_msr = 1,600; plus one exit to user space per repetition; on a host that is itself a VM (host.virtualized) each exit is a nested one, taken by the outer hypervisor first",
        ops: 1_000,
        two_cpus: false,
    },
    Test {
        name: "context_switch",
        what: "thread context switch: two threads pinned to one CPU handing a token over two pipes, per switch",
        informs: &[],
        note: "includes a pipe write and read per switch; no table entry prices a host context switch (the guest's are guest instructions)",
        ops: 2_000,
        two_cpus: false,
    },
    Test {
        name: "rep_movsb",
        what: "REP MOVSB of 4 KiB between two 1 MiB pools in cache, per byte",
        informs: &["string_iteration"],
        note: "the machine charges string_iteration per iteration (a byte for MOVSB); fast-string hardware moves many bytes a cycle",
        ops: 256,
        two_cpus: false,
    },
    Test {
        name: "rep_stosb",
        what: "REP STOSB of 4 KiB into a 1 MiB pool in cache, per byte",
        informs: &["string_iteration"],
        note: "as rep_movsb",
        ops: 256,
        two_cpus: false,
    },
    Test {
        name: "memslot_lookup",
        what: "memslot lookup: a gfn's slot among 32 in a BTreeMap keyed by base gfn (the hv's structure, hv::memslot::Memslots), random gfns inside the slots",
        informs: &["memslot_lookup"],
        note: "the same range query as the hv's lookup, on this host; KVM's is a binary search or an rbtree walk of the same depth",
        ops: 200_000,
        two_cpus: false,
    },
    Test {
        name: "frame_alloc_free",
        what: "a host frame allocated from and freed to a free list (a Vec, as the hv's FrameAllocator), per alloc + free pair",
        informs: &["frame_alloc", "frame_free"],
        note: "the hv's allocator is a free list with counters; Linux's page allocator (per-CPU lists, zone locks) costs more",
        ops: 200_000,
        two_cpus: false,
    },
    Test {
        name: "spte_write_rmap",
        what: "an spte written (atomic store) and its gfn's rmap head set, random gfns over 256 Ki sptes",
        informs: &["spte_write"],
        note: "a one-entry rmap head holds the spte's address (KVM's pte_list_add); many-entry rmaps cost more",
        ops: 200_000,
        two_cpus: false,
    },
    Test {
        name: "host_read_4k",
        what: "a host read of 4 KiB from a 16 MiB file in the page cache: pread(2) at random page offsets",
        informs: &["io_submit"],
        note: "a synchronous read served from the page cache (submission, copy and completion), not an asynchronous submission to a device",
        ops: 2_000,
        two_cpus: false,
    },
    Test {
        name: "kvm_vmcall_exit",
        what: "a hypercall handled in the host kernel: a KVM guest (real mode) runs VMCALL (nr 0, -KVM_ENOSYS) in a loop, per exit and entry",
        informs: &["hypercall", "exit_base", "vm_exit", "vm_entry"],
        note: "the model's figure for the same is vm_exit + vm_entry + exit_base + hypercall = 1,600; nested on a host that is a VM",
        ops: 1_000,
        two_cpus: false,
    },
    Test {
        name: "kvm_rdmsr_exit",
        what: "an MSR read emulated in the host kernel: a KVM guest (real mode) runs RDMSR of IA32_APIC_BASE in a loop, per exit and entry",
        informs: &["cpuid_msr", "exit_base", "vm_exit", "vm_entry"],
        note: "the model's figure for the same is vm_exit + vm_entry + exit_base + cpuid_msr = 1,600; nested on a host that is a VM",
        ops: 1_000,
        two_cpus: false,
    },
    Test {
        name: "kvm_pio_exit",
        what: "a port write emulated in user space: a KVM guest's OUT exits to this process (KVM_EXIT_IO) and KVM_RUN enters again, per round trip",
        informs: &["io_emulation", "exit_base", "vm_exit", "vm_entry"],
        note: "includes the ioctl's return to user space and entry, which the hv's in-process devices do not take; nested on a host that is a VM",
        ops: 1_000,
        two_cpus: false,
    },
    Test {
        name: "kvm_guest_loop",
        what: "an empty loop iteration (dec esi; jnz) inside a KVM guest (real mode), per iteration: whether the host's KVM runs the guest on the CPU",
        informs: &["instruction"],
        note: "a cycle or two where KVM runs the guest on the CPU (the machine charges instruction per instruction); hundreds of ns where it emulates the guest's instructions, and the kvm_* exit tests are then skipped",
        ops: GUEST_LOOPS as u64,
        two_cpus: false,
    },
    Test {
        name: "kvm_int_iret",
        what: "an interrupt delivered and returned from inside a KVM guest (real mode): INT 0x40 through the vector table to an IRET, with the loop's dec and jnz, per iteration",
        informs: &["event_delivery", "privilege_transition"],
        note: "minus kvm_guest_loop: the model's figure for the same is event_delivery + privilege_transition (the IRET) + instruction = 101; no VM exit (the guest's own IDT delivery)",
        ops: GUEST_LOOPS as u64,
        two_cpus: false,
    },
    Test {
        name: "int80_syscall",
        what: "a system call through an IDT gate: getppid by INT 0x80 (the 32-bit entry, left with IRET), entry and return",
        informs: &["event_delivery", "privilege_transition"],
        note: "minus syscall: a gate's delivery and an IRET against SYSCALL and SYSRET (the machine's event_delivery - privilege_transition = 20), plus the two entry paths' own differences; on a host whose kernel runs deprivileged under a software hypervisor (a PVM guest) the IDT is virtual and the figure is that hypervisor's",
        ops: 20_000,
        two_cpus: false,
    },
    Test {
        name: "kvm_pio_kernel_exit",
        what: "a port write handled by a device in the host kernel: a KVM guest (real mode, KVM's in-kernel PIC) runs OUT to the 8259's mask register in a loop, per exit and entry",
        informs: &["io_emulation", "exit_base", "vm_exit", "vm_entry"],
        note: "the model's figure for the same is vm_exit + vm_entry + exit_base + io_emulation = 1,700; minus kvm_vmcall_exit, the model's io_emulation - hypercall = 100; as kvm-unit-tests' outl_to_kernel (docs/costs.md); nested on a host that is a VM",
        ops: 1_000,
        two_cpus: false,
    },
];

/// The current value of entry `name` and its table.
fn entry_value(name: &str) -> Option<(&'static str, u64)> {
    let mut machine = CycleCosts::DEFAULT;
    if let Some((_, v)) = machine.entries_mut().into_iter().find(|(n, _)| *n == name) {
        return Some(("machine", *v));
    }
    let mut hv = HvCosts::DEFAULT;
    hv.entries_mut()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| ("hv", *v))
}

/// The state a test's repetitions share (buffers built once).
#[derive(Default)]
struct Buffers {
    chase: Option<Chase>,
    pool: Option<Mapping>,
    pool2: Option<Mapping>,
    kvm: Option<KvmGuest>,
    /// Pseudo-random gfns or offsets, in the order a test visits them.
    order: Vec<u64>,
    /// memslot_lookup: slots keyed by base gfn (base, pages).
    slots: std::collections::BTreeMap<u64, (u64, u64)>,
    /// spte_write_rmap: the sptes and each gfn's rmap head.
    sptes: Vec<AtomicU64>,
    rmap: Vec<u64>,
    /// host_read_4k: an unlinked file in the page cache.
    file: Option<std::fs::File>,
}

/// Times `ops` operations once; ns per operation.
fn per_op(ops: u64, f: impl FnOnce()) -> f64 {
    let t0 = Instant::now();
    f();
    t0.elapsed().as_nanos() as f64 / ops as f64
}

/// Builds what test `name` needs before its first repetition.
fn prepare(name: &str, b: &mut Buffers, rng: &mut Rng) -> Result<(), String> {
    match name {
        "load_l1" => b.chase = Some(chase_lines(16 * 1024 / LINE, false, rng)?),
        "load_l2" => b.chase = Some(chase_lines(SPARSE_LINES, false, rng)?),
        "load_l2_tlb_miss" => b.chase = Some(chase_lines(SPARSE_LINES, true, rng)?),
        "load_dram_tlb_miss" => b.chase = Some(chase_lines(DRAM_BUFFER / PAGE, true, rng)?),
        "zero_4k" => {
            let pool = Mapping::new(64 << 20)?;
            // SAFETY: the whole mapping, just made; touching it now keeps
            // the page faults out of the timed loop.
            unsafe { std::ptr::write_bytes(pool.ptr, 1, pool.len) };
            b.pool = Some(pool);
        }
        "rep_movsb" | "rep_stosb" => {
            for slot in [&mut b.pool, &mut b.pool2] {
                let pool = Mapping::new(1 << 20)?;
                // SAFETY: the whole mapping, just made.
                unsafe { std::ptr::write_bytes(pool.ptr, 1, pool.len) };
                *slot = Some(pool);
            }
        }
        "copy_4k" => {
            for slot in [&mut b.pool, &mut b.pool2] {
                let pool = Mapping::new(32 << 20)?;
                // SAFETY: as for zero_4k.
                unsafe { std::ptr::write_bytes(pool.ptr, 1, pool.len) };
                *slot = Some(pool);
            }
        }
        "kvm_cpuid_exit" => b.kvm = Some(KvmGuest::new(&CPUID_BODY, LOOP_CPUIDS)?),
        "kvm_vmcall_exit" => b.kvm = Some(KvmGuest::new(&VMCALL_BODY, LOOP_CPUIDS)?),
        "kvm_rdmsr_exit" => b.kvm = Some(KvmGuest::new(&RDMSR_BODY, LOOP_CPUIDS)?),
        // One pass of an empty loop: each KVM_RUN is the OUT's exit to
        // user space and the entry back.
        "kvm_pio_exit" => b.kvm = Some(KvmGuest::new(&[], 1)?),
        "kvm_guest_loop" => b.kvm = Some(KvmGuest::new(&[], GUEST_LOOPS)?),
        "int80_syscall" => int80_works()?,
        "kvm_int_iret" => b.kvm = Some(KvmGuest::with_vectors(&INT_BODY, GUEST_LOOPS)?),
        "kvm_pio_kernel_exit" => {
            b.kvm = Some(KvmGuest::with_irqchip(&PIO_KERNEL_BODY, LOOP_CPUIDS)?)
        }
        "memslot_lookup" => {
            // MEMSLOTS slots of 1 to 64 Ki pages with gaps between them.
            let mut base = 0u64;
            for _ in 0..MEMSLOTS {
                let pages = 1 + rng.below(64 * 1024) as u64;
                b.slots.insert(base, (base, pages));
                base += pages + rng.below(1024) as u64;
            }
            // Lookups of gfns inside the slots.
            let slots: Vec<(u64, u64)> = b.slots.values().copied().collect();
            b.order = (0..4096)
                .map(|_| {
                    let (base, pages) = slots[rng.below(slots.len())];
                    base + rng.below(pages as usize) as u64
                })
                .collect();
        }
        "spte_write_rmap" => {
            b.sptes = (0..SPTE_TABLE).map(|_| AtomicU64::new(0)).collect();
            b.rmap = vec![0; SPTE_TABLE];
            b.order = (0..SPTE_TABLE)
                .map(|_| rng.below(SPTE_TABLE) as u64)
                .collect();
        }
        "frame_alloc_free" => {
            // A free list as the hv's (a Vec of frames), half full.
            b.rmap = (0..FRAME_POOL as u64 / 2).collect();
            b.order = (0..FRAME_POOL).map(|_| rng.below(2) as u64).collect();
        }
        "host_read_4k" => {
            use std::io::Write as _;
            let path =
                std::env::temp_dir().join(format!("faultline-calibrate-{}", std::process::id()));
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            let _ = std::fs::remove_file(&path);
            file.write_all(&vec![1u8; READ_FILE])
                .map_err(|e| format!("writing the file: {e}"))?;
            b.file = Some(file);
            b.order = (0..4096)
                .map(|_| rng.below(READ_FILE / PAGE) as u64)
                .collect();
            b.pool = Some(Mapping::new(PAGE)?);
        }
        _ => {}
    }
    Ok(())
}

/// One repetition of test `t`; ns per operation.
fn repetition(t: &Test, ctx: &Ctx, b: &mut Buffers, rep: u64) -> Timed {
    let ops = t.ops;
    match t.name {
        "line_transfer" => line_transfer(ctx, ops),
        "ticket_lock_handoff" => ticket_handoff(ctx, ops),
        "ticket_lock_uncontended" => {
            let lock = TicketLock::new();
            Ok(per_op(ops, || {
                for _ in 0..ops {
                    let l = black_box(&lock);
                    l.lock_uncontended();
                    l.unlock();
                }
            }))
        }
        "mutex_uncontended" => {
            let m = Mutex::new(0u64);
            Ok(per_op(ops, || {
                for _ in 0..ops {
                    let mut g = black_box(&m).lock().unwrap_or_else(|e| e.into_inner());
                    *g += 1;
                }
            }))
        }
        "lock_add" => {
            let a = Line(AtomicU64::new(0));
            Ok(per_op(ops, || {
                for _ in 0..ops {
                    black_box(&a).0.fetch_add(1, Ordering::Relaxed);
                }
            }))
        }
        "lock_cmpxchg" => {
            let a = Line(AtomicU64::new(0));
            Ok(per_op(ops, || {
                let mut cur = 0u64;
                for _ in 0..ops {
                    cur = match black_box(&a).0.compare_exchange(
                        cur,
                        cur + 1,
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    ) {
                        Ok(_) => cur + 1,
                        Err(now) => now,
                    };
                }
            }))
        }
        "lock_or" => {
            let a = Line(AtomicU64::new(0));
            Ok(per_op(ops, || {
                for i in 0..ops {
                    black_box(&a).0.fetch_or(1 << (i & 63), Ordering::Relaxed);
                }
            }))
        }
        "load_l1" | "load_l2" | "load_l2_tlb_miss" | "load_dram_tlb_miss" => {
            let chase = b.chase.as_ref().expect("prepared");
            // Once untimed on the first repetition: the lines into the
            // caches (or out of them, for the 1 GiB one) and its TLB state.
            if rep == 0 {
                chase.run(ops);
            }
            Ok(per_op(ops, || {
                chase.run(ops);
            }))
        }
        "zero_4k" => {
            let pool = b.pool.as_ref().expect("prepared");
            let frames = pool.len / PAGE;
            Ok(per_op(ops, || {
                for i in 0..ops as usize {
                    let frame = (rep as usize * ops as usize + i) % frames;
                    // SAFETY: frame < frames, so the 4 KiB at frame * PAGE
                    // are inside the pool, which nothing else refers to.
                    unsafe {
                        std::ptr::write_bytes(black_box(pool.ptr.add(frame * PAGE)), 0, PAGE)
                    };
                }
            }))
        }
        "copy_4k" => {
            let (src, dst) = (
                b.pool.as_ref().expect("prepared"),
                b.pool2.as_ref().expect("prepared"),
            );
            let frames = src.len / PAGE;
            Ok(per_op(ops, || {
                for i in 0..ops as usize {
                    let frame = (rep as usize * ops as usize + i) % frames;
                    let to = (frame * 7 + 3) % frames;
                    // SAFETY: both frames are inside their pools (two
                    // distinct mappings, so they do not overlap).
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            black_box(src.ptr.add(frame * PAGE)),
                            dst.ptr.add(to * PAGE),
                            PAGE,
                        )
                    };
                }
            }))
        }
        "syscall" => Ok(per_op(ops, || {
            for _ in 0..ops {
                // SAFETY: getppid has no arguments and cannot fail.
                black_box(unsafe { libc::getppid() });
            }
        })),
        "int80_syscall" => Ok(per_op(ops, || {
            for _ in 0..ops {
                // SAFETY: prepare checked, in a child process, that this
                // kernel has the 32-bit entry.
                black_box(unsafe { int80_getppid() });
            }
        })),
        "context_switch" => context_switch(ctx, ops),
        "rep_movsb" | "rep_stosb" => {
            let (src, dst) = (
                b.pool.as_ref().expect("prepared"),
                b.pool2.as_ref().expect("prepared"),
            );
            let stos = t.name == "rep_stosb";
            Ok(per_op(ops * PAGE as u64, || {
                for i in 0..ops as usize {
                    let frame = i % (src.len / PAGE);
                    // SAFETY: `frame` is inside both 1 MiB pools, distinct
                    // mappings; the string instruction writes PAGE bytes
                    // at `dst + frame * PAGE` (and reads as many at `src`),
                    // with the direction flag clear (the ABI's default).
                    unsafe {
                        rep_string(stos, src.ptr.add(frame * PAGE), dst.ptr.add(frame * PAGE))
                    };
                }
            }))
        }
        "memslot_lookup" => {
            let (slots, order) = (&b.slots, &b.order);
            Ok(per_op(ops, || {
                for i in 0..ops as usize {
                    let gfn = black_box(order[i % order.len()]);
                    let hit = slots
                        .range(..=gfn)
                        .next_back()
                        .filter(|(_, (base, pages))| gfn < base + pages);
                    black_box(hit);
                }
            }))
        }
        "spte_write_rmap" => {
            let (sptes, rmap, order) = (&b.sptes, &mut b.rmap, &b.order);
            Ok(per_op(ops, || {
                for i in 0..ops as usize {
                    let gfn = order[i % order.len()] as usize;
                    let spte = (gfn as u64) << 12 | 0x7;
                    black_box(&sptes[gfn]).store(spte, Ordering::Release);
                    // The rmap head of a gfn with one mapping holds the
                    // spte's address itself (KVM's pte_list_add).
                    rmap[gfn] = &sptes[gfn] as *const AtomicU64 as u64;
                }
                black_box(&*rmap);
            }))
        }
        "frame_alloc_free" => {
            let (free, order) = (&mut b.rmap, &b.order);
            let (mut next, mut in_use, mut peak) = (FRAME_POOL as u64, 0u64, 0u64);
            Ok(per_op(ops, || {
                for i in 0..ops as usize {
                    // An allocation (from the free list, else a new frame)
                    // and the free of a frame, in a pseudo-random order of
                    // which comes first.
                    let alloc = |free: &mut Vec<u64>, next: &mut u64| {
                        free.pop().unwrap_or_else(|| {
                            *next += 1;
                            *next - 1
                        })
                    };
                    let frame = if order[i % order.len()] == 0 {
                        let f = alloc(free, &mut next);
                        free.push(black_box(f));
                        f
                    } else {
                        let f = alloc(free, &mut next);
                        free.push(black_box(f ^ 1));
                        f
                    };
                    in_use += 1;
                    peak = peak.max(in_use);
                    in_use -= 1;
                    black_box(frame);
                }
                black_box((peak, free.len()));
            }))
        }
        "host_read_4k" => {
            use std::os::unix::fs::FileExt as _;
            let (file, order, buf) = (
                b.file.as_ref().expect("prepared"),
                &b.order,
                b.pool.as_ref().expect("prepared"),
            );
            // SAFETY: the one-page mapping, which nothing else refers to.
            let buf = unsafe { std::slice::from_raw_parts_mut(buf.ptr, PAGE) };
            let t0 = Instant::now();
            for i in 0..ops as usize {
                let at = order[i % order.len()] * PAGE as u64;
                file.read_exact_at(buf, at)
                    .map_err(|e| Abort::Os(format!("pread: {e}")))?;
            }
            Ok(t0.elapsed().as_nanos() as f64 / ops as f64)
        }
        "kvm_pio_exit" => {
            let kvm = b.kvm.as_ref().expect("prepared");
            if rep == 0 {
                kvm.run(ctx)?;
            }
            let t0 = Instant::now();
            for _ in 0..ops {
                kvm.run(ctx)?;
            }
            Ok(t0.elapsed().as_nanos() as f64 / ops as f64)
        }
        "kvm_cpuid_exit"
        | "kvm_vmcall_exit"
        | "kvm_rdmsr_exit"
        | "kvm_guest_loop"
        | "kvm_int_iret"
        | "kvm_pio_kernel_exit" => {
            // One KVM_RUN is one pass of the guest's loop.
            let loops = if t.name.starts_with("kvm_guest") || t.name == "kvm_int_iret" {
                GUEST_LOOPS
            } else {
                LOOP_CPUIDS
            };
            let kvm = b.kvm.as_ref().expect("prepared");
            if rep == 0 {
                kvm.run(ctx)?;
            }
            let t0 = Instant::now();
            kvm.run(ctx)?;
            Ok(t0.elapsed().as_nanos() as f64 / f64::from(loops))
        }
        other => unreachable!("no test {other}"),
    }
}

/// Runs `mine` on this thread pinned to `cpus[0]` and `theirs` on a new
/// one pinned to `cpu_b`, both after the other is ready; ns per op from
/// `mine`'s timing (it returns the elapsed ns).
fn two_threads(
    ctx: &Ctx,
    cpu_b: usize,
    mine: impl FnOnce() -> Result<f64, Abort>,
    theirs: impl FnOnce() -> Result<(), Abort> + Send,
) -> Timed {
    let ready = Line(AtomicUsize::new(0));
    ctx.abort.store(false, Ordering::Relaxed);
    std::thread::scope(|s| {
        let helper = s.spawn(|| {
            // Best effort, as for this thread: the host line says whether
            // pinning works here.
            let _ = pin(cpu_b);
            ready.0.fetch_add(1, Ordering::AcqRel);
            let r = theirs();
            if r.is_err() {
                ctx.abort.store(true, Ordering::Relaxed);
            }
            r
        });
        let mine = ctx
            .spin_until("the helper thread to start", || {
                ready.0.load(Ordering::Acquire) == 1
            })
            .and_then(|()| mine());
        if mine.is_err() {
            ctx.abort.store(true, Ordering::Relaxed);
        }
        let theirs = helper
            .join()
            .unwrap_or_else(|_| Err(Abort::Os("the helper thread panicked".into())));
        match (mine, theirs) {
            (Ok(ns), Ok(())) => Ok(ns),
            // The helper's own error first: this thread's is then only
            // that the helper stopped answering.
            (_, Err(e @ Abort::Os(_))) | (_, Err(e @ Abort::Signal(_))) => Err(e),
            (Err(e), _) | (Ok(_), Err(e)) => Err(e),
        }
    })
}

/// Round trips (or acquisitions) timed together in the two-core tests.
/// Their threads share the host's CPUs with whatever else runs there, and
/// a partner preempted for a time slice stalls the other: each repetition
/// reports the median of its batches, so a stall spoils one batch, not
/// the repetition.
const BATCH: u64 = 100;

/// Runs `step(i)` for i in 0..n in batches of [`BATCH`]; the median of
/// the batches' ns per step.
fn batched(n: u64, mut step: impl FnMut(u64) -> Result<(), Abort>) -> Result<f64, Abort> {
    let mut batches = Vec::with_capacity(n.div_ceil(BATCH) as usize);
    let mut i = 0;
    while i < n {
        let k = BATCH.min(n - i);
        let t0 = Instant::now();
        for j in i..i + k {
            step(j)?;
        }
        batches.push(t0.elapsed().as_nanos() as f64 / k as f64);
        i += k;
    }
    Ok(median(&mut batches))
}

fn line_transfer(ctx: &Ctx, rounds: u64) -> Timed {
    let flag = Line(AtomicU64::new(0));
    let round_trip = two_threads(
        ctx,
        ctx.cpus[1],
        || {
            batched(rounds, |i| {
                flag.0.store(2 * i + 1, Ordering::Release);
                ctx.spin_until("the line to come back", || {
                    flag.0.load(Ordering::Acquire) == 2 * i + 2
                })
            })
        },
        || {
            for i in 0..rounds {
                ctx.spin_until("the line to arrive", || {
                    flag.0.load(Ordering::Acquire) == 2 * i + 1
                })?;
                flag.0.store(2 * i + 2, Ordering::Release);
            }
            Ok(())
        },
    )?;
    Ok(round_trip / 2.0)
}

fn ticket_handoff(ctx: &Ctx, ops: u64) -> Timed {
    let lock = TicketLock::new();
    let go = Line(AtomicBool::new(false));
    let each = ops / 2;
    let acquire = || -> Result<(), Abort> {
        lock.lock(ctx)?;
        lock.unlock();
        Ok(())
    };
    // This thread's acquisitions alternate with the other's (the ticket
    // lock is FIFO and both always wait): the time between two of its
    // own is two acquisitions.
    let between_own = two_threads(
        ctx,
        ctx.cpus[1],
        || {
            go.0.store(true, Ordering::Release);
            batched(each, |_| acquire())
        },
        || {
            ctx.spin_until("the start", || go.0.load(Ordering::Acquire))?;
            for _ in 0..each {
                acquire()?;
            }
            Ok(())
        },
    )?;
    Ok(between_own / 2.0)
}

/// A pipe's two ends, closed on drop.
struct Pipe {
    read: libc::c_int,
    write: libc::c_int,
}

impl Pipe {
    fn new() -> Result<Pipe, Abort> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` has room for the two descriptors pipe writes.
        if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
            return Err(Abort::Os(format!(
                "pipe: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(Pipe {
            read: fds[0],
            write: fds[1],
        })
    }

    fn send(&self) -> Result<(), Abort> {
        let byte = 1u8;
        loop {
            // SAFETY: one byte from a live local, to a descriptor this
            // pipe owns.
            let n = unsafe { libc::write(self.write, (&byte as *const u8).cast(), 1) };
            if n == 1 {
                return Ok(());
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(Abort::Os(format!("pipe write: {e}")));
            }
        }
    }

    fn receive(&self) -> Result<(), Abort> {
        let mut byte = 0u8;
        loop {
            // SAFETY: one byte into a live local, from a descriptor this
            // pipe owns.
            let n = unsafe { libc::read(self.read, (&mut byte as *mut u8).cast(), 1) };
            match n {
                1 => return Ok(()),
                0 => return Err(Abort::Os("pipe closed".into())),
                _ => {
                    let e = std::io::Error::last_os_error();
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        return Err(Abort::Os(format!("pipe read: {e}")));
                    }
                }
            }
        }
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        // SAFETY: the two descriptors `new` made, closed once.
        unsafe {
            libc::close(self.read);
            libc::close(self.write);
        }
    }
}

fn context_switch(ctx: &Ctx, rounds: u64) -> Timed {
    let (ping, pong) = (Pipe::new()?, Pipe::new()?);
    // Both on one CPU: every handoff is a switch on that CPU.
    let ns = two_threads(
        ctx,
        ctx.cpus[0],
        || {
            let t0 = Instant::now();
            for _ in 0..rounds {
                ping.send()?;
                pong.receive()?;
            }
            Ok(t0.elapsed().as_nanos() as f64)
        },
        || {
            for _ in 0..rounds {
                ping.receive()?;
                pong.send()?;
            }
            Ok(())
        },
    );
    // A failed 1-byte write or read of a pipe this process owns would leave
    // the partner blocked in read; neither fails short of the process
    // running out of memory, and EINTR (a signal) is retried.
    Ok(ns? / (2 * rounds) as f64)
}

/// Runs every test; `None` when a signal stopped the run.
/// getppid through INT 0x80: the 32-bit system call entry (getppid is 64
/// in its table), an interrupt gate of the IDT, left with IRET.
///
/// # Safety
/// The kernel must have the 32-bit entry (IA32 emulation): without it
/// INT 0x80 raises #GP and the process gets SIGSEGV. [`int80_works`]
/// checks in a child process.
unsafe fn int80_getppid() -> u32 {
    let mut eax: u32 = 64;
    // SAFETY: the caller's; the entry may clear R8-R11 (older kernels did),
    // and changes nothing else of this process.
    unsafe {
        std::arch::asm!("int 0x80", inout("eax") eax, out("r8") _, out("r9") _,
            out("r10") _, out("r11") _)
    };
    eax
}

/// Whether INT 0x80 works here: a child process makes the call once and
/// compares it with getppid(2)'s answer.
fn int80_works() -> Result<(), String> {
    // SAFETY: the child only makes two system calls and `_exit`s, all
    // async-signal-safe, so forking a process with other threads is sound.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(format!("fork: {}", std::io::Error::last_os_error()));
    }
    if pid == 0 {
        // SAFETY: in the child; if the entry is missing, the SIGSEGV ends
        // the child alone.
        let same = unsafe { int80_getppid() } as i32 == unsafe { libc::getppid() };
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(if same { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked, writing its status.
    if unsafe { libc::waitpid(pid, &mut status, 0) } != pid {
        return Err(format!("waitpid: {}", std::io::Error::last_os_error()));
    }
    if libc::WIFSIGNALED(status) {
        Err(format!(
            "INT 0x80 ended a test process by signal {}: this kernel has no 32-bit system call entry",
            libc::WTERMSIG(status)
        ))
    } else if libc::WEXITSTATUS(status) != 0 {
        Err("INT 0x80 getppid did not give getppid(2)'s answer".to_string())
    } else {
        Ok(())
    }
}

/// How this host's KVM runs a guest: the median of three runs of an empty
/// guest loop, ns per iteration (as `kvm_guest_loop`), or why no guest
/// ran.
fn kvm_guest_check(ctx: &Ctx) -> Result<f64, String> {
    let kvm = KvmGuest::new(&[], GUEST_LOOPS)?;
    let pinned = pin(ctx.cpus[0]).is_ok();
    let mut samples = Vec::new();
    let mut result = kvm.run(ctx);
    for _ in 0..3 {
        if result.is_err() {
            break;
        }
        let t0 = Instant::now();
        result = kvm.run(ctx);
        samples.push(t0.elapsed().as_nanos() as f64 / f64::from(GUEST_LOOPS));
    }
    if pinned {
        unpin(&ctx.cpus);
    }
    match result {
        Ok(()) => Ok(median(&mut samples)),
        Err(Abort::Os(e)) => Err(e),
        Err(Abort::Signal(signal)) => Err(format!("stopped by {}", signal.name())),
        Err(Abort::Timeout(what)) => Err(format!("timed out waiting for {what}")),
    }
}

/// `Host::kvm` for the result of [`kvm_guest_check`].
fn kvm_text(check: &Result<f64, String>) -> String {
    match check {
        Ok(ns) if *ns > EMULATED_LOOP_NS => format!(
            "emulated: an empty guest loop iteration takes {ns:.0} ns (KVM's instruction emulator runs the guest; the kvm_* exit tests are skipped)"
        ),
        Ok(ns) => format!("native: an empty guest loop iteration takes {ns:.2} ns"),
        Err(e) => format!("no guest ran: {e}"),
    }
}

fn run_tests(
    args: &CalibrateArgs,
    ctx: &Ctx,
    tsc: Option<f64>,
    progress: bool,
    kvm_check: &Result<f64, String>,
) -> Result<Vec<TestResult>, Signal> {
    let mut results = Vec::new();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for t in TESTS {
        if let Some(signal) = ctx.stop.signal() {
            return Err(signal);
        }
        if progress {
            eprint!("\r[calibrate] {:<28}", t.name);
        }
        let informs = t
            .informs
            .iter()
            .map(|&entry| {
                let (table, value) = entry_value(entry).expect("a cost-table entry");
                Informs {
                    table,
                    entry,
                    value,
                }
            })
            .collect();
        let mut result = TestResult {
            name: t.name,
            what: t.what,
            status: "ok",
            reason: None,
            ops_per_repetition: t.ops,
            repetitions: args.iterations,
            median_ns: None,
            min_ns: None,
            max_ns: None,
            median_cycles: None,
            informs,
            note: t.note,
        };
        if t.two_cpus && ctx.cpus.len() < 2 {
            result.status = "skipped";
            result.reason = Some(format!(
                "needs 2 CPUs; this process may run on {}",
                ctx.cpus.len()
            ));
            results.push(result);
            continue;
        }
        if let Ok(ns) = kvm_check {
            if *ns > EMULATED_LOOP_NS && t.name.starts_with("kvm_") && t.name != "kvm_guest_loop" {
                result.status = "skipped";
                result.reason = Some(format!(
                    "this host's /dev/kvm emulates the guest's instructions (an empty guest loop iteration takes {ns:.0} ns, see kvm_guest_loop): the figure would be its instruction emulator's"
                ));
                results.push(result);
                continue;
            }
        }
        let mut buffers = Buffers::default();
        if let Err(e) = prepare(t.name, &mut buffers, &mut rng) {
            result.status = "skipped";
            result.reason = Some(e);
            results.push(result);
            continue;
        }
        let pinned = pin(ctx.cpus[0]).is_ok();
        let mut samples = Vec::new();
        let mut failure = None;
        for rep in 0..args.iterations {
            match repetition(t, ctx, &mut buffers, u64::from(rep)) {
                Ok(ns) => samples.push(ns),
                Err(Abort::Signal(signal)) => {
                    unpin(&ctx.cpus);
                    return Err(signal);
                }
                Err(Abort::Timeout(what)) => {
                    failure = Some(format!(
                        "gave up after waiting {} s for {what}",
                        WAIT_LIMIT.as_secs()
                    ));
                    break;
                }
                Err(Abort::Os(e)) if rep == 0 && t.name.starts_with("kvm_") => {
                    // The host's KVM does not run this guest as KVM does
                    // (a software or nested hypervisor's quirk).
                    result.status = "skipped";
                    result.reason = Some(format!(
                        "this host's /dev/kvm does not complete the loop in the kernel: {e}"
                    ));
                    break;
                }
                Err(Abort::Os(e)) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        if pinned {
            unpin(&ctx.cpus);
        }
        drop(buffers);
        if let Some(reason) = failure {
            result.status = "failed";
            result.reason = Some(reason);
        } else if result.status != "skipped" {
            let m = median(&mut samples);
            result.median_ns = Some(m);
            result.min_ns = samples.first().copied();
            result.max_ns = samples.last().copied();
            result.median_cycles = tsc.map(|hz| m * hz / 1e9);
        }
        results.push(result);
    }
    if progress {
        eprint!("\r{:<42}\r", "");
    }
    Ok(results)
}

/// `faultline calibrate`.
pub fn calibrate(args: CalibrateArgs) -> u8 {
    let stop = match StopRequest::install() {
        Ok(stop) => stop,
        Err(e) => {
            eprintln!("faultline: installing signal handlers: {e}");
            return EXIT_CONFIG;
        }
    };
    if let Some(path) = &args.write_profile {
        if let Err(e) = crate::config::check_output_path("--write-profile", path) {
            eprintln!("faultline: {e}");
            return EXIT_CONFIG;
        }
    }
    let cpus = allowed_cpus();
    let (tsc, tsc_text) = match tsc_hz() {
        Ok((hz, how)) => (Some(hz), how),
        Err(why) => (None, why),
    };
    let pinning = if cpus.len() >= 2 {
        match pin(cpus[0]).and_then(|()| pin(cpus[1])) {
            Ok(()) => format!(
                "two-core tests on CPUs {} and {}, the rest on CPU {} (sched_setaffinity)",
                cpus[0], cpus[1], cpus[0]
            ),
            Err(e) => format!("not pinned: {e}"),
        }
    } else {
        match pin(cpus[0]) {
            Ok(()) => format!("CPU {} (the only one)", cpus[0]),
            Err(e) => format!("not pinned: {e}"),
        }
    };
    unpin(&cpus);
    let ctx = Ctx {
        stop,
        cpus: cpus.clone(),
        abort: AtomicBool::new(false),
    };
    let progress = !args.json && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let kvm_check = kvm_guest_check(&ctx);
    let tests = match run_tests(&args, &ctx, tsc, progress, &kvm_check) {
        Ok(tests) => tests,
        Err(signal) => {
            eprintln!("\nfaultline calibrate: stopped by {}", signal.name());
            return signal.exit_status();
        }
    };
    let report = Report {
        host: Host {
            cpus: cpus.len(),
            tsc_ghz: tsc.map(|hz| hz / 1e9),
            tsc: tsc_text,
            pinning,
            virtualized: cpu_flag("hypervisor"),
            kvm: kvm_text(&kvm_check),
        },
        table_ghz: machine_ghz(),
        repetitions: args.iterations,
        tests,
    };
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("faultline: writing JSON: {e}");
                return EXIT_VM_ERROR;
            }
        }
    } else {
        print!("{}", table(&report));
    }
    if let Some(path) = &args.write_profile {
        let text = profile(&report);
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("faultline: --write-profile {}: {e}", path.display());
            return EXIT_VM_ERROR;
        }
        eprintln!(
            "faultline calibrate: wrote the cost profile {} (use it with --cost-profile)",
            path.display()
        );
    }
    if report.tests.iter().any(|t| t.status == "failed") {
        EXIT_VM_ERROR
    } else {
        0
    }
}

/// A cost profile of `report`: each entry of [`PROFILE_ENTRIES`] whose
/// test ran, its median in cycles of the tables' 3 GHz core.
fn profile(report: &Report) -> String {
    let header = vec![
        "faultline cost profile: this host's figures from `faultline calibrate`".to_string(),
        format!(
            "host: {} CPUs{}; medians of {} repetitions; cycles of a {} GHz core (ns x {})",
            report.host.cpus,
            if report.host.virtualized {
                ", itself a VM"
            } else {
                ""
            },
            report.repetitions,
            report.table_ghz,
            report.table_ghz
        ),
        "entries not listed keep the default table's figure (docs/costs.md)".to_string(),
    ];
    let entries: Vec<(CostOverride, String)> = PROFILE_ENTRIES
        .iter()
        .filter_map(|&(entry, test)| {
            let result = report.tests.iter().find(|t| t.name == test)?;
            let ns = result.median_ns.filter(|_| result.status == "ok")?;
            let cycles = (ns * report.table_ghz).round() as u64;
            let (_, default) = entry_value(entry)?;
            Some((
                CostOverride {
                    name: entry.to_string(),
                    cycles,
                },
                format!("{test}: {ns:.2} ns (default {default})"),
            ))
        })
        .collect();
    CostProfile::text(&header, &entries)
}

/// The tables' clock, in GHz.
fn machine_ghz() -> f64 {
    hv::CYCLES_PER_SECOND as f64 / 1e9
}

fn table(r: &Report) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "faultline calibrate: host micro-benchmarks, median of {} repetitions per test",
        r.repetitions
    );
    let _ = writeln!(
        s,
        "host: {} CPUs{}; pinning: {}",
        r.host.cpus,
        if r.host.virtualized {
            ", itself a VM (its VM exits are nested)"
        } else {
            ""
        },
        r.host.pinning
    );
    match r.host.tsc_ghz {
        Some(ghz) => {
            let _ = writeln!(s, "TSC: {ghz:.3} GHz ({})", r.host.tsc);
        }
        None => {
            let _ = writeln!(s, "TSC: {}", r.host.tsc);
        }
    }
    let _ = writeln!(s, "KVM: {}", r.host.kvm);
    let _ = writeln!(
        s,
        "table values are cycles of a {:.0} GHz core; `cycles` below are this host's TSC cycles\n",
        r.table_ghz
    );
    let _ = writeln!(
        s,
        "{:<24} {:>10} {:>10} {:>17}  informs (table value, cycles)",
        "test", "ns", "cycles", "ns min..max"
    );
    let mut notes = Vec::new();
    for t in &r.tests {
        let informs = if t.informs.is_empty() {
            "-".to_string()
        } else {
            t.informs
                .iter()
                .map(|i| format!("{}={}", i.entry, i.value))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match (t.median_ns, t.min_ns, t.max_ns) {
            (Some(m), Some(lo), Some(hi)) => {
                let cycles = t
                    .median_cycles
                    .map_or("-".to_string(), |c| format!("{c:.1}"));
                let _ = writeln!(
                    s,
                    "{:<24} {:>10.2} {:>10} {:>17}  {informs}",
                    t.name,
                    m,
                    cycles,
                    format!("{lo:.1}..{hi:.1}")
                );
            }
            _ => {
                let _ = writeln!(
                    s,
                    "{:<24} {:>10} {:>10} {:>17}  {informs}",
                    t.name, t.status, "", ""
                );
            }
        }
        if let Some(reason) = &t.reason {
            notes.push(format!("{}: {}: {reason}", t.name, t.status));
        }
    }
    let _ = writeln!(s);
    for t in &r.tests {
        let _ = writeln!(s, "{}: {}", t.name, t.what);
        if !t.note.is_empty() {
            let _ = writeln!(s, "    {}", t.note);
        }
    }
    if !notes.is_empty() {
        let _ = writeln!(s);
        for n in notes {
            let _ = writeln!(s, "{n}");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_informed_entry_is_in_a_table() {
        for t in TESTS {
            for &entry in t.informs {
                assert!(entry_value(entry).is_some(), "{}: {entry}", t.name);
            }
        }
    }

    #[test]
    fn the_interrupt_guest_runs_its_loop_to_the_out() {
        // Where /dev/kvm runs guests at all (on the CPU or in KVM's
        // emulator, which the timing tests skip), the guest with a vector
        // table takes each INT 0x40 to its IRET and back, and each run
        // ends at the loop's OUT, not at another exit.
        runs_end_at_the_out(KvmGuest::with_vectors(&INT_BODY, 10));
    }

    fn test_ctx() -> Ctx {
        Ctx {
            stop: StopRequest::default(),
            cpus: allowed_cpus(),
            abort: AtomicBool::new(false),
        }
    }

    /// Three runs of `guest`, each ending at the loop's OUT (a panic
    /// otherwise); false where this host has no /dev/kvm to make it.
    fn runs_end_at_the_out(guest: Result<KvmGuest, String>) -> bool {
        let guest = match guest {
            Ok(guest) => guest,
            Err(e) => {
                eprintln!("skipped: {e}");
                return false;
            }
        };
        let ctx = test_ctx();
        for run in 0..3 {
            if let Err(Abort::Os(e)) = guest.run(&ctx) {
                panic!("run {run}: {e}");
            }
        }
        true
    }

    #[test]
    fn the_kernel_pio_guest_runs_its_loop_to_the_out() {
        // With KVM's in-kernel PIC the body's OUT to port 0x21 is handled
        // in the host kernel and each run ends at the loop's OUT; without
        // it the same OUT exits to user space, which the run reports.
        if !runs_end_at_the_out(KvmGuest::with_irqchip(&PIO_KERNEL_BODY, 10)) {
            return;
        }
        let without = KvmGuest::new(&PIO_KERNEL_BODY, 10).expect("as with the irqchip");
        match without.run(&test_ctx()) {
            Err(Abort::Os(e)) => assert!(e.contains("port 0x21"), "{e}"),
            Err(_) => panic!("stopped"),
            Ok(()) => panic!("an OUT to 0x21 with no device ended the loop"),
        }
    }

    #[test]
    fn test_names_are_unique() {
        let mut names: Vec<_> = TESTS.iter().map(|t| t.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), TESTS.len());
    }

    #[test]
    fn a_chase_visits_every_slot_once_per_cycle() {
        let mut rng = Rng(1);
        let chase = chase_lines(64, true, &mut rng).unwrap();
        let start = chase.start as usize;
        let mut p = chase.start;
        let mut seen = std::collections::HashSet::new();
        for _ in 0..64 {
            assert!(seen.insert(p as usize));
            // SAFETY: as in `Chase::run`.
            p = unsafe { p.read() } as *const usize;
        }
        assert_eq!(p as usize, start);
    }

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
