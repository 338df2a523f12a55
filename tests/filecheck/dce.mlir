// RUN: ember opt %s -p dce | filecheck %s

// The unused chain (param u, mul, exp) goes; an op ember does not know to be pure stays.

// CHECK-LABEL: func.func @dce(%x: tensor<3xf32>)
// CHECK-NEXT:    [[W:%[0-9]+]] = "ember.param"() {id = "w", path = "fc.weight"}
// CHECK-NOT:     unused.weight
// CHECK-NOT:     "ember.exp"
// CHECK-NEXT:    "test.side_effect"(%x)
// CHECK-NEXT:    [[M:%[0-9]+]] = "ember.mul"(%x, [[W]])
// CHECK-NEXT:    func.return [[M]] :
module {
  func.func @dce(%x: tensor<3xf32>) -> tensor<3xf32> {
    %0 = "ember.param"() {id = "w", path = "fc.weight"} : () -> tensor<3xf32>
    %1 = "ember.param"() {id = "u", path = "unused.weight"} : () -> tensor<3xf32>
    %2 = "ember.mul"(%x, %1) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
    %3 = "ember.exp"(%2) : (tensor<3xf32>) -> tensor<3xf32>
    %4 = "test.side_effect"(%x) : (tensor<3xf32>) -> tensor<3xf32>
    %5 = "ember.mul"(%x, %0) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
    func.return %5 : tensor<3xf32>
  }
}
