module @reduce_sum_max_min {
  func.func public @main(%arg0: tensor<2x3x4xf32>) -> (tensor<2x3xf32>, tensor<3xf32>, tensor<2x4xf32>, tensor<f32>) {
    %0 = "stablehlo.constant"() {value = dense<0x3F000000> : tensor<f32>} : () -> tensor<f32>
    %1 = "stablehlo.constant"() {value = dense<0x00000000> : tensor<f32>} : () -> tensor<f32>
    %2 = "stablehlo.reduce"(%arg0, %1) ({
    ^bb0(%r2_a: tensor<f32>, %r2_b: tensor<f32>):
      %r2_out = "stablehlo.add"(%r2_a, %r2_b) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%r2_out) : (tensor<f32>) -> ()
    }) {dimensions = array<i64: 2>} : (tensor<2x3x4xf32>, tensor<f32>) -> tensor<2x3xf32>
    %3 = "stablehlo.constant"() {value = dense<0xFF800000> : tensor<f32>} : () -> tensor<f32>
    %4 = "stablehlo.reduce"(%arg0, %3) ({
    ^bb0(%r4_a: tensor<f32>, %r4_b: tensor<f32>):
      %r4_out = "stablehlo.maximum"(%r4_a, %r4_b) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%r4_out) : (tensor<f32>) -> ()
    }) {dimensions = array<i64: 0, 2>} : (tensor<2x3x4xf32>, tensor<f32>) -> tensor<3xf32>
    %5 = "stablehlo.constant"() {value = dense<0x7F800000> : tensor<f32>} : () -> tensor<f32>
    %6 = "stablehlo.reduce"(%arg0, %5) ({
    ^bb0(%r6_a: tensor<f32>, %r6_b: tensor<f32>):
      %r6_out = "stablehlo.minimum"(%r6_a, %r6_b) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%r6_out) : (tensor<f32>) -> ()
    }) {dimensions = array<i64: 1>} : (tensor<2x3x4xf32>, tensor<f32>) -> tensor<2x4xf32>
    %7 = "stablehlo.reduce"(%arg0, %0) ({
    ^bb0(%r7_a: tensor<f32>, %r7_b: tensor<f32>):
      %r7_out = "stablehlo.add"(%r7_a, %r7_b) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%r7_out) : (tensor<f32>) -> ()
    }) {dimensions = array<i64: 0, 1, 2>} : (tensor<2x3x4xf32>, tensor<f32>) -> tensor<f32>
    "func.return"(%2, %4, %6, %7) : (tensor<2x3xf32>, tensor<3xf32>, tensor<2x4xf32>, tensor<f32>) -> ()
  }
}
