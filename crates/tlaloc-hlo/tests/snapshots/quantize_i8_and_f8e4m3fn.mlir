module @quantize {
  func.func public @main(%arg0: tensor<20xf32>) -> (tensor<20xf32>, tensor<20xi8>, tensor<20xf8E4M3FN>, tensor<20xf32>) {
    %0 = "stablehlo.round_nearest_even"(%arg0) : (tensor<20xf32>) -> tensor<20xf32>
    %1 = "stablehlo.constant"() {value = dense<0xC2FE0000> : tensor<20xf32>} : () -> tensor<20xf32>
    %2 = "stablehlo.constant"() {value = dense<0x42FE0000> : tensor<20xf32>} : () -> tensor<20xf32>
    %3 = "stablehlo.clamp"(%1, %0, %2) : (tensor<20xf32>, tensor<20xf32>, tensor<20xf32>) -> tensor<20xf32>
    %4 = "stablehlo.convert"(%3) : (tensor<20xf32>) -> tensor<20xi8>
    %5 = "stablehlo.convert"(%arg0) : (tensor<20xf32>) -> tensor<20xf8E4M3FN>
    %6 = "stablehlo.convert"(%5) : (tensor<20xf8E4M3FN>) -> tensor<20xf32>
    "func.return"(%0, %4, %5, %6) : (tensor<20xf32>, tensor<20xi8>, tensor<20xf8E4M3FN>, tensor<20xf32>) -> ()
  }
}
