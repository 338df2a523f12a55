// RUN: ember opt %s -p 'decompose{linear=keep},autodiff,canonicalize' | filecheck %s --check-prefixes=CHECK,KEEP
// RUN: ember opt %s -p 'decompose{linear=split},autodiff,canonicalize' | filecheck %s --check-prefixes=CHECK,SPLIT

// Both choices of decompose run end to end and the dump says which one ran. fc2's weight
// and bias are frozen, so its backward computes only the input gradient g @ W2^T: there
// is no W2 gradient and nothing keeps fc2's input (the tanh output) alive for one (it is
// read only by tanh's own rule). fc1's input %x needs no gradient, so fc1's weight is not
// read by the backward at all (no W1^T).

// KEEP-LABEL:  func.func @mlp(%x: tensor<8x4xf32>) -> (tensor<f32>, tensor<4x16xf32>, tensor<16xf32>) attributes {ember.grads = ["fc1.weight", "fc1.bias"], ember.linear = "keep"}
// KEEP:          [[W1:%[0-9]+]] = "ember.param"() {id = "fc1.weight"
// KEEP:          [[W2:%[0-9]+]] = "ember.param"() {id = "fc2.weight"
// KEEP:          "nn.linear"(%x, [[W1]], {{%[0-9]+}})
// KEEP:          [[H:%[0-9]+]] = "ember.tanh"
// KEEP-NEXT:     "nn.linear"([[H]], [[W2]], {{%[0-9]+}})
// SPLIT-LABEL: func.func @mlp(%x: tensor<8x4xf32>) -> (tensor<f32>, tensor<4x16xf32>, tensor<16xf32>) attributes {ember.grads = ["fc1.weight", "fc1.bias"], ember.linear = "split"}
// SPLIT:         [[W1:%[0-9]+]] = "ember.param"() {id = "fc1.weight"
// SPLIT:         [[W2:%[0-9]+]] = "ember.param"() {id = "fc2.weight"
// SPLIT-NOT:     nn.linear
// SPLIT:         "ember.matmul"(%x, [[W1]])
// SPLIT:         [[H:%[0-9]+]] = "ember.tanh"
// SPLIT-NEXT:    "ember.matmul"([[H]], [[W2]])
// CHECK:         [[W2T:%[0-9]+]] = "ember.transpose"([[W2]]) {perm = [1, 0]}
// CHECK-NEXT:    [[DH:%[0-9]+]] = "ember.matmul"({{%[0-9]+}}, [[W2T]])
// CHECK-NOT:     "ember.transpose"([[H]])
// CHECK-NOT:     "ember.transpose"([[W1]])
// CHECK:         [[XT:%[0-9]+]] = "ember.transpose"(%x) {perm = [1, 0]}
// CHECK-NEXT:    [[DW1:%[0-9]+]] = "ember.matmul"([[XT]], {{%[0-9]+}}) : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
// CHECK-NOT:     "ember.transpose"([[H]])
// CHECK-NOT:     "ember.transpose"([[W1]])
// CHECK:         func.return
module {
  func.func @mlp(%x: tensor<8x4xf32>) -> tensor<f32> {
    %0 = "ember.param"() {id = "fc1.weight", path = "fc1.weight"} : () -> tensor<4x16xf32>
    %1 = "ember.param"() {id = "fc1.bias", path = "fc1.bias"} : () -> tensor<16xf32>
    %2 = "ember.param"() {id = "fc2.weight", path = "fc2.weight", requires_grad = false} : () -> tensor<16x3xf32>
    %3 = "ember.param"() {id = "fc2.bias", path = "fc2.bias", requires_grad = false} : () -> tensor<3xf32>
    %4 = "nn.linear"(%x, %0, %1) : (tensor<8x4xf32>, tensor<4x16xf32>, tensor<16xf32>) -> tensor<8x16xf32>
    %5 = "ember.tanh"(%4) : (tensor<8x16xf32>) -> tensor<8x16xf32>
    %6 = "nn.linear"(%5, %2, %3) : (tensor<8x16xf32>, tensor<16x3xf32>, tensor<3xf32>) -> tensor<8x3xf32>
    %7 = "ember.reduce_sum"(%6) {axes = [0, 1], keepdims = false} : (tensor<8x3xf32>) -> tensor<f32>
    func.return %7 : tensor<f32>
  }
}
