// RUN: ember opt %s -p fuse | filecheck %s

// A GPT's MLP on [B, T, C] = [2, 3, 8]: decompose flattens x to [6, 8] for each Linear and
// reshapes the product back to [2, 3, N]. fuse moves that reshape onto the operand (the
// GEMM reads x as [2, 3, 8] in place, the weight broadcast over B: stride 0), so the bias
// and the GELU join the first GEMM as its epilogue, and the bias and the residual the
// second: two kernels, no reshape and no elementwise kernel left.

// CHECK-LABEL: func.func @mlp
// CHECK-NOT:     "ember.{{(reshape|matmul|add|mul|erf)}}"
// CHECK:         [[H:%[0-9]+]] = "kernel.matmul"(%x, %0, %1) ({
// CHECK-NEXT:    ^bb0([[ACC:%.*]]: f32, [[B1:%.*]]: f32):
// CHECK-NEXT:      [[Z:%[0-9]+]] = "kernel.add"([[ACC]], [[B1]])
// CHECK:           [[E:%[0-9]+]] = "kernel.erf"
// CHECK:           [[HALF:%[0-9]+]] = "kernel.mul"([[Z]],
// CHECK:           [[ONE:%[0-9]+]] = "kernel.add"([[E]],
// CHECK-NEXT:      [[G:%[0-9]+]] = "kernel.mul"([[HALF]], [[ONE]])
// CHECK-NEXT:      "kernel.yield"([[G]])
// CHECK-NEXT:    }) {maps = {{\[\[}}24, 8, 0, 1], [0, 0, 1, 32], [0, 0, 1, 0]], out_maps = {{\[\[}}96, 32, 1, 0]], out_types = [tensor<2x3x32xf32>], space = [2, 3, 32, 8]}
// CHECK:         [[Y:%[0-9]+]] = "kernel.matmul"([[H]], %2, %3, %x) ({
// CHECK:           "kernel.add"
// CHECK-NEXT:      "kernel.add"
// CHECK-NEXT:      "kernel.yield"
// CHECK-NEXT:    }) {maps = {{\[\[}}96, 32, 0, 1], [0, 0, 1, 8], [0, 0, 1, 0], [24, 8, 1, 0]], {{.*}} space = [2, 3, 8, 32]}
// CHECK-NOT:     "kernel.{{(fused|matmul)}}"
// CHECK:         func.return [[Y]]

module {
  func.func @mlp(%x: tensor<2x3x8xf32>) -> tensor<2x3x8xf32> {
    %0 = "ember.param"() {id = "fc_weight", path = "fc.weight"} : () -> tensor<8x32xf32>
    %1 = "ember.param"() {id = "fc_bias", path = "fc.bias"} : () -> tensor<32xf32>
    %2 = "ember.param"() {id = "proj_weight", path = "proj.weight"} : () -> tensor<32x8xf32>
    %3 = "ember.param"() {id = "proj_bias", path = "proj.bias"} : () -> tensor<8xf32>
    %4 = "ember.reshape"(%x) {shape = [6, 8]} : (tensor<2x3x8xf32>) -> tensor<6x8xf32>
    %5 = "ember.matmul"(%4, %0) : (tensor<6x8xf32>, tensor<8x32xf32>) -> tensor<6x32xf32>
    %6 = "ember.reshape"(%5) {shape = [2, 3, 32]} : (tensor<6x32xf32>) -> tensor<2x3x32xf32>
    %7 = "ember.add"(%6, %1) : (tensor<2x3x32xf32>, tensor<32xf32>) -> tensor<2x3x32xf32>
    %8 = "ember.constant"() {value = dense<0.70710677> : tensor<f32>} : () -> tensor<f32>
    %9 = "ember.mul"(%7, %8) : (tensor<2x3x32xf32>, tensor<f32>) -> tensor<2x3x32xf32>
    %10 = "ember.erf"(%9) : (tensor<2x3x32xf32>) -> tensor<2x3x32xf32>
    %11 = "ember.constant"() {value = dense<0.5> : tensor<f32>} : () -> tensor<f32>
    %12 = "ember.mul"(%7, %11) : (tensor<2x3x32xf32>, tensor<f32>) -> tensor<2x3x32xf32>
    %13 = "ember.constant"() {value = dense<1.0> : tensor<f32>} : () -> tensor<f32>
    %14 = "ember.add"(%10, %13) : (tensor<2x3x32xf32>, tensor<f32>) -> tensor<2x3x32xf32>
    %15 = "ember.mul"(%12, %14) : (tensor<2x3x32xf32>, tensor<2x3x32xf32>) -> tensor<2x3x32xf32>
    %16 = "ember.reshape"(%15) {shape = [6, 32]} : (tensor<2x3x32xf32>) -> tensor<6x32xf32>
    %17 = "ember.matmul"(%16, %2) : (tensor<6x32xf32>, tensor<32x8xf32>) -> tensor<6x8xf32>
    %18 = "ember.reshape"(%17) {shape = [2, 3, 8]} : (tensor<6x8xf32>) -> tensor<2x3x8xf32>
    %19 = "ember.add"(%18, %3) : (tensor<2x3x8xf32>, tensor<8xf32>) -> tensor<2x3x8xf32>
    %20 = "ember.add"(%x, %19) : (tensor<2x3x8xf32>, tensor<2x3x8xf32>) -> tensor<2x3x8xf32>
    func.return %20 : tensor<2x3x8xf32>
  }
}
