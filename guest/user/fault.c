/* Faults on purpose, to test the kernel's handling of user faults:
 * `fault` writes to an unmapped address, `fault ud` executes ud2,
 * `fault thread` faults in a second thread (the program goes on). */
#include "ulib.h"

static int bad_write(void *arg) {
    (void)arg;
    volatile int *unmapped;
    __asm__("mov $0x10, %0" : "=r"(unmapped)); /* hidden from gcc's bounds checks */
    *unmapped = 1;
    return 0;
}

int fault_main(int argc, char **argv);

int fault_main(int argc, char **argv) {
    if (argc > 2 || (argc == 2 && strcmp(argv[1], "ud") != 0 && strcmp(argv[1], "thread") != 0)) {
        eprintf("usage: fault [ud|thread]\n");
        return 2;
    }
    if (argc > 1 && strcmp(argv[1], "ud") == 0)
        __asm__ volatile("ud2");
    if (argc > 1 && strcmp(argv[1], "thread") == 0) {
        int tid = spawn(bad_write, NULL);
        int rc = wait_thread(tid);
        printf("fault: faulting thread ended with %d\n", rc);
        return rc == 128 + 14 ? 0 : 1;
    }
    bad_write(NULL);
    printf("fault: the write did not fault\n");
    return 1;
}
