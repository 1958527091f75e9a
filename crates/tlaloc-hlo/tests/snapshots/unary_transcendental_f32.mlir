module @unary_transcendental_f32 {
  func.func public @main(%arg0: tensor<16xf32>, %arg1: tensor<16xf32>) -> (tensor<16xf32>, tensor<16xf32>, tensor<16xf32>, tensor<16xf32>, tensor<16xf32>, tensor<16xf32>) {
    %0 = "stablehlo.exponential"(%arg0) : (tensor<16xf32>) -> tensor<16xf32>
    %1 = "stablehlo.log"(%arg1) : (tensor<16xf32>) -> tensor<16xf32>
    %2 = "stablehlo.rsqrt"(%arg1) : (tensor<16xf32>) -> tensor<16xf32>
    %3 = "stablehlo.tanh"(%arg0) : (tensor<16xf32>) -> tensor<16xf32>
    %4 = "stablehlo.logistic"(%arg0) : (tensor<16xf32>) -> tensor<16xf32>
    %5 = "stablehlo.power"(%arg1, %arg0) : (tensor<16xf32>, tensor<16xf32>) -> tensor<16xf32>
    "func.return"(%0, %1, %2, %3, %4, %5) : (tensor<16xf32>, tensor<16xf32>, tensor<16xf32>, tensor<16xf32>, tensor<16xf32>, tensor<16xf32>) -> ()
  }
}
