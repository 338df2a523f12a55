// RUN: ember opt %s -p 'decompose{linear=keep},autodiff,optimizer{kind=sgd momentum=0.9},canonicalize,cse,dce' | filecheck %s --check-prefixes=CHECK,KEEP
// RUN: ember opt %s -p 'decompose{linear=split},autodiff,optimizer{kind=sgd momentum=0.9},canonicalize,cse,dce' | filecheck %s --check-prefixes=CHECK,SPLIT

// fc1 of a 2-layer MLP is frozen (weight and bias requires_grad = false). The training
// step has no weight-gradient op for fc1: the whole backward is fc2's (one matmul, h^T g,
// and a bias sum); nothing flows back through relu or fc1 (no select, no W^T, no x^T),
// and the update (ember.updates, new params, momentum state) touches only fc2.

// CHECK-LABEL: func.func @mlp(%x: tensor<8x4xf32>, %y: tensor<8xi64>, %lr: tensor<f32>, %step: tensor<f32>, %arg4: tensor<16x3xf32>, %arg5: tensor<3xf32>) -> (tensor<f32>, tensor<16x3xf32>, tensor<3xf32>, tensor<16x3xf32>, tensor<3xf32>)
// CHECK-SAME:    ember.state = ["fc2.weight:momentum", "fc2.bias:momentum"], ember.updates = ["fc2.weight", "fc2.bias"]}
// CHECK:         [[W1:%[0-9]+]] = "ember.param"() {id = "fc1.weight"
// CHECK:         [[W2:%[0-9]+]] = "ember.param"() {id = "fc2.weight"
// KEEP:          "nn.linear"(%x, [[W1]], {{%[0-9]+}})
// KEEP-NEXT:     [[H:%[0-9]+]] = "ember.relu"
// KEEP-NEXT:     "nn.linear"([[H]], [[W2]], {{%[0-9]+}})
// SPLIT:         "ember.matmul"(%x, [[W1]])
// SPLIT:         [[H:%[0-9]+]] = "ember.relu"
// SPLIT-NEXT:    "ember.matmul"([[H]], [[W2]])
// CHECK:         [[LOSS:%[0-9]+]] = "ember.neg"
// CHECK-NOT:     "ember.select"
// CHECK-NOT:     "ember.transpose"([[W2]])
// CHECK-NOT:     "ember.transpose"(%x)
// CHECK:         [[HT:%[0-9]+]] = "ember.transpose"([[H]]) {perm = [1, 0]}
// CHECK-NEXT:    [[DW2:%[0-9]+]] = "ember.matmul"([[HT]], {{%[0-9]+}}) : (tensor<16x8xf32>, tensor<8x3xf32>) -> tensor<16x3xf32>
// CHECK-NOT:     "ember.matmul"
// CHECK-NOT:     "ember.transpose"
// CHECK-NOT:     [[W1]]
// CHECK:         func.return [[LOSS]], {{%[0-9]+}}, {{%[0-9]+}}, {{%[0-9]+}}, {{%[0-9]+}} : tensor<f32>, tensor<16x3xf32>, tensor<3xf32>, tensor<16x3xf32>, tensor<3xf32>
module {
  func.func @mlp(%x: tensor<8x4xf32>, %y: tensor<8xi64>) -> tensor<f32> {
    %0 = "ember.param"() {id = "fc1.weight", path = "fc1.weight", requires_grad = false} : () -> tensor<4x16xf32>
    %1 = "ember.param"() {id = "fc1.bias", path = "fc1.bias", requires_grad = false} : () -> tensor<16xf32>
    %2 = "ember.param"() {id = "fc2.weight", path = "fc2.weight"} : () -> tensor<16x3xf32>
    %3 = "ember.param"() {id = "fc2.bias", path = "fc2.bias"} : () -> tensor<3xf32>
    %4 = "nn.linear"(%x, %0, %1) : (tensor<8x4xf32>, tensor<4x16xf32>, tensor<16xf32>) -> tensor<8x16xf32>
    %5 = "ember.relu"(%4) : (tensor<8x16xf32>) -> tensor<8x16xf32>
    %6 = "nn.linear"(%5, %2, %3) : (tensor<8x16xf32>, tensor<16x3xf32>, tensor<3xf32>) -> tensor<8x3xf32>
    %7 = "nn.cross_entropy"(%6, %y) : (tensor<8x3xf32>, tensor<8xi64>) -> tensor<f32>
    func.return %7 : tensor<f32>
  }
}
