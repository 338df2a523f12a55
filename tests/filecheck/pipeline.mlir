// RUN: ember opt %s -p 'decompose{linear=keep},autodiff,canonicalize' --print-ir-after-all 2>&1 | filecheck %s
// RUN: not ember opt %s -p 'decompose,nonsense' 2>&1 | filecheck %s --check-prefix=UNKNOWN
// RUN: not ember opt %s -p 'decompose{linear=fused}' 2>&1 | filecheck %s --check-prefix=BADVALUE

// Every pass's IR is dumped, in order, under a header naming it; the final IR follows.
// CHECK:      // -----// IR Dump After decompose //----- //
// CHECK-NEXT: module {
// CHECK:        "nn.linear"
// CHECK:      // -----// IR Dump After autodiff //----- //
// CHECK:        attributes {ember.grads = ["w"], ember.linear = "keep"}
// CHECK:      // -----// IR Dump After canonicalize //----- //
// CHECK:      module {

// UNKNOWN: error: unknown pass 'nonsense' (known passes: {{.*}}autodiff, {{.*}}canonicalize, {{.*}}cse, dce, decompose
// BADVALUE: error: decompose: linear='fused' is not one of split, keep
module {
  func.func @f(%x: tensor<2x3xf32>) -> tensor<f32> {
    %0 = "ember.param"() {id = "w", path = "fc.weight"} : () -> tensor<3x4xf32>
    %1 = "nn.linear"(%x, %0) : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
    %2 = "ember.reduce_sum"(%1) {axes = [0, 1], keepdims = false} : (tensor<2x4xf32>) -> tensor<f32>
    func.return %2 : tensor<f32>
  }
}
