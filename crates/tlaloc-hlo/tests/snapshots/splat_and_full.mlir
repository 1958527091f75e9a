module @splat_and_full {
  func.func public @main() -> (tensor<2x2xf32>, tensor<3xbf16>, tensor<2xi64>, tensor<2xi1>, tensor<f32>) {
    %0 = "stablehlo.constant"() {value = dense<0xBFC00000> : tensor<2x2xf32>} : () -> tensor<2x2xf32>
    %1 = "stablehlo.constant"() {value = dense<0x3DCD> : tensor<3xbf16>} : () -> tensor<3xbf16>
    %2 = "stablehlo.constant"() {value = dense<-3> : tensor<2xi64>} : () -> tensor<2xi64>
    %3 = "stablehlo.constant"() {value = dense<true> : tensor<2xi1>} : () -> tensor<2xi1>
    %4 = "stablehlo.constant"() {value = dense<0xFF800000> : tensor<f32>} : () -> tensor<f32>
    "func.return"(%0, %1, %2, %3, %4) : (tensor<2x2xf32>, tensor<3xbf16>, tensor<2xi64>, tensor<2xi1>, tensor<f32>) -> ()
  }
}
