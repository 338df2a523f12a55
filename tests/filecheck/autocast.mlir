// RUN: ember opt %s -p autocast | filecheck %s
// RUN: ember opt %s -p 'autocast{dtype=f16},autodiff' | filecheck %s --check-prefix=GRAD
// RUN: ember opt %s -p 'autocast,autodiff,decompose,optimizer,widen-low-precision,canonicalize,cse,dce,fuse' | filecheck %s --check-prefix=FUSED
// RUN: not ember opt %s -p 'autodiff,autocast' 2>&1 | filecheck %s --check-prefix=ORDER
// RUN: not ember opt %s -p 'autocast{dtype=f64}' 2>&1 | filecheck %s --check-prefix=DTYPE

// Mixed precision (precision="bf16-mixed" / "16-mixed"), on the traced forward: compute-
// bound ops (nn.linear here) get their f32 operands cast down and run in bf16; data
// movement on their results (the reshape) stays bf16; every other op (gelu, the loss)
// gets them cast back to f32. Each value is cast once, however many ops read it.

// CHECK-LABEL: func.func @train_step
// CHECK:         [[LN:%[0-9]+]] = "nn.layer_norm"(%x, {{.*}}) -> tensor<4x8xf32>
// CHECK-NEXT:    [[X:%[0-9]+]] = "ember.cast"([[LN]]) {dtype = "bf16"} : (tensor<4x8xf32>) -> tensor<4x8xbf16>
// CHECK-NEXT:    [[W1:%[0-9]+]] = "ember.cast"(%2) {dtype = "bf16"} : (tensor<8x16xf32>) -> tensor<8x16xbf16>
// CHECK-NEXT:    [[B1:%[0-9]+]] = "ember.cast"(%3) {dtype = "bf16"} : (tensor<16xf32>) -> tensor<16xbf16>
// CHECK-NEXT:    [[H:%[0-9]+]] = "nn.linear"([[X]], [[W1]], [[B1]]) : (tensor<4x8xbf16>, tensor<8x16xbf16>, tensor<16xbf16>) -> tensor<4x16xbf16>
// CHECK-NEXT:    [[R:%[0-9]+]] = "ember.reshape"([[H]]) {shape = [4, 2, 8]} : (tensor<4x16xbf16>) -> tensor<4x2x8xbf16>
// CHECK-NEXT:    [[RF:%[0-9]+]] = "ember.cast"([[R]]) {dtype = "f32"} : (tensor<4x2x8xbf16>) -> tensor<4x2x8xf32>
// CHECK-NEXT:    [[G:%[0-9]+]] = "nn.gelu"([[RF]]) {approximate = "none"} : (tensor<4x2x8xf32>) -> tensor<4x2x8xf32>
// CHECK-NEXT:    [[G2:%[0-9]+]] = "ember.reshape"([[G]]) {shape = [4, 16]} : (tensor<4x2x8xf32>) -> tensor<4x16xf32>
// CHECK-NEXT:    [[GB:%[0-9]+]] = "ember.cast"([[G2]]) {dtype = "bf16"}
// CHECK-NEXT:    [[W2:%[0-9]+]] = "ember.cast"(%4) {dtype = "bf16"}
// CHECK-NEXT:    [[Y:%[0-9]+]] = "nn.linear"([[GB]], [[W2]]) : (tensor<4x16xbf16>, tensor<16x3xbf16>) -> tensor<4x3xbf16>
// CHECK-NEXT:    [[YF:%[0-9]+]] = "ember.cast"([[Y]]) {dtype = "f32"} : (tensor<4x3xbf16>) -> tensor<4x3xf32>
// CHECK-NEXT:    [[L:%[0-9]+]] = "nn.cross_entropy"([[YF]], %x1) {ignore_index = -100} : (tensor<4x3xf32>, tensor<4xi64>) -> tensor<f32>
// CHECK-NEXT:    func.return [[L]] : tensor<f32>

// autodiff differentiates through the casts: the backward of a linear run in f16 runs in
// f16, and each f32 param's gradient is cast back up to f32.
// GRAD:         "nn.linear"({{.*}}) : (tensor<4x16xf16>, tensor<16x3xf16>) -> tensor<4x3xf16>
// GRAD:         "ember.cast"({{.*}}) {dtype = "f32"} : (tensor<8x16xf16>) -> tensor<8x16xf32>
// GRAD:         func.return {{.*}} : tensor<f32>, tensor<8xf32>, tensor<8xf32>, tensor<8x16xf32>, tensor<16xf32>, tensor<16x3xf32>

// After fusion no cast stands alone: each runs inside a kernel (a GEMM's prologue or
// epilogue, or an elementwise loop), and the update stays f32.
// FUSED-NOT:    "ember.cast"
// FUSED:        "kernel.cast"
// FUSED-NOT:    "ember.cast"
// FUSED:        func.return {{.*}} : tensor<f32>, tensor<8xf32>, tensor<8xf32>, tensor<8x16xf32>, tensor<16xf32>, tensor<16x3xf32>

// ORDER: autocast runs on the forward: run it before autodiff
// DTYPE: autocast: dtype must be one of bf16, f16, got 'f64'

module {
  func.func @train_step(%x: tensor<4x8xf32>, %x1: tensor<4xi64>) -> tensor<f32> {
    %0 = "ember.param"() {id = "657rfnrc2o1ud", path = "norm.gamma"} : () -> tensor<8xf32>
    %1 = "ember.param"() {id = "e7po6gb10ij5c", path = "norm.beta"} : () -> tensor<8xf32>
    %2 = "ember.param"() {id = "0kn9f6hlql52l", path = "fc1.weight"} : () -> tensor<8x16xf32>
    %3 = "ember.param"() {id = "fea5kv914gnhq", path = "fc1.bias"} : () -> tensor<16xf32>
    %4 = "ember.param"() {id = "7ope1sm1e5pj2", path = "fc2.weight"} : () -> tensor<16x3xf32>
    %5 = "nn.layer_norm"(%x, %0, %1) {affine = true, axes = [1], eps = 1.0e-05 : f64} : (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
    %6 = "nn.linear"(%5, %2, %3) : (tensor<4x8xf32>, tensor<8x16xf32>, tensor<16xf32>) -> tensor<4x16xf32>
    %7 = "ember.reshape"(%6) {shape = [4, 2, 8]} : (tensor<4x16xf32>) -> tensor<4x2x8xf32>
    %8 = "nn.gelu"(%7) {approximate = "none"} : (tensor<4x2x8xf32>) -> tensor<4x2x8xf32>
    %9 = "ember.reshape"(%8) {shape = [4, 16]} : (tensor<4x2x8xf32>) -> tensor<4x16xf32>
    %10 = "nn.linear"(%9, %4) : (tensor<4x16xf32>, tensor<16x3xf32>) -> tensor<4x3xf32>
    %11 = "nn.cross_entropy"(%10, %x1) {ignore_index = -100} : (tensor<4x3xf32>, tensor<4xi64>) -> tensor<f32>
    func.return %11 : tensor<f32>
  }
}
