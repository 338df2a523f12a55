// RUN: ember opt %s -p 'autodiff,recompute' | filecheck %s --check-prefix=NONE
// RUN: ember opt %s -p 'autodiff,recompute{strategy=balanced}' | filecheck %s --check-prefix=BALANCED
// RUN: ember opt %s -p 'autodiff,recompute{strategy=min-cut}' | filecheck %s --check-prefix=MINCUT
// RUN: ember opt %s -p 'autodiff,recompute{strategy=all}' | filecheck %s --check-prefix=ALL

// x @ w1 -> tanh -> dropout -> @ w2 -> exp -> sum. The backward reads the tanh output (its
// own rule), the dropout output (w2's gradient) and the exp output (its own rule).
// Recomputed ops are copies marked ember.recompute, placed just before their first
// backward use; the saved set is listed as the dump numbers its values.

// none keeps all three (exp %6, dropout %4, tanh %3) and recomputes nothing.
// NONE-LABEL: func.func @net
// NONE-SAME:    ember.recompute_strategy = "none"
// NONE-SAME:    ember.saved = ["%6", "%4", "%3"], ember.saved_bytes = 1088
// NONE-NOT:     ember.recompute

// balanced keeps the two matmul results and recomputes the memory-bound rest from them;
// the dropout copy has the forward's attributes and rng operand: the same mask.
// BALANCED-LABEL: func.func @net
// BALANCED-SAME:    ember.saved = ["%5", "%2"], ember.saved_bytes = 576
// BALANCED:         %2 = "ember.matmul"(%x, %0)
// BALANCED:         %5 = "ember.matmul"(%4, %1)
// BALANCED:         %9 = "ember.exp"(%5) {ember.recompute = true}
// BALANCED-NEXT:    "ember.matmul"(%9, %8)
// BALANCED-NEXT:    %11 = "ember.tanh"(%2) {ember.recompute = true}
// BALANCED-NEXT:    %12 = "ember.dropout"(%11, %rng) {ember.recompute = true, key = 1, p = 0.5 : f64, seed = 7}
// BALANCED-NEXT:    "ember.transpose"(%12) {perm = [1, 0]}
// BALANCED-NOT:     "ember.matmul"({{.*}}) {ember.recompute = true}

// min-cut: the fewest bytes (576, as balanced) and, among those, the least recomputation:
// it keeps the tanh and exp outputs and recomputes only the dropout.
// MINCUT-LABEL: func.func @net
// MINCUT-SAME:    ember.saved = ["%6", "%3"], ember.saved_bytes = 576
// MINCUT:         %10 = "ember.dropout"(%3, %rng) {ember.recompute = true, key = 1, p = 0.5 : f64, seed = 7}
// MINCUT-NOT:     ember.recompute

// all keeps nothing but inputs and params: both matmuls are recomputed too.
// ALL-LABEL: func.func @net
// ALL-SAME:    ember.saved = [], ember.saved_bytes = 0
// ALL:         "ember.matmul"(%x, %0) {ember.recompute = true}
// ALL:         "ember.matmul"(%11, %1) {ember.recompute = true}
module {
  func.func @net(%x: tensor<8x4xf32>, %rng: tensor<i64>) -> tensor<f32> {
    %0 = "ember.param"() {id = "w1", path = "fc1.weight"} : () -> tensor<4x16xf32>
    %1 = "ember.param"() {id = "w2", path = "fc2.weight"} : () -> tensor<16x2xf32>
    %2 = "ember.matmul"(%x, %0) : (tensor<8x4xf32>, tensor<4x16xf32>) -> tensor<8x16xf32>
    %3 = "ember.tanh"(%2) : (tensor<8x16xf32>) -> tensor<8x16xf32>
    %4 = "ember.dropout"(%3, %rng) {key = 1 : i64, p = 5.000000e-01 : f64, seed = 7 : i64} : (tensor<8x16xf32>, tensor<i64>) -> tensor<8x16xf32>
    %5 = "ember.matmul"(%4, %1) : (tensor<8x16xf32>, tensor<16x2xf32>) -> tensor<8x2xf32>
    %6 = "ember.exp"(%5) : (tensor<8x2xf32>) -> tensor<8x2xf32>
    %7 = "ember.reduce_sum"(%6) {axes = [0, 1], keepdims = false} : (tensor<8x2xf32>) -> tensor<f32>
    func.return %7 : tensor<f32>
  }
}
