/* Picks the program named by argv[0]. */
#include "ulib.h"

int hello_main(int argc, char **argv);
int bm_main(int argc, char **argv);
int ctxsw_main(int argc, char **argv);
int memtouch_main(int argc, char **argv);
int fault_main(int argc, char **argv);
int pagetag_main(int argc, char **argv);
int apfcalc_main(int argc, char **argv);

static const struct {
    const char *name;
    int (*main)(int, char **);
} programs[] = {
    {"hello", hello_main},
    {"bm", bm_main},
    {"ctxsw", ctxsw_main},
    {"memtouch", memtouch_main},
    {"fault", fault_main},
    {"pagetag", pagetag_main},
    {"apfcalc", apfcalc_main},
};

int umain(int argc, char **argv);

int umain(int argc, char **argv) {
    for (size_t i = 0; i < sizeof(programs) / sizeof(programs[0]); i++)
        if (strcmp(argv[0], programs[i].name) == 0)
            return programs[i].main(argc, argv);
    printf("unknown program '%s'; available:", argv[0]);
    for (size_t i = 0; i < sizeof(programs) / sizeof(programs[0]); i++)
        printf(" %s", programs[i].name);
    printf("\n");
    return 127;
}
