module @dot_general_bf16_to_f32 {
  func.func public @main(%arg0: tensor<2x8xbf16>, %arg1: tensor<8x3xbf16>) -> (tensor<2x3xf32>) {
    %0 = "stablehlo.dot_general"(%arg0, %arg1) {dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>, precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]} : (tensor<2x8xbf16>, tensor<8x3xbf16>) -> tensor<2x3xf32>
    "func.return"(%0) : (tensor<2x3xf32>) -> ()
  }
}
