// RUN: ember opt %s -p fuse | filecheck %s

// An optimizer's update shares scalars (here the weight decay factor 1 - lr * wd) among
// params of every shape. A group never joins a kernel over more dims than it varies along
// (none of them reduced) while a value of it is read outside that kernel: it would be
// computed and stored again at every point of those dims. So the factor is a kernel of
// its own, and the embedding's and the bias's updates read it: no out map repeats a store
// (a 0 stride). A bias's gradient summed over the rows still carries its update: after
// the reduction the update runs once per column. A [8] value read only by the kernel over
// [65, 8] still joins it (nothing stored twice).

// CHECK-LABEL: func.func @update
// CHECK:         [[F:%[0-9]+]] = "kernel.fused"(%lr) ({
// CHECK:         }) {maps = {{\[\[}}]], out_maps = {{\[\[}}]], out_types = [tensor<f32>], space = []}
// CHECK:         [[E:%[0-9]+]] = "kernel.fused"(%e, [[F]]) ({
// CHECK:         }) {maps = {{\[\[}}8, 1], [0, 0]], out_maps = {{\[\[}}8, 1]], out_types = [tensor<65x8xf32>], space = [65, 8]}
// CHECK:         [[B:%[0-9]+]] = "kernel.fused"(%b, [[F]]) ({
// CHECK:         }) {maps = {{\[\[}}1], [0]], out_maps = {{\[\[}}1]], out_types = [tensor<8xf32>], space = [8]}
// CHECK:         [[C:%[0-9]+]] = "kernel.fused"(%dy, %c, [[F]]) ({
// CHECK:           "kernel.reduce"({{.*}}) {dims = [0], kind = "add"}
// CHECK:         }) {maps = {{\[\[}}8, 1], [0, 1], [0, 0]], out_maps = {{\[\[}}0, 1]], out_types = [tensor<8xf32>], space = [65, 8]}
// CHECK:         [[Y:%[0-9]+]] = "kernel.fused"(%b, %dy) ({
// CHECK:           "kernel.mul"
// CHECK:           "kernel.add"
// CHECK:         }) {maps = {{\[\[}}0, 1], [8, 1]], out_maps = {{\[\[}}8, 1]], out_types = [tensor<65x8xf32>], space = [65, 8]}
// CHECK-NOT:     "kernel.fused"
// CHECK:         func.return [[E]], [[B]], [[C]], [[Y]]
func.func @update(%lr: tensor<f32>, %e: tensor<65x8xf32>, %b: tensor<8xf32>, %c: tensor<8xf32>, %dy: tensor<65x8xf32>) -> (tensor<65x8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<65x8xf32>) {
  %wd = "ember.constant"() {value = dense<1.000000e-02> : tensor<f32>} : () -> tensor<f32>
  %one = "ember.constant"() {value = dense<1.000000e+00> : tensor<f32>} : () -> tensor<f32>
  %0 = "ember.mul"(%lr, %wd) : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %1 = "ember.sub"(%one, %0) : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %2 = "ember.mul"(%e, %1) : (tensor<65x8xf32>, tensor<f32>) -> tensor<65x8xf32>
  %3 = "ember.mul"(%b, %1) : (tensor<8xf32>, tensor<f32>) -> tensor<8xf32>
  %4 = "ember.reduce_sum"(%dy) {axes = [0], keepdims = false} : (tensor<65x8xf32>) -> tensor<8xf32>
  %5 = "ember.mul"(%c, %1) : (tensor<8xf32>, tensor<f32>) -> tensor<8xf32>
  %6 = "ember.sub"(%5, %4) : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32>
  %two = "ember.constant"() {value = dense<2.000000e+00> : tensor<f32>} : () -> tensor<f32>
  %7 = "ember.mul"(%b, %two) : (tensor<8xf32>, tensor<f32>) -> tensor<8xf32>
  %8 = "ember.add"(%dy, %7) : (tensor<65x8xf32>, tensor<8xf32>) -> tensor<65x8xf32>
  func.return %2, %3, %6, %8 : tensor<65x8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<65x8xf32>
}
