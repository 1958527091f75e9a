module @gather_embedding {
  func.func public @main(%arg0: tensor<5x3xf32>, %arg1: tensor<4xi32>) -> (tensor<4x3xf32>) {
    %0 = "stablehlo.gather"(%arg0, %arg1) {dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 3>} : (tensor<5x3xf32>, tensor<4xi32>) -> tensor<4x3xf32>
    "func.return"(%0) : (tensor<4x3xf32>) -> ()
  }
}
