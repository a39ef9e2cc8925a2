#include "ulib.h"

int hello_main(int argc, char **argv);

int hello_main(int argc, char **argv) {
    printf("hello from user space: tid %d on cpu %d of %d, argc %d", gettid(), getcpu(), ncpus(), argc);
    for (int i = 1; i < argc; i++)
        printf(" '%s'", argv[i]);
    printf("\n");
    report("hello=ok cpus=%d", ncpus());
    return 0;
}
