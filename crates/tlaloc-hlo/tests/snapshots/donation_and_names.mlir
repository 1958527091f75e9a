module @donation_and_names {
  func.func public @main(%arg0: tensor<4xf32> loc("delta"), %arg1: tensor<4xf32> {tf.aliasing_output = 1 : i32} loc("kvPool[0]")) -> (tensor<f32>, tensor<4xf32>) {
    %0 = "stablehlo.constant"() {value = dense<0x00000000> : tensor<f32>} : () -> tensor<f32>
    %1 = "stablehlo.reduce"(%arg0, %0) ({
    ^bb0(%r1_a: tensor<f32>, %r1_b: tensor<f32>):
      %r1_out = "stablehlo.add"(%r1_a, %r1_b) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%r1_out) : (tensor<f32>) -> ()
    }) {dimensions = array<i64: 0>} : (tensor<4xf32>, tensor<f32>) -> tensor<f32>
    %2 = "stablehlo.add"(%arg1, %arg0) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    "func.return"(%1, %2) : (tensor<f32>, tensor<4xf32>) -> ()
  }
}
