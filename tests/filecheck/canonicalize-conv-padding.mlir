// RUN: ember opt %s -p canonicalize | filecheck %s

// A conv of an input zero-padded as much before as after (ONNX's Pad before a Conv) takes
// the padding as its own and reads the input in place; padding only at the end (TF's
// "same" for stride 2) is not a conv's padding and stays.

// CHECK-LABEL: func.func @f
// CHECK-NEXT:    "ember.conv2d"(%x, %w) {dilation = [1, 1], groups = 8, padding = [2, 1], stride = [1, 1]}
// CHECK-NEXT:    [[P:%[0-9]+]] = "ember.unslice"(%x) {shape = [1, 8, 11, 11], start = [0, 0, 0, 0]
// CHECK-NEXT:    "ember.conv2d"([[P]], %w) {dilation = [1, 1], groups = 8, padding = [0, 0], stride = [2, 2]}
func.func @f(%x: tensor<1x8x10x10xf32>, %w: tensor<8x1x3x3xf32>) -> (tensor<1x8x12x10xf32>, tensor<1x8x5x5xf32>) {
  %0 = "ember.unslice"(%x) {shape = [1, 8, 12, 12], start = [0, 0, 1, 1], step = [1, 1, 1, 1]} : (tensor<1x8x10x10xf32>) -> tensor<1x8x12x12xf32>
  %1 = "ember.conv2d"(%0, %w) {dilation = [1, 1], groups = 8, padding = [1, 0], stride = [1, 1]} : (tensor<1x8x12x12xf32>, tensor<8x1x3x3xf32>) -> tensor<1x8x12x10xf32>
  %2 = "ember.unslice"(%x) {shape = [1, 8, 11, 11], start = [0, 0, 0, 0], step = [1, 1, 1, 1]} : (tensor<1x8x10x10xf32>) -> tensor<1x8x11x11xf32>
  %3 = "ember.conv2d"(%2, %w) {dilation = [1, 1], groups = 8, padding = [0, 0], stride = [2, 2]} : (tensor<1x8x11x11xf32>, tensor<8x1x3x3xf32>) -> tensor<1x8x5x5xf32>
  func.return %1, %3 : tensor<1x8x12x10xf32>, tensor<1x8x5x5xf32>
}
