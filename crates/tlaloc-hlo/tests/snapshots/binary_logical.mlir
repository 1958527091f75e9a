module @binary_logical {
  func.func public @main(%arg0: tensor<4xi1>, %arg1: tensor<4xi1>, %arg2: tensor<4xi32>, %arg3: tensor<4xi32>) -> (tensor<4xi1>, tensor<4xi1>, tensor<4xi1>, tensor<4xi32>, tensor<4xi32>, tensor<4xi32>) {
    %0 = "stablehlo.and"(%arg0, %arg1) : (tensor<4xi1>, tensor<4xi1>) -> tensor<4xi1>
    %1 = "stablehlo.or"(%arg0, %arg1) : (tensor<4xi1>, tensor<4xi1>) -> tensor<4xi1>
    %2 = "stablehlo.not"(%arg0) : (tensor<4xi1>) -> tensor<4xi1>
    %3 = "stablehlo.and"(%arg2, %arg3) : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi32>
    %4 = "stablehlo.or"(%arg2, %arg3) : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi32>
    %5 = "stablehlo.not"(%arg2) : (tensor<4xi32>) -> tensor<4xi32>
    "func.return"(%0, %1, %2, %3, %4, %5) : (tensor<4xi1>, tensor<4xi1>, tensor<4xi1>, tensor<4xi32>, tensor<4xi32>, tensor<4xi32>) -> ()
  }
}
