module @dot_general_matmul_highest {
  func.func public @main(%arg0: tensor<3x5xf32>, %arg1: tensor<4x3xf32>) -> (tensor<5x4xf32>) {
    %0 = "stablehlo.dot_general"(%arg0, %arg1) {dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [0], rhs_contracting_dimensions = [1]>, precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]} : (tensor<3x5xf32>, tensor<4x3xf32>) -> tensor<5x4xf32>
    "func.return"(%0) : (tensor<5x4xf32>) -> ()
  }
}
