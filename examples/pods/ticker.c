/* ticker: counts ticks (kube32.io/tick-interval) and events of the topics in its
 * pod spec (kube32.io/events); GET / answers {"ticks":..,"events":..,"last_topic":".."}.
 * On every 10th tick it publishes "ticker.tens" with the count. */
#include "k32.h"
#include "util.h"

static uint64_t ticks, events;
static char topic[64];
static int32_t topic_len;

K32_EXPORT(k32_tick) void k32_tick(void) {
    ticks++;
    if (ticks % 10 == 0) {
        char t[24]; sbuf b = {t, 0, sizeof t}; sb_putu(&b, ticks);
        k32_publish("ticker.tens", 11, t, b.n);
    }
}

K32_EXPORT(k32_event) void k32_event(int32_t tlen, int32_t plen) {
    (void)plen;
    events++;
    int32_t n = k32_event_topic(topic, sizeof topic);
    topic_len = n < 0 ? 0 : (n > (int32_t)sizeof topic ? (int32_t)sizeof topic : n);
    (void)tlen;
}

K32_EXPORT(k32_handle) void k32_handle(void) {
    char out[256]; sbuf b = {out, 0, sizeof out};
    sb_puts(&b, "{\"ticks\":"); sb_putu(&b, ticks);
    sb_puts(&b, ",\"events\":"); sb_putu(&b, events);
    sb_puts(&b, ",\"last_topic\":\""); sb_putjs(&b, topic, topic_len); sb_puts(&b, "\"}\n");
    k32_header_str("Content-Type", "application/json");
    k32_resp_body(b.p, b.n);
}
