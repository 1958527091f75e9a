module @unary_exact_f32 {
  func.func public @main(%arg0: tensor<12xf32>) -> (tensor<12xf32>, tensor<12xf32>, tensor<12xf32>) {
    %0 = "stablehlo.abs"(%arg0) : (tensor<12xf32>) -> tensor<12xf32>
    %1 = "stablehlo.negate"(%arg0) : (tensor<12xf32>) -> tensor<12xf32>
    %2 = "stablehlo.sqrt"(%0) : (tensor<12xf32>) -> tensor<12xf32>
    "func.return"(%1, %0, %2) : (tensor<12xf32>, tensor<12xf32>, tensor<12xf32>) -> ()
  }
}
