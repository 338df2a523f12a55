// RUN: ember opt %s -p 'pad-mask{grads=true}' | filecheck %s

// With grads=true, an op whose backward sums padded positions into an operand that lacks
// them (here a Linear's weight, and a scale broadcast along T) reads zeros at the padded
// positions and its padded result is zeroed before any use: the padded rows of x @ w hold
// 0, not what the model makes of padding, so a log or a division there cannot send a NaN
// into the weight's gradient (0 * inf). The rsqrt between them has no unpadded operand:
// it is left alone. The sum over T reads the zeroed product as it is (no second select).

// CHECK-LABEL: func.func @f
// CHECK:         [[POS:%[0-9]+]] = "ember.constant"() {value = dense<{{\[\[\[}}0], [1], [2], [3]]]> : tensor<1x4x1xi64>}
// CHECK-NEXT:    [[REAL:%[0-9]+]] = "ember.cmp"([[POS]], %len_T) {predicate = "lt"}
// CHECK:         [[X:%[0-9]+]] = "ember.select"([[REAL]], %x, {{%[0-9]+}})
// CHECK-NEXT:    [[H:%[0-9]+]] = "ember.matmul"([[X]], [[W:%[0-9]+]])
// CHECK:         [[HZ:%[0-9]+]] = "ember.select"([[REAL]], [[H]], {{%[0-9]+}})
// CHECK-NEXT:    [[R:%[0-9]+]] = "ember.rsqrt"([[HZ]])
// CHECK:         [[RZ:%[0-9]+]] = "ember.select"([[REAL]], [[R]], {{%[0-9]+}})
// CHECK-NEXT:    [[Y:%[0-9]+]] = "ember.mul"([[RZ]], [[S:%[0-9]+]])
// CHECK:         [[YZ:%[0-9]+]] = "ember.select"([[REAL]], [[Y]], {{%[0-9]+}})
// CHECK-NEXT:    "ember.reduce_sum"([[YZ]]) {axes = [1], keepdims = false}
module {
  func.func @f(%x: tensor<2x4x3xf32>, %len_T: tensor<i64>) -> tensor<2x5xf32> attributes {ember.length_args = [["T", 1]], ember.padded_args = [[0, 1, "T"]]} {
    %w = "ember.param"() {id = "w", path = "w"} : () -> tensor<3x5xf32>
    %s = "ember.param"() {id = "s", path = "s"} : () -> tensor<5xf32>
    %0 = "ember.matmul"(%x, %w) : (tensor<2x4x3xf32>, tensor<3x5xf32>) -> tensor<2x4x5xf32>
    %1 = "ember.rsqrt"(%0) : (tensor<2x4x5xf32>) -> tensor<2x4x5xf32>
    %2 = "ember.mul"(%1, %s) : (tensor<2x4x5xf32>, tensor<5xf32>) -> tensor<2x4x5xf32>
    %3 = "ember.reduce_sum"(%2) {axes = [1], keepdims = false} : (tensor<2x4x5xf32>) -> tensor<2x5xf32>
    func.return %3 : tensor<2x5xf32>
  }
}
