module @constants {
  func.func public @main() -> (tensor<2x3xf32>, tensor<2x2xbf16>, tensor<4xf16>, tensor<3xi32>, tensor<2xi64>, tensor<3xi8>, tensor<2xui8>, tensor<2x2xi1>, tensor<i32>, tensor<0x3xf32>) {
    %0 = "stablehlo.constant"() {value = dense<[[0x3F800000, 0x80000000, 0x3EAAAAAB], [0x7F800000, 0xFF800000, 0x7FC00000]]> : tensor<2x3xf32>} : () -> tensor<2x3xf32>
    %1 = "stablehlo.constant"() {value = dense<[[0x3DCD, 0xC020], [0x4780, 0x3A83]]> : tensor<2x2xbf16>} : () -> tensor<2x2xbf16>
    %2 = "stablehlo.constant"() {value = dense<[0x2E66, 0xC100, 0x7BFF, 0x1419]> : tensor<4xf16>} : () -> tensor<4xf16>
    %3 = "stablehlo.constant"() {value = dense<[-2147483648, 0, 2147483647]> : tensor<3xi32>} : () -> tensor<3xi32>
    %4 = "stablehlo.constant"() {value = dense<[-9223372036854775808, 9223372036854775807]> : tensor<2xi64>} : () -> tensor<2xi64>
    %5 = "stablehlo.constant"() {value = dense<[-128, -1, 127]> : tensor<3xi8>} : () -> tensor<3xi8>
    %6 = "stablehlo.constant"() {value = dense<[0, 255]> : tensor<2xui8>} : () -> tensor<2xui8>
    %7 = "stablehlo.constant"() {value = dense<[[true, false], [false, true]]> : tensor<2x2xi1>} : () -> tensor<2x2xi1>
    %8 = "stablehlo.constant"() {value = dense<-7> : tensor<i32>} : () -> tensor<i32>
    %9 = "stablehlo.constant"() {value = dense<0x00000000> : tensor<0x3xf32>} : () -> tensor<0x3xf32>
    "func.return"(%0, %1, %2, %3, %4, %5, %6, %7, %8, %9) : (tensor<2x3xf32>, tensor<2x2xbf16>, tensor<4xf16>, tensor<3xi32>, tensor<2xi64>, tensor<3xi8>, tensor<2xui8>, tensor<2x2xi1>, tensor<i32>, tensor<0x3xf32>) -> ()
  }
}
