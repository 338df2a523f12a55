// RUN: ember opt %s -p canonicalize | filecheck %s

// Ops whose operands are all constants fold to a constant, unless the result is large.

// CHECK-LABEL: func.func @fold(%x: tensor<2xf32>)
// CHECK-NOT:     "ember.mul"
// CHECK-NOT:     "ember.neg"
// CHECK:         [[C:%[0-9]+]] = "ember.constant"() {value = dense<[-3.0, -6.0]> : tensor<2xf32>}
// CHECK-NEXT:    [[A:%[0-9]+]] = "ember.add"(%x, [[C]])
// CHECK-NEXT:    [[B:%[0-9]+]] = "ember.broadcast"({{%[0-9]+}}) {shape = [40, 40]}
// CHECK-NEXT:    func.return [[A]], [[B]] :
module {
  func.func @fold(%x: tensor<2xf32>) -> (tensor<2xf32>, tensor<40x40xf32>) {
    %0 = "ember.constant"() {value = dense<[1.000000e+00, 2.000000e+00]> : tensor<2xf32>} : () -> tensor<2xf32>
    %1 = "ember.constant"() {value = dense<3.000000e+00> : tensor<f32>} : () -> tensor<f32>
    %2 = "ember.mul"(%0, %1) : (tensor<2xf32>, tensor<f32>) -> tensor<2xf32>
    %3 = "ember.neg"(%2) : (tensor<2xf32>) -> tensor<2xf32>
    %4 = "ember.add"(%x, %3) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    %5 = "ember.broadcast"(%1) {shape = [40, 40]} : (tensor<f32>) -> tensor<40x40xf32>
    func.return %4, %5 : tensor<2xf32>, tensor<40x40xf32>
  }
}
