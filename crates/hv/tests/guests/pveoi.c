/* PV EOI as a guest uses it (KVM's ABI, Linux's `kvm_guest_apic_eoi_write`):
 * KVM's MSR rules (an address not 4-byte aligned, or outside RAM when
 * enabling, refused), then self-IPIs whose handlers exit to the hv (CPUID)
 * while their vector is in service and end it as Linux does: clear the
 * flag's bit 0 if set, else write the EOI register. Prints `name=value`
 * lines (msr_probe.h); the Rust test (tests/pv_eoi.rs) checks them. */
#include "gates.h"

#define VEC_A 0x50 /* class 5 */
#define VEC_B 0x51 /* class 5: blocked while VEC_A is in service */
#define X2APIC_SVR 0x80f
#define X2APIC_EOI 0x80b
#define X2APIC_ISR2 0x812 /* vectors 0x40-0x5f */
#define X2APIC_SELF_IPI 0x83f

static volatile uint64_t eoi_flag __attribute__((aligned(8)));
static volatile uint64_t flag_seen, isr_in_service, isr_after_exit, skipped, written, b_runs;
static volatile int send_b;


/* Linux's kvm_guest_apic_eoi_write. */
static void eoi(void) {
    uint8_t was;
    __asm__ volatile("btrq $0, %1; setc %0" : "=q"(was), "+m"(eoi_flag)::"memory");
    if (was) {
        skipped++;
        return;
    }
    written++;
    wrmsr(X2APIC_EOI, 0);
}

__attribute__((interrupt)) static void handler_a(struct interrupt_frame *f) {
    (void)f;
    if (send_b)
        wrmsr(X2APIC_SELF_IPI, VEC_B);
    /* An exit with VEC_A alone in service: the hv may set the flag. */
    exit_to_hv();
    flag_seen = eoi_flag;
    eoi();
    /* A skipped EOI leaves VEC_A in service until the hv's next exit. */
    isr_in_service = (rdmsr(X2APIC_ISR2) >> (VEC_A - 0x40)) & 1;
    exit_to_hv();
    isr_after_exit = (rdmsr(X2APIC_ISR2) >> (VEC_A - 0x40)) & 1;
}

__attribute__((interrupt)) static void handler_b(struct interrupt_frame *f) {
    (void)f;
    b_runs++;
    eoi();
}


static void interrupt_a(void) {
    wrmsr(X2APIC_SELF_IPI, VEC_A);
    __asm__ volatile("sti; nop; cli" ::: "memory");
}

static void field(const char *round, const char *name, uint64_t v) {
    puts_serial(round);
    putc_serial('_');
    line(name, v);
}

static void report(const char *round) {
    field(round, "flag_seen", flag_seen);
    field(round, "isr_in_service", isr_in_service);
    field(round, "isr_after_exit", isr_after_exit);
    field(round, "skipped", skipped);
    field(round, "written", written);
    field(round, "b_runs", b_runs);
    field(round, "flag_after", eoi_flag);
    flag_seen = isr_in_service = isr_after_exit = skipped = written = b_runs = 0;
}

__attribute__((section(".text.start"))) void _start(struct boot_info *bi) {
    (void)bi;
    set_gate(VEC_A, (void *)handler_a);
    set_gate(VEC_B, (void *)handler_b);
    load_gates();
    wrmsr(X2APIC_SVR, 0x1ff);

    uint32_t r[4];
    cpuid(0x40000001, r);
    line("features", r[0]);
    uint64_t flag = (uint64_t)&eoi_flag;
    line("gp_unaligned", try_wrmsr(MSR_KVM_PV_EOI_EN, (flag + 2) | KVM_MSR_ENABLED));
    line("gp_outside", try_wrmsr(MSR_KVM_PV_EOI_EN, 0x7ff00000000ull | KVM_MSR_ENABLED));
    line("gp_disabled_outside", try_wrmsr(MSR_KVM_PV_EOI_EN, 0x7ff00000000ull));
    line("gp_enable", try_wrmsr(MSR_KVM_PV_EOI_EN, flag | KVM_MSR_ENABLED));
    line("msr_readback", rdmsr(MSR_KVM_PV_EOI_EN) == (flag | KVM_MSR_ENABLED));

    /* One vector in service, nothing pending: the EOI is the hv's. */
    interrupt_a();
    report("alone");
    /* VEC_B pending behind VEC_A: no flag, a real EOI, then VEC_B. */
    send_b = 1;
    interrupt_a();
    __asm__ volatile("sti; nop; cli" ::: "memory");
    send_b = 0;
    report("pending");
    /* Disabled: every EOI is written. */
    line("gp_disable", try_wrmsr(MSR_KVM_PV_EOI_EN, 0));
    interrupt_a();
    report("disabled");
    debug_exit(0x21);
}
