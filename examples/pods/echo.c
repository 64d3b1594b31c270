/* echo: answers the request back as text: method, path, query, headers, body. */
#include "k32.h"
#include "util.h"

static char out[70000];

K32_EXPORT(k32_handle) void k32_handle(void) {
    char tmp[4096];
    sbuf b = {out, 0, sizeof out};
    int32_t n;
    sb_puts(&b, "method: "); n = k32_req_method(tmp, sizeof tmp); sb_putn(&b, tmp, n < 0 ? 0 : n); sb_puts(&b, "\n");
    sb_puts(&b, "path: "); n = k32_req_path(tmp, sizeof tmp); sb_putn(&b, tmp, n < 0 ? 0 : n); sb_puts(&b, "\n");
    sb_puts(&b, "query: "); n = k32_req_query(tmp, sizeof tmp); sb_putn(&b, tmp, n < 0 ? 0 : n); sb_puts(&b, "\n");
    sb_puts(&b, "headers:\n"); n = k32_req_headers(tmp, sizeof tmp);
    if (n > (int32_t)sizeof tmp) n = sizeof tmp;
    sb_putn(&b, tmp, n < 0 ? 0 : n);
    sb_puts(&b, "body: ");
    int32_t off = 0;
    while (b.n < b.cap) {
        int32_t got = k32_req_body(out + b.n, b.cap - b.n, off);
        if (got <= 0) break;
        b.n += got; off += got;
    }
    k32_header_str("Content-Type", "text/plain");
    k32_resp_body(b.p, b.n);
}
