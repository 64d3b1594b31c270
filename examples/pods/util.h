/* Tiny string helpers shared by the example pods (no libc). */
#ifndef POD_UTIL_H
#define POD_UTIL_H
#include "k32.h"

typedef struct { char *p; int32_t n, cap; } sbuf;

static inline void sb_putn(sbuf *b, const char *s, int32_t n) {
    for (int32_t i = 0; i < n && b->n < b->cap; i++) b->p[b->n++] = s[i];
}
static inline void sb_puts(sbuf *b, const char *s) { sb_putn(b, s, k32_strlen(s)); }
static inline void sb_putu(sbuf *b, uint64_t v) {
    char t[24]; int i = 0;
    do { t[i++] = (char)('0' + v % 10); v /= 10; } while (v);
    while (i) { char c = t[--i]; sb_putn(b, &c, 1); }
}
/* JSON string body without quotes: escapes quote, backslash and control bytes */
static inline void sb_putjs(sbuf *b, const char *s, int32_t n) {
    static const char hex[] = "0123456789abcdef";
    for (int32_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') { char e[2] = {'\\', (char)c}; sb_putn(b, e, 2); }
        else if (c < 0x20) { char e[6] = {'\\','u','0','0',hex[c >> 4],hex[c & 15]}; sb_putn(b, e, 6); }
        else sb_putn(b, (const char *)&c, 1);
    }
}
static inline int str_eq(const char *a, int32_t n, const char *b) {
    int32_t m = k32_strlen(b);
    if (n != m) return 0;
    for (int32_t i = 0; i < n; i++) if (a[i] != b[i]) return 0;
    return 1;
}
/* value of key in a query string "a=1&b=2"; length or -1 */
static inline int32_t query_get(const char *q, int32_t n, const char *key, const char **out) {
    int32_t k = k32_strlen(key), i = 0;
    while (i < n) {
        int32_t j = i;
        while (j < n && q[j] != '&') j++;
        if (j - i > k && q[i + k] == '=') {
            int same = 1;
            for (int32_t x = 0; x < k; x++) if (q[i + x] != key[x]) { same = 0; break; }
            if (same) { *out = q + i + k + 1; return j - i - k - 1; }
        }
        i = j + 1;
    }
    return -1;
}
static inline int64_t parse_int(const char *s, int32_t n) {
    int64_t v = 0;
    for (int32_t i = 0; i < n && s[i] >= '0' && s[i] <= '9'; i++) v = v * 10 + (s[i] - '0');
    return v;
}
#endif
