module @reshape_transpose {
  func.func public @main(%arg0: tensor<2x3x4xi32>) -> (tensor<6x4xi32>, tensor<4x2x3xi32>) {
    %0 = "stablehlo.reshape"(%arg0) : (tensor<2x3x4xi32>) -> tensor<6x4xi32>
    %1 = "stablehlo.transpose"(%arg0) {permutation = array<i64: 2, 0, 1>} : (tensor<2x3x4xi32>) -> tensor<4x2x3xi32>
    "func.return"(%0, %1) : (tensor<6x4xi32>, tensor<4x2x3xi32>) -> ()
  }
}
