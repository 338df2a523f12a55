// RUN: ember opt %s -p autodiff | filecheck %s

// An nn.* op on bf16 values means "computed in f32, each result rounded once", and so
// does its backward: the rule runs on the op's f32 twin (its operands cast up), and each
// gradient is rounded to its operand's dtype once. Attention's backward (the recomputed
// probabilities, dp, ds) thus stays f32 throughout, which `fuse` turns into
// kernel.attention_grad; the twin op itself, which the rule does not read, is not kept.

// CHECK-LABEL: func.func @f
// CHECK:         [[Q:%[0-9]+]] = "ember.cast"(%0) {dtype = "f32"} : (tensor<2x4x8xbf16>) -> tensor<2x4x8xf32>
// CHECK-NOT:     "nn.attention"
// CHECK:         "ember.exp"({{.*}}) : (tensor<2x4x4xf32>) -> tensor<2x4x4xf32>
// CHECK:         [[DQ:%[0-9]+]] = "ember.matmul"({{.*}}) : (tensor<2x4x4xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
// CHECK-NEXT:    [[G:%[0-9]+]] = "ember.cast"([[DQ]]) {dtype = "bf16"} : (tensor<2x4x8xf32>) -> tensor<2x4x8xbf16>
// CHECK-NEXT:    func.return %4, [[G]] : tensor<f32>, tensor<2x4x8xbf16>

module {
  func.func @f(%x: tensor<2x4x8xf32>) -> tensor<f32> {
    %0 = "ember.param"() {id = "657rfnrc2o1ud", path = "q"} : () -> tensor<2x4x8xbf16>
    %1 = "ember.cast"(%x) {dtype = "bf16"} : (tensor<2x4x8xf32>) -> tensor<2x4x8xbf16>
    %2 = "nn.attention"(%0, %1, %1) {causal = true, scale = 0.35355339059327373 : f64} : (tensor<2x4x8xbf16>, tensor<2x4x8xbf16>, tensor<2x4x8xbf16>) -> tensor<2x4x8xbf16>
    %3 = "ember.cast"(%2) {dtype = "f32"} : (tensor<2x4x8xbf16>) -> tensor<2x4x8xf32>
    %4 = "ember.reduce_sum"(%3) {axes = [0, 1, 2], keepdims = false} : (tensor<2x4x8xf32>) -> tensor<f32>
    func.return %4 : tensor<f32>
  }
}
