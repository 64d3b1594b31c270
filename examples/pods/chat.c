/* chat: pods talking over the node-local channel "chat".
 *   POST /send?msg=..  sends msg (or the body when there is no msg) on the channel
 *   GET  /             answers the messages received since the last GET, one a line */
#include "k32.h"
#include "util.h"

static int32_t chan = -1;
static char out[16384];

static void ensure_open(void) { if (chan <= 0) chan = kube32_channel_open("chat", 4); }

K32_EXPORT(k32_init) void k32_init(void) { ensure_open(); }

K32_EXPORT(k32_handle) void k32_handle(void) {
    char method[8], path[64], query[1024];
    int32_t mn = k32_req_method(method, sizeof method);
    int32_t pn = k32_req_path(path, sizeof path);
    int32_t qn = k32_req_query(query, sizeof query);
    if (qn < 0 || qn > (int32_t)sizeof query) qn = 0;
    ensure_open();
    sbuf b = {out, 0, sizeof out};
    if (str_eq(method, mn, "POST") && str_eq(path, pn, "/send")) {
        const char *msg; int32_t len = query_get(query, qn, "msg", &msg);
        if (len < 0) { len = k32_req_body(out, sizeof out, 0); msg = out; if (len < 0) len = 0; }
        int32_t reached = kube32_channel_send(chan, msg, len);
        b.n = 0;
        sb_puts(&b, "{\"sent\":true,\"receivers\":"); sb_putu(&b, (uint64_t)(reached < 0 ? 0 : reached)); sb_puts(&b, "}\n");
        k32_header_str("Content-Type", "application/json");
    } else if (str_eq(method, mn, "GET") && str_eq(path, pn, "/")) {
        char msg[1024];
        for (;;) {
            int32_t n = kube32_channel_receive(chan, msg, sizeof msg);
            if (n < 0) break;
            if (n > (int32_t)sizeof msg) break;   /* too long for us: it stays queued */
            sb_putn(&b, msg, n); sb_puts(&b, "\n");
        }
        k32_header_str("Content-Type", "text/plain");
    } else {
        k32_resp_status(404);
        sb_puts(&b, "not found\n");
    }
    k32_resp_body(b.p, b.n);
}
