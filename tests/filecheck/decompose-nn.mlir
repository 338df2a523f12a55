// RUN: ember opt %s -p decompose | filecheck %s

// decompose lowers every nn.* op to core ops. conv2d: ember.conv2d plus the bias on the
// channel axis. batch_norm (training): batch mean and biased variance (two passes, from
// the centered values) normalize; the running statistics are updated with momentum and
// the unbiased variance (n/(n-1) = 32/31), its other two results. gelu: tanh or erf form.
// layer_norm over the last axis. attention: q k^T * scale, the causal mask from two index
// vectors (never a T x T constant), a softmax whose max is stop_gradient, times v.

// CHECK-LABEL: func.func @layers
// CHECK-NOT:     "nn.
// CHECK:         [[C:%[0-9]+]] = "ember.conv2d"(%x, {{%[0-9]+}}) {dilation = [1, 1], groups = 1, padding = [1, 1], stride = [1, 1]}
// CHECK-NEXT:    [[CB:%[0-9]+]] = "ember.reshape"({{%[0-9]+}}) {shape = [6, 1, 1]}
// CHECK-NEXT:    [[H:%[0-9]+]] = "ember.add"([[C]], [[CB]])
// CHECK-NEXT:    [[MEAN:%[0-9]+]] = "ember.reduce_mean"([[H]]) {axes = [0, 2, 3], keepdims = true}
// CHECK-NEXT:    [[XC:%[0-9]+]] = "ember.sub"([[H]], [[MEAN]])
// CHECK-NEXT:    [[SQ:%[0-9]+]] = "ember.mul"([[XC]], [[XC]])
// CHECK-NEXT:    [[VAR:%[0-9]+]] = "ember.reduce_mean"([[SQ]]) {axes = [0, 2, 3], keepdims = true}
// CHECK:         "ember.rsqrt"
// CHECK:         "ember.constant"() {value = dense<1.032258> : tensor<f32>}
// CHECK:         [[RM:%[0-9]+]] = "ember.add"({{.*}}) : (tensor<6xf32>, tensor<6xf32>) -> tensor<6xf32>
// CHECK:         [[RV:%[0-9]+]] = "ember.add"({{.*}}) : (tensor<6xf32>, tensor<6xf32>) -> tensor<6xf32>
// CHECK:         "ember.tanh"
// CHECK:         [[G1:%[0-9]+]] = "ember.mul"({{.*}}) : (tensor<2x6x4x4xf32>, tensor<2x6x4x4xf32>) -> tensor<2x6x4x4xf32>
// CHECK-NEXT:    "ember.reduce_mean"(%t) {axes = [2], keepdims = true}
// CHECK:         [[LN:%[0-9]+]] = "ember.mul"({{.*}}) : (tensor<2x5x8xf32>, tensor<2x5x1xf32>) -> tensor<2x5x8xf32>
// CHECK-NEXT:    [[KT:%[0-9]+]] = "ember.transpose"([[LN]]) {perm = [0, 2, 1]}
// CHECK-NEXT:    "ember.matmul"([[LN]], [[KT]])
// CHECK:         [[ROWS:%[0-9]+]] = "ember.constant"() {value = dense<{{\[}}[0], [1], [2], [3], [4]]> : tensor<5x1xi64>}
// CHECK-NEXT:    [[COLS:%[0-9]+]] = "ember.constant"() {value = dense<[0, 1, 2, 3, 4]> : tensor<5xi64>}
// CHECK-NEXT:    [[HIDE:%[0-9]+]] = "ember.cmp"([[COLS]], [[ROWS]]) {predicate = "gt"}
// CHECK-NEXT:    [[NEGINF:%[0-9]+]] = "ember.constant"() {value = dense<0xFF800000> : tensor<f32>}
// CHECK-NEXT:    [[S:%[0-9]+]] = "ember.select"([[HIDE]], [[NEGINF]], {{%[0-9]+}})
// CHECK-NEXT:    "ember.reduce_max"([[S]]) {axes = [2], keepdims = true, stop_gradient = true}
// CHECK:         [[P:%[0-9]+]] = "ember.div"
// CHECK-NEXT:    [[ATT:%[0-9]+]] = "ember.matmul"([[P]], [[LN]])
// CHECK:         "ember.erf"
// CHECK:         [[G2:%[0-9]+]] = "ember.mul"({{.*}}) : (tensor<2x5x8xf32>, tensor<2x5x8xf32>) -> tensor<2x5x8xf32>
// CHECK-NEXT:    func.return [[G1]], [[RM]], [[RV]], [[ATT]], [[G2]] :
module {
  func.func @layers(%x: tensor<2x3x4x4xf32>, %t: tensor<2x5x8xf32>) -> (tensor<2x6x4x4xf32>, tensor<6xf32>, tensor<6xf32>, tensor<2x5x8xf32>, tensor<2x5x8xf32>) {
    %0 = "ember.param"() {id = "cw", path = "conv.weight"} : () -> tensor<6x3x3x3xf32>
    %1 = "ember.param"() {id = "cb", path = "conv.bias"} : () -> tensor<6xf32>
    %2 = "ember.param"() {id = "g", path = "bn.gamma"} : () -> tensor<6xf32>
    %3 = "ember.param"() {id = "b", path = "bn.beta"} : () -> tensor<6xf32>
    %4 = "ember.param"() {id = "m", path = "bn.running_mean", kind = "buffer"} : () -> tensor<6xf32>
    %5 = "ember.param"() {id = "v", path = "bn.running_var", kind = "buffer"} : () -> tensor<6xf32>
    %6 = "nn.conv2d"(%x, %0, %1) {dilation = [1, 1], groups = 1, padding = [1, 1], stride = [1, 1]} : (tensor<2x3x4x4xf32>, tensor<6x3x3x3xf32>, tensor<6xf32>) -> tensor<2x6x4x4xf32>
    %7, %8, %9 = "nn.batch_norm"(%6, %2, %3, %4, %5) {eps = 1.0e-05 : f64, momentum = 0.1 : f64, training = true} : (tensor<2x6x4x4xf32>, tensor<6xf32>, tensor<6xf32>, tensor<6xf32>, tensor<6xf32>) -> (tensor<2x6x4x4xf32>, tensor<6xf32>, tensor<6xf32>)
    %10 = "nn.gelu"(%7) {approximate = "tanh"} : (tensor<2x6x4x4xf32>) -> tensor<2x6x4x4xf32>
    %11 = "nn.layer_norm"(%t) {axes = [-1], eps = 1.0e-05 : f64} : (tensor<2x5x8xf32>) -> tensor<2x5x8xf32>
    %12 = "nn.attention"(%11, %11, %11) {causal = true, scale = 0.35355339059327373 : f64} : (tensor<2x5x8xf32>, tensor<2x5x8xf32>, tensor<2x5x8xf32>) -> tensor<2x5x8xf32>
    %13 = "nn.gelu"(%12) {approximate = "none"} : (tensor<2x5x8xf32>) -> tensor<2x5x8xf32>
    func.return %10, %8, %9, %12, %13 : tensor<2x6x4x4xf32>, tensor<6xf32>, tensor<6xf32>, tensor<2x5x8xf32>, tensor<2x5x8xf32>
  }
}
