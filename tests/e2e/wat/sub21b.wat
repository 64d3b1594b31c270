(module
  (import "k32" "k32_resp_body" (func $resp_body (param i32 i32) (result i32)))
  (memory 1)
  (global $n (mut i32) (i32.const 0))
  (func (export "k32_handle")
    (global.set $n (i32.add (global.get $n) (i32.const 1)))
    (i32.store (i32.const 996) (global.get $n))
    (i32.store8 (i32.const 0) (i32.add (i32.const 0x30) (i32.load (i32.const 996))))
    (drop (call $resp_body (i32.const 0) (i32.const 1)))))
