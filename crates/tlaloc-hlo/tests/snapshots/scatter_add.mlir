module @scatter_add {
  func.func public @main(%arg0: tensor<5xf32>, %arg1: tensor<5xi32>, %arg2: tensor<5xf32>) -> (tensor<5xf32>) {
    %0 = "stablehlo.scatter"(%arg0, %arg1, %arg2) ({
    ^bb0(%r0_old: tensor<f32>, %r0_new: tensor<f32>):
      %r0_sum = "stablehlo.add"(%r0_old, %r0_new) : (tensor<f32>, tensor<f32>) -> tensor<f32>
      "stablehlo.return"(%r0_sum) : (tensor<f32>) -> ()
    }) {indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false} : (tensor<5xf32>, tensor<5xi32>, tensor<5xf32>) -> tensor<5xf32>
    "func.return"(%0) : (tensor<5xf32>) -> ()
  }
}
