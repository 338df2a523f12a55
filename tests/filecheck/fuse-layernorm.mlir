// RUN: ember opt %s -p fuse | filecheck %s

// Linear -> LayerNorm -> ReLU -> Linear, SGD training step. The layer norm forward
// (mean, then variance, then normalize, scale, shift and the ReLU) is ONE kernel that
// reduces over the features in two phases and also stores what the backward reads; its
// backward through the input is one more row kernel with two reductions, fed by the
// epilogue of the GEMM before it; gamma/beta gradients are column sums (a different
// reduction axis: separate kernels, each with its SGD update). dy itself is stored for
// those sums, so dy * x-hat, which only the gamma sum reads, is taken there as it reads
// dy rather than stored by the epilogue as one more result.

// CHECK-LABEL: func.func @train_step
// CHECK:         [[Y:%[0-9]+]] = "kernel.matmul"(%x, %0, %1)
// CHECK:         [[XC:%[0-9]+]], [[RSTD:%[0-9]+]], [[XHAT:%[0-9]+]], [[ACT:%[0-9]+]], [[MASK:%[0-9]+]], [[DVAR:%[0-9]+]] = "kernel.fused"([[Y]], %2, %3) ({
// CHECK:           [[S:%[0-9]+]] = "kernel.reduce"({{%.*}}) {dims = [1], kind = "add"}
// CHECK:           [[MEAN:%[0-9]+]] = "kernel.div"([[S]],
// CHECK:           [[C:%[0-9]+]] = "kernel.sub"({{%.*}}, [[MEAN]])
// CHECK:           [[SQ:%[0-9]+]] = "kernel.mul"([[C]], [[C]])
// CHECK:           "kernel.reduce"([[SQ]]) {dims = [1], kind = "add"}
// CHECK:           "kernel.rsqrt"
// CHECK:           "kernel.relu"
// CHECK:         }) {{.*}} space = [16, 32]}
// CHECK-NEXT:    [[LOGITS:%[0-9]+]] = "kernel.matmul"([[ACT]], %4, %5)
// CHECK:         "kernel.fused"(%labels, [[LOGITS]])
// dX of the head: its epilogue applies the ReLU mask and the products with gamma that
// the row kernel reduces
// CHECK:         [[DH:%[0-9]+]], [[P1:%[0-9]+]], [[P2:%[0-9]+]] = "kernel.matmul"({{%[0-9]+}}, %4, [[MASK]], %2, [[RSTD]], [[XC]])
// CHECK:           "kernel.select"
// the gradient through the layer norm input: one row kernel, two reductions
// CHECK:         [[DY:%[0-9]+]] = "kernel.fused"([[P2]], [[DVAR]], [[XC]], [[P1]]) ({
// CHECK:           "kernel.reduce"({{.*}}) {dims = [1], kind = "add"}
// CHECK:           "kernel.reduce"({{.*}}) {dims = [1], kind = "add"}
// CHECK:         }) {{.*}} space = [16, 32]}
// CHECK:         "kernel.matmul"(%x, [[DY]], %lr, %0)
// CHECK:         "kernel.fused"([[DY]], %lr, %1) ({
// CHECK:           "kernel.reduce"({{.*}}) {dims = [0], kind = "add"}
// gamma and beta: column sums with their updates
// CHECK:         "kernel.fused"([[DH]], [[XHAT]], %lr, %2) ({
// CHECK:           "kernel.mul"
// CHECK:           "kernel.reduce"({{.*}}) {dims = [0], kind = "add"}
// CHECK:         "kernel.fused"([[DH]], %lr, %3) ({
// CHECK:           "kernel.reduce"({{.*}}) {dims = [0], kind = "add"}
// CHECK:         func.return

module {
  func.func @train_step(%x: tensor<16x24xf32>, %labels: tensor<16xi64>, %lr: tensor<f32>, %step: tensor<f32>) -> (tensor<f32>, tensor<24x32xf32>, tensor<32xf32>, tensor<32xf32>, tensor<32xf32>, tensor<32x10xf32>, tensor<10xf32>) {
    %0 = "ember.param"() {id = "inp_weight", path = "inp.weight"} : () -> tensor<24x32xf32>
    %1 = "ember.param"() {id = "inp_bias", path = "inp.bias"} : () -> tensor<32xf32>
    %2 = "ember.param"() {id = "norm_gamma", path = "norm.gamma"} : () -> tensor<32xf32>
    %3 = "ember.param"() {id = "norm_beta", path = "norm.beta"} : () -> tensor<32xf32>
    %4 = "ember.param"() {id = "fc_weight", path = "fc.weight"} : () -> tensor<32x10xf32>
    %5 = "ember.param"() {id = "fc_bias", path = "fc.bias"} : () -> tensor<10xf32>
    %6 = "ember.matmul"(%x, %0) : (tensor<16x24xf32>, tensor<24x32xf32>) -> tensor<16x32xf32>
    %7 = "ember.add"(%6, %1) : (tensor<16x32xf32>, tensor<32xf32>) -> tensor<16x32xf32>
    %8 = "ember.reduce_mean"(%7) {axes = [1], keepdims = true} : (tensor<16x32xf32>) -> tensor<16x1xf32>
    %9 = "ember.sub"(%7, %8) : (tensor<16x32xf32>, tensor<16x1xf32>) -> tensor<16x32xf32>
    %10 = "ember.mul"(%9, %9) : (tensor<16x32xf32>, tensor<16x32xf32>) -> tensor<16x32xf32>
    %11 = "ember.reduce_mean"(%10) {axes = [1], keepdims = true} : (tensor<16x32xf32>) -> tensor<16x1xf32>
    %12 = "ember.constant"() {value = dense<1.0e-05> : tensor<f32>} : () -> tensor<f32>
    %13 = "ember.add"(%11, %12) : (tensor<16x1xf32>, tensor<f32>) -> tensor<16x1xf32>
    %14 = "ember.rsqrt"(%13) : (tensor<16x1xf32>) -> tensor<16x1xf32>
    %15 = "ember.mul"(%9, %14) : (tensor<16x32xf32>, tensor<16x1xf32>) -> tensor<16x32xf32>
    %16 = "ember.mul"(%15, %2) : (tensor<16x32xf32>, tensor<32xf32>) -> tensor<16x32xf32>
    %17 = "ember.add"(%16, %3) : (tensor<16x32xf32>, tensor<32xf32>) -> tensor<16x32xf32>
    %18 = "ember.relu"(%17) : (tensor<16x32xf32>) -> tensor<16x32xf32>
    %19 = "ember.matmul"(%18, %4) : (tensor<16x32xf32>, tensor<32x10xf32>) -> tensor<16x10xf32>
    %20 = "ember.add"(%19, %5) : (tensor<16x10xf32>, tensor<10xf32>) -> tensor<16x10xf32>
    %21 = "ember.one_hot"(%labels) {dtype = "f32", num_classes = 10} : (tensor<16xi64>) -> tensor<16x10xf32>
    %22 = "ember.reduce_max"(%20) {axes = [1], keepdims = true, stop_gradient = true} : (tensor<16x10xf32>) -> tensor<16x1xf32>
    %23 = "ember.sub"(%20, %22) : (tensor<16x10xf32>, tensor<16x1xf32>) -> tensor<16x10xf32>
    %24 = "ember.exp"(%23) : (tensor<16x10xf32>) -> tensor<16x10xf32>
    %25 = "ember.reduce_sum"(%24) {axes = [1], keepdims = true} : (tensor<16x10xf32>) -> tensor<16x1xf32>
    %26 = "ember.log"(%25) : (tensor<16x1xf32>) -> tensor<16x1xf32>
    %27 = "ember.sub"(%23, %26) : (tensor<16x10xf32>, tensor<16x1xf32>) -> tensor<16x10xf32>
    %28 = "ember.mul"(%27, %21) : (tensor<16x10xf32>, tensor<16x10xf32>) -> tensor<16x10xf32>
    %29 = "ember.reduce_sum"(%28) {axes = [1], keepdims = false} : (tensor<16x10xf32>) -> tensor<16xf32>
    %30 = "ember.reduce_mean"(%29) {axes = [0], keepdims = false} : (tensor<16xf32>) -> tensor<f32>
    %31 = "ember.neg"(%30) : (tensor<f32>) -> tensor<f32>
    %32 = "ember.constant"() {value = dense<-0.0625> : tensor<16x10xf32>} : () -> tensor<16x10xf32>
    %33 = "ember.mul"(%32, %21) : (tensor<16x10xf32>, tensor<16x10xf32>) -> tensor<16x10xf32>
    %34 = "ember.neg"(%33) : (tensor<16x10xf32>) -> tensor<16x10xf32>
    %35 = "ember.reduce_sum"(%34) {axes = [1], keepdims = true} : (tensor<16x10xf32>) -> tensor<16x1xf32>
    %36 = "ember.div"(%35, %25) : (tensor<16x1xf32>, tensor<16x1xf32>) -> tensor<16x1xf32>
    %37 = "ember.broadcast"(%36) {shape = [16, 10]} : (tensor<16x1xf32>) -> tensor<16x10xf32>
    %38 = "ember.mul"(%37, %24) : (tensor<16x10xf32>, tensor<16x10xf32>) -> tensor<16x10xf32>
    %39 = "ember.add"(%33, %38) : (tensor<16x10xf32>, tensor<16x10xf32>) -> tensor<16x10xf32>
    %40 = "ember.reduce_sum"(%39) {axes = [0], keepdims = false} : (tensor<16x10xf32>) -> tensor<10xf32>
    %41 = "ember.transpose"(%4) {perm = [1, 0]} : (tensor<32x10xf32>) -> tensor<10x32xf32>
    %42 = "ember.matmul"(%39, %41) : (tensor<16x10xf32>, tensor<10x32xf32>) -> tensor<16x32xf32>
    %43 = "ember.transpose"(%18) {perm = [1, 0]} : (tensor<16x32xf32>) -> tensor<32x16xf32>
    %44 = "ember.matmul"(%43, %39) : (tensor<32x16xf32>, tensor<16x10xf32>) -> tensor<32x10xf32>
    %45 = "ember.constant"() {value = dense<0.0> : tensor<f32>} : () -> tensor<f32>
    %46 = "ember.cmp"(%18, %45) {predicate = "gt"} : (tensor<16x32xf32>, tensor<f32>) -> tensor<16x32xi1>
    %47 = "ember.select"(%46, %42, %45) : (tensor<16x32xi1>, tensor<16x32xf32>, tensor<f32>) -> tensor<16x32xf32>
    %48 = "ember.reduce_sum"(%47) {axes = [0], keepdims = false} : (tensor<16x32xf32>) -> tensor<32xf32>
    %49 = "ember.mul"(%47, %2) : (tensor<16x32xf32>, tensor<32xf32>) -> tensor<16x32xf32>
    %50 = "ember.mul"(%47, %15) : (tensor<16x32xf32>, tensor<16x32xf32>) -> tensor<16x32xf32>
    %51 = "ember.reduce_sum"(%50) {axes = [0], keepdims = false} : (tensor<16x32xf32>) -> tensor<32xf32>
    %52 = "ember.mul"(%49, %14) : (tensor<16x32xf32>, tensor<16x1xf32>) -> tensor<16x32xf32>
    %53 = "ember.mul"(%49, %9) : (tensor<16x32xf32>, tensor<16x32xf32>) -> tensor<16x32xf32>
    %54 = "ember.reduce_sum"(%53) {axes = [1], keepdims = true} : (tensor<16x32xf32>) -> tensor<16x1xf32>
    %55 = "ember.constant"() {value = dense<-0.5> : tensor<f32>} : () -> tensor<f32>
    %56 = "ember.mul"(%14, %55) : (tensor<16x1xf32>, tensor<f32>) -> tensor<16x1xf32>
    %57 = "ember.div"(%56, %13) : (tensor<16x1xf32>, tensor<16x1xf32>) -> tensor<16x1xf32>
    %58 = "ember.mul"(%54, %57) : (tensor<16x1xf32>, tensor<16x1xf32>) -> tensor<16x1xf32>
    %59 = "ember.broadcast"(%58) {shape = [16, 32]} : (tensor<16x1xf32>) -> tensor<16x32xf32>
    %60 = "ember.constant"() {value = dense<0.03125> : tensor<f32>} : () -> tensor<f32>
    %61 = "ember.mul"(%59, %60) : (tensor<16x32xf32>, tensor<f32>) -> tensor<16x32xf32>
    %62 = "ember.mul"(%61, %9) : (tensor<16x32xf32>, tensor<16x32xf32>) -> tensor<16x32xf32>
    %63 = "ember.add"(%52, %62) : (tensor<16x32xf32>, tensor<16x32xf32>) -> tensor<16x32xf32>
    %64 = "ember.add"(%63, %62) : (tensor<16x32xf32>, tensor<16x32xf32>) -> tensor<16x32xf32>
    %65 = "ember.neg"(%64) : (tensor<16x32xf32>) -> tensor<16x32xf32>
    %66 = "ember.reduce_sum"(%65) {axes = [1], keepdims = true} : (tensor<16x32xf32>) -> tensor<16x1xf32>
    %67 = "ember.broadcast"(%66) {shape = [16, 32]} : (tensor<16x1xf32>) -> tensor<16x32xf32>
    %68 = "ember.mul"(%67, %60) : (tensor<16x32xf32>, tensor<f32>) -> tensor<16x32xf32>
    %69 = "ember.add"(%64, %68) : (tensor<16x32xf32>, tensor<16x32xf32>) -> tensor<16x32xf32>
    %70 = "ember.reduce_sum"(%69) {axes = [0], keepdims = false} : (tensor<16x32xf32>) -> tensor<32xf32>
    %71 = "ember.transpose"(%x) {perm = [1, 0]} : (tensor<16x24xf32>) -> tensor<24x16xf32>
    %72 = "ember.matmul"(%71, %69) : (tensor<24x16xf32>, tensor<16x32xf32>) -> tensor<24x32xf32>
    %73 = "ember.mul"(%lr, %72) : (tensor<f32>, tensor<24x32xf32>) -> tensor<24x32xf32>
    %74 = "ember.sub"(%0, %73) : (tensor<24x32xf32>, tensor<24x32xf32>) -> tensor<24x32xf32>
    %75 = "ember.mul"(%lr, %70) : (tensor<f32>, tensor<32xf32>) -> tensor<32xf32>
    %76 = "ember.sub"(%1, %75) : (tensor<32xf32>, tensor<32xf32>) -> tensor<32xf32>
    %77 = "ember.mul"(%lr, %51) : (tensor<f32>, tensor<32xf32>) -> tensor<32xf32>
    %78 = "ember.sub"(%2, %77) : (tensor<32xf32>, tensor<32xf32>) -> tensor<32xf32>
    %79 = "ember.mul"(%lr, %48) : (tensor<f32>, tensor<32xf32>) -> tensor<32xf32>
    %80 = "ember.sub"(%3, %79) : (tensor<32xf32>, tensor<32xf32>) -> tensor<32xf32>
    %81 = "ember.mul"(%lr, %44) : (tensor<f32>, tensor<32x10xf32>) -> tensor<32x10xf32>
    %82 = "ember.sub"(%4, %81) : (tensor<32x10xf32>, tensor<32x10xf32>) -> tensor<32x10xf32>
    %83 = "ember.mul"(%lr, %40) : (tensor<f32>, tensor<10xf32>) -> tensor<10xf32>
    %84 = "ember.sub"(%5, %83) : (tensor<10xf32>, tensor<10xf32>) -> tensor<10xf32>
    func.return %31, %74, %76, %78, %80, %82, %84 : tensor<f32>, tensor<24x32xf32>, tensor<32xf32>, tensor<32xf32>, tensor<32xf32>, tensor<32x10xf32>, tensor<10xf32>
  }
}

