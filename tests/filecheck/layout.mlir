// RUN: ember opt %s -p layout,canonicalize,cse,dce | filecheck %s

// A MobileNet block (pointwise expand, bias, ReLU6, stride-2 depthwise with its padding
// at the end only, pointwise project) runs channels last: the depthwise conv as
// conv2d_nhwc taking the end padding as its own, the pointwise convs as matmuls over
// every position; the bias and ReLU6 run channels last between them, one transpose
// starts the chain and the last matmul's transpose back ends it (the result is NCHW).
// A chain without a depthwise conv (%r through a ResNet's 1x1 and 3x3 convs) stays NCHW.

// CHECK-LABEL: func.func @f
// CHECK:         [[X:%[0-9]+]] = "ember.transpose"(%x) {perm = [0, 2, 3, 1]} : (tensor<1x8x10x10xf32>) -> tensor<1x10x10x8xf32>
// CHECK-NEXT:    [[R:%[0-9]+]] = "ember.reshape"([[X]]) {shape = [100, 8]}
// CHECK:         "ember.matmul"([[R]],
// CHECK:         [[B:%[0-9]+]] = "ember.reshape"(%b) {shape = [1, 1, 1, 16]}
// CHECK-NEXT:    "ember.add"({{.*}}, [[B]]) : (tensor<1x10x10x16xf32>, tensor<1x1x1x16xf32>)
// CHECK-NEXT:    "ember.min"
// CHECK-NEXT:    [[W:%[0-9]+]] = "ember.transpose"(%dw) {perm = [2, 3, 1, 0]} : (tensor<16x1x3x3xf32>) -> tensor<3x3x1x16xf32>
// CHECK-NEXT:    "ember.conv2d_nhwc"({{.*}}, [[W]]) {dilation = [1, 1], groups = 16, padding = [0, 0, 1, 1], stride = [2, 2]} : (tensor<1x10x10x16xf32>, tensor<3x3x1x16xf32>) -> tensor<1x5x5x16xf32>
// CHECK-NOT:     {perm = [0, 3, 1, 2]}
// CHECK:         [[Y:%[0-9]+]] = "ember.matmul"
// CHECK-NEXT:    [[Y4:%[0-9]+]] = "ember.reshape"([[Y]]) {shape = [1, 5, 5, 8]}
// CHECK-NEXT:    [[OUT:%[0-9]+]] = "ember.transpose"([[Y4]]) {perm = [0, 3, 1, 2]}
// CHECK-NEXT:    [[R1:%[0-9]+]] = "ember.conv2d"(%r, %w1)
// CHECK-NEXT:    [[R3:%[0-9]+]] = "ember.conv2d"([[R1]], %w3)
// CHECK-NEXT:    func.return [[OUT]], [[R3]]
func.func @f(%x: tensor<1x8x10x10xf32>, %pw1: tensor<16x8x1x1xf32>, %b: tensor<16x1x1xf32>, %dw: tensor<16x1x3x3xf32>, %pw2: tensor<8x16x1x1xf32>, %r: tensor<1x8x6x6xf32>, %w1: tensor<8x8x1x1xf32>, %w3: tensor<8x8x3x3xf32>) -> (tensor<1x8x5x5xf32>, tensor<1x8x6x6xf32>) {
  %c6 = "ember.constant"() {value = dense<6.0> : tensor<f32>} : () -> tensor<f32>
  %0 = "ember.conv2d"(%x, %pw1) {dilation = [1, 1], groups = 1, padding = [0, 0], stride = [1, 1]} : (tensor<1x8x10x10xf32>, tensor<16x8x1x1xf32>) -> tensor<1x16x10x10xf32>
  %1 = "ember.add"(%0, %b) : (tensor<1x16x10x10xf32>, tensor<16x1x1xf32>) -> tensor<1x16x10x10xf32>
  %2 = "ember.min"(%1, %c6) : (tensor<1x16x10x10xf32>, tensor<f32>) -> tensor<1x16x10x10xf32>
  %3 = "ember.unslice"(%2) {shape = [1, 16, 11, 11], start = [0, 0, 0, 0], step = [1, 1, 1, 1]} : (tensor<1x16x10x10xf32>) -> tensor<1x16x11x11xf32>
  %4 = "ember.conv2d"(%3, %dw) {dilation = [1, 1], groups = 16, padding = [0, 0], stride = [2, 2]} : (tensor<1x16x11x11xf32>, tensor<16x1x3x3xf32>) -> tensor<1x16x5x5xf32>
  %5 = "ember.conv2d"(%4, %pw2) {dilation = [1, 1], groups = 1, padding = [0, 0], stride = [1, 1]} : (tensor<1x16x5x5xf32>, tensor<8x16x1x1xf32>) -> tensor<1x8x5x5xf32>
  %6 = "ember.conv2d"(%r, %w1) {dilation = [1, 1], groups = 1, padding = [0, 0], stride = [1, 1]} : (tensor<1x8x6x6xf32>, tensor<8x8x1x1xf32>) -> tensor<1x8x6x6xf32>
  %7 = "ember.conv2d"(%6, %w3) {dilation = [1, 1], groups = 1, padding = [1, 1], stride = [1, 1]} : (tensor<1x8x6x6xf32>, tensor<8x8x3x3xf32>) -> tensor<1x8x6x6xf32>
  func.return %5, %7 : tensor<1x8x5x5xf32>, tensor<1x8x6x6xf32>
}
