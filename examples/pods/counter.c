/* counter: the pod every migration test uses.
 *   GET  /            JSON: requests (this one included), ticks, events, init_calls,
 *                     restored_calls, time_ms, last_event, hostname, channel
 *   POST /work?ms=N   busy-loops N ms of pod time inside the call
 *   POST /alloc?kb=N  grows linear memory by N KiB (whole pages) and touches them
 * State lives in linear memory; clang keeps __stack_pointer in a hidden mutable
 * global, and routes dispatch through a function table: a snapshot must carry both. */
#include "k32.h"
#include "util.h"

static uint64_t requests, ticks, events, init_calls, restored_calls, grown_kb;
static int32_t log_channel = -1;
static char last_event[128];
static int32_t last_event_len;
static char out[2048];

typedef void (*route_fn)(const char *query, int32_t qlen);
struct route { const char *method; const char *path; route_fn fn; };

static void reply_json(sbuf *b) {
    k32_header_str("Content-Type", "application/json");
    k32_resp_body(b->p, b->n);
}

static void get_state(const char *q, int32_t qn) {
    (void)q; (void)qn;
    char host[64];
    int32_t hn = k32_env("HOSTNAME", 8, host, sizeof host);
    if (hn < 0) hn = 0;
    if (hn > (int32_t)sizeof host) hn = sizeof host;
    sbuf b = {out, 0, sizeof out};
    sb_puts(&b, "{\"requests\":"); sb_putu(&b, requests);
    sb_puts(&b, ",\"ticks\":"); sb_putu(&b, ticks);
    sb_puts(&b, ",\"events\":"); sb_putu(&b, events);
    sb_puts(&b, ",\"init_calls\":"); sb_putu(&b, init_calls);
    sb_puts(&b, ",\"restored_calls\":"); sb_putu(&b, restored_calls);
    sb_puts(&b, ",\"time_ms\":"); sb_putu(&b, (uint64_t)k32_time_ms());
    sb_puts(&b, ",\"last_event\":\""); sb_putjs(&b, last_event, last_event_len);
    sb_puts(&b, "\",\"hostname\":\""); sb_putjs(&b, host, hn);
    sb_puts(&b, "\",\"channel\":"); sb_putu(&b, (uint64_t)(log_channel < 0 ? 0 : log_channel));
    sb_puts(&b, ",\"grown_kb\":"); sb_putu(&b, grown_kb);
    sb_puts(&b, ",\"memory_bytes\":"); sb_putu(&b, (uint64_t)__builtin_wasm_memory_size(0) * 65536);
    sb_puts(&b, "}\n");
    reply_json(&b);
}

static void post_work(const char *q, int32_t qn) {
    const char *v; int32_t vn = query_get(q, qn, "ms", &v);
    int64_t ms = vn > 0 ? parse_int(v, vn) : 0;
    int64_t end = k32_time_ms() + ms;
    volatile uint64_t spin = 0;
    while (k32_time_ms() < end) spin++;
    sbuf b = {out, 0, sizeof out};
    sb_puts(&b, "{\"worked_ms\":"); sb_putu(&b, (uint64_t)ms); sb_puts(&b, "}\n");
    reply_json(&b);
}

static void post_alloc(const char *q, int32_t qn) {
    const char *v; int32_t vn = query_get(q, qn, "kb", &v);
    int64_t kb = vn > 0 ? parse_int(v, vn) : 0;
    int32_t pages = (int32_t)((kb + 63) / 64);
    int32_t old = __builtin_wasm_memory_grow(0, pages);
    sbuf b = {out, 0, sizeof out};
    if (old < 0) {
        k32_resp_status(507);
        sb_puts(&b, "{\"error\":\"memory limit reached\"}\n");
    } else {
        volatile unsigned char *base = (volatile unsigned char *)((uintptr_t)old * 65536);
        for (int32_t i = 0; i < pages * 65536; i += 4096) base[i] = (unsigned char)(i >> 12);
        grown_kb += (uint64_t)pages * 64;
        sb_puts(&b, "{\"grown_kb\":"); sb_putu(&b, grown_kb); sb_puts(&b, "}\n");
    }
    reply_json(&b);
}

static const struct route routes[] = {
    {"GET", "/", get_state},
    {"POST", "/work", post_work},
    {"POST", "/alloc", post_alloc},
};

K32_EXPORT(k32_init) void k32_init(void) {
    init_calls++;
    log_channel = kube32_channel_open("counter-log", 11);
    k32_log_str("counter: init");
}

K32_EXPORT(k32_restored) void k32_restored(void) {
    restored_calls++;
    k32_log_str("counter: restored");
}

K32_EXPORT(k32_handle) void k32_handle(void) {
    char method[16], path[128], query[256];
    int32_t mn = k32_req_method(method, sizeof method);
    int32_t pn = k32_req_path(path, sizeof path);
    int32_t qn = k32_req_query(query, sizeof query);
    if (qn < 0 || qn > (int32_t)sizeof query) qn = 0;
    requests++;
    if (log_channel > 0) {
        sbuf b = {out, 0, sizeof out};
        sb_puts(&b, "request "); sb_putu(&b, requests);
        kube32_channel_send(log_channel, b.p, b.n);
    }
    for (unsigned i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        if (str_eq(method, mn, routes[i].method) && str_eq(path, pn, routes[i].path)) {
            routes[i].fn(query, qn);
            return;
        }
    }
    k32_resp_status(404);
    k32_resp_str("not found\n");
}

K32_EXPORT(k32_tick) void k32_tick(void) { ticks++; }

K32_EXPORT(k32_event) void k32_event(int32_t topic_len, int32_t payload_len) {
    events++;
    int32_t n = k32_event_topic(last_event, 64);
    if (n > 64) n = 64;
    if (n < 0) n = 0;
    last_event[n++] = ':';
    int32_t p = k32_event_payload(last_event + n, (int32_t)sizeof last_event - n, 0);
    last_event_len = n + (p > 0 ? p : 0);
    (void)topic_len; (void)payload_len;
}
