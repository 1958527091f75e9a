module @binary_i32 {
  func.func public @main(%arg0: tensor<12xi32>, %arg1: tensor<12xi32>) -> (tensor<12xi32>, tensor<12xi32>, tensor<12xi32>, tensor<12xi32>, tensor<12xi32>, tensor<12xi32>, tensor<12xi32>, tensor<12xi32>) {
    %0 = "stablehlo.add"(%arg0, %arg1) : (tensor<12xi32>, tensor<12xi32>) -> tensor<12xi32>
    %1 = "stablehlo.subtract"(%arg0, %arg1) : (tensor<12xi32>, tensor<12xi32>) -> tensor<12xi32>
    %2 = "stablehlo.multiply"(%arg0, %arg1) : (tensor<12xi32>, tensor<12xi32>) -> tensor<12xi32>
    %3 = "stablehlo.divide"(%arg0, %arg1) : (tensor<12xi32>, tensor<12xi32>) -> tensor<12xi32>
    %4 = "stablehlo.maximum"(%arg0, %arg1) : (tensor<12xi32>, tensor<12xi32>) -> tensor<12xi32>
    %5 = "stablehlo.minimum"(%arg0, %arg1) : (tensor<12xi32>, tensor<12xi32>) -> tensor<12xi32>
    %6 = "stablehlo.negate"(%arg0) : (tensor<12xi32>) -> tensor<12xi32>
    %7 = "stablehlo.abs"(%arg1) : (tensor<12xi32>) -> tensor<12xi32>
    "func.return"(%0, %1, %2, %3, %4, %5, %6, %7) : (tensor<12xi32>, tensor<12xi32>, tensor<12xi32>, tensor<12xi32>, tensor<12xi32>, tensor<12xi32>, tensor<12xi32>, tensor<12xi32>) -> ()
  }
}
