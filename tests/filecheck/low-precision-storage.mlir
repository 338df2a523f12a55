// RUN: ember opt %s --split-input-file -p low-precision-storage | filecheck %s

// After `fuse`, a kernel result that holds bf16 values in f32 (its body yields a bf16
// value cast to f32) is stored as bf16 where only kernel bodies read it, directly or
// through a reshape (a `kernel.fused`, a product's epilogue): each reader's body casts it
// to f32 first. A result the graph returns, or a GEMM reads as its operand, stays f32.

// CHECK-LABEL: func.func @stored
// CHECK:         [[S:%[0-9]+]] = "kernel.fused"(%x)
// CHECK-NEXT:    ^bb0(%a: f32):
// CHECK-NEXT:      [[T:%[0-9]+]] = "kernel.cast"(%a) {dtype = "bf16"} : (f32) -> bf16
// CHECK-NEXT:      "kernel.yield"([[T]]) : (bf16) -> ()
// CHECK:         out_types = [tensor<4x3xbf16>]
// CHECK:         [[R:%[0-9]+]] = "ember.reshape"([[S]]) {shape = [12]} : (tensor<4x3xbf16>) -> tensor<12xbf16>
// CHECK:         "kernel.fused"([[R]])
// CHECK-NEXT:    ^bb0([[A:%[a-z0-9]+]]: bf16):
// CHECK-NEXT:      [[W:%[0-9]+]] = "kernel.cast"([[A]]) {dtype = "f32"} : (bf16) -> f32
// CHECK-NEXT:      "kernel.exp"([[W]])
// CHECK:         "kernel.matmul"(%x, %w, [[S]])
// CHECK-NEXT:    ^bb0(%p: f32, [[E:%[a-z0-9]+]]: bf16):
// CHECK-NEXT:      [[V:%[0-9]+]] = "kernel.cast"([[E]]) {dtype = "f32"} : (bf16) -> f32
// CHECK-NEXT:      "kernel.add"(%p, [[V]])

// CHECK-LABEL: func.func @returned
// CHECK-NOT:     bf16>
// CHECK:         func.return

// CHECK-LABEL: func.func @gemm_operand
// CHECK:         "kernel.yield"(%{{[0-9]+}}, %{{[0-9]+}}) : (f32, f32) -> ()
// CHECK:         "kernel.matmul"
// CHECK:         space = [4, 3, 3]} : (tensor<4x3xf32>, tensor<3x3xf32>, tensor<4x3xf32>) -> tensor<4x3xf32>
module {
  func.func @stored(%x: tensor<4x3xf32>, %w: tensor<3x3xf32>) -> (tensor<12xf32>, tensor<4x3xf32>) {
    %0 = "kernel.fused"(%x) ({
    ^bb0(%a: f32):
      %t = "kernel.cast"(%a) {dtype = "bf16"} : (f32) -> bf16
      %c = "kernel.cast"(%t) {dtype = "f32"} : (bf16) -> f32
      "kernel.yield"(%c) : (f32) -> ()
    }) {maps = [[3, 1]], out_maps = [[3, 1]], out_types = [tensor<4x3xf32>], space = [4, 3]} : (tensor<4x3xf32>) -> tensor<4x3xf32>
    %1 = "ember.reshape"(%0) {shape = [12]} : (tensor<4x3xf32>) -> tensor<12xf32>
    %2 = "kernel.fused"(%1) ({
    ^bb0(%a: f32):
      %e = "kernel.exp"(%a) : (f32) -> f32
      "kernel.yield"(%e) : (f32) -> ()
    }) {maps = [[1]], out_maps = [[1]], out_types = [tensor<12xf32>], space = [12]} : (tensor<12xf32>) -> tensor<12xf32>
    %3 = "kernel.matmul"(%x, %w, %0) ({
    ^bb0(%p: f32, %r: f32):
      %s = "kernel.add"(%p, %r) : (f32, f32) -> f32
      "kernel.yield"(%s) : (f32) -> ()
    }) {maps = [[3, 0, 1], [0, 1, 3], [3, 1, 0]], out_maps = [[3, 1, 0]], out_types = [tensor<4x3xf32>], space = [4, 3, 3]} : (tensor<4x3xf32>, tensor<3x3xf32>, tensor<4x3xf32>) -> tensor<4x3xf32>
    func.return %2, %3 : tensor<12xf32>, tensor<4x3xf32>
  }
}

// -----

module {
  func.func @returned(%x: tensor<4x3xf32>) -> (tensor<4x3xf32>, tensor<4x3xf32>) {
    %0 = "kernel.fused"(%x) ({
    ^bb0(%a: f32):
      %t = "kernel.cast"(%a) {dtype = "bf16"} : (f32) -> bf16
      %c = "kernel.cast"(%t) {dtype = "f32"} : (bf16) -> f32
      "kernel.yield"(%c) : (f32) -> ()
    }) {maps = [[3, 1]], out_maps = [[3, 1]], out_types = [tensor<4x3xf32>], space = [4, 3]} : (tensor<4x3xf32>) -> tensor<4x3xf32>
    %1 = "kernel.fused"(%0) ({
    ^bb0(%a: f32):
      %e = "kernel.exp"(%a) : (f32) -> f32
      "kernel.yield"(%e) : (f32) -> ()
    }) {maps = [[3, 1]], out_maps = [[3, 1]], out_types = [tensor<4x3xf32>], space = [4, 3]} : (tensor<4x3xf32>) -> tensor<4x3xf32>
    func.return %0, %1 : tensor<4x3xf32>, tensor<4x3xf32>
  }
}

// -----

module {
  func.func @gemm_operand(%x: tensor<4x3xf32>, %w: tensor<3x3xf32>) -> tensor<4x3xf32> {
    %0:2 = "kernel.fused"(%x) ({
    ^bb0(%a: f32):
      %t = "kernel.cast"(%a) {dtype = "bf16"} : (f32) -> bf16
      %c = "kernel.cast"(%t) {dtype = "f32"} : (bf16) -> f32
      %e = "kernel.exp"(%c) : (f32) -> f32
      "kernel.yield"(%c, %e) : (f32, f32) -> ()
    }) {maps = [[3, 1]], out_maps = [[3, 1], [3, 1]], out_types = [tensor<4x3xf32>, tensor<4x3xf32>], space = [4, 3]} : (tensor<4x3xf32>) -> (tensor<4x3xf32>, tensor<4x3xf32>)
    %1 = "kernel.matmul"(%0#0, %w, %0#1) ({
    ^bb0(%p: f32, %r: f32):
      %s = "kernel.add"(%p, %r) : (f32, f32) -> f32
      "kernel.yield"(%s) : (f32) -> ()
    }) {maps = [[3, 0, 1], [0, 1, 3], [3, 1, 0]], out_maps = [[3, 1, 0]], out_types = [tensor<4x3xf32>], space = [4, 3, 3]} : (tensor<4x3xf32>, tensor<3x3xf32>, tensor<4x3xf32>) -> tensor<4x3xf32>
    func.return %1 : tensor<4x3xf32>
  }
}
