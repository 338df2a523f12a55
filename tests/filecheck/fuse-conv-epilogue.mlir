// RUN: ember opt %s -p fuse | filecheck %s

// Inference: a conv's bias, residual add and ReLU become its epilogue, one kernel.conv2d
// whose body starts from the conv's value at each output point; `maps` holds the epilogue
// operands' maps only (x and w are read as the conv reads them). A conv without
// elementwise readers stays the plain op.

// CHECK-LABEL: func.func @block
// CHECK-NOT:     "ember.{{(add|relu|reshape)}}"
// CHECK:         [[Y:%[0-9]+]] = "kernel.conv2d"(%x, %w, %b, %x) ({
// CHECK-NEXT:    ^bb0([[ACC:%.*]]: f32, [[B:%.*]]: f32, [[R:%.*]]: f32):
// CHECK-NEXT:      [[S:%[0-9]+]] = "kernel.add"([[ACC]], [[B]])
// CHECK-NEXT:      [[T:%[0-9]+]] = "kernel.add"([[S]], [[R]])
// CHECK-NEXT:      [[U:%[0-9]+]] = "kernel.relu"([[T]])
// CHECK-NEXT:      "kernel.yield"([[U]])
// CHECK-NEXT:    }) {dilation = [1, 1], groups = 1, maps = {{\[\[}}0, 1, 0, 0], [800, 100, 10, 1]], out_maps = {{\[\[}}800, 100, 10, 1]], out_types = [tensor<2x8x10x10xf32>], padding = [1, 1], space = [2, 8, 10, 10], stride = [1, 1]}
// CHECK:         "ember.conv2d"([[Y]], %w)
// CHECK-NEXT:    func.return
func.func @block(%x: tensor<2x8x10x10xf32>, %w: tensor<8x8x3x3xf32>, %b: tensor<8xf32>) -> tensor<2x8x10x10xf32> {
  %0 = "ember.conv2d"(%x, %w) {dilation = [1, 1], groups = 1, padding = [1, 1], stride = [1, 1]} : (tensor<2x8x10x10xf32>, tensor<8x8x3x3xf32>) -> tensor<2x8x10x10xf32>
  %1 = "ember.reshape"(%b) {shape = [1, 8, 1, 1]} : (tensor<8xf32>) -> tensor<1x8x1x1xf32>
  %2 = "ember.add"(%0, %1) : (tensor<2x8x10x10xf32>, tensor<1x8x1x1xf32>) -> tensor<2x8x10x10xf32>
  %3 = "ember.add"(%2, %x) : (tensor<2x8x10x10xf32>, tensor<2x8x10x10xf32>) -> tensor<2x8x10x10xf32>
  %4 = "ember.relu"(%3) : (tensor<2x8x10x10xf32>) -> tensor<2x8x10x10xf32>
  %5 = "ember.conv2d"(%4, %w) {dilation = [1, 1], groups = 1, padding = [1, 1], stride = [1, 1]} : (tensor<2x8x10x10xf32>, tensor<8x8x3x3xf32>) -> tensor<2x8x10x10xf32>
  func.return %5 : tensor<2x8x10x10xf32>
}
