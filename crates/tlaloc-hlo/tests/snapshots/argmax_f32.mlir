module @argmax_f32 {
  func.func public @main(%arg0: tensor<5x8xf32>) -> (tensor<5xf32>, tensor<5xi32>) {
    %0 = "stablehlo.iota"() {iota_dimension = 1 : i64} : () -> tensor<5x8xi32>
    %1 = "stablehlo.constant"() {value = dense<0xFF800000> : tensor<f32>} : () -> tensor<f32>
    %2 = "stablehlo.constant"() {value = dense<0> : tensor<i32>} : () -> tensor<i32>
    %3:2 = "stablehlo.reduce"(%arg0, %0, %1, %2) ({
    ^bb0(%r3_av: tensor<f32>, %r3_ai: tensor<i32>, %r3_bv: tensor<f32>, %r3_bi: tensor<i32>):
      %r3_gt = "stablehlo.compare"(%r3_av, %r3_bv) {compare_type = #stablehlo<comparison_type FLOAT>, comparison_direction = #stablehlo<comparison_direction GT>} : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %r3_eq = "stablehlo.compare"(%r3_av, %r3_bv) {compare_type = #stablehlo<comparison_type FLOAT>, comparison_direction = #stablehlo<comparison_direction EQ>} : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %r3_lower = "stablehlo.compare"(%r3_ai, %r3_bi) {compare_type = #stablehlo<comparison_type SIGNED>, comparison_direction = #stablehlo<comparison_direction LT>} : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %r3_anan = "stablehlo.compare"(%r3_av, %r3_av) {compare_type = #stablehlo<comparison_type FLOAT>, comparison_direction = #stablehlo<comparison_direction NE>} : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %r3_bnan = "stablehlo.compare"(%r3_bv, %r3_bv) {compare_type = #stablehlo<comparison_type FLOAT>, comparison_direction = #stablehlo<comparison_direction NE>} : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %r3_bnum = "stablehlo.not"(%r3_bnan) : (tensor<i1>) -> tensor<i1>
      %r3_nanwin = "stablehlo.and"(%r3_anan, %r3_bnum) : (tensor<i1>, tensor<i1>) -> tensor<i1>
      %r3_better = "stablehlo.or"(%r3_gt, %r3_nanwin) : (tensor<i1>, tensor<i1>) -> tensor<i1>
      %r3_bothnan = "stablehlo.and"(%r3_anan, %r3_bnan) : (tensor<i1>, tensor<i1>) -> tensor<i1>
      %r3_tie = "stablehlo.or"(%r3_eq, %r3_bothnan) : (tensor<i1>, tensor<i1>) -> tensor<i1>
      %r3_tiewin = "stablehlo.and"(%r3_tie, %r3_lower) : (tensor<i1>, tensor<i1>) -> tensor<i1>
      %r3_pick = "stablehlo.or"(%r3_better, %r3_tiewin) : (tensor<i1>, tensor<i1>) -> tensor<i1>
      %r3_value = "stablehlo.select"(%r3_pick, %r3_av, %r3_bv) : (tensor<i1>, tensor<f32>, tensor<f32>) -> tensor<f32>
      %r3_index = "stablehlo.select"(%r3_pick, %r3_ai, %r3_bi) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
      "stablehlo.return"(%r3_value, %r3_index) : (tensor<f32>, tensor<i32>) -> ()
    }) {dimensions = array<i64: 1>} : (tensor<5x8xf32>, tensor<5x8xi32>, tensor<f32>, tensor<i32>) -> (tensor<5xf32>, tensor<5xi32>)
    "func.return"(%3#0, %3#1) : (tensor<5xf32>, tensor<5xi32>) -> ()
  }
}
