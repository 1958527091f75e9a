module @scatter_replace_drops_out_of_bounds {
  func.func public @main(%arg0: tensor<6x3xf32>, %arg1: tensor<4x1xi32>, %arg2: tensor<4x3xf32>) -> (tensor<6x3xf32>) {
    %0 = "stablehlo.scatter"(%arg0, %arg1, %arg2) ({
    ^bb0(%r0_old: tensor<f32>, %r0_new: tensor<f32>):
      "stablehlo.return"(%r0_new) : (tensor<f32>) -> ()
    }) {indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = true} : (tensor<6x3xf32>, tensor<4x1xi32>, tensor<4x3xf32>) -> tensor<6x3xf32>
    "func.return"(%0) : (tensor<6x3xf32>) -> ()
  }
}
