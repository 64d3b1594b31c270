/* k32.h - the Kube32 pod ABI for C (clang --target=wasm32 -nostdlib).
 *
 * All imports come from Wasm module "k32".  See docs/pod-abi.md.
 * Conventions:
 *  - every import returns a value and never traps; a negative int32 is an error
 *    code (K32_E*), a non-negative one a length, count, handle or descriptor;
 *  - buffers are pull-style: pass (pointer, capacity); the host copies at most
 *    `cap` bytes and returns the FULL length of the value, so a return value
 *    greater than `cap` means "your buffer was too small, retry with more";
 *  - the host calls the exports below one at a time, never concurrently.
 */
#ifndef K32_H
#define K32_H

#include <stdint.h>
#include <stddef.h>

#define K32_OK 0
#define K32_EINVAL -1    /* pointer/length outside memory, bad argument or UTF-8 */
#define K32_ENOENT -2    /* no such header, env variable, asset or channel */
#define K32_EBADF -3     /* unknown channel handle or file descriptor */
#define K32_EAGAIN -4    /* nothing to receive yet */
#define K32_ENOSPC -5    /* too many open channels/files, or a queue is full */
#define K32_ESTATE -6    /* not available in this call (request access outside k32_handle) */
#define K32_E2BIG -7     /* larger than the host accepts (messages: 64 KiB) */
#define K32_EINTERNAL -8 /* the host failed; retry later */

#define K32_IMPORT(name) __attribute__((import_module("k32"), import_name(#name)))
#define K32_EXPORT(name) __attribute__((export_name(#name)))

/* clock and logging */
K32_IMPORT(k32_time_ms) int64_t k32_time_ms(void);          /* pod clock, ms; never goes backward, survives moves */
K32_IMPORT(k32_sleep_ms) int32_t k32_sleep_ms(int32_t ms);  /* K32_ESTATE when the pod is being stopped */
K32_IMPORT(k32_log) int32_t k32_log(const char *msg, int32_t len);
K32_IMPORT(k32_env) int32_t k32_env(const char *name, int32_t name_len, char *buf, int32_t cap);
K32_IMPORT(k32_random) int32_t k32_random(void *buf, int32_t len);   /* at most 64 KiB per call */

/* the request of the current k32_handle call (K32_ESTATE elsewhere) */
K32_IMPORT(k32_req_method) int32_t k32_req_method(char *buf, int32_t cap);
K32_IMPORT(k32_req_path) int32_t k32_req_path(char *buf, int32_t cap);
K32_IMPORT(k32_req_query) int32_t k32_req_query(char *buf, int32_t cap);   /* without '?' */
K32_IMPORT(k32_req_header) int32_t k32_req_header(const char *name, int32_t name_len, char *buf, int32_t cap); /* case-insensitive; K32_ENOENT */
K32_IMPORT(k32_req_headers) int32_t k32_req_headers(char *buf, int32_t cap); /* "Name: value\n" for each */
K32_IMPORT(k32_req_body_len) int32_t k32_req_body_len(void);
K32_IMPORT(k32_req_body) int32_t k32_req_body(void *buf, int32_t cap, int32_t offset); /* bytes copied; 0 at the end */

/* the response (status 200 and no headers unless set) */
K32_IMPORT(k32_resp_status) int32_t k32_resp_status(int32_t code);
K32_IMPORT(k32_resp_header) int32_t k32_resp_header(const char *name, int32_t name_len, const char *value, int32_t value_len);
K32_IMPORT(k32_resp_body) int32_t k32_resp_body(const void *data, int32_t len);   /* appends */

/* the event of the current k32_event call */
K32_IMPORT(k32_event_topic) int32_t k32_event_topic(char *buf, int32_t cap);
K32_IMPORT(k32_event_payload) int32_t k32_event_payload(void *buf, int32_t cap, int32_t offset);
K32_IMPORT(k32_publish) int32_t k32_publish(const char *topic, int32_t topic_len, const void *payload, int32_t len);

/* node-local channels: a send reaches every other pod that opened the same name */
K32_IMPORT(kube32_channel_open) int32_t kube32_channel_open(const char *name, int32_t name_len);      /* handle >= 1 */
K32_IMPORT(kube32_channel_send) int32_t kube32_channel_send(int32_t handle, const void *msg, int32_t len); /* receivers reached */
K32_IMPORT(kube32_channel_receive) int32_t kube32_channel_receive(int32_t handle, void *buf, int32_t cap); /* length; K32_EAGAIN; > cap: stays queued */
K32_IMPORT(kube32_channel_close) int32_t kube32_channel_close(int32_t handle);

/* read-only assets of the pod (ConfigMap volumes); close before returning to move */
K32_IMPORT(k32_fs_open) int32_t k32_fs_open(const char *path, int32_t path_len);  /* descriptor >= 3 */
K32_IMPORT(k32_fs_size) int32_t k32_fs_size(int32_t fd);
K32_IMPORT(k32_fs_read) int32_t k32_fs_read(int32_t fd, void *buf, int32_t cap);  /* 0 at end of file */
K32_IMPORT(k32_fs_close) int32_t k32_fs_close(int32_t fd);

/* Exports the host calls (define those you need; all optional, a request pod has
 * at least one of k32_handle, k32_tick, k32_event):
 *   K32_EXPORT(k32_init)     void k32_init(void);       first start only
 *   K32_EXPORT(k32_restored) void k32_restored(void);   after a restore, instead of k32_init
 *   K32_EXPORT(k32_handle)   void k32_handle(void);     one HTTP request
 *   K32_EXPORT(k32_tick)     void k32_tick(void);       every kube32.io/tick-interval
 *   K32_EXPORT(k32_event)    void k32_event(int32_t topic_len, int32_t payload_len);
 * A command pod exports _start (or app_main, main) instead; it cannot move. */

/* small helpers for -nostdlib pods */
static inline int32_t k32_strlen(const char *s) { int32_t n = 0; while (s[n]) n++; return n; }
static inline int32_t k32_log_str(const char *s) { return k32_log(s, k32_strlen(s)); }
static inline int32_t k32_resp_str(const char *s) { return k32_resp_body(s, k32_strlen(s)); }
static inline int32_t k32_header_str(const char *n, const char *v) { return k32_resp_header(n, k32_strlen(n), v, k32_strlen(v)); }

#endif
