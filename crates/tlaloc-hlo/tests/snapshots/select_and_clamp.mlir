module @select_and_clamp {
  func.func public @main(%arg0: tensor<2x3xi1>, %arg1: tensor<2x3xf32>, %arg2: tensor<2x3xf32>) -> (tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>) {
    %0 = "stablehlo.select"(%arg0, %arg1, %arg2) : (tensor<2x3xi1>, tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
    %1 = "stablehlo.constant"() {value = dense<false> : tensor<i1>} : () -> tensor<i1>
    %2 = "stablehlo.select"(%1, %arg1, %arg2) : (tensor<i1>, tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
    %3 = "stablehlo.constant"() {value = dense<0xC0200000> : tensor<f32>} : () -> tensor<f32>
    %4 = "stablehlo.constant"() {value = dense<0x40900000> : tensor<f32>} : () -> tensor<f32>
    %5 = "stablehlo.clamp"(%3, %0, %4) : (tensor<f32>, tensor<2x3xf32>, tensor<f32>) -> tensor<2x3xf32>
    "func.return"(%0, %2, %5) : (tensor<2x3xf32>, tensor<2x3xf32>, tensor<2x3xf32>) -> ()
  }
}
