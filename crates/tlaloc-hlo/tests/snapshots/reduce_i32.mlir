module @reduce_i32 {
  func.func public @main(%arg0: tensor<3x5xi32>) -> (tensor<3xi32>, tensor<5xi32>) {
    %0 = "stablehlo.constant"() {value = dense<0> : tensor<i32>} : () -> tensor<i32>
    %1 = "stablehlo.reduce"(%arg0, %0) ({
    ^bb0(%r1_a: tensor<i32>, %r1_b: tensor<i32>):
      %r1_out = "stablehlo.add"(%r1_a, %r1_b) : (tensor<i32>, tensor<i32>) -> tensor<i32>
      "stablehlo.return"(%r1_out) : (tensor<i32>) -> ()
    }) {dimensions = array<i64: 1>} : (tensor<3x5xi32>, tensor<i32>) -> tensor<3xi32>
    %2 = "stablehlo.constant"() {value = dense<-2147483648> : tensor<i32>} : () -> tensor<i32>
    %3 = "stablehlo.reduce"(%arg0, %2) ({
    ^bb0(%r3_a: tensor<i32>, %r3_b: tensor<i32>):
      %r3_out = "stablehlo.maximum"(%r3_a, %r3_b) : (tensor<i32>, tensor<i32>) -> tensor<i32>
      "stablehlo.return"(%r3_out) : (tensor<i32>) -> ()
    }) {dimensions = array<i64: 0>} : (tensor<3x5xi32>, tensor<i32>) -> tensor<5xi32>
    "func.return"(%1, %3) : (tensor<3xi32>, tensor<5xi32>) -> ()
  }
}
