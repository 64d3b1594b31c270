;; state: a request pod holding every kind of state a K32S snapshot carries, for the
;; tests of moves between engines.  Written in WAT because C (clang 14) cannot name a
;; table it rewrites nor keep a NaN payload in a Wasm global.
;;
;; State: counters in i64/i32 globals; an f32 global holding a signalling NaN and an
;; f64 global holding a negative signalling NaN (their payloads change if they ever
;; pass through a Python float); a funcref table of three functions and a funcref
;; global; a channel handle; the pod clock.
;;
;; GET /        one line of space-separated hex fields:
;;              requests events restored time_ms f32_bits f64_bits table fg channel send
;;              (table: what slots 0, 1, 2 return, e.g. "123"; fg: what the funcref
;;              global's function returns; send: kube32_channel_send's result, >= 0
;;              while the channel handle is open on this node)
;; POST /mutate the same line after rotating the table one slot left, adding 1 to
;;              the f32 and f64 bits (still NaNs), and pointing the funcref global at
;;              the function now in slot 2
;; k32_event    counts events; k32_restored counts restores and logs "state: restored".
(module
  (import "k32" "k32_time_ms" (func $time_ms (result i64)))
  (import "k32" "k32_req_path" (func $req_path (param i32 i32) (result i32)))
  (import "k32" "k32_resp_body" (func $resp_body (param i32 i32) (result i32)))
  (import "k32" "k32_log" (func $log (param i32 i32) (result i32)))
  (import "k32" "kube32_channel_open" (func $channel_open (param i32 i32) (result i32)))
  (import "k32" "kube32_channel_send" (func $channel_send (param i32 i32 i32) (result i32)))

  (memory 1)
  (data (i32.const 0) "state-ch")
  (data (i32.const 16) "state: restored")

  (type $digit (func (result i32)))
  (table $t 3 funcref)
  (table $probe 1 funcref)
  (elem (table $t) (i32.const 0) func $one $two $three)

  (global $requests (mut i64) (i64.const 0))
  (global $events (mut i32) (i32.const 0))
  (global $restored (mut i32) (i32.const 0))
  (global $channel (mut i32) (i32.const -1))
  (global $f32 (mut f32) (f32.const nan:0x000001))
  (global $f64 (mut f64) (f64.const -nan:0x4000000000001))
  (global $fg (mut funcref) (ref.func $two))

  (func $one (type $digit) (i32.const 0x31))
  (func $two (type $digit) (i32.const 0x32))
  (func $three (type $digit) (i32.const 0x33))

  ;; Write the low `digits` hex digits of v at `at`, then a space; the next free byte.
  (func $hex (param $v i64) (param $digits i32) (param $at i32) (result i32)
    (local $i i32) (local $n i32)
    (local.set $i (local.get $digits))
    (block $done
      (loop $next
        (br_if $done (i32.eqz (local.get $i)))
        (local.set $i (i32.sub (local.get $i) (i32.const 1)))
        (local.set $n (i32.wrap_i64 (i64.and (i64.shr_u (local.get $v)
                                                         (i64.extend_i32_u (i32.mul (local.get $i) (i32.const 4))))
                                             (i64.const 15))))
        (i32.store8 (local.get $at)
          (i32.add (local.get $n) (select (i32.const 0x30) (i32.const 0x57) (i32.lt_u (local.get $n) (i32.const 10)))))
        (local.set $at (i32.add (local.get $at) (i32.const 1)))
        (br $next)))
    (i32.store8 (local.get $at) (i32.const 0x20))
    (i32.add (local.get $at) (i32.const 1)))

  (func $mutate
    (local $first funcref)
    (local.set $first (table.get $t (i32.const 0)))
    (table.set $t (i32.const 0) (table.get $t (i32.const 1)))
    (table.set $t (i32.const 1) (table.get $t (i32.const 2)))
    (table.set $t (i32.const 2) (local.get $first))
    (global.set $f32 (f32.reinterpret_i32 (i32.add (i32.reinterpret_f32 (global.get $f32)) (i32.const 1))))
    (global.set $f64 (f64.reinterpret_i64 (i64.add (i64.reinterpret_f64 (global.get $f64)) (i64.const 1))))
    (global.set $fg (table.get $t (i32.const 2))))

  (func (export "k32_init")
    (global.set $channel (call $channel_open (i32.const 0) (i32.const 8))))

  (func (export "k32_restored")
    (global.set $restored (i32.add (global.get $restored) (i32.const 1)))
    (drop (call $log (i32.const 16) (i32.const 15))))

  (func (export "k32_event") (param $topic_len i32) (param $payload_len i32)
    (global.set $events (i32.add (global.get $events) (i32.const 1))))

  (func (export "k32_handle")
    (local $at i32) (local $path_len i32)
    ;; the path at 64: "/mutate" has a second byte "m"
    (local.set $path_len (call $req_path (i32.const 64) (i32.const 32)))
    (if (i32.and (i32.ge_s (local.get $path_len) (i32.const 2))
                 (i32.eq (i32.load8_u (i32.const 65)) (i32.const 0x6d)))
      (then (call $mutate)))
    (global.set $requests (i64.add (global.get $requests) (i64.const 1)))
    (table.set $probe (i32.const 0) (global.get $fg))
    (local.set $at (i32.const 256))
    (local.set $at (call $hex (global.get $requests) (i32.const 16) (local.get $at)))
    (local.set $at (call $hex (i64.extend_i32_u (global.get $events)) (i32.const 8) (local.get $at)))
    (local.set $at (call $hex (i64.extend_i32_u (global.get $restored)) (i32.const 8) (local.get $at)))
    (local.set $at (call $hex (call $time_ms) (i32.const 16) (local.get $at)))
    (local.set $at (call $hex (i64.extend_i32_u (i32.reinterpret_f32 (global.get $f32))) (i32.const 8) (local.get $at)))
    (local.set $at (call $hex (i64.reinterpret_f64 (global.get $f64)) (i32.const 16) (local.get $at)))
    (i32.store8 (local.get $at) (call_indirect $t (type $digit) (i32.const 0)))
    (i32.store8 (i32.add (local.get $at) (i32.const 1)) (call_indirect $t (type $digit) (i32.const 1)))
    (i32.store8 (i32.add (local.get $at) (i32.const 2)) (call_indirect $t (type $digit) (i32.const 2)))
    (i32.store8 (i32.add (local.get $at) (i32.const 3)) (i32.const 0x20))
    (i32.store8 (i32.add (local.get $at) (i32.const 4)) (call_indirect $probe (type $digit) (i32.const 0)))
    (i32.store8 (i32.add (local.get $at) (i32.const 5)) (i32.const 0x20))
    (local.set $at (i32.add (local.get $at) (i32.const 6)))
    (local.set $at (call $hex (i64.extend_i32_u (global.get $channel)) (i32.const 8) (local.get $at)))
    (local.set $at (call $hex (i64.extend_i32_u
                                (call $channel_send (global.get $channel) (i32.const 0) (i32.const 1)))
                              (i32.const 8) (local.get $at)))
    (i32.store8 (i32.sub (local.get $at) (i32.const 1)) (i32.const 0x0a))
    (drop (call $resp_body (i32.const 256) (i32.sub (local.get $at) (i32.const 256))))))
