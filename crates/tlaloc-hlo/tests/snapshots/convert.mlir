module @convert {
  func.func public @main(%arg0: tensor<12xf32>, %arg1: tensor<2xi1>, %arg2: tensor<2xi32>) -> (tensor<12xbf16>, tensor<12xf32>, tensor<12xf16>, tensor<12xi32>, tensor<2xf32>, tensor<2xf32>, tensor<2xi64>) {
    %0 = "stablehlo.convert"(%arg0) : (tensor<12xf32>) -> tensor<12xbf16>
    %1 = "stablehlo.convert"(%0) : (tensor<12xbf16>) -> tensor<12xf32>
    %2 = "stablehlo.convert"(%arg0) : (tensor<12xf32>) -> tensor<12xf16>
    %3 = "stablehlo.convert"(%arg0) : (tensor<12xf32>) -> tensor<12xi32>
    %4 = "stablehlo.convert"(%arg1) : (tensor<2xi1>) -> tensor<2xf32>
    %5 = "stablehlo.convert"(%arg2) : (tensor<2xi32>) -> tensor<2xf32>
    %6 = "stablehlo.convert"(%arg2) : (tensor<2xi32>) -> tensor<2xi64>
    "func.return"(%0, %1, %2, %3, %4, %5, %6) : (tensor<12xbf16>, tensor<12xf32>, tensor<12xf16>, tensor<12xi32>, tensor<2xf32>, tensor<2xf32>, tensor<2xi64>) -> ()
  }
}
