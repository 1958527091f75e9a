module @slice {
  func.func public @main(%arg0: tensor<5x6xi32>) -> (tensor<2x2xi32>) {
    %0 = "stablehlo.slice"(%arg0) {start_indices = array<i64: 1, 0>, limit_indices = array<i64: 5, 5>, strides = array<i64: 2, 3>} : (tensor<5x6xi32>) -> tensor<2x2xi32>
    "func.return"(%0) : (tensor<2x2xi32>) -> ()
  }
}
