module @concatenate {
  func.func public @main(%arg0: tensor<2x2xi32>, %arg1: tensor<2x3xi32>) -> (tensor<2x7xi32>) {
    %0 = "stablehlo.concatenate"(%arg0, %arg1, %arg0) {dimension = 1 : i64} : (tensor<2x2xi32>, tensor<2x3xi32>, tensor<2x2xi32>) -> tensor<2x7xi32>
    "func.return"(%0) : (tensor<2x7xi32>) -> ()
  }
}
