// RUN: ember opt %s -p 'decompose{linear=split}' | filecheck %s --check-prefix=SPLIT
// RUN: ember opt %s -p 'decompose{linear=keep}' | filecheck %s --check-prefix=KEEP
// RUN: ember opt %s -p decompose | filecheck %s --check-prefix=SPLIT

// split: nn.linear becomes one rank-2 matmul (leading dims flattened) plus a broadcast add
// of the bias; keep: nn.linear stays. The graph attribute records the choice.

// SPLIT-LABEL: func.func @linear(%x: tensor<2x5x20xf32>) -> tensor<2x5x48xf32> attributes {ember.linear = "split"}
// SPLIT:         [[W:%[0-9]+]] = "ember.param"() {id = "9199rs1gnooc6", path = "fc.weight"}
// SPLIT-NEXT:    [[B:%[0-9]+]] = "ember.param"() {id = "tumvmkapa4mm2", path = "fc.bias"}
// SPLIT-NEXT:    [[X2:%[0-9]+]] = "ember.reshape"(%x) {shape = [10, 20]}
// SPLIT-NEXT:    [[Y2:%[0-9]+]] = "ember.matmul"([[X2]], [[W]]) : (tensor<10x20xf32>, tensor<20x48xf32>) -> tensor<10x48xf32>
// SPLIT-NEXT:    [[Y:%[0-9]+]] = "ember.reshape"([[Y2]]) {shape = [2, 5, 48]}
// SPLIT-NEXT:    [[Z:%[0-9]+]] = "ember.add"([[Y]], [[B]]) : (tensor<2x5x48xf32>, tensor<48xf32>) -> tensor<2x5x48xf32>
// SPLIT-NEXT:    func.return [[Z]] :
// SPLIT-NOT:     nn.linear

// KEEP-LABEL:  func.func @linear(%x: tensor<2x5x20xf32>) -> tensor<2x5x48xf32> attributes {ember.linear = "keep"}
// KEEP-NOT:      ember.matmul
// KEEP:          "nn.linear"(%x, {{%[0-9]+}}, {{%[0-9]+}})
module {
  func.func @linear(%x: tensor<2x5x20xf32>) -> tensor<2x5x48xf32> {
    %0 = "ember.param"() {id = "9199rs1gnooc6", path = "fc.weight"} : () -> tensor<20x48xf32>
    %1 = "ember.param"() {id = "tumvmkapa4mm2", path = "fc.bias"} : () -> tensor<48xf32>
    %2 = "nn.linear"(%x, %0, %1) : (tensor<2x5x20xf32>, tensor<20x48xf32>, tensor<48xf32>) -> tensor<2x5x48xf32>
    func.return %2 : tensor<2x5x48xf32>
  }
}
