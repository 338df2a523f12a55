// RUN: ember opt %s -p decompose | filecheck %s

// Softmaxes subtract the row max before exp, so they never overflow (axis -1 is
// normalized to 1); the max cancels out, so autodiff may treat it as a constant
// (stop_gradient). Cross-entropy is -mean(sum(log_softmax * one_hot)), a scalar.

// CHECK-LABEL: func.func @softmaxes
// CHECK-NOT:     "nn.
// CHECK:         [[M:%[0-9]+]] = "ember.reduce_max"(%x) {axes = [1], keepdims = true, stop_gradient = true}
// CHECK-NEXT:    [[S:%[0-9]+]] = "ember.sub"(%x, [[M]])
// CHECK-NEXT:    [[E:%[0-9]+]] = "ember.exp"([[S]])
// CHECK-NEXT:    [[Z:%[0-9]+]] = "ember.reduce_sum"([[E]]) {axes = [1], keepdims = true}
// CHECK-NEXT:    [[SOFTMAX:%[0-9]+]] = "ember.div"([[E]], [[Z]])
// CHECK-NEXT:    [[M2:%[0-9]+]] = "ember.reduce_max"(%x) {axes = [1], keepdims = true, stop_gradient = true}
// CHECK-NEXT:    [[S2:%[0-9]+]] = "ember.sub"(%x, [[M2]])
// CHECK-NEXT:    [[E2:%[0-9]+]] = "ember.exp"([[S2]])
// CHECK-NEXT:    [[Z2:%[0-9]+]] = "ember.reduce_sum"([[E2]]) {axes = [1], keepdims = true}
// CHECK-NEXT:    [[L2:%[0-9]+]] = "ember.log"([[Z2]])
// CHECK-NEXT:    [[LOGSOFTMAX:%[0-9]+]] = "ember.sub"([[S2]], [[L2]])
// CHECK-NEXT:    [[HOT:%[0-9]+]] = "ember.one_hot"(%y) {dtype = "f32", num_classes = 10}
// CHECK:         "ember.log"
// CHECK-NEXT:    [[LSM:%[0-9]+]] = "ember.sub"
// CHECK-NEXT:    [[P:%[0-9]+]] = "ember.mul"([[LSM]], [[HOT]])
// CHECK-NEXT:    [[ROWS:%[0-9]+]] = "ember.reduce_sum"([[P]]) {axes = [1], keepdims = false}
// CHECK-NEXT:    [[MEAN:%[0-9]+]] = "ember.reduce_mean"([[ROWS]]) {axes = [0], keepdims = false} : (tensor<4xf32>) -> tensor<f32>
// CHECK-NEXT:    [[CE:%[0-9]+]] = "ember.neg"([[MEAN]])
// CHECK-NEXT:    func.return [[SOFTMAX]], [[LOGSOFTMAX]], [[CE]] :
module {
  func.func @softmaxes(%x: tensor<4x10xf32>, %y: tensor<4xi64>) -> (tensor<4x10xf32>, tensor<4x10xf32>, tensor<f32>) {
    %0 = "nn.softmax"(%x) {axis = 1} : (tensor<4x10xf32>) -> tensor<4x10xf32>
    %1 = "nn.log_softmax"(%x) {axis = -1} : (tensor<4x10xf32>) -> tensor<4x10xf32>
    %2 = "nn.cross_entropy"(%x, %y) : (tensor<4x10xf32>, tensor<4xi64>) -> tensor<f32>
    func.return %0, %1, %2 : tensor<4x10xf32>, tensor<4x10xf32>, tensor<f32>
  }
}
