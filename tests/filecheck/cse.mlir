// RUN: ember opt %s -p cse | filecheck %s

// Equal constants merge, then the adds using them, then the exps; ops that differ in an
// attribute (keepdims) or an operand (the constant 2) stay apart.

// CHECK-LABEL: func.func @cse(%x: tensor<3xf32>)
// CHECK-NEXT:    [[ONE:%[0-9]+]] = "ember.constant"() {value = dense<1.0> : tensor<f32>}
// CHECK-NEXT:    [[ADD:%[0-9]+]] = "ember.add"(%x, [[ONE]])
// CHECK-NEXT:    [[EXP:%[0-9]+]] = "ember.exp"([[ADD]])
// CHECK-NEXT:    [[MUL:%[0-9]+]] = "ember.mul"([[EXP]], [[EXP]])
// CHECK-NEXT:    [[S0:%[0-9]+]] = "ember.reduce_sum"(%x) {axes = [0], keepdims = false}
// CHECK-NEXT:    [[S1:%[0-9]+]] = "ember.reduce_sum"(%x) {axes = [0], keepdims = true}
// CHECK-NEXT:    [[TWO:%[0-9]+]] = "ember.constant"() {value = dense<2.0> : tensor<f32>}
// CHECK-NEXT:    [[ADD2:%[0-9]+]] = "ember.add"(%x, [[TWO]])
// CHECK-NEXT:    func.return [[MUL]], [[S0]], [[S1]], [[ADD2]] :
module {
  func.func @cse(%x: tensor<3xf32>) -> (tensor<3xf32>, tensor<f32>, tensor<1xf32>, tensor<3xf32>) {
    %0 = "ember.constant"() {value = dense<1.000000e+00> : tensor<f32>} : () -> tensor<f32>
    %1 = "ember.constant"() {value = dense<1.000000e+00> : tensor<f32>} : () -> tensor<f32>
    %2 = "ember.add"(%x, %0) : (tensor<3xf32>, tensor<f32>) -> tensor<3xf32>
    %3 = "ember.add"(%x, %1) : (tensor<3xf32>, tensor<f32>) -> tensor<3xf32>
    %4 = "ember.exp"(%2) : (tensor<3xf32>) -> tensor<3xf32>
    %5 = "ember.exp"(%3) : (tensor<3xf32>) -> tensor<3xf32>
    %6 = "ember.mul"(%4, %5) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
    %7 = "ember.reduce_sum"(%x) {axes = [0], keepdims = false} : (tensor<3xf32>) -> tensor<f32>
    %8 = "ember.reduce_sum"(%x) {axes = [0], keepdims = true} : (tensor<3xf32>) -> tensor<1xf32>
    %9 = "ember.constant"() {value = dense<2.000000e+00> : tensor<f32>} : () -> tensor<f32>
    %10 = "ember.add"(%x, %9) : (tensor<3xf32>, tensor<f32>) -> tensor<3xf32>
    func.return %6, %7, %8, %10 : tensor<3xf32>, tensor<f32>, tensor<1xf32>, tensor<3xf32>
  }
}
