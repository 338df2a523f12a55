// RUN: not ember opt %s -p pad-mask 2>&1 | filecheck %s

// Causal attention of unpadded queries over padded keys would let real queries see padded
// keys: refused, naming the op and its line (the runtime then compiles that length exactly).
// CHECK: error: pad-mask: cannot mask nn.attention at model.py:7: causal attention whose keys are padded unlike its queries
module {
  func.func @f(%x: tensor<2x8x4xf32>, %q: tensor<2x4x4xf32>, %len_T: tensor<i64>) -> tensor<f32> attributes {ember.length_args = [["T", 2]], ember.padded_args = [[0, 1, "T"]]} {
    %0 = "nn.attention"(%q, %x, %x) {causal = true, scale = 0.5} : (tensor<2x4x4xf32>, tensor<2x8x4xf32>, tensor<2x8x4xf32>) -> tensor<2x4x4xf32> loc("model.py":7:0)
    %1 = "ember.reduce_sum"(%0) {axes = [0, 1, 2], keepdims = false} : (tensor<2x4x4xf32>) -> tensor<f32>
    func.return %1 : tensor<f32>
  }
}
