// RUN: not ember opt %s -p autodiff 2>&1 | filecheck %s

// The loss must be a scalar: the error names what the first result is instead.
// CHECK: error: autodiff: the loss (first result of @f) must be a scalar float tensor such as tensor<f32>, got tensor<3xf32>
module {
  func.func @f(%x: tensor<3xf32>) -> tensor<3xf32> {
    %0 = "ember.param"() {id = "w", path = "w"} : () -> tensor<3xf32>
    %1 = "ember.mul"(%x, %0) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
    func.return %1 : tensor<3xf32>
  }
}
