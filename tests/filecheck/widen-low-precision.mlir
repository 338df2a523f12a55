// RUN: ember opt %s -p widen-low-precision | filecheck %s

// For backends with f32 kernels only: every op on bf16/f16 values runs in f32 between
// casts (an exact rewrite: the op's meaning is "compute in f32, round the result"); data
// movement (transpose) keeps its dtype; a cast between bf16/f16 and anything but f32
// goes through f32.

// CHECK-LABEL: func.func @mixed
// CHECK:         [[X:%[0-9]+]] = "ember.cast"(%x) {dtype = "f32"} : (tensor<4x8xbf16>) -> tensor<4x8xf32>
// CHECK-NEXT:    [[W:%[0-9]+]] = "ember.cast"(%w) {dtype = "f32"} : (tensor<8x3xbf16>) -> tensor<8x3xf32>
// CHECK-NEXT:    [[MM:%[0-9]+]] = "ember.matmul"([[X]], [[W]]) : (tensor<4x8xf32>, tensor<8x3xf32>) -> tensor<4x3xf32>
// CHECK-NEXT:    [[MMB:%[0-9]+]] = "ember.cast"([[MM]]) {dtype = "bf16"} : (tensor<4x3xf32>) -> tensor<4x3xbf16>
// CHECK-NEXT:    [[MMF:%[0-9]+]] = "ember.cast"([[MMB]]) {dtype = "f32"}
// CHECK-NEXT:    [[E:%[0-9]+]] = "ember.exp"([[MMF]]) : (tensor<4x3xf32>) -> tensor<4x3xf32>
// CHECK-NEXT:    [[EB:%[0-9]+]] = "ember.cast"([[E]]) {dtype = "bf16"}
// CHECK-NEXT:    [[T:%[0-9]+]] = "ember.transpose"([[EB]]) {perm = [1, 0]} : (tensor<4x3xbf16>) -> tensor<3x4xbf16>
// CHECK-NEXT:    [[EF:%[0-9]+]] = "ember.cast"([[EB]]) {dtype = "f32"}
// CHECK-NEXT:    [[EH:%[0-9]+]] = "ember.cast"([[EF]]) {dtype = "f16"} : (tensor<4x3xf32>) -> tensor<4x3xf16>
// CHECK-NEXT:    [[A:%[0-9]+]] = "ember.cast"([[EH]]) {dtype = "f32"}
// CHECK-NEXT:    [[H:%[0-9]+]] = "ember.cast"(%h) {dtype = "f32"}
// CHECK-NEXT:    [[SUM:%[0-9]+]] = "ember.add"([[A]], [[H]]) : (tensor<4x3xf32>, tensor<4x3xf32>) -> tensor<4x3xf32>
// CHECK-NEXT:    [[SUMH:%[0-9]+]] = "ember.cast"([[SUM]]) {dtype = "f16"}
// CHECK-NEXT:    [[D:%[0-9]+]] = "ember.cast"(%d) {dtype = "f32"} : (tensor<4x3xf64>) -> tensor<4x3xf32>
// CHECK-NEXT:    [[DB:%[0-9]+]] = "ember.cast"([[D]]) {dtype = "bf16"}
// CHECK-NEXT:    [[I:%[0-9]+]] = "ember.cast"([[SUMH]]) {dtype = "f32"}
// CHECK-NEXT:    [[II:%[0-9]+]] = "ember.cast"([[I]]) {dtype = "i32"} : (tensor<4x3xf32>) -> tensor<4x3xi32>
// CHECK-NEXT:    func.return [[EB]], [[T]], [[SUMH]], [[DB]], [[II]] :
module {
  func.func @mixed(%x: tensor<4x8xbf16>, %w: tensor<8x3xbf16>, %h: tensor<4x3xf16>, %d: tensor<4x3xf64>) -> (tensor<4x3xbf16>, tensor<3x4xbf16>, tensor<4x3xf16>, tensor<4x3xbf16>, tensor<4x3xi32>) {
    %0 = "ember.matmul"(%x, %w) : (tensor<4x8xbf16>, tensor<8x3xbf16>) -> tensor<4x3xbf16>
    %1 = "ember.exp"(%0) : (tensor<4x3xbf16>) -> tensor<4x3xbf16>
    %2 = "ember.transpose"(%1) {perm = [1, 0]} : (tensor<4x3xbf16>) -> tensor<3x4xbf16>
    %3 = "ember.cast"(%1) {dtype = "f16"} : (tensor<4x3xbf16>) -> tensor<4x3xf16>
    %4 = "ember.add"(%3, %h) : (tensor<4x3xf16>, tensor<4x3xf16>) -> tensor<4x3xf16>
    %5 = "ember.cast"(%d) {dtype = "bf16"} : (tensor<4x3xf64>) -> tensor<4x3xbf16>
    %6 = "ember.cast"(%4) {dtype = "i32"} : (tensor<4x3xf16>) -> tensor<4x3xi32>
    func.return %1, %2, %4, %5, %6 : tensor<4x3xbf16>, tensor<3x4xbf16>, tensor<4x3xf16>, tensor<4x3xbf16>, tensor<4x3xi32>
  }
}
