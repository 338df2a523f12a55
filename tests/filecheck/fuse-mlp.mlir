// RUN: ember opt %s -p fuse | filecheck %s

// The SGD training step of an MLP 64-128-10 (as the training pipeline leaves it) becomes
// nine kernels: five GEMMs whose epilogues hold the bias add, ReLU and its mask, the ReLU
// backward select and the SGD updates, and four fused loops — the whole softmax /
// cross-entropy forward and backward (one-hot included) in one kernel reducing over the
// classes, the mean loss, and each bias gradient with its update (column sums). Transposes
// are strides in the GEMMs' maps: no copies.

// CHECK-LABEL: func.func @train_step
// CHECK-NOT:     "ember.{{(add|sub|mul|relu|exp|log|matmul|transpose|reduce_.*|one_hot|cmp|select)}}"
// CHECK:         [[H:%[0-9]+]], [[MASK:%[0-9]+]] = "kernel.matmul"(%x, %0, %1) ({
// CHECK-NEXT:    ^bb0([[ACC:%.*]]: f32, [[B1:%.*]]: f32):
// CHECK-NEXT:      [[Z:%[0-9]+]] = "kernel.add"([[ACC]], [[B1]])
// CHECK-NEXT:      [[R:%[0-9]+]] = "kernel.relu"([[Z]])
// CHECK:           "kernel.cmp"([[R]], {{.*}}) {predicate = "gt"}
// CHECK:         }) {maps = {{\[\[}}64, 0, 1], [0, 1, 128], [0, 1, 0]], out_maps = {{.*}}, out_types = [tensor<64x128xf32>, tensor<64x128xi1>], space = [64, 128, 64]}
// CHECK:         [[LOGITS:%[0-9]+]] = "kernel.matmul"([[H]], %2, %3)
// CHECK:         [[ROWLOSS:%[0-9]+]], [[DLOGITS:%[0-9]+]] = "kernel.fused"(%labels, [[LOGITS]]) ({
// CHECK:           "kernel.index"() {dim = 1}
// CHECK:           "kernel.reduce"({{.*}}) {dims = [1], kind = "max"}
// CHECK:           "kernel.exp"
// CHECK:           "kernel.reduce"({{.*}}) {dims = [1], kind = "add"}
// CHECK:           "kernel.log"
// CHECK-NOT:     "kernel.matmul"
// CHECK:         }) {{.*}} space = [64, 10]}
// CHECK:         [[LOSS:%[0-9]+]] = "kernel.fused"([[ROWLOSS]]) ({
// CHECK:           "kernel.reduce"({{.*}}) {dims = [0], kind = "add"}
// CHECK:         }) {{.*}} out_types = [tensor<f32>], space = [64]}
// dX of fc2: B = W2 read transposed (strides [0, 10, 1]); the ReLU backward is its epilogue
// CHECK:         [[DH:%[0-9]+]] = "kernel.matmul"([[DLOGITS]], %2, [[MASK]]) ({
// CHECK:           "kernel.select"
// CHECK:         }) {maps = {{\[\[}}10, 0, 1], [0, 10, 1], [128, 1, 0]]
// dW1 = x^T dH (A transposed: strides [1, 0, 64]) with the SGD update as epilogue
// CHECK:         [[W1:%[0-9]+]] = "kernel.matmul"(%x, [[DH]], %lr, %0) ({
// CHECK:           "kernel.mul"
// CHECK-NEXT:      "kernel.sub"
// CHECK:         }) {maps = {{\[\[}}1, 0, 64],
// CHECK:         [[B1NEW:%[0-9]+]] = "kernel.fused"([[DH]], %lr, %1) ({
// CHECK:           "kernel.reduce"({{.*}}) {dims = [0], kind = "add"}
// CHECK:         [[W2:%[0-9]+]] = "kernel.matmul"([[H]], [[DLOGITS]], %lr, %2)
// CHECK:         [[B2NEW:%[0-9]+]] = "kernel.fused"([[DLOGITS]], %lr, %3)
// CHECK-NOT:     {{^    %[0-9]+.*"kernel.(fused|matmul)"}}
// CHECK:         func.return [[LOSS]], [[W1]], [[B1NEW]], [[W2]], [[B2NEW]]

module {
  func.func @train_step(%x: tensor<64x64xf32>, %labels: tensor<64xi64>, %lr: tensor<f32>, %step: tensor<f32>) -> (tensor<f32>, tensor<64x128xf32>, tensor<128xf32>, tensor<128x10xf32>, tensor<10xf32>) {
    %0 = "ember.param"() {id = "fc1_weight", path = "fc1.weight"} : () -> tensor<64x128xf32>
    %1 = "ember.param"() {id = "fc1_bias", path = "fc1.bias"} : () -> tensor<128xf32>
    %2 = "ember.param"() {id = "fc2_weight", path = "fc2.weight"} : () -> tensor<128x10xf32>
    %3 = "ember.param"() {id = "fc2_bias", path = "fc2.bias"} : () -> tensor<10xf32>
    %4 = "ember.matmul"(%x, %0) : (tensor<64x64xf32>, tensor<64x128xf32>) -> tensor<64x128xf32>
    %5 = "ember.add"(%4, %1) : (tensor<64x128xf32>, tensor<128xf32>) -> tensor<64x128xf32>
    %6 = "ember.relu"(%5) : (tensor<64x128xf32>) -> tensor<64x128xf32>
    %7 = "ember.matmul"(%6, %2) : (tensor<64x128xf32>, tensor<128x10xf32>) -> tensor<64x10xf32>
    %8 = "ember.add"(%7, %3) : (tensor<64x10xf32>, tensor<10xf32>) -> tensor<64x10xf32>
    %9 = "ember.one_hot"(%labels) {dtype = "f32", num_classes = 10} : (tensor<64xi64>) -> tensor<64x10xf32>
    %10 = "ember.reduce_max"(%8) {axes = [1], keepdims = true, stop_gradient = true} : (tensor<64x10xf32>) -> tensor<64x1xf32>
    %11 = "ember.sub"(%8, %10) : (tensor<64x10xf32>, tensor<64x1xf32>) -> tensor<64x10xf32>
    %12 = "ember.exp"(%11) : (tensor<64x10xf32>) -> tensor<64x10xf32>
    %13 = "ember.reduce_sum"(%12) {axes = [1], keepdims = true} : (tensor<64x10xf32>) -> tensor<64x1xf32>
    %14 = "ember.log"(%13) : (tensor<64x1xf32>) -> tensor<64x1xf32>
    %15 = "ember.sub"(%11, %14) : (tensor<64x10xf32>, tensor<64x1xf32>) -> tensor<64x10xf32>
    %16 = "ember.mul"(%15, %9) : (tensor<64x10xf32>, tensor<64x10xf32>) -> tensor<64x10xf32>
    %17 = "ember.reduce_sum"(%16) {axes = [1], keepdims = false} : (tensor<64x10xf32>) -> tensor<64xf32>
    %18 = "ember.reduce_mean"(%17) {axes = [0], keepdims = false} : (tensor<64xf32>) -> tensor<f32>
    %19 = "ember.neg"(%18) : (tensor<f32>) -> tensor<f32>
    %20 = "ember.constant"() {value = dense<-0.015625> : tensor<64x10xf32>} : () -> tensor<64x10xf32>
    %21 = "ember.mul"(%20, %9) : (tensor<64x10xf32>, tensor<64x10xf32>) -> tensor<64x10xf32>
    %22 = "ember.neg"(%21) : (tensor<64x10xf32>) -> tensor<64x10xf32>
    %23 = "ember.reduce_sum"(%22) {axes = [1], keepdims = true} : (tensor<64x10xf32>) -> tensor<64x1xf32>
    %24 = "ember.div"(%23, %13) : (tensor<64x1xf32>, tensor<64x1xf32>) -> tensor<64x1xf32>
    %25 = "ember.broadcast"(%24) {shape = [64, 10]} : (tensor<64x1xf32>) -> tensor<64x10xf32>
    %26 = "ember.mul"(%25, %12) : (tensor<64x10xf32>, tensor<64x10xf32>) -> tensor<64x10xf32>
    %27 = "ember.add"(%21, %26) : (tensor<64x10xf32>, tensor<64x10xf32>) -> tensor<64x10xf32>
    %28 = "ember.reduce_sum"(%27) {axes = [0], keepdims = false} : (tensor<64x10xf32>) -> tensor<10xf32>
    %29 = "ember.transpose"(%2) {perm = [1, 0]} : (tensor<128x10xf32>) -> tensor<10x128xf32>
    %30 = "ember.matmul"(%27, %29) : (tensor<64x10xf32>, tensor<10x128xf32>) -> tensor<64x128xf32>
    %31 = "ember.transpose"(%6) {perm = [1, 0]} : (tensor<64x128xf32>) -> tensor<128x64xf32>
    %32 = "ember.matmul"(%31, %27) : (tensor<128x64xf32>, tensor<64x10xf32>) -> tensor<128x10xf32>
    %33 = "ember.constant"() {value = dense<0.0> : tensor<f32>} : () -> tensor<f32>
    %34 = "ember.cmp"(%6, %33) {predicate = "gt"} : (tensor<64x128xf32>, tensor<f32>) -> tensor<64x128xi1>
    %35 = "ember.select"(%34, %30, %33) : (tensor<64x128xi1>, tensor<64x128xf32>, tensor<f32>) -> tensor<64x128xf32>
    %36 = "ember.reduce_sum"(%35) {axes = [0], keepdims = false} : (tensor<64x128xf32>) -> tensor<128xf32>
    %37 = "ember.transpose"(%x) {perm = [1, 0]} : (tensor<64x64xf32>) -> tensor<64x64xf32>
    %38 = "ember.matmul"(%37, %35) : (tensor<64x64xf32>, tensor<64x128xf32>) -> tensor<64x128xf32>
    %39 = "ember.mul"(%lr, %38) : (tensor<f32>, tensor<64x128xf32>) -> tensor<64x128xf32>
    %40 = "ember.sub"(%0, %39) : (tensor<64x128xf32>, tensor<64x128xf32>) -> tensor<64x128xf32>
    %41 = "ember.mul"(%lr, %36) : (tensor<f32>, tensor<128xf32>) -> tensor<128xf32>
    %42 = "ember.sub"(%1, %41) : (tensor<128xf32>, tensor<128xf32>) -> tensor<128xf32>
    %43 = "ember.mul"(%lr, %32) : (tensor<f32>, tensor<128x10xf32>) -> tensor<128x10xf32>
    %44 = "ember.sub"(%2, %43) : (tensor<128x10xf32>, tensor<128x10xf32>) -> tensor<128x10xf32>
    %45 = "ember.mul"(%lr, %28) : (tensor<f32>, tensor<10xf32>) -> tensor<10xf32>
    %46 = "ember.sub"(%3, %45) : (tensor<10xf32>, tensor<10xf32>) -> tensor<10xf32>
    func.return %19, %40, %42, %44, %46 : tensor<f32>, tensor<64x128xf32>, tensor<128xf32>, tensor<128x10xf32>, tensor<10xf32>
  }
}
