module @iota {
  func.func public @main() -> (tensor<3x4xi32>, tensor<2x3xf32>) {
    %0 = "stablehlo.iota"() {iota_dimension = 1 : i64} : () -> tensor<3x4xi32>
    %1 = "stablehlo.iota"() {iota_dimension = 0 : i64} : () -> tensor<2x3xf32>
    "func.return"(%0, %1) : (tensor<3x4xi32>, tensor<2x3xf32>) -> ()
  }
}
