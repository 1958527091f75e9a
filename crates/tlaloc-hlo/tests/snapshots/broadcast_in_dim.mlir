module @broadcast_in_dim {
  func.func public @main(%arg0: tensor<3xf32>, %arg1: tensor<3x1xi32>, %arg2: tensor<2x3xf32>) -> (tensor<2x3xf32>, tensor<3x4xi32>, tensor<3x2x4xf32>, tensor<2x2x3xf32>) {
    %0 = "stablehlo.broadcast_in_dim"(%arg0) {broadcast_dimensions = array<i64: 1>} : (tensor<3xf32>) -> tensor<2x3xf32>
    %1 = "stablehlo.broadcast_in_dim"(%arg1) {broadcast_dimensions = array<i64: 0, 1>} : (tensor<3x1xi32>) -> tensor<3x4xi32>
    %2 = "stablehlo.broadcast_in_dim"(%arg2) {broadcast_dimensions = array<i64: 1, 0>} : (tensor<2x3xf32>) -> tensor<3x2x4xf32>
    %3 = "stablehlo.broadcast_in_dim"(%arg0) {broadcast_dimensions = array<i64: 2>} : (tensor<3xf32>) -> tensor<2x2x3xf32>
    "func.return"(%0, %1, %2, %3) : (tensor<2x3xf32>, tensor<3x4xi32>, tensor<3x2x4xf32>, tensor<2x2x3xf32>) -> ()
  }
}
