module @compare_signed_unsigned {
  func.func public @main(%arg0: tensor<4xi32>, %arg1: tensor<4xi32>, %arg2: tensor<4xui8>, %arg3: tensor<4xui8>) -> (tensor<4xi1>, tensor<4xi1>, tensor<4xi1>, tensor<4xi1>) {
    %0 = "stablehlo.compare"(%arg0, %arg1) {compare_type = #stablehlo<comparison_type SIGNED>, comparison_direction = #stablehlo<comparison_direction LT>} : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi1>
    %1 = "stablehlo.compare"(%arg2, %arg3) {compare_type = #stablehlo<comparison_type UNSIGNED>, comparison_direction = #stablehlo<comparison_direction LT>} : (tensor<4xui8>, tensor<4xui8>) -> tensor<4xi1>
    %2 = "stablehlo.compare"(%arg0, %arg1) {compare_type = #stablehlo<comparison_type SIGNED>, comparison_direction = #stablehlo<comparison_direction GE>} : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi1>
    %3 = "stablehlo.compare"(%arg2, %arg3) {compare_type = #stablehlo<comparison_type UNSIGNED>, comparison_direction = #stablehlo<comparison_direction GE>} : (tensor<4xui8>, tensor<4xui8>) -> tensor<4xi1>
    "func.return"(%0, %1, %2, %3) : (tensor<4xi1>, tensor<4xi1>, tensor<4xi1>, tensor<4xi1>) -> ()
  }
}
