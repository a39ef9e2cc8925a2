/* hello.c: the smallest bare-mode program: one line on COM1, exit 0. */
#include "rt.h"

int kmain(void);
int kmain(void)
{
    puts("hello from the machine\n");
    return 0;
}
