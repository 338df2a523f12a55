// RUN: ember opt %s -p 'autodiff{loss_scale=true},optimizer{kind=sgd momentum=0.9}' | filecheck %s

// Dynamic loss scaling (precision="16-mixed"): the backward starts from the new argument
// %loss_scale rather than from 1; the update divides the gradients by it, and a step with
// any inf or NaN gradient (sum(g * 0) is then NaN, not 0) keeps every old param and state
// value. Result 1 says whether the gradients were finite, for the runtime's scaler.

// CHECK-LABEL: func.func @train_step(%x: tensor<3xf32>, %loss_scale: tensor<f32>, %lr: tensor<f32>, %step: tensor<f32>, %arg4: tensor<3xf32>) -> (tensor<f32>, tensor<i1>, tensor<3xf32>, tensor<3xf32>)
// CHECK-SAME:    ember.grads_finite = 1, ember.loss_scale = 1
// CHECK:         "ember.reshape"(%loss_scale)
// CHECK:         [[ONE:%[0-9]+]] = "ember.constant"() {value = dense<1.0> : tensor<f32>}
// CHECK-NEXT:    [[INV:%[0-9]+]] = "ember.div"([[ONE]], %loss_scale)
// CHECK-NEXT:    [[G:%[0-9]+]] = "ember.mul"({{%[0-9]+}}, [[INV]])
// CHECK-NEXT:    [[ZERO:%[0-9]+]] = "ember.constant"() {value = dense<0.0> : tensor<f32>}
// CHECK-NEXT:    [[POISON:%[0-9]+]] = "ember.mul"([[G]], [[ZERO]])
// CHECK-NEXT:    [[SUM:%[0-9]+]] = "ember.reduce_sum"([[POISON]])
// CHECK:         [[FINITE:%[0-9]+]] = "ember.cmp"([[SUM]], {{%[0-9]+}}) {predicate = "eq"}
// CHECK:         [[BUF:%[0-9]+]] = "ember.add"({{%[0-9]+}}, [[G]])
// CHECK:         [[P:%[0-9]+]] = "ember.sub"(%0, {{%[0-9]+}})
// CHECK-NEXT:    [[NEWP:%[0-9]+]] = "ember.select"([[FINITE]], [[P]], %0)
// CHECK-NEXT:    [[NEWBUF:%[0-9]+]] = "ember.select"([[FINITE]], [[BUF]], %arg4)
// CHECK-NEXT:    func.return %2, [[FINITE]], [[NEWP]], [[NEWBUF]] : tensor<f32>, tensor<i1>, tensor<3xf32>, tensor<3xf32>

module {
  func.func @train_step(%x: tensor<3xf32>) -> tensor<f32> {
    %0 = "ember.param"() {id = "657rfnrc2o1ud", path = "w"} : () -> tensor<3xf32>
    %1 = "ember.mul"(%0, %x) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
    %2 = "ember.reduce_sum"(%1) {axes = [0], keepdims = false} : (tensor<3xf32>) -> tensor<f32>
    func.return %2 : tensor<f32>
  }
}
