// RUN: ember opt %s -p plan-memory | filecheck %s

// tanh writes over exp's buffer (exp dies there); the returned mul and scalar sum are the
// caller's buffers, held from the first op, so mul never writes over neg's (the sum's slot
// is 64 bytes). The arena is 3 x 1024 + 64 bytes; the peak adds the 1024-byte input.
// CHECK: func.func @f(%x: tensor<256xf32>) -> (tensor<f32>, tensor<256xf32>) attributes {ember.arena_bytes = 3136, ember.peak_bytes = 4160}
module {
  func.func @f(%x: tensor<256xf32>) -> (tensor<f32>, tensor<256xf32>) {
    %0 = "ember.exp"(%x) : (tensor<256xf32>) -> tensor<256xf32>
    %1 = "ember.tanh"(%0) : (tensor<256xf32>) -> tensor<256xf32>
    %2 = "ember.reduce_sum"(%1) {axes = [0], keepdims = false} : (tensor<256xf32>) -> tensor<f32>
    %3 = "ember.neg"(%x) : (tensor<256xf32>) -> tensor<256xf32>
    %4 = "ember.mul"(%3, %1) : (tensor<256xf32>, tensor<256xf32>) -> tensor<256xf32>
    func.return %2, %4 : tensor<f32>, tensor<256xf32>
  }
}
