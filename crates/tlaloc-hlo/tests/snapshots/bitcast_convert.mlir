module @bitcast_convert {
  func.func public @main(%arg0: tensor<3x2xui8>, %arg1: tensor<6xui8>, %arg2: tensor<2xf32>) -> (tensor<3xf16>, tensor<6xi8>, tensor<2x4xui8>) {
    %0 = "stablehlo.bitcast_convert"(%arg0) : (tensor<3x2xui8>) -> tensor<3xf16>
    %1 = "stablehlo.bitcast_convert"(%arg1) : (tensor<6xui8>) -> tensor<6xi8>
    %2 = "stablehlo.bitcast_convert"(%arg2) : (tensor<2xf32>) -> tensor<2x4xui8>
    "func.return"(%0, %1, %2) : (tensor<3xf16>, tensor<6xi8>, tensor<2x4xui8>) -> ()
  }
}
