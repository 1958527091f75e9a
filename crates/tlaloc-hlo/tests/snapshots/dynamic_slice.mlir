module @dynamic_slice {
  func.func public @main(%arg0: tensor<4x5xi32>, %arg1: tensor<i32>, %arg2: tensor<i32>) -> (tensor<2x3xi32>) {
    %0 = "stablehlo.dynamic_slice"(%arg0, %arg1, %arg2) {slice_sizes = array<i64: 2, 3>} : (tensor<4x5xi32>, tensor<i32>, tensor<i32>) -> tensor<2x3xi32>
    "func.return"(%0) : (tensor<2x3xi32>) -> ()
  }
}
