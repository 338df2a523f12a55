// RUN: ember opt %s -p autodiff | filecheck %s --check-prefix=RAW
// RUN: ember opt %s -p autodiff,canonicalize | filecheck %s

// What autodiff emits, rule by rule, is correct but verbose: the loss seed 1 broadcast and
// multiplied in, a transpose of the forward's transpose, a sum over a broadcast. The
// canonicalizer turns it into what one would write by hand: d fc.bias = sum(x, 0),
// d fc.weight = a @ x, d c = 8 (a constant), and the forward's "+ broadcast(0)" is gone.

// RAW:         "ember.broadcast"({{%[0-9]+}}) {shape = [8, 3]}
// RAW:         "ember.mul"({{%[0-9]+}}, %x)
// RAW:         "ember.transpose"({{%[0-9]+}}) {perm = [1, 0]} : (tensor<8x4xf32>) -> tensor<4x8xf32>

// CHECK-LABEL: func.func @f(%a: tensor<4x8xf32>, %x: tensor<8x3xf32>)
// CHECK:         [[LIN:%[0-9]+]] = "nn.linear"
// CHECK-NEXT:    [[BIAS:%[0-9]+]] = "ember.broadcast"
// CHECK-NEXT:    [[SUM:%[0-9]+]] = "ember.add"([[LIN]], [[BIAS]])
// CHECK-NEXT:    "ember.mul"([[SUM]], %x)
// CHECK-NOT:     "ember.constant"() {value = dense<0.0>
// CHECK:         [[LOSS:%[0-9]+]] = "ember.add"
// CHECK-NOT:     "ember.transpose"
// CHECK-NOT:     "ember.broadcast"
// CHECK:         [[DC:%[0-9]+]] = "ember.constant"() {value = dense<8.0> : tensor<3xf32>}
// CHECK-NEXT:    [[DB:%[0-9]+]] = "ember.reduce_sum"(%x) {axes = [0], keepdims = false}
// CHECK-NEXT:    [[DW:%[0-9]+]] = "ember.matmul"(%a, %x) : (tensor<4x8xf32>, tensor<8x3xf32>) -> tensor<4x3xf32>
// CHECK-NEXT:    func.return [[LOSS]], [[DW]], [[DB]], [[DC]] :
module {
  func.func @f(%a: tensor<4x8xf32>, %x: tensor<8x3xf32>) -> tensor<f32> {
    %0 = "ember.param"() {id = "w", path = "fc.weight"} : () -> tensor<4x3xf32>
    %1 = "ember.param"() {id = "b", path = "fc.bias"} : () -> tensor<3xf32>
    %2 = "ember.param"() {id = "c", path = "c"} : () -> tensor<3xf32>
    %3 = "ember.constant"() {value = dense<0.000000e+00> : tensor<f32>} : () -> tensor<f32>
    %4 = "ember.broadcast"(%3) {shape = [8, 3]} : (tensor<f32>) -> tensor<8x3xf32>
    %5 = "ember.transpose"(%a) {perm = [1, 0]} : (tensor<4x8xf32>) -> tensor<8x4xf32>
    %6 = "nn.linear"(%5, %0) : (tensor<8x4xf32>, tensor<4x3xf32>) -> tensor<8x3xf32>
    %7 = "ember.broadcast"(%1) {shape = [8, 3]} : (tensor<3xf32>) -> tensor<8x3xf32>
    %8 = "ember.add"(%6, %7) : (tensor<8x3xf32>, tensor<8x3xf32>) -> tensor<8x3xf32>
    %9 = "ember.add"(%8, %4) : (tensor<8x3xf32>, tensor<8x3xf32>) -> tensor<8x3xf32>
    %10 = "ember.mul"(%9, %x) : (tensor<8x3xf32>, tensor<8x3xf32>) -> tensor<8x3xf32>
    %11 = "ember.reduce_sum"(%10) {axes = [0, 1], keepdims = false} : (tensor<8x3xf32>) -> tensor<f32>
    %12 = "ember.broadcast"(%2) {shape = [8, 3]} : (tensor<3xf32>) -> tensor<8x3xf32>
    %13 = "ember.reduce_sum"(%12) {axes = [0, 1], keepdims = false} : (tensor<8x3xf32>) -> tensor<f32>
    %14 = "ember.add"(%11, %13) : (tensor<f32>, tensor<f32>) -> tensor<f32>
    func.return %14 : tensor<f32>
  }
}
