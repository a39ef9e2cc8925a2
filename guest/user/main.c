/* Picks the program named by argv[0]. */
#include "ulib.h"

int hello_main(int argc, char **argv);
int bm_main(int argc, char **argv);
int ctxsw_main(int argc, char **argv);
int memtouch_main(int argc, char **argv);
int fault_main(int argc, char **argv);
int pagetag_main(int argc, char **argv);
int apfcalc_main(int argc, char **argv);
int touchloop_main(int argc, char **argv);
int fbwrite_main(int argc, char **argv);
int tlbflush_main(int argc, char **argv);
int hackbench_main(int argc, char **argv);
int clockwarp_main(int argc, char **argv);
int ipiping_main(int argc, char **argv);

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
    {"touchloop", touchloop_main},
    {"fbwrite", fbwrite_main},
    {"tlbflush", tlbflush_main},
    {"hackbench", hackbench_main},
    {"clockwarp", clockwarp_main},
    {"ipiping", ipiping_main},
};

int umain(int argc, char **argv);

int umain(int argc, char **argv) {
    for (size_t i = 0; i < sizeof(programs) / sizeof(programs[0]); i++)
        if (strcmp(argv[0], programs[i].name) == 0)
            return programs[i].main(argc, argv);
    /* One write, so the line stays whole on a shared console. */
    char line[256];
    int n = ksnprintf(line, sizeof(line), "unknown program '%s'; available:", argv[0]);
    for (size_t i = 0; i < sizeof(programs) / sizeof(programs[0]) && n < (int)sizeof(line); i++)
        n += ksnprintf(line + n, sizeof(line) - (size_t)n, " %s", programs[i].name);
    eprintf("%s\n", line);
    return 127; /* as a shell says "command not found" */
}
