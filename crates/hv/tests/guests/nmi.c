/* NMIs as a guest receives them: a self-NMI through the x2APIC ICR, one
 * through KVM_HC_SEND_IPI (Linux's `APIC_DM_NMI`) taken with interrupts
 * off, and one sent from inside the NMI handler, held back until its
 * IRET. Prints `name=value` lines (msr_probe.h); the Rust test
 * (tests/nmi.rs) checks them. */
#include "gates.h"

#define X2APIC_SVR 0x80f
#define X2APIC_ICR 0x830
#define ICR_DM_NMI (4ull << 8)
#define ICR_ASSERT (1ull << 14)

static volatile uint64_t nmis, depth, max_depth, held_in_handler;
static volatile int send_again;


static void self_nmi(void) { wrmsr(X2APIC_ICR, ICR_DM_NMI | ICR_ASSERT); /* physical, APIC id 0 */ }

__attribute__((interrupt)) static void nmi_handler(struct interrupt_frame *f) {
    (void)f;
    depth++;
    if (depth > max_depth)
        max_depth = depth;
    nmis++;
    if (send_again) {
        send_again = 0;
        self_nmi();
        exit_to_hv();
        exit_to_hv();
        held_in_handler = nmis;
    }
    depth--;
}

__attribute__((section(".text.start"))) void _start(struct boot_info *bi) {
    (void)bi;
    set_gate(2, (void *)nmi_handler);
    load_gates();
    wrmsr(X2APIC_SVR, 0x1ff);

    __asm__ volatile("cli");
    self_nmi();
    line("icr_nmis", nmis);
    /* Bit 0 of the bitmap: APIC id 0 + 0, this CPU. */
    line("pv_sent", (uint64_t)hypercall4(KVM_HC_SEND_IPI, 1, 0, 0, ICR_DM_NMI));
    line("pv_nmis", nmis);
    line("pv_smi", (uint64_t)hypercall4(KVM_HC_SEND_IPI, 1, 0, 0, 2ull << 8));
    send_again = 1;
    self_nmi();
    exit_to_hv();
    line("held_in_handler", held_in_handler);
    line("after_iret", nmis);
    line("max_depth", max_depth);
    debug_exit(0x21);
}
