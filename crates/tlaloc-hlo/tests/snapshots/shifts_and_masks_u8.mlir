module @shifts_and_masks_u8 {
  func.func public @main(%arg0: tensor<8xui8>, %arg1: tensor<8xui8>) -> (tensor<8xui8>, tensor<8xui8>, tensor<8xui8>, tensor<8xui8>) {
    %0 = "stablehlo.constant"() {value = dense<15> : tensor<8xui8>} : () -> tensor<8xui8>
    %1 = "stablehlo.constant"() {value = dense<4> : tensor<8xui8>} : () -> tensor<8xui8>
    %2 = "stablehlo.and"(%arg0, %0) : (tensor<8xui8>, tensor<8xui8>) -> tensor<8xui8>
    %3 = "stablehlo.shift_right_logical"(%arg0, %1) : (tensor<8xui8>, tensor<8xui8>) -> tensor<8xui8>
    %4 = "stablehlo.shift_right_logical"(%arg0, %arg1) : (tensor<8xui8>, tensor<8xui8>) -> tensor<8xui8>
    %5 = "stablehlo.shift_left"(%arg0, %arg1) : (tensor<8xui8>, tensor<8xui8>) -> tensor<8xui8>
    "func.return"(%2, %3, %4, %5) : (tensor<8xui8>, tensor<8xui8>, tensor<8xui8>, tensor<8xui8>) -> ()
  }
}
