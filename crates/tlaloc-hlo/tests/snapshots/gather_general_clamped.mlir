module @gather_general_clamped {
  func.func public @main(%arg0: tensor<4x5xi32>, %arg1: tensor<3x2xi32>) -> (tensor<3x2x3xi32>) {
    %0 = "stablehlo.gather"(%arg0, %arg1) {dimension_numbers = #stablehlo.gather<offset_dims = [1, 2], start_index_map = [0, 1], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 2, 3>} : (tensor<4x5xi32>, tensor<3x2xi32>) -> tensor<3x2x3xi32>
    "func.return"(%0) : (tensor<3x2x3xi32>) -> ()
  }
}
