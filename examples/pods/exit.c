/* exit: a command pod that ends with the exit code it is told.  Its entry point `main`
 * returns an int32: the container's exit code (0 Completed, any other Error), as a
 * C program's main does.  Env EXIT_CODE (default 0) and SLEEP_MS (default 0: how long
 * to run first); EXIT_CODE_<i> and SLEEP_MS_<i> override them for an Indexed Job's pod
 * of completion index i (env JOB_COMPLETION_INDEX), so one Job can have an index fail. */
#include "k32.h"
#include "util.h"

/* The env var NAME, or NAME_<JOB_COMPLETION_INDEX> when that is set: as a number, or dflt. */
static int64_t setting(const char *name, int64_t dflt) {
    char key[48]; sbuf k = {key, 0, sizeof key};
    char ix[12]; int32_t n = k32_env("JOB_COMPLETION_INDEX", 20, ix, sizeof ix);
    char v[16]; int32_t m;
    if (n > 0 && n <= (int32_t)sizeof ix) {
        sb_puts(&k, name); sb_puts(&k, "_"); sb_putn(&k, ix, n);
        m = k32_env(key, k.n, v, sizeof v);
        if (m > 0 && m <= (int32_t)sizeof v) return parse_int(v, m);
    }
    m = k32_env(name, k32_strlen(name), v, sizeof v);
    return m > 0 && m <= (int32_t)sizeof v ? parse_int(v, m) : dflt;
}

K32_EXPORT(main) int32_t exit_main(void) {
    int64_t code = setting("EXIT_CODE", 0), sleep = setting("SLEEP_MS", 0);
    if (sleep > 0 && k32_sleep_ms((int32_t)sleep) < 0) return 0;   /* being stopped */
    char out[48]; sbuf b = {out, 0, sizeof out};
    sb_puts(&b, "exit: code "); sb_putu(&b, (uint64_t)code);
    k32_log(b.p, b.n);
    return (int32_t)code;
}
