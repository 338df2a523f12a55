// RUN: not ember opt %s -p 'recompute{strategy=balanced}' 2>&1 | filecheck %s --check-prefix=BEFORE
// RUN: not ember opt %s -p 'autodiff,optimizer,recompute' 2>&1 | filecheck %s --check-prefix=AFTER
// RUN: not ember opt %s -p 'autodiff,recompute,recompute' 2>&1 | filecheck %s --check-prefix=TWICE
// RUN: not ember opt %s -p 'recompute{strategy=some}' 2>&1 | filecheck %s --check-prefix=STRATEGY
// RUN: not ember opt %s -p 'autodiff,recompute{strategy=min-cut budget=100}' 2>&1 | filecheck %s --check-prefix=BUDGET
// RUN: ember opt %s -p 'autodiff,recompute{strategy=min-cut budget=100000}' | filecheck %s --check-prefix=FITS

// A pipeline in the wrong order is rejected with the reason, before anything runs.
// BEFORE: error: recompute needs the joint forward+backward graph: run autodiff first (e.g. -p 'decompose,autodiff,recompute')
// AFTER: error: recompute must run before optimizer: it splits the joint forward+backward graph that autodiff returns, and the update is neither
// TWICE: error: recompute: @f has been through recompute already (strategy 'none')
// STRATEGY: error: recompute: strategy='some' is not one of none, all, balanced, min-cut

// A budget under what any schedule needs fails, naming the best achievable peak; one
// that fits is met.
// BUDGET: error: recompute: the memory budget of 100 bytes cannot be met: the best achievable planned peak is {{[0-9]+}} bytes
// FITS: ember.recompute_strategy = "min-cut"
module {
  func.func @f(%x: tensor<8x4xf32>) -> tensor<f32> {
    %0 = "ember.param"() {id = "w", path = "fc.weight"} : () -> tensor<4x16xf32>
    %1 = "ember.matmul"(%x, %0) : (tensor<8x4xf32>, tensor<4x16xf32>) -> tensor<8x16xf32>
    %2 = "ember.tanh"(%1) : (tensor<8x16xf32>) -> tensor<8x16xf32>
    %3 = "ember.reduce_sum"(%2) {axes = [0, 1], keepdims = false} : (tensor<8x16xf32>) -> tensor<f32>
    func.return %3 : tensor<f32>
  }
}
