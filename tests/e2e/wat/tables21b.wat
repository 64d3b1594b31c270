(module
  (import "k32" "k32_resp_body" (func $resp_body (param i32 i32) (result i32)))
  (memory 1)
  (table $t 10 funcref)
  (table $u 0 externref)
  (func (export "k32_handle") (local $r i32) (local $s i32)
    (block $d (loop $l
      (br_if $d (i32.eq (table.grow $t (ref.null func) (i32.const 1)) (i32.const -1)))
      (br $l)))
    (block $d (loop $l
      (br_if $d (i32.eq (table.grow $u (ref.null extern) (i32.const 1)) (i32.const -1)))
      (br $l)))
    (i32.store (i32.const 0) (table.size $t))
    (i32.store (i32.const 4) (table.size $u))
    (i32.store (i32.const 8) (memory.grow (i32.const 1)))
    (drop (call $resp_body (i32.const 0) (i32.const 12)))))
