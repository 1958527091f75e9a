module @binary_bf16 {
  func.func public @main(%arg0: tensor<16xbf16>, %arg1: tensor<16xbf16>) -> (tensor<16xbf16>, tensor<16xbf16>, tensor<16xbf16>) {
    %0 = "stablehlo.add"(%arg0, %arg1) : (tensor<16xbf16>, tensor<16xbf16>) -> tensor<16xbf16>
    %1 = "stablehlo.multiply"(%arg0, %arg1) : (tensor<16xbf16>, tensor<16xbf16>) -> tensor<16xbf16>
    %2 = "stablehlo.divide"(%arg0, %arg1) : (tensor<16xbf16>, tensor<16xbf16>) -> tensor<16xbf16>
    "func.return"(%0, %1, %2) : (tensor<16xbf16>, tensor<16xbf16>, tensor<16xbf16>) -> ()
  }
}
