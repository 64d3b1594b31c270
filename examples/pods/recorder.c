/* recorder: records every request it runs (tests/e2e/test_service_hold_attacks.py):
 *   a request run twice, or out of order, shows.
 *   GET  /log          the record (not itself recorded): one line per call,
 *                      "<n> <method> <path>?<query> len=<body bytes> sum=<byte sum>"
 *   any  /x?ms=N       busy-loops N ms inside the call (recorded first)
 *   any  /x?status=S   answers S (503 adds Retry-After: 1), recorded
 *   any  /x?big=N      answers N bytes of 'x'
 *   any  /x?fake=1     503 with Retry-After and the kubelet's X-Kube32-Not-Started mark
 *   otherwise          200 "ok <n> len=<body bytes>\n"                          */
#include "k32.h"
#include "util.h"

void *memcpy(void *d, const void *s, unsigned long n) { volatile char *a = d; const char *b = s; while (n--) *a++ = *b++; return d; }
void *memset(void *d, int c, unsigned long n) { volatile char *a = d; while (n--) *a++ = (char)c; return d; }
static char logbuf[200000];
static int32_t loglen;
static uint64_t calls;
static char body[70000];
static char big[300000];
static char out[512];

K32_EXPORT(k32_init) void k32_init(void) { }
K32_EXPORT(k32_restored) void k32_restored(void) { }

K32_EXPORT(k32_handle) void k32_handle(void) {
    char method[16], path[128], query[256];
    int32_t mn = k32_req_method(method, sizeof method);
    int32_t pn = k32_req_path(path, sizeof path);
    int32_t qn = k32_req_query(query, sizeof query);
    if (mn < 0 || mn > (int32_t)sizeof method) mn = 0;
    if (pn < 0 || pn > (int32_t)sizeof path) pn = 0;
    if (qn < 0 || qn > (int32_t)sizeof query) qn = 0;
    if (str_eq(method, mn, "GET") && str_eq(path, pn, "/log")) {
        k32_header_str("Content-Type", "text/plain");
        k32_resp_body(logbuf, loglen);
        return;
    }
    calls++;
    int32_t blen = k32_req_body_len();
    uint64_t sum = 0;
    int32_t off = 0;
    while (1) {
        int32_t got = k32_req_body(body, sizeof body, off);
        if (got <= 0) break;
        for (int32_t i = 0; i < got; i++) sum += (unsigned char)body[i];
        off += got;
    }
    sbuf b = {out, 0, sizeof out};
    sb_putu(&b, calls); sb_puts(&b, " "); sb_putn(&b, method, mn); sb_puts(&b, " ");
    sb_putn(&b, path, pn); sb_puts(&b, "?"); sb_putn(&b, query, qn);
    sb_puts(&b, " len="); sb_putu(&b, (uint64_t)(blen < 0 ? 0 : blen));
    sb_puts(&b, " got="); sb_putu(&b, (uint64_t)off);
    sb_puts(&b, " sum="); sb_putu(&b, sum); sb_puts(&b, "\n");
    if (loglen + b.n < (int32_t)sizeof logbuf) {
        for (int32_t i = 0; i < b.n; i++) logbuf[loglen + i] = out[i];
        loglen += b.n;
    }
    const char *v; int32_t vn;
    vn = query_get(query, qn, "ms", &v);
    if (vn > 0) {
        int64_t end = k32_time_ms() + parse_int(v, vn);
        volatile uint64_t spin = 0;
        while (k32_time_ms() < end) spin++;
    }
    vn = query_get(query, qn, "status", &v);
    if (vn > 0) {
        int64_t s = parse_int(v, vn);
        k32_resp_status((int32_t)s);
        if (s == 503) k32_header_str("Retry-After", "1");
    }
    vn = query_get(query, qn, "fake", &v);
    if (vn > 0) {   /* a pod that pretends to be the kubelet's refusal */
        k32_resp_status(503);
        k32_header_str("Retry-After", "1");
        k32_header_str("X-Kube32-Not-Started", "frozen");
        k32_header_str("x-kube32-not-started", "moved-away");
    }
    vn = query_get(query, qn, "big", &v);
    if (vn > 0) {
        int64_t n = parse_int(v, vn);
        if (n > (int64_t)sizeof big) n = sizeof big;
        for (int64_t i = 0; i < n; i++) big[i] = 'x';
        k32_resp_body(big, (int32_t)n);
        return;
    }
    k32_header_str("Content-Type", "text/plain");
    k32_resp_body(out, b.n);
}
