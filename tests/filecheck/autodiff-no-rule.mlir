// RUN: not ember opt %s -p autodiff 2>&1 | filecheck %s
// RUN: not ember opt %s -p 'decompose,autodiff' 2>&1 | filecheck %s --check-prefix=NOPARAM

// An op on the path from a trainable param to the loss with no gradient rule: the error
// names the op and where it came from. (Second order through max pooling is one.)
// CHECK: error: autodiff: no gradient rule for op 'ember.max_pool2d_grad' at loc("model.py":12:5)
// NOPARAM-NOT: no trainable
// NOPARAM: error: autodiff: no gradient rule for op 'ember.max_pool2d_grad'
module {
  func.func @f(%x: tensor<1x1x4x4xf32>) -> tensor<f32> {
    %0 = "ember.param"() {id = "g", path = "g"} : () -> tensor<1x1x2x2xf32>
    %1 = "ember.max_pool2d_grad"(%x, %0) {kernel = [2, 2], padding = [0, 0], stride = [2, 2]} : (tensor<1x1x4x4xf32>, tensor<1x1x2x2xf32>) -> tensor<1x1x4x4xf32> loc("model.py":12:5)
    %2 = "ember.reduce_sum"(%1) {axes = [0, 1, 2, 3], keepdims = false} : (tensor<1x1x4x4xf32>) -> tensor<f32>
    func.return %2 : tensor<f32>
  }
}
