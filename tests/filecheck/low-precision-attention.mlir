// RUN: ember opt %s --split-input-file -p low-precision-attention | filecheck %s

// On a cpu with AMX's bf16 tiles, after `fuse`: a fused attention whose q, k and v are
// kernels casting bf16 values to f32 reads the bf16 values. A kernel that is only the
// cast goes, its input read through its map (q: a transposed [B, T, H, D] projection); a
// kernel that computes the bf16 value before casting it (v: a padded value's mask) stores
// that value too; a cast the backward still reads (k) stays. An attention with an operand
// that is not such a cast is left as it was.

// CHECK-LABEL: func.func @mixed
// CHECK:         [[K:%[0-9]+]] = "kernel.fused"(%k)
// CHECK:         %{{[0-9]+}}, [[V:%[0-9]+]] = "kernel.fused"(%v, %keep)
// CHECK:           "kernel.yield"(%{{[0-9]+}}, %{{[0-9]+}}) : (f32, bf16) -> ()
// CHECK:         out_maps = {{\[}}[8, 1, 16], [8, 1, 16]], out_types = [tensor<2x8x2xf32>, tensor<2x8x2xbf16>]
// CHECK-NOT:     "kernel.fused"
// CHECK:         "kernel.attention"(%q, %k, [[V]]) {{{.*}}maps = {{\[}}[2, 4, 1], [16, 2, 1], [8, 1, 16]]{{.*}}} : (tensor<8x2x2xbf16>, tensor<2x8x2xbf16>, tensor<2x8x2xbf16>) -> (tensor<2x8x2xf32>, tensor<2x8xf32>)
// CHECK:         func.return {{.*}}, [[K]] :

// CHECK-LABEL: func.func @f32_operand
// CHECK:         "kernel.attention"(%q, %{{[0-9]+}}, %{{[0-9]+}}) {{.*}} : (tensor<2x8x2xf32>, tensor<2x8x2xf32>, tensor<2x8x2xf32>)
module {
  func.func @mixed(%q: tensor<8x2x2xbf16>, %k: tensor<2x8x2xbf16>, %v: tensor<2x8x2xbf16>, %keep: tensor<2x8x2xi1>) -> (tensor<2x8x2xf32>, tensor<2x8xf32>, tensor<2x8x2xf32>) {
    %0 = "kernel.fused"(%q) ({
    ^bb0(%a: bf16):
      %c = "kernel.cast"(%a) {dtype = "f32"} : (bf16) -> f32
      "kernel.yield"(%c) : (f32) -> ()
    }) {maps = [[2, 4, 1]], out_maps = [[16, 2, 1]], out_types = [tensor<2x8x2xf32>], space = [2, 8, 2]} : (tensor<8x2x2xbf16>) -> tensor<2x8x2xf32>
    %1 = "kernel.fused"(%k) ({
    ^bb0(%a: bf16):
      %c = "kernel.cast"(%a) {dtype = "f32"} : (bf16) -> f32
      "kernel.yield"(%c) : (f32) -> ()
    }) {maps = [[16, 2, 1]], out_maps = [[16, 2, 1]], out_types = [tensor<2x8x2xf32>], space = [2, 8, 2]} : (tensor<2x8x2xbf16>) -> tensor<2x8x2xf32>
    %2 = "kernel.fused"(%v, %keep) ({
    ^bb0(%a: bf16, %m: i1):
      %z = "kernel.constant"() {value = 0.0 : f64} : () -> bf16
      %s = "kernel.select"(%m, %a, %z) : (i1, bf16, bf16) -> bf16
      %c = "kernel.cast"(%s) {dtype = "f32"} : (bf16) -> f32
      "kernel.yield"(%c) : (f32) -> ()
    }) {maps = [[16, 2, 1], [16, 2, 1]], out_maps = [[8, 1, 16]], out_types = [tensor<2x8x2xf32>], space = [2, 8, 2]} : (tensor<2x8x2xbf16>, tensor<2x8x2xi1>) -> tensor<2x8x2xf32>
    %o, %lse = "kernel.attention"(%0, %1, %2) {batch = [2], causal = true, maps = [[16, 2, 1], [16, 2, 1], [8, 1, 16]], scale = 0.5 : f64, sizes = [8, 8, 2, 2]} : (tensor<2x8x2xf32>, tensor<2x8x2xf32>, tensor<2x8x2xf32>) -> (tensor<2x8x2xf32>, tensor<2x8xf32>)
    func.return %o, %lse, %1 : tensor<2x8x2xf32>, tensor<2x8xf32>, tensor<2x8x2xf32>
  }
}

// -----

module {
  func.func @f32_operand(%q: tensor<2x8x2xf32>, %k: tensor<2x8x2xbf16>, %v: tensor<2x8x2xbf16>) -> (tensor<2x8x2xf32>, tensor<2x8xf32>) {
    %0 = "kernel.fused"(%k) ({
    ^bb0(%a: bf16):
      %c = "kernel.cast"(%a) {dtype = "f32"} : (bf16) -> f32
      "kernel.yield"(%c) : (f32) -> ()
    }) {maps = [[16, 2, 1]], out_maps = [[16, 2, 1]], out_types = [tensor<2x8x2xf32>], space = [2, 8, 2]} : (tensor<2x8x2xbf16>) -> tensor<2x8x2xf32>
    %1 = "kernel.fused"(%v) ({
    ^bb0(%a: bf16):
      %c = "kernel.cast"(%a) {dtype = "f32"} : (bf16) -> f32
      "kernel.yield"(%c) : (f32) -> ()
    }) {maps = [[16, 2, 1]], out_maps = [[16, 2, 1]], out_types = [tensor<2x8x2xf32>], space = [2, 8, 2]} : (tensor<2x8x2xbf16>) -> tensor<2x8x2xf32>
    %o, %lse = "kernel.attention"(%q, %0, %1) {batch = [2], causal = false, maps = [[16, 2, 1], [16, 2, 1], [16, 2, 1]], scale = 0.5 : f64, sizes = [8, 8, 2, 2]} : (tensor<2x8x2xf32>, tensor<2x8x2xf32>, tensor<2x8x2xf32>) -> (tensor<2x8x2xf32>, tensor<2x8xf32>)
    func.return %o, %lse : tensor<2x8x2xf32>, tensor<2x8xf32>
  }
}

// -----

// The backward reads its q, k, v and do as bf16 too; o and lse stay f32. A result that
// only a cast to bf16 reads is stored as bf16 in the layout the cast's readers read: dq
// through a transpose, dk in the cast kernel's transposed layout and through a transpose
// to the same one; dv, returned as it is, stays f32.
// CHECK-LABEL: func.func @backward
// CHECK-NOT:     "kernel.fused"
// CHECK:         [[DQ:%[0-9]+]], [[DK:%[0-9]+]], [[DV:%[0-9]+]] = "kernel.attention_grad"(%q, %k, %v, %o, %lse, %do) {{.*}}out_maps = {{\[}}[2, 4, 1], [2, 4, 1], [16, 2, 1]], out_types = [tensor<8x2x2xbf16>, tensor<8x2x2xbf16>, tensor<2x8x2xf32>]{{.*}} : (tensor<2x8x2xbf16>, tensor<2x8x2xbf16>, tensor<2x8x2xbf16>, tensor<2x8x2xf32>, tensor<2x8xf32>, tensor<2x8x2xbf16>) -> (tensor<8x2x2xbf16>, tensor<8x2x2xbf16>, tensor<2x8x2xf32>)
// CHECK-NOT:     "ember.transpose"
// CHECK:         func.return [[DQ]], [[DK]], [[DK]], [[DV]] :
module {
  func.func @backward(%q: tensor<2x8x2xbf16>, %k: tensor<2x8x2xbf16>, %v: tensor<2x8x2xbf16>, %o: tensor<2x8x2xf32>, %lse: tensor<2x8xf32>, %do: tensor<2x8x2xbf16>) -> (tensor<8x2x2xbf16>, tensor<8x2x2xbf16>, tensor<8x2x2xbf16>, tensor<2x8x2xf32>) {
    %0 = "kernel.fused"(%q) ({
    ^bb0(%a: bf16):
      %c = "kernel.cast"(%a) {dtype = "f32"} : (bf16) -> f32
      "kernel.yield"(%c) : (f32) -> ()
    }) {maps = [[16, 2, 1]], out_maps = [[16, 2, 1]], out_types = [tensor<2x8x2xf32>], space = [2, 8, 2]} : (tensor<2x8x2xbf16>) -> tensor<2x8x2xf32>
    %1 = "kernel.fused"(%k) ({
    ^bb0(%a: bf16):
      %c = "kernel.cast"(%a) {dtype = "f32"} : (bf16) -> f32
      "kernel.yield"(%c) : (f32) -> ()
    }) {maps = [[16, 2, 1]], out_maps = [[16, 2, 1]], out_types = [tensor<2x8x2xf32>], space = [2, 8, 2]} : (tensor<2x8x2xbf16>) -> tensor<2x8x2xf32>
    %2 = "kernel.fused"(%v) ({
    ^bb0(%a: bf16):
      %c = "kernel.cast"(%a) {dtype = "f32"} : (bf16) -> f32
      "kernel.yield"(%c) : (f32) -> ()
    }) {maps = [[16, 2, 1]], out_maps = [[16, 2, 1]], out_types = [tensor<2x8x2xf32>], space = [2, 8, 2]} : (tensor<2x8x2xbf16>) -> tensor<2x8x2xf32>
    %3 = "kernel.fused"(%do) ({
    ^bb0(%a: bf16):
      %c = "kernel.cast"(%a) {dtype = "f32"} : (bf16) -> f32
      "kernel.yield"(%c) : (f32) -> ()
    }) {maps = [[16, 2, 1]], out_maps = [[16, 2, 1]], out_types = [tensor<2x8x2xf32>], space = [2, 8, 2]} : (tensor<2x8x2xbf16>) -> tensor<2x8x2xf32>
    %dq, %dk, %dv = "kernel.attention_grad"(%0, %1, %2, %o, %lse, %3) {batch = [2], causal = true, maps = [[16, 2, 1], [16, 2, 1], [16, 2, 1], [16, 2, 1], [8, 1], [16, 2, 1]], scale = 0.5 : f64, sizes = [8, 8, 2, 2]} : (tensor<2x8x2xf32>, tensor<2x8x2xf32>, tensor<2x8x2xf32>, tensor<2x8x2xf32>, tensor<2x8xf32>, tensor<2x8x2xf32>) -> (tensor<2x8x2xf32>, tensor<2x8x2xf32>, tensor<2x8x2xf32>)
    %4 = "kernel.fused"(%dq) ({
    ^bb0(%a: f32):
      %c = "kernel.cast"(%a) {dtype = "bf16"} : (f32) -> bf16
      "kernel.yield"(%c) : (bf16) -> ()
    }) {maps = [[16, 2, 1]], out_maps = [[16, 2, 1]], out_types = [tensor<2x8x2xbf16>], space = [2, 8, 2]} : (tensor<2x8x2xf32>) -> tensor<2x8x2xbf16>
    %5 = "ember.transpose"(%4) {perm = [1, 0, 2]} : (tensor<2x8x2xbf16>) -> tensor<8x2x2xbf16>
    %6, %7 = "kernel.fused"(%dk) ({
    ^bb0(%a: f32):
      %c = "kernel.cast"(%a) {dtype = "bf16"} : (f32) -> bf16
      "kernel.yield"(%c, %c) : (bf16, bf16) -> ()
    }) {maps = [[16, 2, 1]], out_maps = [[16, 2, 1], [2, 4, 1]], out_types = [tensor<2x8x2xbf16>, tensor<8x2x2xbf16>], space = [2, 8, 2]} : (tensor<2x8x2xf32>) -> (tensor<2x8x2xbf16>, tensor<8x2x2xbf16>)
    %8 = "ember.transpose"(%6) {perm = [1, 0, 2]} : (tensor<2x8x2xbf16>) -> tensor<8x2x2xbf16>
    func.return %5, %8, %7, %dv : tensor<8x2x2xbf16>, tensor<8x2x2xbf16>, tensor<8x2x2xbf16>, tensor<2x8x2xf32>
  }
}
