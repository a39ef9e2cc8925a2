//! Running a snippet on the host CPU in ring 3, in a forked child.
//!
//! The child maps the code page, the window pages, an I/O page and the
//! trampoline page at their fixed addresses (`MAP_FIXED_NOREPLACE`, so an
//! address already in use is an error, never a clobbered mapping), copies
//! everything in, installs `SA_SIGINFO` handlers on an alternate stack (the
//! snippet's stack is in the compared window) and calls the trampoline:
//!
//! - prologue (trampoline page): saves the callee-saved registers and the
//!   host RSP, loads RFLAGS and all sixteen registers from the I/O page and
//!   jumps to the snippet;
//! - epilogue (right after the snippet, where the interpreter has its
//!   sentinel): stores all sixteen registers and RFLAGS to the I/O page,
//!   restores the host state, clears DF and returns.
//!
//! A signal handler records the signal, the faulting address and the
//! registers, RIP and RFLAGS from the `ucontext`. Either way the child
//! copies the result and the window into a `MAP_SHARED` page created by the
//! parent before `fork` and exits. The parent waits with a timeout and
//! kills a child that runs away.
//!
//! The child only makes async-signal-safe calls (no allocation, no locks),
//! so forking from a multi-threaded process (the test harness) is sound.

use super::layout::*;
use super::{FaultKind, FinalState, InitialState, Stop, COMPARED_FLAGS};
use crate::cpu::state::rflags;
use iced_x86::code_asm::*;
use iced_x86::IcedError;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::time::{Duration, Instant};
use thiserror::Error;

/// Errors of the native runner itself (not of the snippet).
#[derive(Debug, Error)]
pub enum NativeError {
    #[error("assembling the trampoline: {0}")]
    Assemble(#[from] IcedError),
    #[error("{0}")]
    Os(#[from] std::io::Error),
    #[error("snippet of {0} bytes does not fit the code page")]
    CodeTooLong(usize),
    #[error("window of {0} bytes, expected {WINDOW_SIZE}")]
    WindowSize(usize),
}

// Offsets inside the I/O page.
const IN_GPR: u64 = NATIVE_IO_ADDR;
const IN_RFLAGS: u64 = NATIVE_IO_ADDR + 0x80;
const OUT_GPR: u64 = NATIVE_IO_ADDR + 0x100;
const OUT_RFLAGS: u64 = NATIVE_IO_ADDR + 0x180;
const HOST_RSP: u64 = NATIVE_IO_ADDR + 0x188;
/// FXSAVE images (16-byte aligned): the host's, the snippet's initial
/// one, the snippet's final one.
const HOST_FX: u64 = NATIVE_IO_ADDR + 0x200;
const IN_FX: u64 = NATIVE_IO_ADDR + 0x400;
const OUT_FX: u64 = NATIVE_IO_ADDR + 0x600;
/// Far pointers (m16:32) of the `c32` runs: to the snippet in the 32-bit
/// user code segment, and back to the 64-bit epilogue.
const FAR_TO_SNIPPET: u64 = NATIVE_IO_ADDR + 0x190;
const FAR_TO_EPILOGUE: u64 = NATIVE_IO_ADDR + 0x1a0;
/// Where the 64-bit epilogue sits in the trampoline page of a `c32` run.
const COMPAT_EPILOGUE_ADDR: u64 = NATIVE_TRAMPOLINE_ADDR + 0x800;
/// Linux x86-64's user code selectors: 32-bit and 64-bit.
const LINUX_USER32_CS: u64 = 0x23;
const LINUX_USER_CS: u64 = 0x33;
/// Linux's user data selector, loaded into DS and ES for 32-bit code
/// (a 64-bit process has null DS/ES, which compatibility mode rejects).
const LINUX_USER_DS: u32 = 0x2b;
use crate::cpu::fpu_state::{FpuState, FXSAVE_SIZE};

const STATUS_NONE: u32 = 0;
const STATUS_COMPLETED: u32 = 1;
const STATUS_SIGNAL: u32 = 2;
const STATUS_SETUP_FAILED: u32 = 3;

/// What the child reports through the shared page.
#[repr(C)]
struct SharedResult {
    status: u32,
    signal: i32,
    /// errno of a failed setup step, or the signal's `si_code`.
    detail: i32,
    /// Which setup step failed.
    setup_step: u32,
    fault_address: u64,
    rip: u64,
    rflags: u64,
    gpr: [u64; 16],
    window: [u8; WINDOW_SIZE],
    /// The FXSAVE64 image of the final x87/SSE state.
    fx: [u8; FXSAVE_SIZE],
}

/// The shared page of the current child, for the signal handler.
static SHARED: AtomicPtr<SharedResult> = AtomicPtr::new(std::ptr::null_mut());

/// Size of the alternate signal stack.
const ALT_STACK_SIZE: usize = 64 * 1024;

/// Runs snippets natively. One runner runs one child at a time.
pub struct NativeRunner {
    shared: *mut SharedResult,
    shared_len: usize,
    prologue: Vec<u8>,
    epilogue: Vec<u8>,
    /// The trampoline page and the snippet's tail of `c32` runs.
    compat_trampoline: Vec<u8>,
    compat_exit: Vec<u8>,
    alt_stack: Vec<u8>,
    timeout: Duration,
}

impl std::fmt::Debug for NativeRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NativeRunner")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

const GPRS: [AsmRegister64; 16] = [
    rax, rcx, rdx, rbx, rsp, rbp, rsi, rdi, r8, r9, r10, r11, r12, r13, r14, r15,
];
const CALLEE_SAVED: [AsmRegister64; 6] = [rbx, rbp, r12, r13, r14, r15];

/// The prologue: called as `extern "C" fn()`.
fn assemble_prologue() -> Result<Vec<u8>, IcedError> {
    assemble_prologue_for(false)
}

/// The prologue of a 64-bit snippet, or (`compat`) of a 32-bit one, which
/// it enters by a far jump to the 32-bit user code segment.
fn assemble_prologue_for(compat: bool) -> Result<Vec<u8>, IcedError> {
    let mut a = CodeAssembler::new(64)?;
    for r in CALLEE_SAVED {
        a.push(r)?;
    }
    a.mov(qword_ptr(HOST_RSP), rsp)?;
    // The whole x87/SSE state from an FXSAVE image (and the host's kept).
    a.fxsave64(ptr(HOST_FX))?;
    a.fxrstor64(ptr(IN_FX))?;
    if compat {
        a.mov(eax, LINUX_USER_DS)?;
        a.mov(ds, ax)?;
        a.mov(es, ax)?;
    }
    a.push(qword_ptr(IN_RFLAGS))?;
    a.popfq()?;
    // MOV changes no flag, so the loaded RFLAGS reach the snippet intact.
    for (i, r) in GPRS.iter().enumerate() {
        a.mov(*r, qword_ptr(IN_GPR + 8 * i as u64))?;
    }
    if compat {
        a.jmp(fword_ptr(FAR_TO_SNIPPET))?;
    } else {
        a.jmp(CODE_ADDR)?;
    }
    a.assemble(NATIVE_TRAMPOLINE_ADDR)
}

/// The trampoline page of a `c32` run: the prologue, and the 64-bit
/// epilogue at [`COMPAT_EPILOGUE_ADDR`].
fn assemble_compat_trampoline(epilogue: &[u8]) -> Result<Vec<u8>, IcedError> {
    let mut page = assemble_prologue_for(true)?;
    let at = (COMPAT_EPILOGUE_ADDR - NATIVE_TRAMPOLINE_ADDR) as usize;
    assert!(
        page.len() <= at,
        "the compat prologue fits below its epilogue"
    );
    page.resize(at, 0xcc);
    page.extend_from_slice(epilogue);
    Ok(page)
}

/// What follows a 32-bit snippet: `jmp far [FAR_TO_EPILOGUE]` (FF /5 with
/// a disp32), which changes no register or flag.
fn compat_exit() -> Vec<u8> {
    let mut v = vec![0xff, 0x2d];
    v.extend_from_slice(&(FAR_TO_EPILOGUE as u32).to_le_bytes());
    v
}

/// The epilogue, placed right after the snippet. It uses absolute
/// addresses only, so it runs wherever the snippet ends.
fn assemble_epilogue() -> Result<Vec<u8>, IcedError> {
    let mut a = CodeAssembler::new(64)?;
    for (i, r) in GPRS.iter().enumerate() {
        a.mov(qword_ptr(OUT_GPR + 8 * i as u64), *r)?;
    }
    // FXSAVE/FXRSTOR change no flags.
    a.fxsave64(ptr(OUT_FX))?;
    a.fxrstor64(ptr(HOST_FX))?;
    // Back on the host stack before PUSHFQ: the snippet's stack is part of
    // the compared window.
    a.mov(rsp, qword_ptr(HOST_RSP))?;
    a.pushfq()?;
    a.pop(rax)?;
    a.mov(qword_ptr(OUT_RFLAGS), rax)?;
    // The ABI requires DF clear on return.
    a.cld()?;
    for r in CALLEE_SAVED.iter().rev() {
        a.pop(*r)?;
    }
    a.ret()?;
    a.assemble(0)
}

impl NativeRunner {
    /// A runner with a 5-second timeout per snippet.
    pub fn new() -> Result<NativeRunner, NativeError> {
        let shared_len = std::mem::size_of::<SharedResult>().next_multiple_of(4096);
        // SAFETY: an anonymous shared mapping with no address hint touches
        // no existing memory; the result is checked against MAP_FAILED.
        let shared = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                shared_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if shared == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error().into());
        }
        let epilogue = assemble_epilogue()?;
        Ok(NativeRunner {
            shared: shared.cast(),
            shared_len,
            prologue: assemble_prologue()?,
            compat_trampoline: assemble_compat_trampoline(&epilogue)?,
            compat_exit: compat_exit(),
            epilogue,
            alt_stack: vec![0; ALT_STACK_SIZE],
            timeout: Duration::from_secs(5),
        })
    }

    /// Sets how long a child may run before it is killed.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Runs `code` (placed at [`CODE_ADDR`]) from `initial` on the host CPU.
    /// Errors are the runner's own; everything the snippet does (including
    /// a child that dies or hangs) is reported in the returned state.
    pub fn run(&mut self, code: &[u8], initial: &InitialState) -> Result<FinalState, NativeError> {
        self.run_bits(code, initial, false)
    }

    /// Runs 32-bit `code` in compatibility mode: the prologue far-jumps to
    /// it through the 32-bit user code segment (0x23), and its tail
    /// far-jumps back to the 64-bit epilogue (0x33).
    pub fn run_compat(
        &mut self,
        code: &[u8],
        initial: &InitialState,
    ) -> Result<FinalState, NativeError> {
        self.run_bits(code, initial, true)
    }

    fn run_bits(
        &mut self,
        code: &[u8],
        initial: &InitialState,
        compat: bool,
    ) -> Result<FinalState, NativeError> {
        let (tail, trampoline) = if compat {
            (&self.compat_exit, &self.compat_trampoline)
        } else {
            (&self.epilogue, &self.prologue)
        };
        if code.len() + tail.len() > CODE_SIZE as usize {
            return Err(NativeError::CodeTooLong(code.len()));
        }
        if initial.window.len() != WINDOW_SIZE {
            return Err(NativeError::WindowSize(initial.window.len()));
        }
        // Everything the child needs is prepared here, before fork.
        let mut code_page = vec![0xccu8; CODE_SIZE as usize];
        code_page[..code.len()].copy_from_slice(code);
        code_page[code.len()..code.len() + tail.len()].copy_from_slice(tail);
        let mut io_page = [0u64; 512];
        io_page[..16].copy_from_slice(&initial.gpr);
        // Arithmetic flags and DF only: TF or AC would change behaviour.
        io_page[16] = (initial.rflags & COMPARED_FLAGS) | rflags::FIXED1 | rflags::IF;
        let far = |offset: u64, selector: u64| offset | (selector << 32);
        io_page[((FAR_TO_SNIPPET - NATIVE_IO_ADDR) / 8) as usize] = far(CODE_ADDR, LINUX_USER32_CS);
        io_page[((FAR_TO_EPILOGUE - NATIVE_IO_ADDR) / 8) as usize] =
            far(COMPAT_EPILOGUE_ADDR, LINUX_USER_CS);
        let image = initial.fpu.fxsave_image(true);
        let fx_slot = ((IN_FX - NATIVE_IO_ADDR) / 8) as usize;
        for (k, chunk) in image.chunks_exact(8).enumerate() {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            io_page[fx_slot + k] = u64::from_le_bytes(b);
        }
        let job = ChildJob {
            code_page: &code_page,
            io_page: &io_page,
            prologue: trampoline,
            window: &initial.window,
            alt_stack: self.alt_stack.as_mut_ptr(),
            shared: self.shared,
        };
        // SAFETY: `shared` is our live MAP_SHARED mapping of at least
        // size_of::<SharedResult>() bytes; only this thread and the child
        // (after fork) touch it.
        unsafe { (*self.shared).status = STATUS_NONE };

        // SAFETY: fork has no memory-safety preconditions; the child below
        // only runs `child_main`, which makes async-signal-safe calls only
        // and never returns.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        if pid == 0 {
            // SAFETY: we are the freshly forked child; `job` points to
            // memory copied into this process by fork.
            unsafe { child_main(&job) }
        }
        let wait = self.wait(pid)?;
        // SAFETY: the child has exited (reaped by `wait`), so nothing else
        // writes the shared page; it is a valid SharedResult (all fields are
        // plain integers).
        let result = unsafe { &*self.shared };
        Ok(interpret(result, wait, code.len()))
    }

    /// Waits for `pid`, killing it after the timeout. Returns how it ended.
    fn wait(&self, pid: libc::pid_t) -> Result<ChildEnd, NativeError> {
        let start = Instant::now();
        let mut pause = Duration::from_micros(5);
        loop {
            let mut status = 0;
            // SAFETY: waitpid on our own child with a valid status pointer.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                return Ok(if libc::WIFSIGNALED(status) {
                    ChildEnd::Killed(libc::WTERMSIG(status))
                } else {
                    ChildEnd::Exited(libc::WEXITSTATUS(status))
                });
            }
            if r < 0 {
                let err = std::io::Error::last_os_error();
                if err.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return Err(err.into());
            }
            if start.elapsed() > self.timeout {
                // SAFETY: signalling and reaping our own child.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                return Ok(ChildEnd::TimedOut);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }
}

impl Drop for NativeRunner {
    fn drop(&mut self) {
        // SAFETY: `shared`/`shared_len` are exactly what mmap returned, and
        // no child is running (run() always reaps it).
        unsafe {
            libc::munmap(self.shared.cast(), self.shared_len);
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum ChildEnd {
    Exited(i32),
    Killed(i32),
    TimedOut,
}

fn interpret(r: &SharedResult, end: ChildEnd, code_len: usize) -> FinalState {
    let mut state = FinalState {
        stop: Stop::Finished,
        rip: r.rip,
        gpr: r.gpr,
        rflags: r.rflags,
        window: r.window.to_vec(),
        fpu: FpuState::default(),
    };
    if r.status == STATUS_COMPLETED || r.status == STATUS_SIGNAL {
        // The image's MXCSR_MASK and pointer fields are the host's own;
        // only the state is taken.
        if state.fpu.fxrstor_image(&r.fx, true).is_err() {
            return FinalState::abnormal("native FXSAVE image with a reserved MXCSR");
        }
    }
    match (r.status, end) {
        (STATUS_COMPLETED, ChildEnd::Exited(0)) => {
            state.rip = CODE_ADDR + code_len as u64;
        }
        (STATUS_SIGNAL, ChildEnd::Exited(0)) => {
            let kind = FaultKind::from_signal(r.signal, r.detail);
            // A SIGSEGV from a #GP reports address 0; only a page fault
            // reports the address.
            let address = (r.signal == libc::SIGSEGV && r.detail != libc::SI_KERNEL)
                .then_some(r.fault_address);
            state.stop = Stop::Fault {
                kind,
                raw: r.signal,
                address,
            };
        }
        (STATUS_SETUP_FAILED, _) => {
            let err = std::io::Error::from_raw_os_error(r.detail);
            return FinalState::abnormal(format!(
                "native setup step {} failed: {err}",
                r.setup_step
            ));
        }
        (_, ChildEnd::TimedOut) => return FinalState::abnormal("native child timed out"),
        (_, ChildEnd::Killed(sig)) => {
            return FinalState::abnormal(format!("native child killed by signal {sig}"))
        }
        (status, ChildEnd::Exited(code)) => {
            return FinalState::abnormal(format!(
                "native child exited with {code}, status {status}"
            ))
        }
    }
    state
}

/// Everything the child needs, prepared by the parent.
struct ChildJob<'a> {
    code_page: &'a [u8],
    io_page: &'a [u64; 512],
    prologue: &'a [u8],
    window: &'a [u8],
    alt_stack: *mut u8,
    shared: *mut SharedResult,
}

/// Reports a failed setup step and exits.
///
/// # Safety
/// `shared` must point to the live shared result page.
unsafe fn setup_failed(shared: *mut SharedResult, step: u32) -> ! {
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    // SAFETY: guaranteed by the caller.
    unsafe {
        (*shared).setup_step = step;
        (*shared).detail = errno;
        (*shared).status = STATUS_SETUP_FAILED;
        libc::_exit(3)
    }
}

/// Maps `len` bytes at the fixed `addr`, failing if anything is there.
///
/// # Safety
/// Only for the child: it creates mappings at fixed addresses.
unsafe fn map_fixed(addr: u64, len: usize, prot: libc::c_int) -> bool {
    // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping, so
    // no memory of this process is invalidated.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            prot,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    p as u64 == addr
}

/// The child's whole life.
///
/// # Safety
/// Must only be called in a freshly forked child, with `job` valid.
unsafe fn child_main(job: &ChildJob<'_>) -> ! {
    let shared = job.shared;
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    let rwx = rw | libc::PROT_EXEC;
    // SAFETY: we are the child; each mapping is at a fixed, previously
    // unused address (MAP_FIXED_NOREPLACE), and each copy stays inside the
    // page just mapped (sizes checked by the parent).
    unsafe {
        let regions = [
            (CODE_ADDR, CODE_SIZE as usize, rwx),
            (DATA_ADDR, WINDOW_PAGE_SIZE as usize, rw),
            (STACK_ADDR, WINDOW_PAGE_SIZE as usize, rw),
            (NATIVE_IO_ADDR, 4096, rw),
            (NATIVE_TRAMPOLINE_ADDR, 4096, rwx),
        ];
        // Inaccessible guard pages around the window pages, so an access
        // running off a window page faults here exactly as it does in the
        // interpreter (where the neighbours are unmapped), whatever else
        // the host process has mapped.
        let guard = WINDOW_PAGE_SIZE;
        let guards = [
            (DATA_ADDR - guard, guard as usize, libc::PROT_NONE),
            (DATA_ADDR + guard, guard as usize, libc::PROT_NONE),
            (STACK_ADDR - guard, guard as usize, libc::PROT_NONE),
            (STACK_ADDR + guard, guard as usize, libc::PROT_NONE),
        ];
        for (step, (addr, len, prot)) in regions.into_iter().chain(guards).enumerate() {
            if !map_fixed(addr, len, prot) {
                setup_failed(shared, step as u32 + 1);
            }
        }
        let copy = |dst: u64, src: &[u8]| {
            std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len())
        };
        copy(CODE_ADDR, job.code_page);
        copy(NATIVE_TRAMPOLINE_ADDR, job.prologue);
        let page = WINDOW_PAGE_SIZE as usize;
        copy(DATA_ADDR, &job.window[..page]);
        copy(STACK_ADDR, &job.window[page..]);
        std::ptr::copy_nonoverlapping(job.io_page.as_ptr(), NATIVE_IO_ADDR as *mut u64, 512);

        SHARED.store(shared, Ordering::SeqCst);
        let stack = libc::stack_t {
            ss_sp: job.alt_stack.cast(),
            ss_flags: 0,
            ss_size: ALT_STACK_SIZE,
        };
        if libc::sigaltstack(&stack, std::ptr::null_mut()) != 0 {
            setup_failed(shared, 10);
        }
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_signal as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut action.sa_mask);
        for sig in [
            libc::SIGFPE,
            libc::SIGSEGV,
            libc::SIGILL,
            libc::SIGBUS,
            libc::SIGTRAP,
        ] {
            if libc::sigaction(sig, &action, std::ptr::null_mut()) != 0 {
                setup_failed(shared, 11);
            }
        }

        let trampoline: extern "C" fn() = std::mem::transmute(NATIVE_TRAMPOLINE_ADDR as usize);
        trampoline();

        let out = std::slice::from_raw_parts(OUT_GPR as *const u64, 16);
        (*shared).gpr.copy_from_slice(out);
        (*shared).rflags = *(OUT_RFLAGS as *const u64);
        std::ptr::copy_nonoverlapping(OUT_FX as *const u8, (*shared).fx.as_mut_ptr(), FXSAVE_SIZE);
        (*shared).rip = 0;
        copy_window(shared);
        (*shared).status = STATUS_COMPLETED;
        libc::_exit(0)
    }
}

/// Copies the window pages into the shared result.
///
/// # Safety
/// Only in the child after the window pages are mapped; `shared` valid.
unsafe fn copy_window(shared: *mut SharedResult) {
    let page = WINDOW_PAGE_SIZE as usize;
    // SAFETY: both window pages are mapped and readable; the destination
    // is the shared page's window array of WINDOW_SIZE bytes.
    unsafe {
        let dst = (*shared).window.as_mut_ptr();
        std::ptr::copy_nonoverlapping(DATA_ADDR as *const u8, dst, page);
        std::ptr::copy_nonoverlapping(STACK_ADDR as *const u8, dst.add(page), page);
    }
}

/// The child's handler for the fault signals: records where and how the
/// snippet stopped, then exits.
extern "C" fn on_signal(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    let shared = SHARED.load(Ordering::SeqCst);
    if shared.is_null() {
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(4) }
    }
    // SAFETY: the kernel passes a valid siginfo and ucontext to an
    // SA_SIGINFO handler; `shared` is the live shared page (set before any
    // of these signals was enabled); the window pages are mapped.
    unsafe {
        let uc = &*(context as *const libc::ucontext_t);
        let g = &uc.uc_mcontext.gregs;
        let order = [
            libc::REG_RAX,
            libc::REG_RCX,
            libc::REG_RDX,
            libc::REG_RBX,
            libc::REG_RSP,
            libc::REG_RBP,
            libc::REG_RSI,
            libc::REG_RDI,
            libc::REG_R8,
            libc::REG_R9,
            libc::REG_R10,
            libc::REG_R11,
            libc::REG_R12,
            libc::REG_R13,
            libc::REG_R14,
            libc::REG_R15,
        ];
        for (i, reg) in order.iter().enumerate() {
            (*shared).gpr[i] = g[*reg as usize] as u64;
        }
        (*shared).rip = g[libc::REG_RIP as usize] as u64;
        // The interrupted x87/SSE state, in FXSAVE format.
        let fp = uc.uc_mcontext.fpregs;
        if !fp.is_null() {
            std::ptr::copy_nonoverlapping(fp as *const u8, (*shared).fx.as_mut_ptr(), FXSAVE_SIZE);
        }
        (*shared).rflags = g[libc::REG_EFL as usize] as u64;
        (*shared).signal = signal;
        (*shared).detail = (*info).si_code;
        (*shared).fault_address = (*info).si_addr() as u64;
        copy_window(shared);
        (*shared).status = STATUS_SIGNAL;
        libc::_exit(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trampoline_assembles_with_absolute_addresses() {
        let prologue = assemble_prologue().unwrap();
        let epilogue = assemble_epilogue().unwrap();
        // The epilogue is position-independent: the same bytes at any
        // address decode to the same absolute operands.
        let a = super::super::gen::disassemble(&epilogue, 0x1000_0000);
        let b = super::super::gen::disassemble(&epilogue, 0x1000_0123);
        let texts =
            |v: &Vec<(u64, Vec<u8>, String)>| v.iter().map(|x| x.2.clone()).collect::<Vec<_>>();
        assert_eq!(texts(&a), texts(&b));
        assert!(
            texts(&a).iter().any(|t| t.contains("10200100")),
            "{:?}",
            texts(&a)
        );
        assert!(!prologue.is_empty());
    }
}
