module @argmax_i32 {
  func.func public @main(%arg0: tensor<4x6xi32>) -> (tensor<6xi32>, tensor<6xi64>) {
    %0 = "stablehlo.iota"() {iota_dimension = 0 : i64} : () -> tensor<4x6xi64>
    %1 = "stablehlo.constant"() {value = dense<-2147483648> : tensor<i32>} : () -> tensor<i32>
    %2 = "stablehlo.constant"() {value = dense<0> : tensor<i64>} : () -> tensor<i64>
    %3:2 = "stablehlo.reduce"(%arg0, %0, %1, %2) ({
    ^bb0(%r3_av: tensor<i32>, %r3_ai: tensor<i64>, %r3_bv: tensor<i32>, %r3_bi: tensor<i64>):
      %r3_gt = "stablehlo.compare"(%r3_av, %r3_bv) {compare_type = #stablehlo<comparison_type SIGNED>, comparison_direction = #stablehlo<comparison_direction GT>} : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %r3_eq = "stablehlo.compare"(%r3_av, %r3_bv) {compare_type = #stablehlo<comparison_type SIGNED>, comparison_direction = #stablehlo<comparison_direction EQ>} : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %r3_lower = "stablehlo.compare"(%r3_ai, %r3_bi) {compare_type = #stablehlo<comparison_type SIGNED>, comparison_direction = #stablehlo<comparison_direction LT>} : (tensor<i64>, tensor<i64>) -> tensor<i1>
      %r3_tiewin = "stablehlo.and"(%r3_eq, %r3_lower) : (tensor<i1>, tensor<i1>) -> tensor<i1>
      %r3_pick = "stablehlo.or"(%r3_gt, %r3_tiewin) : (tensor<i1>, tensor<i1>) -> tensor<i1>
      %r3_value = "stablehlo.select"(%r3_pick, %r3_av, %r3_bv) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
      %r3_index = "stablehlo.select"(%r3_pick, %r3_ai, %r3_bi) : (tensor<i1>, tensor<i64>, tensor<i64>) -> tensor<i64>
      "stablehlo.return"(%r3_value, %r3_index) : (tensor<i32>, tensor<i64>) -> ()
    }) {dimensions = array<i64: 0>} : (tensor<4x6xi32>, tensor<4x6xi64>, tensor<i32>, tensor<i64>) -> (tensor<6xi32>, tensor<6xi64>)
    "func.return"(%3#0, %3#1) : (tensor<6xi32>, tensor<6xi64>) -> ()
  }
}
