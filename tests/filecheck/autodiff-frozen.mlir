// RUN: not ember opt %s -p autodiff 2>&1 | filecheck %s

// Every param is frozen, a flag or a buffer: there is nothing to differentiate.
// CHECK: error: autodiff: @f has no trainable ember.param (all are frozen, flags or buffers): nothing to differentiate
module {
  func.func @f(%x: tensor<3xf32>) -> tensor<f32> {
    %0 = "ember.param"() {id = "w", path = "w", requires_grad = false} : () -> tensor<3xf32>
    %1 = "ember.param"() {id = "m", path = "m", kind = "buffer"} : () -> tensor<3xf32>
    %2 = "ember.mul"(%x, %0) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
    %3 = "ember.mul"(%2, %1) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
    %4 = "ember.reduce_sum"(%3) {axes = [0], keepdims = false} : (tensor<3xf32>) -> tensor<f32>
    func.return %4 : tensor<f32>
  }
}
