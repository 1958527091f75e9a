module @gather_pages {
  func.func public @main(%arg0: tensor<6x2x1x3xf32>, %arg1: tensor<2x3xi32>) -> (tensor<2x3x2x1x3xf32>) {
    %0 = "stablehlo.gather"(%arg0, %arg1) {dimension_numbers = #stablehlo.gather<offset_dims = [2, 3, 4], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 2>, indices_are_sorted = false, slice_sizes = array<i64: 1, 2, 1, 3>} : (tensor<6x2x1x3xf32>, tensor<2x3xi32>) -> tensor<2x3x2x1x3xf32>
    "func.return"(%0) : (tensor<2x3x2x1x3xf32>) -> ()
  }
}
