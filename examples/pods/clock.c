/* clock: a command pod.  _start logs a line about once a second, LINES times
 * (env LINES, default forever), then returns.  It runs on its own thread and
 * cannot move. */
#include "k32.h"
#include "util.h"

K32_EXPORT(_start) void _start(void) {
    char v[16]; int32_t n = k32_env("LINES", 5, v, sizeof v);
    int64_t lines = n > 0 && n <= (int32_t)sizeof v ? parse_int(v, n) : -1;
    int32_t period = 1000;
    n = k32_env("PERIOD_MS", 9, v, sizeof v);
    if (n > 0 && n <= (int32_t)sizeof v) period = (int32_t)parse_int(v, n);
    for (int64_t i = 1; lines < 0 || i <= lines; i++) {
        char out[64]; sbuf b = {out, 0, sizeof out};
        sb_puts(&b, "clock: tick "); sb_putu(&b, (uint64_t)i);
        sb_puts(&b, " at "); sb_putu(&b, (uint64_t)k32_time_ms()); sb_puts(&b, " ms");
        k32_log(b.p, b.n);
        if (k32_sleep_ms(period) < 0) return;
    }
}
