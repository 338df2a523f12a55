// RUN: ember opt %s -p autodiff | filecheck %s
// RUN: ember opt %s -p 'decompose,autodiff,canonicalize,cse,dce' | filecheck %s --check-prefix=PIPE

// The loss is the first result; autodiff appends one gradient per trainable param, in order,
// and lists their ids in ember.grads. fc1.weight is frozen (requires_grad = false) and
// `steps` is a buffer: neither gets a gradient, and nothing is emitted for them or for the
// input %x (no x^T, no weight-gradient matmul for fc1).

// CHECK-LABEL: func.func @mlp(%x: tensor<8x4xf32>, %y: tensor<8xi64>) -> (tensor<f32>, tensor<8x3xf32>, tensor<16xf32>, tensor<16x3xf32>) attributes {ember.grads = ["b1", "w2"]}
// CHECK:         [[W2:%[0-9]+]] = "ember.param"() {id = "w2", path = "fc2.weight"}
// CHECK:         [[H:%[0-9]+]] = "ember.relu"
// CHECK:         [[LOSS:%[0-9]+]] = "ember.mul"
// CHECK:         "ember.one_hot"(%y) {dtype = "f32", num_classes = 3}
// CHECK:         [[DLOGITS:%[0-9]+]] = "ember.mul"
// CHECK-NEXT:    [[W2T:%[0-9]+]] = "ember.transpose"([[W2]]) {perm = [1, 0]}
// CHECK-NEXT:    [[DH:%[0-9]+]] = "ember.matmul"([[DLOGITS]], [[W2T]])
// CHECK-NEXT:    [[HT:%[0-9]+]] = "ember.transpose"([[H]]) {perm = [1, 0]}
// CHECK-NEXT:    [[DW2:%[0-9]+]] = "ember.matmul"([[HT]], [[DLOGITS]])
// CHECK-NOT:     "ember.transpose"(%x)
// CHECK-NOT:     "ember.matmul"
// CHECK:         "ember.select"({{%[0-9]+}}, [[DH]], {{%[0-9]+}})
// CHECK-NEXT:    [[DB1:%[0-9]+]] = "ember.reduce_sum"({{%[0-9]+}}) {axes = [0], keepdims = false}
// CHECK-NEXT:    func.return [[LOSS]], {{%[0-9]+}}, [[DB1]], [[DW2]] :

// After decompose, the backward goes through core ops; the softmax's max is a constant to
// autodiff (stop_gradient), so no tie-splitting cmp/eq appears, and still no gradient for x.
// PIPE-LABEL:  func.func @mlp
// PIPE-SAME:     attributes {ember.grads = ["b1", "w2"], ember.linear = "split"}
// PIPE-NOT:      "ember.cmp"({{.*}}) {predicate = "eq"}
// PIPE-NOT:      "ember.transpose"(%x)
// PIPE:          func.return
module {
  func.func @mlp(%x: tensor<8x4xf32>, %y: tensor<8xi64>) -> (tensor<f32>, tensor<8x3xf32>) {
    %0 = "ember.param"() {id = "w1", path = "fc1.weight", requires_grad = false} : () -> tensor<4x16xf32>
    %1 = "ember.param"() {id = "b1", path = "fc1.bias"} : () -> tensor<16xf32>
    %2 = "ember.param"() {id = "w2", path = "fc2.weight"} : () -> tensor<16x3xf32>
    %3 = "ember.param"() {id = "steps", path = "steps", kind = "buffer"} : () -> tensor<f32>
    %4 = "nn.linear"(%x, %0, %1) : (tensor<8x4xf32>, tensor<4x16xf32>, tensor<16xf32>) -> tensor<8x16xf32>
    %5 = "ember.relu"(%4) : (tensor<8x16xf32>) -> tensor<8x16xf32>
    %6 = "nn.linear"(%5, %2) : (tensor<8x16xf32>, tensor<16x3xf32>) -> tensor<8x3xf32>
    %7 = "nn.cross_entropy"(%6, %y) : (tensor<8x3xf32>, tensor<8xi64>) -> tensor<f32>
    %8 = "ember.mul"(%7, %3) : (tensor<f32>, tensor<f32>) -> tensor<f32>
    func.return %8, %6 : tensor<f32>, tensor<8x3xf32>
  }
}
