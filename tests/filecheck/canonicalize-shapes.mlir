// RUN: ember opt %s -p canonicalize | filecheck %s

// Transposes compose (and vanish when the composition is the identity), reshapes of
// reshapes collapse, reshapes and broadcasts to the same shape vanish, and a sum over
// exactly the broadcast axes of broadcast(y) is y * count (a mean of it is y).

// CHECK-LABEL: func.func @shapes(%x: tensor<2x3x4xf32>, %y: tensor<1x4xf32>)
// CHECK-NEXT:    [[T:%[0-9]+]] = "ember.transpose"(%x) {perm = [1, 2, 0]} : (tensor<2x3x4xf32>) -> tensor<3x4x2xf32>
// CHECK-NEXT:    [[R:%[0-9]+]] = "ember.reshape"(%x) {shape = [4, 6]} : (tensor<2x3x4xf32>) -> tensor<4x6xf32>
// CHECK-NEXT:    [[B:%[0-9]+]] = "ember.broadcast"(%y) {shape = [5, 1, 4]} : (tensor<1x4xf32>) -> tensor<5x1x4xf32>
// CHECK-NEXT:    [[N:%[0-9]+]] = "ember.constant"() {value = dense<35.0> : tensor<f32>}
// CHECK-NEXT:    [[M:%[0-9]+]] = "ember.mul"(%y, [[N]])
// CHECK-NEXT:    [[S:%[0-9]+]] = "ember.reshape"([[M]]) {shape = [4]}
// CHECK-NEXT:    func.return %x, [[T]], [[R]], %x, [[B]], [[S]], %y :
module {
  func.func @shapes(%x: tensor<2x3x4xf32>, %y: tensor<1x4xf32>) -> (tensor<2x3x4xf32>, tensor<3x4x2xf32>, tensor<4x6xf32>, tensor<2x3x4xf32>, tensor<5x1x4xf32>, tensor<4xf32>, tensor<1x4xf32>) {
    %0 = "ember.transpose"(%x) {perm = [1, 0, 2]} : (tensor<2x3x4xf32>) -> tensor<3x2x4xf32>
    %1 = "ember.transpose"(%0) {perm = [1, 0, 2]} : (tensor<3x2x4xf32>) -> tensor<2x3x4xf32>
    %2 = "ember.transpose"(%0) {perm = [0, 2, 1]} : (tensor<3x2x4xf32>) -> tensor<3x4x2xf32>
    %3 = "ember.reshape"(%x) {shape = [24]} : (tensor<2x3x4xf32>) -> tensor<24xf32>
    %4 = "ember.reshape"(%3) {shape = [4, 6]} : (tensor<24xf32>) -> tensor<4x6xf32>
    %5 = "ember.reshape"(%x) {shape = [2, 3, 4]} : (tensor<2x3x4xf32>) -> tensor<2x3x4xf32>
    %6 = "ember.broadcast"(%y) {shape = [1, 4]} : (tensor<1x4xf32>) -> tensor<1x4xf32>
    %7 = "ember.broadcast"(%6) {shape = [5, 1, 4]} : (tensor<1x4xf32>) -> tensor<5x1x4xf32>
    %8 = "ember.broadcast"(%y) {shape = [5, 7, 4]} : (tensor<1x4xf32>) -> tensor<5x7x4xf32>
    %9 = "ember.reduce_sum"(%8) {axes = [0, 1], keepdims = false} : (tensor<5x7x4xf32>) -> tensor<4xf32>
    %10 = "ember.reduce_mean"(%8) {axes = [0, 1], keepdims = false} : (tensor<5x7x4xf32>) -> tensor<4xf32>
    %11 = "ember.reshape"(%10) {shape = [1, 4]} : (tensor<4xf32>) -> tensor<1x4xf32>
    func.return %1, %2, %4, %5, %7, %9, %11 : tensor<2x3x4xf32>, tensor<3x4x2xf32>, tensor<4x6xf32>, tensor<2x3x4xf32>, tensor<5x1x4xf32>, tensor<4xf32>, tensor<1x4xf32>
  }
}
