module @dot_general_batched {
  func.func public @main(%arg0: tensor<2x3x4x5xf32>, %arg1: tensor<2x5x4x6xf32>) -> (tensor<2x3x6xf32>) {
    %0 = "stablehlo.dot_general"(%arg0, %arg1) {dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2, 3], rhs_contracting_dimensions = [2, 1]>, precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]} : (tensor<2x3x4x5xf32>, tensor<2x5x4x6xf32>) -> tensor<2x3x6xf32>
    "func.return"(%0) : (tensor<2x3x6xf32>) -> ()
  }
}
