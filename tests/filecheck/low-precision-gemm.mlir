// RUN: ember opt %s -p widen-low-precision,low-precision-gemm,canonicalize,dce | filecheck %s
// RUN: ember opt %s -p 'widen-low-precision,low-precision-gemm{dtype=f16}' | filecheck %s --check-prefix=F16

// On a cpu with AMX's bf16 tiles: a matmul that widening left on f32 copies of bf16 values
// (through reshapes and transposes) multiplies the bf16 values, its result the f32 sums
// (`dtype = "f32"`); the movement is replayed on the bf16 values. A batched matmul
// (attention's scores) stays f32, as does one with an operand that is not such a copy.

// CHECK-LABEL: func.func @linear
// CHECK-DAG:     [[X:%[0-9]+]] = "ember.reshape"(%x) {shape = [8, 8]} : (tensor<2x4x8xbf16>) -> tensor<8x8xbf16>
// CHECK-DAG:     [[WT:%[0-9]+]] = "ember.transpose"(%w) {perm = [1, 0]} : (tensor<3x8xbf16>) -> tensor<8x3xbf16>
// CHECK:         [[MM:%[0-9]+]] = "ember.matmul"([[X]], [[WT]]) {dtype = "f32"} : (tensor<8x8xbf16>, tensor<8x3xbf16>) -> tensor<8x3xf32>
// CHECK-NEXT:    [[B:%[0-9]+]] = "ember.cast"([[MM]]) {dtype = "bf16"} : (tensor<8x3xf32>) -> tensor<8x3xbf16>
// CHECK:         "ember.matmul"({{.*}}) : (tensor<2x4x8xf32>, tensor<2x8x4xf32>) -> tensor<2x4x4xf32>
// CHECK:         "ember.matmul"({{.*}}) : (tensor<8x8xf32>, tensor<8x3xf32>) -> tensor<8x3xf32>

// F16-LABEL: func.func @linear
// F16:         "ember.matmul"({{.*}}) : (tensor<8x8xf32>, tensor<8x3xf32>) -> tensor<8x3xf32>
module {
  func.func @linear(%x: tensor<2x4x8xbf16>, %w: tensor<3x8xbf16>, %f: tensor<8x8xf32>) -> (tensor<8x3xbf16>, tensor<2x4x4xbf16>, tensor<8x3xf32>) {
    %0 = "ember.reshape"(%x) {shape = [8, 8]} : (tensor<2x4x8xbf16>) -> tensor<8x8xbf16>
    %1 = "ember.transpose"(%w) {perm = [1, 0]} : (tensor<3x8xbf16>) -> tensor<8x3xbf16>
    %2 = "ember.matmul"(%0, %1) : (tensor<8x8xbf16>, tensor<8x3xbf16>) -> tensor<8x3xbf16>
    %3 = "ember.transpose"(%x) {perm = [0, 2, 1]} : (tensor<2x4x8xbf16>) -> tensor<2x8x4xbf16>
    %4 = "ember.matmul"(%x, %3) : (tensor<2x4x8xbf16>, tensor<2x8x4xbf16>) -> tensor<2x4x4xbf16>
    %5 = "ember.cast"(%1) {dtype = "f32"} : (tensor<8x3xbf16>) -> tensor<8x3xf32>
    %6 = "ember.matmul"(%f, %5) : (tensor<8x8xf32>, tensor<8x3xf32>) -> tensor<8x3xf32>
    func.return %2, %4, %6 : tensor<8x3xbf16>, tensor<2x4x4xbf16>, tensor<8x3xf32>
  }
}
