// RUN: ember opt %s -p pad-mask | filecheck %s

// %x is padded along T (axis 1, bucket 8), as are %a (axis 1) and %b (axis 0), and %len_T
// holds the real length. A mean over T becomes the sum of a select (padded positions 0,
// never multiplied: they may hold inf) divided by the real count; exp keeps the pad, so
// its result is cut back by the runtime (ember.padded_results: result, axis, name, inner,
// bucket), as the softmax's is.

// CHECK-LABEL: func.func @f
// CHECK-SAME:    ember.padded_results = {{\[\[}}1, 1, "T", 1, 8], [3, 1, "T", 1, 8]]
// CHECK:         [[E:%[0-9]+]] = "ember.exp"(%x)
// CHECK-NEXT:    [[POS:%[0-9]+]] = "ember.constant"() {value = dense<{{\[\[\[}}0], [1], [2], [3], [4], [5], [6], [7]]]> : tensor<1x8x1xi64>}
// CHECK-NEXT:    [[REAL:%[0-9]+]] = "ember.cmp"([[POS]], %len_T) {predicate = "lt"}
// CHECK-NEXT:    [[ZERO:%[0-9]+]] = "ember.constant"() {value = dense<0.0> : tensor<f32>}
// CHECK-NEXT:    [[SEL:%[0-9]+]] = "ember.select"([[REAL]], [[E]], [[ZERO]])
// CHECK-NEXT:    [[SUM:%[0-9]+]] = "ember.reduce_sum"([[SEL]]) {axes = [1], keepdims = false}
// CHECK-NEXT:    [[N:%[0-9]+]] = "ember.cast"(%len_T) {dtype = "f32"}
// CHECK-NEXT:    [[MEAN:%[0-9]+]] = "ember.div"([[SUM]], [[N]])
// CHECK-NOT:     ember.reduce_mean

// T merged into a flat axis ([2, 8, 4] -> [2, 32]): position i is real when i // 4 < len.
// A max fills -inf; a softmax over T sees -inf at the padded positions.
// CHECK:         "ember.constant"() {value = dense<{{\[\[}}0, 0, 0, 0, 1, 1, 1, 1, 2, {{.*}} 7, 7, 7, 7]]> : tensor<1x32xi64>}
// CHECK:         [[NEGINF:%[0-9]+]] = "ember.constant"() {value = dense<0xFF800000> : tensor<f32>}
// CHECK-NEXT:    [[M:%[0-9]+]] = "ember.select"({{%[0-9]+}}, {{%[0-9]+}}, [[NEGINF]])
// CHECK-NEXT:    [[MAX:%[0-9]+]] = "ember.reduce_max"([[M]]) {axes = [1], keepdims = false}
// CHECK:         [[S:%[0-9]+]] = "ember.select"([[REAL]], %x, {{%[0-9]+}}) : (tensor<1x8x1xi1>, tensor<2x8x4xf32>, tensor<f32>)
// CHECK-NEXT:    [[SM:%[0-9]+]] = "nn.softmax"([[S]]) {axis = 1}

// A matmul contracting over T zeroes the padded positions of each operand padded there.
// CHECK:         [[A:%[0-9]+]] = "ember.select"({{%[0-9]+}}, %a, {{%[0-9]+}}) : (tensor<1x8xi1>, tensor<4x8xf32>, tensor<f32>)
// CHECK:         [[B:%[0-9]+]] = "ember.select"({{%[0-9]+}}, %b, {{%[0-9]+}}) : (tensor<8x1xi1>, tensor<8x3xf32>, tensor<f32>)
// CHECK-NEXT:    [[MM:%[0-9]+]] = "ember.matmul"([[A]], [[B]])

// A constant built from the padded size (an arange of it) is padded too: its sum is
// masked, and its mark is dropped.
// CHECK:         [[C:%[0-9]+]] = "ember.constant"() {value = dense<[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]> : tensor<8xf32>}
// CHECK-NOT:     ember.padded =
// CHECK:         [[CS:%[0-9]+]] = "ember.select"({{%[0-9]+}}, [[C]], {{%[0-9]+}}) : (tensor<8xi1>, tensor<8xf32>, tensor<f32>)
// CHECK-NEXT:    [[CSUM:%[0-9]+]] = "ember.reduce_sum"([[CS]])
// CHECK:         func.return [[MEAN]], [[E]], [[MAX]], [[SM]], [[MM]], [[CSUM]]
module {
  func.func @f(%x: tensor<2x8x4xf32>, %a: tensor<4x8xf32>, %b: tensor<8x3xf32>, %len_T: tensor<i64>) -> (tensor<2x4xf32>, tensor<2x8x4xf32>, tensor<2xf32>, tensor<2x8x4xf32>, tensor<4x3xf32>, tensor<f32>) attributes {ember.length_args = [["T", 3]], ember.padded_args = [[0, 1, "T"], [1, 1, "T"], [2, 0, "T"]]} {
    %0 = "ember.exp"(%x) : (tensor<2x8x4xf32>) -> tensor<2x8x4xf32>
    %1 = "ember.reduce_mean"(%0) {axes = [1], keepdims = false} : (tensor<2x8x4xf32>) -> tensor<2x4xf32>
    %2 = "ember.reshape"(%x) {shape = [2, 32]} : (tensor<2x8x4xf32>) -> tensor<2x32xf32>
    %3 = "ember.reduce_max"(%2) {axes = [1], keepdims = false} : (tensor<2x32xf32>) -> tensor<2xf32>
    %4 = "nn.softmax"(%x) {axis = 1} : (tensor<2x8x4xf32>) -> tensor<2x8x4xf32>
    %5 = "ember.matmul"(%a, %b) : (tensor<4x8xf32>, tensor<8x3xf32>) -> tensor<4x3xf32>
    %6 = "ember.constant"() {value = dense<[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]> : tensor<8xf32>, ember.padded = [[0, "T"]]} : () -> tensor<8xf32>
    %7 = "ember.reduce_sum"(%6) {axes = [0], keepdims = false} : (tensor<8xf32>) -> tensor<f32>
    func.return %1, %0, %3, %4, %5, %7 : tensor<2x4xf32>, tensor<2x8x4xf32>, tensor<2xf32>, tensor<2x8x4xf32>, tensor<4x3xf32>, tensor<f32>
  }
}
