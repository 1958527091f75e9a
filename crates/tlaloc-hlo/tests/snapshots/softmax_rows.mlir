module @softmax_rows {
  func.func public @main(%arg0: tensor<3x5xf32>) -> (tensor<3x5xf32>) {
    %0 = "stablehlo.constant"() {value = dense<0xFF800000> : tensor<f32>} : () -> tensor<f32>
    %1 = "stablehlo.reduce"(%arg0, %0) ({
    ^bb0(%r1_a: tensor<f32>, %r1_b: tensor<f32>):
      %r1_out = "stablehlo.maximum"(%r1_a, %r1_b) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%r1_out) : (tensor<f32>) -> ()
    }) {dimensions = array<i64: 1>} : (tensor<3x5xf32>, tensor<f32>) -> tensor<3xf32>
    %2 = "stablehlo.reshape"(%1) : (tensor<3xf32>) -> tensor<3x1xf32>
    %3 = "stablehlo.broadcast_in_dim"(%2) {broadcast_dimensions = array<i64: 0, 1>} : (tensor<3x1xf32>) -> tensor<3x5xf32>
    %4 = "stablehlo.subtract"(%arg0, %3) : (tensor<3x5xf32>, tensor<3x5xf32>) -> tensor<3x5xf32>
    %5 = "stablehlo.exponential"(%4) : (tensor<3x5xf32>) -> tensor<3x5xf32>
    %6 = "stablehlo.constant"() {value = dense<0x00000000> : tensor<f32>} : () -> tensor<f32>
    %7 = "stablehlo.reduce"(%5, %6) ({
    ^bb0(%r7_a: tensor<f32>, %r7_b: tensor<f32>):
      %r7_out = "stablehlo.add"(%r7_a, %r7_b) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%r7_out) : (tensor<f32>) -> ()
    }) {dimensions = array<i64: 1>} : (tensor<3x5xf32>, tensor<f32>) -> tensor<3xf32>
    %8 = "stablehlo.reshape"(%7) : (tensor<3xf32>) -> tensor<3x1xf32>
    %9 = "stablehlo.broadcast_in_dim"(%8) {broadcast_dimensions = array<i64: 0, 1>} : (tensor<3x1xf32>) -> tensor<3x5xf32>
    %10 = "stablehlo.divide"(%5, %9) : (tensor<3x5xf32>, tensor<3x5xf32>) -> tensor<3x5xf32>
    "func.return"(%10) : (tensor<3x5xf32>) -> ()
  }
}
