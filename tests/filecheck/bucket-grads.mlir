// RUN: ember opt %s -p 'bucket-grads{bytes=64}' | filecheck %s
// RUN: ember opt %s -p bucket-grads | filecheck %s --check-prefix=ONE

// The gradients are bucketed in the order the backward finishes them (dw2 first, then db1,
// then dw1), at most 64 bytes and one dtype a bucket: dw2 (48 bytes) and db1 (16) share
// bucket 0, dw1 (128 bytes, larger than the limit) is a bucket of its own. Each
// `ember.grads_ready` comes right after its bucket's last producer; ember.grad_buckets
// lists each bucket's indexes into ember.grads.

// CHECK-LABEL: func.func @grads
// CHECK-SAME:    ember.grad_buckets = {{\[}}[2, 1], [0]]
// CHECK:         [[DW2:%[0-9]+]] = "ember.mul"(%g, %h)
// CHECK-NEXT:    [[DB1:%[0-9]+]] = "ember.reduce_sum"(%g)
// CHECK-NEXT:    "ember.grads_ready"([[DW2]], [[DB1]]) {bucket = 0} : (tensor<4x3xf32>, tensor<4xf32>) -> tensor<i64>
// CHECK-NEXT:    [[DW1:%[0-9]+]] = "ember.exp"(%w1)
// CHECK-NEXT:    "ember.grads_ready"([[DW1]]) {bucket = 1}
// CHECK-NEXT:    func.return %loss, [[DW1]], [[DB1]], [[DW2]] :

// With the default 25 MiB, one bucket after the last gradient.
// ONE:           ember.grad_buckets = {{\[}}[2, 1, 0]]
// ONE:           "ember.exp"
// ONE-NEXT:      "ember.grads_ready"({{.*}}) {bucket = 0}
// ONE-NEXT:      func.return
module {
  func.func @grads(%loss: tensor<f32>, %g: tensor<4x3xf32>, %h: tensor<4x3xf32>, %w1: tensor<32xf32>) -> (tensor<f32>, tensor<32xf32>, tensor<4xf32>, tensor<4x3xf32>) attributes {ember.grads = ["w1", "b1", "w2"]} {
    %0 = "ember.mul"(%g, %h) : (tensor<4x3xf32>, tensor<4x3xf32>) -> tensor<4x3xf32>
    %1 = "ember.reduce_sum"(%g) {axes = [1], keepdims = false} : (tensor<4x3xf32>) -> tensor<4xf32>
    %2 = "ember.exp"(%w1) : (tensor<32xf32>) -> tensor<32xf32>
    func.return %loss, %2, %1, %0 : tensor<f32>, tensor<32xf32>, tensor<4xf32>, tensor<4x3xf32>
  }
}
