// RUN: ember opt %s --split-input-file -p fuse | filecheck %s
// RUN: ember opt %s --split-input-file -p "fuse{attention=false}" | filecheck %s --check-prefix=UNFUSED

// Causal multi-head attention (3 heads of 2 split from [2, 4, 6] projections) and the
// attention rule's backward, decomposed: the forward softmax(q k^T s + mask) v becomes ONE
// kernel.attention that reads q, k and v in place (maps over the [B, T, H*D] buffers) and
// also returns lse; the backward (do v^T, rowsum(dp p), ds, ds k, ds^T q, p^T do) is ONE
// kernel.attention_grad reading o and lse. No [4, 4] scores remain. The gradients go back
// to [2, 4, 6] through a transpose and a reshape: kernel.attention_grad writes them as
// [2, 4, 3, 2] (out_maps over the logical [2, 3, 4, 2]), so only free reshapes are left.

// CHECK-LABEL: func.func @f
// CHECK:         [[O:%[0-9]+]], [[LSE:%[0-9]+]] = "kernel.attention"(%0, %1, %2) {batch = [2, 3], causal = true, maps = {{\[}}[24, 2, 6, 1], [24, 2, 6, 1], [24, 2, 6, 1]], scale = 0.70{{[0-9]+}} : f64, sizes = [4, 4, 2, 2]}
// CHECK-SAME:      -> (tensor<2x3x4x2xf32>, tensor<2x3x4xf32>)
// CHECK:         [[DQ:%[0-9]+]], [[DK:%[0-9]+]], [[DV:%[0-9]+]] = "kernel.attention_grad"(%0, %1, %2, [[O]], [[LSE]], %5)
// CHECK-SAME:      maps = {{\[}}[24, 2, 6, 1], [24, 2, 6, 1], [24, 2, 6, 1], [24, 8, 2, 1], [12, 4, 1], [24, 8, 2, 1]]
// CHECK-SAME:      out_maps = {{\[}}[24, 2, 6, 1], [24, 2, 6, 1], [24, 2, 6, 1]], out_types = [tensor<2x4x3x2xf32>, tensor<2x4x3x2xf32>, tensor<2x4x3x2xf32>]
// CHECK-SAME:      -> (tensor<2x4x3x2xf32>, tensor<2x4x3x2xf32>, tensor<2x4x3x2xf32>)
// CHECK-NOT:     tensor<2x3x4x4xf32>
// CHECK-NOT:     ember.transpose
// CHECK:         "ember.reshape"([[DV]]) {shape = [2, 4, 6]} : (tensor<2x4x3x2xf32>) -> tensor<2x4x6xf32>
// CHECK:         func.return

// UNFUSED-LABEL: func.func @f
// UNFUSED-NOT:   kernel.attention
// UNFUSED:       out_types = [tensor<2x3x4x4xf32>]

module {
  func.func @f() -> (tensor<f32>, tensor<2x4x6xf32>, tensor<2x4x6xf32>, tensor<2x4x6xf32>) attributes {ember.grads = ["p0", "p1", "p2"], ember.linear = "split"} {
    %0 = "ember.param"() {id = "p0", path = "p0"} : () -> tensor<2x4x6xf32>
    %1 = "ember.param"() {id = "p1", path = "p1"} : () -> tensor<2x4x6xf32>
    %2 = "ember.param"() {id = "p2", path = "p2"} : () -> tensor<2x4x6xf32>
    %3 = "ember.reshape"(%0) {shape = [2, 4, 3, 2]} : (tensor<2x4x6xf32>) -> tensor<2x4x3x2xf32>
    %4 = "ember.transpose"(%3) {perm = [0, 2, 1, 3]} : (tensor<2x4x3x2xf32>) -> tensor<2x3x4x2xf32>
    %5 = "ember.reshape"(%1) {shape = [2, 4, 3, 2]} : (tensor<2x4x6xf32>) -> tensor<2x4x3x2xf32>
    %6 = "ember.transpose"(%5) {perm = [0, 2, 1, 3]} : (tensor<2x4x3x2xf32>) -> tensor<2x3x4x2xf32>
    %7 = "ember.reshape"(%2) {shape = [2, 4, 3, 2]} : (tensor<2x4x6xf32>) -> tensor<2x4x3x2xf32>
    %8 = "ember.transpose"(%7) {perm = [0, 2, 1, 3]} : (tensor<2x4x3x2xf32>) -> tensor<2x3x4x2xf32>
    %9 = "ember.transpose"(%5) {perm = [0, 2, 3, 1]} : (tensor<2x4x3x2xf32>) -> tensor<2x3x2x4xf32>
    %10 = "ember.matmul"(%4, %9) : (tensor<2x3x4x2xf32>, tensor<2x3x2x4xf32>) -> tensor<2x3x4x4xf32>
    %11 = "ember.constant"() {value = dense<0.70710677> : tensor<f32>} : () -> tensor<f32>
    %12 = "ember.mul"(%10, %11) : (tensor<2x3x4x4xf32>, tensor<f32>) -> tensor<2x3x4x4xf32>
    %13 = "ember.constant"() {value = dense<[[false, true, true, true], [false, false, true, true], [false, false, false, true], [false, false, false, false]]> : tensor<4x4xi1>} : () -> tensor<4x4xi1>
    %14 = "ember.constant"() {value = dense<0xFF800000> : tensor<f32>} : () -> tensor<f32>
    %15 = "ember.select"(%13, %14, %12) : (tensor<4x4xi1>, tensor<f32>, tensor<2x3x4x4xf32>) -> tensor<2x3x4x4xf32>
    %16 = "ember.reduce_max"(%15) {axes = [3], keepdims = true, stop_gradient = true} : (tensor<2x3x4x4xf32>) -> tensor<2x3x4x1xf32>
    %17 = "ember.sub"(%15, %16) : (tensor<2x3x4x4xf32>, tensor<2x3x4x1xf32>) -> tensor<2x3x4x4xf32>
    %18 = "ember.exp"(%17) : (tensor<2x3x4x4xf32>) -> tensor<2x3x4x4xf32>
    %19 = "ember.reduce_sum"(%18) {axes = [3], keepdims = true} : (tensor<2x3x4x4xf32>) -> tensor<2x3x4x1xf32>
    %20 = "ember.div"(%18, %19) : (tensor<2x3x4x4xf32>, tensor<2x3x4x1xf32>) -> tensor<2x3x4x4xf32>
    %21 = "ember.matmul"(%20, %8) : (tensor<2x3x4x4xf32>, tensor<2x3x4x2xf32>) -> tensor<2x3x4x2xf32>
    %22 = "ember.constant"() {value = dense<[[[[0.12573022, -0.13210486], [0.64042264, 0.104900114], [-0.5356694, 0.36159506], [1.304, 0.94708097]], [[-0.70373523, -1.2654215], [-0.62327445, 0.04132598], [-2.3250308, -0.21879166], [-1.245911, -0.7322674]], [[-0.544259, -0.31630015], [0.41163054, 1.0425134], [-0.12853466, 1.3664634], [-0.6651947, 0.35151008]]], [[[0.90347016, 0.0940123], [-0.7434993, -0.9217254], [-0.45772582, 0.22019513], [-1.0096182, -0.20917557]], [[-0.15922502, 0.5408456], [0.21465912, 0.3553727], [-0.6538286, -0.12961364], [0.7839755, 1.4934311]], [[-1.2590655, 1.5139238], [1.3458754, 0.7813114], [0.26445562, -0.31392282], [1.4580207, 1.9602584]]]]> : tensor<2x3x4x2xf32>} : () -> tensor<2x3x4x2xf32>
    %23 = "ember.mul"(%21, %22) : (tensor<2x3x4x2xf32>, tensor<2x3x4x2xf32>) -> tensor<2x3x4x2xf32>
    %24 = "ember.reduce_sum"(%23) {axes = [0, 1, 2, 3], keepdims = false} : (tensor<2x3x4x2xf32>) -> tensor<f32>
    %25 = "ember.transpose"(%7) {perm = [0, 2, 3, 1]} : (tensor<2x4x3x2xf32>) -> tensor<2x3x2x4xf32>
    %26 = "ember.matmul"(%22, %25) : (tensor<2x3x4x2xf32>, tensor<2x3x2x4xf32>) -> tensor<2x3x4x4xf32>
    %27 = "ember.mul"(%26, %20) : (tensor<2x3x4x4xf32>, tensor<2x3x4x4xf32>) -> tensor<2x3x4x4xf32>
    %28 = "ember.reduce_sum"(%27) {axes = [3], keepdims = true} : (tensor<2x3x4x4xf32>) -> tensor<2x3x4x1xf32>
    %29 = "ember.sub"(%26, %28) : (tensor<2x3x4x4xf32>, tensor<2x3x4x1xf32>) -> tensor<2x3x4x4xf32>
    %30 = "ember.mul"(%20, %29) : (tensor<2x3x4x4xf32>, tensor<2x3x4x4xf32>) -> tensor<2x3x4x4xf32>
    %31 = "ember.mul"(%30, %11) : (tensor<2x3x4x4xf32>, tensor<f32>) -> tensor<2x3x4x4xf32>
    %32 = "ember.matmul"(%31, %6) : (tensor<2x3x4x4xf32>, tensor<2x3x4x2xf32>) -> tensor<2x3x4x2xf32>
    %33 = "ember.transpose"(%31) {perm = [0, 1, 3, 2]} : (tensor<2x3x4x4xf32>) -> tensor<2x3x4x4xf32>
    %34 = "ember.matmul"(%33, %4) : (tensor<2x3x4x4xf32>, tensor<2x3x4x2xf32>) -> tensor<2x3x4x2xf32>
    %35 = "ember.transpose"(%20) {perm = [0, 1, 3, 2]} : (tensor<2x3x4x4xf32>) -> tensor<2x3x4x4xf32>
    %36 = "ember.matmul"(%35, %22) : (tensor<2x3x4x4xf32>, tensor<2x3x4x2xf32>) -> tensor<2x3x4x2xf32>
    %37 = "ember.transpose"(%36) {perm = [0, 2, 1, 3]} : (tensor<2x3x4x2xf32>) -> tensor<2x4x3x2xf32>
    %38 = "ember.reshape"(%37) {shape = [2, 4, 6]} : (tensor<2x4x3x2xf32>) -> tensor<2x4x6xf32>
    %39 = "ember.transpose"(%34) {perm = [0, 2, 1, 3]} : (tensor<2x3x4x2xf32>) -> tensor<2x4x3x2xf32>
    %40 = "ember.reshape"(%39) {shape = [2, 4, 6]} : (tensor<2x4x3x2xf32>) -> tensor<2x4x6xf32>
    %41 = "ember.transpose"(%32) {perm = [0, 2, 1, 3]} : (tensor<2x3x4x2xf32>) -> tensor<2x4x3x2xf32>
    %42 = "ember.reshape"(%41) {shape = [2, 4, 6]} : (tensor<2x4x3x2xf32>) -> tensor<2x4x6xf32>
    func.return %24, %42, %40, %38 : tensor<f32>, tensor<2x4x6xf32>, tensor<2x4x6xf32>, tensor<2x4x6xf32>
  }
}

// -----

// Inference, heads merged back into a projection: o is written as [2, 4, 3, 2] (lse stays
// contiguous), so the matmul reads it in place as [2, 4, 6] and no transpose is left.

// CHECK-LABEL: func.func @merged
// CHECK:         [[O:%[0-9]+]], [[LSE:%[0-9]+]] = "kernel.attention"(%q, %k, %v) {batch = [2, 3], causal = false, maps = {{\[}}[24, 2, 6, 1], [24, 2, 6, 1], [24, 2, 6, 1]], out_maps = {{\[}}[24, 2, 6, 1], [12, 4, 1]], out_types = [tensor<2x4x3x2xf32>, tensor<2x3x4xf32>]
// CHECK-SAME:      -> (tensor<2x4x3x2xf32>, tensor<2x3x4xf32>)
// CHECK-NOT:     ember.transpose
// CHECK:         "kernel.matmul"([[O]], %w)
// CHECK:         space = [2, 4, 5, 6]} : (tensor<2x4x3x2xf32>, tensor<6x5xf32>) -> tensor<2x4x5xf32>

// UNFUSED-LABEL: func.func @merged
// UNFUSED-NOT:   kernel.attention
// UNFUSED:       func.return
module {
  func.func @merged(%q: tensor<2x4x6xf32>, %k: tensor<2x4x6xf32>, %v: tensor<2x4x6xf32>, %w: tensor<6x5xf32>) -> tensor<2x4x5xf32> {
    %0 = "ember.reshape"(%q) {shape = [2, 4, 3, 2]} : (tensor<2x4x6xf32>) -> tensor<2x4x3x2xf32>
    %1 = "ember.transpose"(%0) {perm = [0, 2, 1, 3]} : (tensor<2x4x3x2xf32>) -> tensor<2x3x4x2xf32>
    %2 = "ember.reshape"(%k) {shape = [2, 4, 3, 2]} : (tensor<2x4x6xf32>) -> tensor<2x4x3x2xf32>
    %3 = "ember.transpose"(%2) {perm = [0, 2, 3, 1]} : (tensor<2x4x3x2xf32>) -> tensor<2x3x2x4xf32>
    %4 = "ember.reshape"(%v) {shape = [2, 4, 3, 2]} : (tensor<2x4x6xf32>) -> tensor<2x4x3x2xf32>
    %5 = "ember.transpose"(%4) {perm = [0, 2, 1, 3]} : (tensor<2x4x3x2xf32>) -> tensor<2x3x4x2xf32>
    %6 = "ember.matmul"(%1, %3) : (tensor<2x3x4x2xf32>, tensor<2x3x2x4xf32>) -> tensor<2x3x4x4xf32>
    %7 = "ember.reduce_max"(%6) {axes = [3], keepdims = true, stop_gradient = true} : (tensor<2x3x4x4xf32>) -> tensor<2x3x4x1xf32>
    %8 = "ember.sub"(%6, %7) : (tensor<2x3x4x4xf32>, tensor<2x3x4x1xf32>) -> tensor<2x3x4x4xf32>
    %9 = "ember.exp"(%8) : (tensor<2x3x4x4xf32>) -> tensor<2x3x4x4xf32>
    %10 = "ember.reduce_sum"(%9) {axes = [3], keepdims = true} : (tensor<2x3x4x4xf32>) -> tensor<2x3x4x1xf32>
    %11 = "ember.div"(%9, %10) : (tensor<2x3x4x4xf32>, tensor<2x3x4x1xf32>) -> tensor<2x3x4x4xf32>
    %12 = "ember.matmul"(%11, %5) : (tensor<2x3x4x4xf32>, tensor<2x3x4x2xf32>) -> tensor<2x3x4x2xf32>
    %13 = "ember.transpose"(%12) {perm = [0, 2, 1, 3]} : (tensor<2x3x4x2xf32>) -> tensor<2x4x3x2xf32>
    %14 = "ember.reshape"(%13) {shape = [2, 4, 6]} : (tensor<2x4x3x2xf32>) -> tensor<2x4x6xf32>
    %15 = "ember.matmul"(%14, %w) : (tensor<2x4x6xf32>, tensor<6x5xf32>) -> tensor<2x4x5xf32>
    func.return %15 : tensor<2x4x5xf32>
  }
}
