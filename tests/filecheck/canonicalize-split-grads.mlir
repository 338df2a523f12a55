// RUN: ember opt %s -p autodiff | filecheck %s --check-prefix=GRAD
// RUN: ember opt %s -p autodiff,canonicalize,cse,dce | filecheck %s

// A fused projection split in three (q, k, v as slices of one matmul result, as
// `qkv.split(d, dim=-1)` traces). Autodiff gives each slice's gradient as an unslice (the
// piece zero-padded to the whole) and adds them up; canonicalize joins the adjacent blocks
// into one concat, so the projection's gradient is written once, not as three full-size
// zero-padded terms and two adds.

// GRAD-LABEL: func.func @split3
// GRAD:         "ember.slice"(%1) {shape = [2, 2], start = [0, 0], step = [1, 1]}
// GRAD-COUNT-3: "ember.unslice"
// GRAD:         "ember.add"({{%[0-9]+}}, {{%[0-9]+}}) : (tensor<2x6xf32>, tensor<2x6xf32>)

// CHECK-LABEL: func.func @split3
// CHECK:         [[Q:%[0-9]+]] = "ember.slice"(%1) {shape = [2, 2], start = [0, 0], step = [1, 1]}
// CHECK-NEXT:    [[K:%[0-9]+]] = "ember.slice"(%1) {shape = [2, 2], start = [0, 2], step = [1, 1]}
// CHECK-NEXT:    [[V:%[0-9]+]] = "ember.slice"(%1) {shape = [2, 2], start = [0, 4], step = [1, 1]}
// CHECK-NOT:     "ember.unslice"
// CHECK:         [[D:%[0-9]+]] = "ember.concat"({{%[0-9]+}}, {{%[0-9]+}}, {{%[0-9]+}}) {axis = 1} : (tensor<2x2xf32>, tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x6xf32>
// CHECK-NOT:     "ember.unslice"
// CHECK:         "ember.matmul"({{%[0-9]+}}, [[D]])
module {
  func.func @split3(%x: tensor<2x6xf32>) -> tensor<f32> {
    %0 = "ember.param"() {id = "w", path = "c_attn.weight"} : () -> tensor<6x6xf32>
    %1 = "ember.matmul"(%x, %0) : (tensor<2x6xf32>, tensor<6x6xf32>) -> tensor<2x6xf32>
    %2 = "ember.slice"(%1) {shape = [2, 2], start = [0, 0], step = [1, 1]} : (tensor<2x6xf32>) -> tensor<2x2xf32>
    %3 = "ember.slice"(%1) {shape = [2, 2], start = [0, 2], step = [1, 1]} : (tensor<2x6xf32>) -> tensor<2x2xf32>
    %4 = "ember.slice"(%1) {shape = [2, 2], start = [0, 4], step = [1, 1]} : (tensor<2x6xf32>) -> tensor<2x2xf32>
    %5 = "ember.mul"(%2, %3) : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %6 = "ember.mul"(%5, %4) : (tensor<2x2xf32>, tensor<2x2xf32>) -> tensor<2x2xf32>
    %7 = "ember.reduce_sum"(%6) {axes = [0, 1], keepdims = false} : (tensor<2x2xf32>) -> tensor<f32>
    func.return %7 : tensor<f32>
  }
}
