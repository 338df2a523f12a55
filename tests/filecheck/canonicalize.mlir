// RUN: ember opt %s -p canonicalize | filecheck %s

// x*1, 1*x, x+0, x-0, x/1 and neg(neg(x)) are x; x + zeros[2,3] broadcasts x, so it stays.
// The constants that become unused are erased.

// CHECK-LABEL: func.func @identities(%x: tensor<3xf32>)
// CHECK-NOT:     "ember.mul"
// CHECK-NOT:     "ember.sub"
// CHECK-NOT:     "ember.div"
// CHECK-NOT:     "ember.neg"
// CHECK:         [[ZERO:%[0-9]+]] = "ember.constant"() {value = dense<0.0> : tensor<2x3xf32>}
// CHECK-NEXT:    [[SUM:%[0-9]+]] = "ember.add"(%x, [[ZERO]])
// CHECK-NEXT:    func.return %x, %x, %x, %x, %x, %x, [[SUM]] :
module {
  func.func @identities(%x: tensor<3xf32>) -> (tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<2x3xf32>) {
    %0 = "ember.constant"() {value = dense<1.000000e+00> : tensor<f32>} : () -> tensor<f32>
    %1 = "ember.constant"() {value = dense<0.000000e+00> : tensor<3xf32>} : () -> tensor<3xf32>
    %2 = "ember.constant"() {value = dense<0.000000e+00> : tensor<2x3xf32>} : () -> tensor<2x3xf32>
    %3 = "ember.mul"(%x, %0) : (tensor<3xf32>, tensor<f32>) -> tensor<3xf32>
    %4 = "ember.mul"(%0, %x) : (tensor<f32>, tensor<3xf32>) -> tensor<3xf32>
    %5 = "ember.add"(%x, %1) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
    %6 = "ember.sub"(%x, %1) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
    %7 = "ember.div"(%x, %0) : (tensor<3xf32>, tensor<f32>) -> tensor<3xf32>
    %8 = "ember.neg"(%x) : (tensor<3xf32>) -> tensor<3xf32>
    %9 = "ember.neg"(%8) : (tensor<3xf32>) -> tensor<3xf32>
    %10 = "ember.add"(%x, %2) : (tensor<3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
    func.return %3, %4, %5, %6, %7, %9, %10 : tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<2x3xf32>
  }
}
