// RUN: hlofuse-opt %s --split-input-file --hlofuse-prepare | filecheck %s

// CHECK-LABEL: func.func public @inlines_private_helpers
// CHECK-NOT: call @
// CHECK: stablehlo.iota dim = 0
// CHECK: stablehlo.select
// CHECK-NOT: func.func private @tril
func.func public @inlines_private_helpers(%arg0: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %c = stablehlo.constant dense<true> : tensor<i1>
  %0 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i1>) -> tensor<4x4xi1>
  %1 = call @tril(%0) : (tensor<4x4xi1>) -> tensor<4x4xi1>
  %cst = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %2 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<4x4xf32>
  %3 = stablehlo.select %1, %arg0, %2 : tensor<4x4xi1>, tensor<4x4xf32>
  return %3 : tensor<4x4xf32>
}
func.func private @tril(%arg0: tensor<4x4xi1>) -> tensor<4x4xi1> {
  %0 = stablehlo.iota dim = 0 : tensor<4x4xi32>
  %1 = stablehlo.iota dim = 1 : tensor<4x4xi32>
  %2 = stablehlo.compare GE, %0, %1, SIGNED : (tensor<4x4xi32>, tensor<4x4xi32>) -> tensor<4x4xi1>
  %c = stablehlo.constant dense<false> : tensor<i1>
  %3 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i1>) -> tensor<4x4xi1>
  %4 = stablehlo.select %2, %arg0, %3 : tensor<4x4xi1>, tensor<4x4xi1>
  return %4 : tensor<4x4xi1>
}

// -----

// A public function is an entry point, not a helper: it stays, and so do calls to it.
// CHECK-LABEL: func.func public @no_match_public_callee
// CHECK: call @helper
// CHECK: func.func public @helper
func.func public @no_match_public_callee(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = call @helper(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
func.func public @helper(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %arg0, %arg0 : tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// lax.cond on a flag known when tracing (a logits warper switched on): the taken branch replaces the case.
// CHECK-LABEL: func.func public @folds_a_case_on_a_constant_flag
// CHECK-NOT: stablehlo.case
// CHECK: %[[Q:.*]] = stablehlo.divide %arg0
// CHECK: return %[[Q]]
func.func public @folds_a_case_on_a_constant_flag(%arg0: tensor<2x8xf32>) -> tensor<2x8xf32> {
  %t = stablehlo.constant dense<0.699999988> : tensor<f32>
  %off = stablehlo.constant dense<-1.000000e+00> : tensor<f32>
  %on = stablehlo.compare NE, %t, %off, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
  %index = stablehlo.convert %on : (tensor<i1>) -> tensor<i32>
  %0 = "stablehlo.case"(%index) ({
    stablehlo.return %arg0 : tensor<2x8xf32>
  }, {
    %1 = stablehlo.broadcast_in_dim %t, dims = [] : (tensor<f32>) -> tensor<2x8xf32>
    %2 = stablehlo.divide %arg0, %1 : tensor<2x8xf32>
    stablehlo.return %2 : tensor<2x8xf32>
  }) : (tensor<i32>) -> tensor<2x8xf32>
  return %0 : tensor<2x8xf32>
}

// -----

// An index past the last branch takes the last (StableHLO's rule).
// CHECK-LABEL: func.func public @folds_an_out_of_range_index_to_the_last_branch
// CHECK-NOT: stablehlo.case
// CHECK: stablehlo.negate %arg0
func.func public @folds_an_out_of_range_index_to_the_last_branch(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %index = stablehlo.constant dense<7> : tensor<i32>
  %0 = "stablehlo.case"(%index) ({
    stablehlo.return %arg0 : tensor<4xf32>
  }, {
    %1 = stablehlo.negate %arg0 : tensor<4xf32>
    stablehlo.return %1 : tensor<4xf32>
  }) : (tensor<i32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// A guard on a p known when tracing, as Levanter's sampler skips its top-p (`lax.cond(jnp.all(p >= 1.0), ...)`): the
// index is an `all` (a reduce over no dims) of a compare of constants, decided by evaluation.
// CHECK-LABEL: func.func public @folds_a_case_on_an_all_of_constants
// CHECK-NOT: stablehlo.case
// CHECK: stablehlo.negate %arg0
func.func public @folds_a_case_on_an_all_of_constants(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %p = stablehlo.constant dense<0.899999976> : tensor<f32>
  %one = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %false = stablehlo.constant dense<false> : tensor<i1>
  %true = stablehlo.constant dense<true> : tensor<i1>
  %ge = stablehlo.compare GE, %p, %one, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
  %ne = stablehlo.compare NE, %ge, %false, UNSIGNED : (tensor<i1>, tensor<i1>) -> tensor<i1>
  %all = stablehlo.reduce(%ne init: %true) applies stablehlo.and across dimensions = [] : (tensor<i1>, tensor<i1>) -> tensor<i1>
  %index = stablehlo.convert %all : (tensor<i1>) -> tensor<i32>
  %0 = "stablehlo.case"(%index) ({
    %1 = stablehlo.negate %arg0 : tensor<4xf32>
    stablehlo.return %1 : tensor<4xf32>
  }, {
    stablehlo.return %arg0 : tensor<4xf32>
  }) : (tensor<i32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// Near miss: an `any` over a p per row, an argument: the case stays.
// CHECK-LABEL: func.func public @no_match_case_on_an_any_of_an_argument
// CHECK: stablehlo.case
func.func public @no_match_case_on_an_any_of_an_argument(%arg0: tensor<4xf32>, %arg1: tensor<2xf32>) -> tensor<4xf32> {
  %one = stablehlo.constant dense<1.000000e+00> : tensor<2xf32>
  %false = stablehlo.constant dense<false> : tensor<i1>
  %ge = stablehlo.compare GE, %arg1, %one, FLOAT : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xi1>
  %any = stablehlo.reduce(%ge init: %false) applies stablehlo.or across dimensions = [0] : (tensor<2xi1>, tensor<i1>) -> tensor<i1>
  %index = stablehlo.convert %any : (tensor<i1>) -> tensor<i32>
  %0 = "stablehlo.case"(%index) ({
    %1 = stablehlo.negate %arg0 : tensor<4xf32>
    stablehlo.return %1 : tensor<4xf32>
  }, {
    stablehlo.return %arg0 : tensor<4xf32>
  }) : (tensor<i32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// Near miss: an `any` over a k per row given as constants (eSurge's guard of its searched top-k: `lax.cond(jnp.any(k >
// 0), ...)`): the rows are the sampler's per-row parameters, which a template takes as operands, so the case stays.
// CHECK-LABEL: func.func public @no_match_case_on_an_any_of_constant_rows
// CHECK: stablehlo.case
func.func public @no_match_case_on_an_any_of_constant_rows(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %k = stablehlo.constant dense<16> : tensor<2xi32>
  %zero = stablehlo.constant dense<0> : tensor<2xi32>
  %false = stablehlo.constant dense<false> : tensor<i1>
  %gt = stablehlo.compare GT, %k, %zero, SIGNED : (tensor<2xi32>, tensor<2xi32>) -> tensor<2xi1>
  %any = stablehlo.reduce(%gt init: %false) applies stablehlo.or across dimensions = [0] : (tensor<2xi1>, tensor<i1>) -> tensor<i1>
  %index = stablehlo.convert %any : (tensor<i1>) -> tensor<i32>
  %0 = "stablehlo.case"(%index) ({
    %1 = stablehlo.negate %arg0 : tensor<4xf32>
    stablehlo.return %1 : tensor<4xf32>
  }, {
    stablehlo.return %arg0 : tensor<4xf32>
  }) : (tensor<i32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// Near miss: the same guard over a batch of one row (a serving engine's sampler at batch 1): its (1,) k is still a
// per-row parameter, so the case stays.
// CHECK-LABEL: func.func public @no_match_case_on_an_any_of_one_constant_row
// CHECK: stablehlo.case
func.func public @no_match_case_on_an_any_of_one_constant_row(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %k = stablehlo.constant dense<16> : tensor<1xi32>
  %zero = stablehlo.constant dense<0> : tensor<1xi32>
  %false = stablehlo.constant dense<false> : tensor<i1>
  %gt = stablehlo.compare GT, %k, %zero, SIGNED : (tensor<1xi32>, tensor<1xi32>) -> tensor<1xi1>
  %any = stablehlo.reduce(%gt init: %false) applies stablehlo.or across dimensions = [0] : (tensor<1xi1>, tensor<i1>) -> tensor<i1>
  %index = stablehlo.convert %any : (tensor<i1>) -> tensor<i32>
  %0 = "stablehlo.case"(%index) ({
    %1 = stablehlo.negate %arg0 : tensor<4xf32>
    stablehlo.return %1 : tensor<4xf32>
  }, {
    stablehlo.return %arg0 : tensor<4xf32>
  }) : (tensor<i32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// A data-dependent index: the case stays.
// CHECK-LABEL: func.func public @no_match_case_on_an_argument
// CHECK: stablehlo.case
func.func public @no_match_case_on_an_argument(%arg0: tensor<4xf32>, %arg1: tensor<i32>) -> tensor<4xf32> {
  %0 = "stablehlo.case"(%arg1) ({
    stablehlo.return %arg0 : tensor<4xf32>
  }, {
    %1 = stablehlo.negate %arg0 : tensor<4xf32>
    stablehlo.return %1 : tensor<4xf32>
  }) : (tensor<i32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// Near miss: the index compares a float computed from constants (0.1 + 0.2 rounds in f32 otherwise than in the
// evaluator's f64), so it is not decided here and the case stays.
// CHECK-LABEL: func.func public @no_match_index_from_float_arithmetic
// CHECK: stablehlo.case
func.func public @no_match_index_from_float_arithmetic(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %a = stablehlo.constant dense<1.000000e-01> : tensor<f32>
  %b = stablehlo.constant dense<2.000000e-01> : tensor<f32>
  %c = stablehlo.constant dense<3.000000e-01> : tensor<f32>
  %sum = stablehlo.add %a, %b : tensor<f32>
  %eq = stablehlo.compare EQ, %sum, %c, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
  %index = stablehlo.convert %eq : (tensor<i1>) -> tensor<i32>
  %0 = "stablehlo.case"(%index) ({
    stablehlo.return %arg0 : tensor<4xf32>
  }, {
    %1 = stablehlo.negate %arg0 : tensor<4xf32>
    stablehlo.return %1 : tensor<4xf32>
  }) : (tensor<i32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// A weak-typed Python scalar lowers through a convert to its own type: dropped, so `where(m, x, 0.0)` reads as
// `where(m, x, zeros_like(x))`.
// CHECK-LABEL: func.func public @drops_identity_converts
// CHECK: %[[ZERO:.*]] = stablehlo.constant dense<0.000000e+00> : tensor<f32>
// CHECK-NEXT: stablehlo.broadcast_in_dim %[[ZERO]]
// CHECK: stablehlo.convert %arg1 : (tensor<4xf32>) -> tensor<4xbf16>
func.func public @drops_identity_converts(%arg0: tensor<4xi1>, %arg1: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xbf16>) {
  %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %0 = stablehlo.convert %cst : tensor<f32>
  %1 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<f32>) -> tensor<4xf32>
  %2 = stablehlo.select %arg0, %arg1, %1 : tensor<4xi1>, tensor<4xf32>
  %3 = stablehlo.convert %arg1 : (tensor<4xf32>) -> tensor<4xbf16>
  return %2, %3 : tensor<4xf32>, tensor<4xbf16>
}

// -----

// An index computed from constants (EasyDeL's `maximum(0, k - 1)` under its cond, then JAX's negative-index wrap
// `select(i < 0, i + n, i)`) folds to its constant, so the read is at a constant column.
// CHECK-LABEL: func.func public @folds_integer_scalars_of_constants
// CHECK-DAG: %[[ZERO:.*]] = stablehlo.constant dense<0> : tensor<i32>
// CHECK-DAG: %[[K:.*]] = stablehlo.constant dense<39> : tensor<i32>
// CHECK-NOT: stablehlo.select
// CHECK: stablehlo.dynamic_slice %arg0, %[[ZERO]], %[[K]], sizes = [2, 1]
func.func public @folds_integer_scalars_of_constants(%arg0: tensor<2x64xf32>) -> tensor<2x1xf32> {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %c1 = stablehlo.constant dense<1> : tensor<i32>
  %c40 = stablehlo.constant dense<40> : tensor<i32>
  %c64 = stablehlo.constant dense<64> : tensor<i32>
  %0 = stablehlo.subtract %c40, %c1 : tensor<i32>
  %1 = stablehlo.maximum %c0, %0 : tensor<i32>
  %2 = stablehlo.compare LT, %1, %c0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
  %3 = stablehlo.add %1, %c64 : tensor<i32>
  %4 = stablehlo.select %2, %3, %1 : tensor<i1>, tensor<i32>
  %5 = stablehlo.dynamic_slice %arg0, %c0, %4, sizes = [2, 1] : (tensor<2x64xf32>, tensor<i32>, tensor<i32>) -> tensor<2x1xf32>
  return %5 : tensor<2x1xf32>
}

// -----

// Near miss: an index that reads an argument stays computed.
// CHECK-LABEL: func.func public @no_match_integer_scalars_of_an_argument
// CHECK: stablehlo.maximum
// CHECK: stablehlo.dynamic_slice
func.func public @no_match_integer_scalars_of_an_argument(%arg0: tensor<2x64xf32>, %arg1: tensor<i32>) -> tensor<2x1xf32> {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %0 = stablehlo.maximum %c0, %arg1 : tensor<i32>
  %1 = stablehlo.dynamic_slice %arg0, %c0, %0, sizes = [2, 1] : (tensor<2x64xf32>, tensor<i32>, tensor<i32>) -> tensor<2x1xf32>
  return %1 : tensor<2x1xf32>
}

// -----

// A temperature bounded below by a Python constant (axlearn's `logits / jnp.maximum(T, 1e-4)`) folds to the one the
// maximum picks (exact: no rounding), so the division reads a constant; a minimum likewise.
// CHECK-LABEL: func.func public @folds_float_scalar_extrema_of_constants
// CHECK-NOT: stablehlo.maximum
// CHECK-NOT: stablehlo.minimum
// CHECK-DAG: %[[T:.*]] = stablehlo.constant dense<0.699999988> : tensor<f32>
// CHECK-DAG: %[[P:.*]] = stablehlo.constant dense<0.899999976> : tensor<f32>
// CHECK: stablehlo.broadcast_in_dim %[[T]]
// CHECK: stablehlo.broadcast_in_dim %[[P]]
func.func public @folds_float_scalar_extrema_of_constants(%arg0: tensor<2x8xf32>) -> (tensor<2x8xf32>, tensor<2x8xf32>) {
  %t = stablehlo.constant dense<0.699999988> : tensor<f32>
  %floor = stablehlo.constant dense<9.99999974E-5> : tensor<f32>
  %p = stablehlo.constant dense<0.899999976> : tensor<f32>
  %one = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %0 = stablehlo.maximum %t, %floor : tensor<f32>
  %1 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<f32>) -> tensor<2x8xf32>
  %2 = stablehlo.divide %arg0, %1 : tensor<2x8xf32>
  %3 = stablehlo.minimum %one, %p : tensor<f32>
  %4 = stablehlo.broadcast_in_dim %3, dims = [] : (tensor<f32>) -> tensor<2x8xf32>
  %5 = stablehlo.multiply %arg0, %4 : tensor<2x8xf32>
  return %2, %5 : tensor<2x8xf32>, tensor<2x8xf32>
}

// -----

// Near miss: a maximum of two zeros (which of -0 and +0 it gives is the backend's) and one of an argument stay.
// CHECK-LABEL: func.func public @no_match_float_extrema_of_zeros_or_an_argument
// CHECK: stablehlo.maximum
// CHECK: stablehlo.maximum
func.func public @no_match_float_extrema_of_zeros_or_an_argument(%arg0: tensor<f32>) -> (tensor<f32>, tensor<f32>) {
  %zero = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %minus_zero = stablehlo.constant dense<-0.000000e+00> : tensor<f32>
  %0 = stablehlo.maximum %zero, %minus_zero : tensor<f32>
  %1 = stablehlo.maximum %arg0, %zero : tensor<f32>
  return %0, %1 : tensor<f32>, tensor<f32>
}

// -----

// A threshold moved by a tolerance in jnp (Levanter's top-p: `clip(p, 0, 1)[..., None] - 1e-4`, f32) folds to one
// constant, f32(0.9) - f32(1e-4) = 0.899899959, broadcast as the subtract was: the compare reads a constant.
// CHECK-LABEL: func.func public @folds_f32_arithmetic_of_constants
// CHECK-NOT: stablehlo.subtract
// CHECK: %[[P:.*]] = stablehlo.constant dense<0.899899959> : tensor<f32>
// CHECK: %[[B:.*]] = stablehlo.broadcast_in_dim %[[P]], dims = [] : (tensor<f32>) -> tensor<1xf32>
// CHECK: stablehlo.compare LT, %arg0, %{{.*}}
func.func public @folds_f32_arithmetic_of_constants(%arg0: tensor<2x8xf32>) -> tensor<2x8xi1> {
  %p = stablehlo.constant dense<0.899999976> : tensor<f32>
  %tol = stablehlo.constant dense<9.99999974E-5> : tensor<f32>
  %0 = stablehlo.broadcast_in_dim %p, dims = [] : (tensor<f32>) -> tensor<1xf32>
  %1 = stablehlo.broadcast_in_dim %tol, dims = [] : (tensor<f32>) -> tensor<1xf32>
  %2 = stablehlo.subtract %0, %1 : tensor<1xf32>
  %3 = stablehlo.broadcast_in_dim %2, dims = [1] : (tensor<1xf32>) -> tensor<1x1xf32>
  %4 = stablehlo.broadcast_in_dim %3, dims = [0, 1] : (tensor<1x1xf32>) -> tensor<2x8xf32>
  %5 = stablehlo.compare LT, %arg0, %4, FLOAT : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xi1>
  return %5 : tensor<2x8xi1>
}

// -----

// A 0-d threshold of 0-d arrays (grok-1's `1 - top_p` of an f32 p) folds to the constant itself, with no broadcast of
// it to its own type, so the compare reads it broadcast once, as JAX writes a Python float's.
// CHECK-LABEL: func.func public @folds_0d_f32_arithmetic_to_the_constant
// CHECK-NOT: stablehlo.subtract
// CHECK: %[[C:.*]] = stablehlo.constant dense<0.100000024> : tensor<f32>
// CHECK-NEXT: %[[B:.*]] = stablehlo.broadcast_in_dim %[[C]], dims = [] : (tensor<f32>) -> tensor<2x8xf32>
// CHECK-NEXT: stablehlo.compare GE, %arg0, %[[B]]
func.func public @folds_0d_f32_arithmetic_to_the_constant(%arg0: tensor<2x8xf32>) -> tensor<2x8xi1> {
  %one = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %p = stablehlo.constant dense<0.899999976> : tensor<f32>
  %0 = stablehlo.subtract %one, %p : tensor<f32>
  %1 = stablehlo.broadcast_in_dim %0, dims = [] : (tensor<f32>) -> tensor<2x8xf32>
  %2 = stablehlo.compare GE, %arg0, %1, FLOAT : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xi1>
  return %2 : tensor<2x8xi1>
}

// -----

// Near miss: arithmetic that reads an argument, bf16 arithmetic (XLA rounds it through f32), and a result that is
// subnormal (a TPU flushes it) stay.
// CHECK-LABEL: func.func public @no_match_arithmetic_of_an_argument_bf16_or_subnormal
// CHECK: stablehlo.subtract
// CHECK: stablehlo.subtract
// CHECK: stablehlo.multiply
func.func public @no_match_arithmetic_of_an_argument_bf16_or_subnormal(%arg0: tensor<f32>) -> (tensor<f32>, tensor<bf16>, tensor<f32>) {
  %tol = stablehlo.constant dense<9.99999974E-5> : tensor<f32>
  %p16 = stablehlo.constant dense<8.984380e-01> : tensor<bf16>
  %tol16 = stablehlo.constant dense<1.000980e-04> : tensor<bf16>
  %tiny = stablehlo.constant dense<1.000000e-20> : tensor<f32>
  %0 = stablehlo.subtract %arg0, %tol : tensor<f32>
  %1 = stablehlo.subtract %p16, %tol16 : tensor<bf16>
  %2 = stablehlo.multiply %tiny, %tiny : tensor<f32>
  return %0, %1, %2 : tensor<f32>, tensor<bf16>, tensor<f32>
}

// -----

// A decode loop carries the temperature it closes over (JAX passes a body's constant arrays as loop operands): the
// body gives it back unchanged and it starts as a constant, so the body divides by the constant itself.
// (CSE then shares the body's clone of the constant with the function's.)
// CHECK-LABEL: func.func public @folds_a_loop_invariant_constant_carry
// CHECK: %[[T:.*]] = stablehlo.constant dense<0.699999988> : tensor<f32>
// CHECK: stablehlo.while
// CHECK: do {
// CHECK: stablehlo.broadcast_in_dim %[[T]]
func.func public @folds_a_loop_invariant_constant_carry(%arg0: tensor<2x8xf32>) -> tensor<2x8xf32> {
  %t = stablehlo.constant dense<0.699999988> : tensor<f32>
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %0:3 = stablehlo.while(%i = %c0, %x = %arg0, %temp = %t) : tensor<i32>, tensor<2x8xf32>, tensor<f32>
  cond {
    %c2 = stablehlo.constant dense<2> : tensor<i32>
    %1 = stablehlo.compare LT, %i, %c2, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %1 : tensor<i1>
  } do {
    %c1 = stablehlo.constant dense<1> : tensor<i32>
    %1 = stablehlo.add %i, %c1 : tensor<i32>
    %2 = stablehlo.broadcast_in_dim %temp, dims = [] : (tensor<f32>) -> tensor<2x8xf32>
    %3 = stablehlo.divide %x, %2 : tensor<2x8xf32>
    stablehlo.return %1, %3, %temp : tensor<i32>, tensor<2x8xf32>, tensor<f32>
  }
  return %0#1 : tensor<2x8xf32>
}

// -----

// Not invariant: the body gives back a new value, so the loop's operand is only its first iteration's.
// CHECK-LABEL: func.func public @no_match_a_carry_the_body_changes
// CHECK: do {
// CHECK-NEXT: stablehlo.broadcast_in_dim %iterArg{{(_[0-9]+)?}}, dims
func.func public @no_match_a_carry_the_body_changes(%arg0: tensor<2x8xf32>) -> tensor<2x8xf32> {
  %t = stablehlo.constant dense<0.699999988> : tensor<f32>
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %0:3 = stablehlo.while(%i = %c0, %temp = %t, %x = %arg0) : tensor<i32>, tensor<f32>, tensor<2x8xf32>
  cond {
    %c2 = stablehlo.constant dense<2> : tensor<i32>
    %1 = stablehlo.compare LT, %i, %c2, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %1 : tensor<i1>
  } do {
    %2 = stablehlo.broadcast_in_dim %temp, dims = [] : (tensor<f32>) -> tensor<2x8xf32>
    %3 = stablehlo.divide %x, %2 : tensor<2x8xf32>
    %4 = stablehlo.multiply %temp, %temp : tensor<f32>
    %c1 = stablehlo.constant dense<1> : tensor<i32>
    %1 = stablehlo.add %i, %c1 : tensor<i32>
    stablehlo.return %1, %4, %3 : tensor<i32>, tensor<f32>, tensor<2x8xf32>
  }
  return %0#2 : tensor<2x8xf32>
}

// -----

// Near miss: invariant, but it starts as an argument (a temperature given at run time), not a constant.
// CHECK-LABEL: func.func public @no_match_an_invariant_carry_of_an_argument
// CHECK: do {
// CHECK-NEXT: stablehlo.broadcast_in_dim %iterArg{{(_[0-9]+)?}}, dims
func.func public @no_match_an_invariant_carry_of_an_argument(%arg0: tensor<2x8xf32>, %arg1: tensor<f32>) -> tensor<2x8xf32> {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %0:3 = stablehlo.while(%i = %c0, %temp = %arg1, %x = %arg0) : tensor<i32>, tensor<f32>, tensor<2x8xf32>
  cond {
    %c2 = stablehlo.constant dense<2> : tensor<i32>
    %1 = stablehlo.compare LT, %i, %c2, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %1 : tensor<i1>
  } do {
    %2 = stablehlo.broadcast_in_dim %temp, dims = [] : (tensor<f32>) -> tensor<2x8xf32>
    %3 = stablehlo.divide %x, %2 : tensor<2x8xf32>
    %c1 = stablehlo.constant dense<1> : tensor<i32>
    %1 = stablehlo.add %i, %c1 : tensor<i32>
    stablehlo.return %1, %temp, %3 : tensor<i32>, tensor<f32>, tensor<2x8xf32>
  }
  return %0#2 : tensor<2x8xf32>
}

// -----

// A (B,) row reshaped to a (B, 1) column and broadcast: the row broadcast itself, as `v[..., -1:]` would be.
// CHECK-LABEL: func.func public @folds_a_unit_reshape_into_its_broadcast
// CHECK-NOT: stablehlo.reshape
// CHECK: stablehlo.broadcast_in_dim %arg1, dims = [0] : (tensor<2xf32>) -> tensor<2x8xf32>
func.func public @folds_a_unit_reshape_into_its_broadcast(%arg0: tensor<2x8xf32>, %arg1: tensor<2xf32>) -> tensor<2x8xi1> {
  %0 = stablehlo.reshape %arg1 : (tensor<2xf32>) -> tensor<2x1xf32>
  %1 = stablehlo.broadcast_in_dim %0, dims = [0, 1] : (tensor<2x1xf32>) -> tensor<2x8xf32>
  %2 = stablehlo.compare LT, %arg0, %1, FLOAT : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xi1>
  return %2 : tensor<2x8xi1>
}

// -----

// One row's k-th value as a () scalar (`v[-1]`): broadcast from its (1,) slice, as `v[-1:]` is.
// CHECK-LABEL: func.func public @folds_a_scalar_back_to_its_unit_slice
// CHECK: %[[KTH:.*]] = stablehlo.slice %arg1 [3:4]
// CHECK-NEXT: stablehlo.broadcast_in_dim %[[KTH]], dims = [0] : (tensor<1xf32>) -> tensor<8xf32>
func.func public @folds_a_scalar_back_to_its_unit_slice(%arg0: tensor<8xf32>, %arg1: tensor<4xf32>) -> tensor<8xi1> {
  %0 = stablehlo.slice %arg1 [3:4] : (tensor<4xf32>) -> tensor<1xf32>
  %1 = stablehlo.reshape %0 : (tensor<1xf32>) -> tensor<f32>
  %2 = stablehlo.broadcast_in_dim %1, dims = [] : (tensor<f32>) -> tensor<8xf32>
  %3 = stablehlo.compare LT, %arg0, %2, FLOAT : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xi1>
  return %3 : tensor<8xi1>
}

// -----

// One row's k-th value as a () scalar given its unit dim back (`v[-1][None]`): the (1,) slice itself.
// CHECK-LABEL: func.func public @folds_a_scalar_given_its_unit_dim_back_to_its_slice
// CHECK: %[[KTH:.*]] = stablehlo.slice %arg1 [3:4]
// CHECK-NEXT: stablehlo.broadcast_in_dim %[[KTH]], dims = [0] : (tensor<1xf32>) -> tensor<8xf32>
func.func public @folds_a_scalar_given_its_unit_dim_back_to_its_slice(%arg0: tensor<8xf32>, %arg1: tensor<4xf32>) -> tensor<8xi1> {
  %0 = stablehlo.slice %arg1 [3:4] : (tensor<4xf32>) -> tensor<1xf32>
  %1 = stablehlo.reshape %0 : (tensor<1xf32>) -> tensor<f32>
  %2 = stablehlo.broadcast_in_dim %1, dims = [] : (tensor<f32>) -> tensor<1xf32>
  %3 = stablehlo.broadcast_in_dim %2, dims = [0] : (tensor<1xf32>) -> tensor<8xf32>
  %4 = stablehlo.compare LT, %arg0, %3, FLOAT : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xi1>
  return %4 : tensor<8xi1>
}

// -----

// Near miss: the reshape regroups dims that are not 1 ((2, 4) to (8,)): it stays.
// CHECK-LABEL: func.func public @no_fold_a_reshape_of_more_than_unit_dims
// CHECK: stablehlo.reshape %arg0 : (tensor<2x4xf32>) -> tensor<8xf32>
// CHECK: stablehlo.broadcast_in_dim
func.func public @no_fold_a_reshape_of_more_than_unit_dims(%arg0: tensor<2x4xf32>) -> tensor<3x8xf32> {
  %0 = stablehlo.reshape %arg0 : (tensor<2x4xf32>) -> tensor<8xf32>
  %1 = stablehlo.broadcast_in_dim %0, dims = [1] : (tensor<8xf32>) -> tensor<3x8xf32>
  return %1 : tensor<3x8xf32>
}

// -----

// What else the broadcast carries (a sharding annotation) stays on the one it becomes.
// CHECK-LABEL: func.func public @fold_keeps_the_broadcasts_sharding
// CHECK: stablehlo.broadcast_in_dim %arg1, dims = [0] {mhlo.sharding = "{replicated}"}
func.func public @fold_keeps_the_broadcasts_sharding(%arg0: tensor<2x8xf32>, %arg1: tensor<2xf32>) -> tensor<2x8xi1> {
  %0 = stablehlo.reshape %arg1 : (tensor<2xf32>) -> tensor<2x1xf32>
  %1 = stablehlo.broadcast_in_dim %0, dims = [0, 1] {mhlo.sharding = "{replicated}"} : (tensor<2x1xf32>) -> tensor<2x8xf32>
  %2 = stablehlo.compare LT, %arg0, %1, FLOAT : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xi1>
  return %2 : tensor<2x8xi1>
}

// -----

// take_along_axis(x, argsort(x)[:, ::-1]): its bounds checks decided (an argsort's ids lie in [0, 8)), then the
// take read as the sort's own values, reversed as the ids are.
// CHECK-LABEL: func.func public @takes_values_along_their_own_argsort
// CHECK: %[[S:.*]]:2 = "stablehlo.sort"(%arg0, %{{.*}})
// CHECK: %[[R:.*]] = stablehlo.reverse %[[S]]#0, dims = [1]
// CHECK-NOT: stablehlo.gather
// CHECK: return %[[R]]
func.func public @takes_values_along_their_own_argsort(%arg0: tensor<2x8xf32>) -> tensor<2x8xf32> {
  %iota = stablehlo.iota dim = 1 : tensor<2x8xi32>
  %s:2 = "stablehlo.sort"(%arg0, %iota) <{dimension = 1 : i64, is_stable = true}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>, %c: tensor<i32>, %d: tensor<i32>):
    %lt = stablehlo.compare LT, %a, %b, TOTALORDER : (tensor<f32>, tensor<f32>) -> tensor<i1>
    stablehlo.return %lt : tensor<i1>
  }) : (tensor<2x8xf32>, tensor<2x8xi32>) -> (tensor<2x8xf32>, tensor<2x8xi32>)
  %ids = stablehlo.reverse %s#1, dims = [1] : tensor<2x8xi32>
  %0 = call @take_along_axis(%arg0, %ids) : (tensor<2x8xf32>, tensor<2x8xi32>) -> tensor<2x8xf32>
  return %0 : tensor<2x8xf32>
}
func.func private @take_along_axis(%arg0: tensor<2x8xf32>, %arg1: tensor<2x8xi32>) -> tensor<2x8xf32> {
  %c = stablehlo.constant dense<0> : tensor<i32>
  %0 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<2x8xi32>
  %1 = stablehlo.compare LT, %arg1, %0, SIGNED : (tensor<2x8xi32>, tensor<2x8xi32>) -> tensor<2x8xi1>
  %c_0 = stablehlo.constant dense<8> : tensor<i32>
  %2 = stablehlo.broadcast_in_dim %c_0, dims = [] : (tensor<i32>) -> tensor<2x8xi32>
  %3 = stablehlo.add %arg1, %2 : tensor<2x8xi32>
  %4 = stablehlo.select %1, %3, %arg1 : tensor<2x8xi1>, tensor<2x8xi32>
  %5 = stablehlo.reshape %4 : (tensor<2x8xi32>) -> tensor<2x8x1xi32>
  %c_1 = stablehlo.constant dense<7> : tensor<1xi32>
  %6 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<2x8x1xi32>
  %7 = stablehlo.compare GE, %5, %6, SIGNED : (tensor<2x8x1xi32>, tensor<2x8x1xi32>) -> tensor<2x8x1xi1>
  %8 = stablehlo.broadcast_in_dim %c_1, dims = [2] : (tensor<1xi32>) -> tensor<2x8x1xi32>
  %9 = stablehlo.compare LE, %5, %8, SIGNED : (tensor<2x8x1xi32>, tensor<2x8x1xi32>) -> tensor<2x8x1xi1>
  %10 = stablehlo.and %7, %9 : tensor<2x8x1xi1>
  %c_3 = stablehlo.constant dense<true> : tensor<i1>
  %11 = stablehlo.reduce(%10 init: %c_3) applies stablehlo.and across dimensions = [2] : (tensor<2x8x1xi1>, tensor<i1>) -> tensor<2x8xi1>
  %12 = "stablehlo.gather"(%arg0, %5) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [1], operand_batching_dims = [0], start_indices_batching_dims = [0], start_index_map = [1], index_vector_dim = 2>, indices_are_sorted = false, slice_sizes = array<i64: 1, 1>}> : (tensor<2x8xf32>, tensor<2x8x1xi32>) -> tensor<2x8xf32>
  %cst = stablehlo.constant dense<0x7FC00000> : tensor<f32>
  %13 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x8xf32>
  %14 = stablehlo.select %11, %12, %13 : tensor<2x8xi1>, tensor<2x8xf32>
  return %14 : tensor<2x8xf32>
}

// -----

// A take of another array along x's argsort: its bounds checks are decided, but its values are no sort's output.
// CHECK-LABEL: func.func public @no_match_take_of_another_array
// CHECK-NOT: SIGNED
// CHECK: %[[G:.*]] = "stablehlo.gather"(%arg1,
// CHECK: return %[[G]]
func.func public @no_match_take_of_another_array(%arg0: tensor<2x8xf32>, %arg1: tensor<2x8xf32>) -> tensor<2x8xf32> {
  %iota = stablehlo.iota dim = 1 : tensor<2x8xi32>
  %s:2 = "stablehlo.sort"(%arg0, %iota) <{dimension = 1 : i64, is_stable = true}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>, %c: tensor<i32>, %d: tensor<i32>):
    %lt = stablehlo.compare LT, %a, %b, TOTALORDER : (tensor<f32>, tensor<f32>) -> tensor<i1>
    stablehlo.return %lt : tensor<i1>
  }) : (tensor<2x8xf32>, tensor<2x8xi32>) -> (tensor<2x8xf32>, tensor<2x8xi32>)
  %c = stablehlo.constant dense<0> : tensor<i32>
  %0 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<2x8xi32>
  %1 = stablehlo.compare LT, %s#1, %0, SIGNED : (tensor<2x8xi32>, tensor<2x8xi32>) -> tensor<2x8xi1>
  %c_0 = stablehlo.constant dense<8> : tensor<i32>
  %2 = stablehlo.broadcast_in_dim %c_0, dims = [] : (tensor<i32>) -> tensor<2x8xi32>
  %3 = stablehlo.add %s#1, %2 : tensor<2x8xi32>
  %4 = stablehlo.select %1, %3, %s#1 : tensor<2x8xi1>, tensor<2x8xi32>
  %5 = stablehlo.reshape %4 : (tensor<2x8xi32>) -> tensor<2x8x1xi32>
  %6 = "stablehlo.gather"(%arg1, %5) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [1], operand_batching_dims = [0], start_indices_batching_dims = [0], start_index_map = [1], index_vector_dim = 2>, indices_are_sorted = false, slice_sizes = array<i64: 1, 1>}> : (tensor<2x8xf32>, tensor<2x8x1xi32>) -> tensor<2x8xf32>
  return %6 : tensor<2x8xf32>
}

// -----

// take_along_axis(v, argsort(order)), order an argsort's ids: v put back in id order, as sort_key_val(order, v).
// CHECK-LABEL: func.func public @puts_back_along_the_inverse_of_an_argsort
// CHECK: %[[S:.*]]:2 = "stablehlo.sort"(%arg0, %{{.*}})
// CHECK: %[[B:.*]]:2 = "stablehlo.sort"(%[[S]]#1, %arg1) <{dimension = 1 : i64, is_stable = true}>
// CHECK: stablehlo.compare LT, %{{.*}}, %{{.*}}, SIGNED
// CHECK-NOT: stablehlo.gather
// CHECK: return %[[B]]#1
func.func public @puts_back_along_the_inverse_of_an_argsort(%arg0: tensor<2x8xf32>, %arg1: tensor<2x8xi1>) -> tensor<2x8xi1> {
  %iota = stablehlo.iota dim = 1 : tensor<2x8xi32>
  %s:2 = "stablehlo.sort"(%arg0, %iota) <{dimension = 1 : i64, is_stable = true}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>, %c: tensor<i32>, %d: tensor<i32>):
    %lt = stablehlo.compare LT, %a, %b, TOTALORDER : (tensor<f32>, tensor<f32>) -> tensor<i1>
    stablehlo.return %lt : tensor<i1>
  }) : (tensor<2x8xf32>, tensor<2x8xi32>) -> (tensor<2x8xf32>, tensor<2x8xi32>)
  %inv:2 = "stablehlo.sort"(%s#1, %iota) <{dimension = 1 : i64, is_stable = true}> ({
  ^bb0(%a: tensor<i32>, %b: tensor<i32>, %c: tensor<i32>, %d: tensor<i32>):
    %lt = stablehlo.compare LT, %a, %b, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %lt : tensor<i1>
  }) : (tensor<2x8xi32>, tensor<2x8xi32>) -> (tensor<2x8xi32>, tensor<2x8xi32>)
  %0 = stablehlo.reshape %inv#1 : (tensor<2x8xi32>) -> tensor<2x8x1xi32>
  %1 = "stablehlo.gather"(%arg1, %0) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [1], operand_batching_dims = [0], start_indices_batching_dims = [0], start_index_map = [1], index_vector_dim = 2>, indices_are_sorted = false, slice_sizes = array<i64: 1, 1>}> : (tensor<2x8xi1>, tensor<2x8x1xi32>) -> tensor<2x8xi1>
  return %1 : tensor<2x8xi1>
}

// -----

// The argsort of an order sorted descending (`argsort(-order)`) is no inverse: the take stays.
// CHECK-LABEL: func.func public @no_match_take_along_a_descending_argsort_of_an_order
// CHECK: stablehlo.gather
func.func public @no_match_take_along_a_descending_argsort_of_an_order(%arg0: tensor<2x8xf32>, %arg1: tensor<2x8xi1>) -> tensor<2x8xi1> {
  %iota = stablehlo.iota dim = 1 : tensor<2x8xi32>
  %s:2 = "stablehlo.sort"(%arg0, %iota) <{dimension = 1 : i64, is_stable = true}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>, %c: tensor<i32>, %d: tensor<i32>):
    %lt = stablehlo.compare LT, %a, %b, TOTALORDER : (tensor<f32>, tensor<f32>) -> tensor<i1>
    stablehlo.return %lt : tensor<i1>
  }) : (tensor<2x8xf32>, tensor<2x8xi32>) -> (tensor<2x8xf32>, tensor<2x8xi32>)
  %inv:2 = "stablehlo.sort"(%s#1, %iota) <{dimension = 1 : i64, is_stable = true}> ({
  ^bb0(%a: tensor<i32>, %b: tensor<i32>, %c: tensor<i32>, %d: tensor<i32>):
    %gt = stablehlo.compare GT, %a, %b, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %gt : tensor<i1>
  }) : (tensor<2x8xi32>, tensor<2x8xi32>) -> (tensor<2x8xi32>, tensor<2x8xi32>)
  %0 = stablehlo.reshape %inv#1 : (tensor<2x8xi32>) -> tensor<2x8x1xi32>
  %1 = "stablehlo.gather"(%arg1, %0) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [1], operand_batching_dims = [0], start_indices_batching_dims = [0], start_index_map = [1], index_vector_dim = 2>, indices_are_sorted = false, slice_sizes = array<i64: 1, 1>}> : (tensor<2x8xi1>, tensor<2x8x1xi32>) -> tensor<2x8xi1>
  return %1 : tensor<2x8xi1>
}

// -----

// jnp.roll(m, 1).at[:, 0].set(False): the rolled-in column set, so a shift by one with False, as a pad.
// CHECK-LABEL: func.func public @shifts_a_roll_whose_rolled_in_place_is_set
// CHECK: %[[F:.*]] = stablehlo.constant dense<false> : tensor<i1>
// CHECK: %[[M:.*]] = stablehlo.slice %arg0 [0:2, 0:7]
// CHECK: %[[P:.*]] = stablehlo.pad %[[M]], %[[F]], low = [0, 1], high = [0, 0], interior = [0, 0]
// CHECK-NOT: stablehlo.scatter
// CHECK: return %[[P]]
func.func public @shifts_a_roll_whose_rolled_in_place_is_set(%arg0: tensor<2x8xi1>) -> tensor<2x8xi1> {
  %0 = stablehlo.slice %arg0 [0:2, 7:8] : (tensor<2x8xi1>) -> tensor<2x1xi1>
  %1 = stablehlo.slice %arg0 [0:2, 0:7] : (tensor<2x8xi1>) -> tensor<2x7xi1>
  %2 = stablehlo.concatenate %0, %1, dim = 1 : (tensor<2x1xi1>, tensor<2x7xi1>) -> tensor<2x8xi1>
  %c = stablehlo.constant dense<0> : tensor<i32>
  %3 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<1xi32>
  %f = stablehlo.constant dense<false> : tensor<i1>
  %4 = stablehlo.broadcast_in_dim %f, dims = [] : (tensor<i1>) -> tensor<2xi1>
  %5 = "stablehlo.scatter"(%2, %3, %4) <{indices_are_sorted = true, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [0], inserted_window_dims = [1], scatter_dims_to_operand_dims = [1]>, unique_indices = true}> ({
  ^bb0(%a: tensor<i1>, %b: tensor<i1>):
    stablehlo.return %b : tensor<i1>
  }) : (tensor<2x8xi1>, tensor<1xi32>, tensor<2xi1>) -> tensor<2x8xi1>
  return %5 : tensor<2x8xi1>
}

// -----

// The set at column 1 overwrites part of the rolled row, not the rolled-in column: no shift, the scatter stays.
// CHECK-LABEL: func.func public @no_match_set_beside_the_rolled_in_place
// CHECK: stablehlo.concatenate
// CHECK: stablehlo.scatter
func.func public @no_match_set_beside_the_rolled_in_place(%arg0: tensor<2x8xi1>) -> tensor<2x8xi1> {
  %0 = stablehlo.slice %arg0 [0:2, 7:8] : (tensor<2x8xi1>) -> tensor<2x1xi1>
  %1 = stablehlo.slice %arg0 [0:2, 0:7] : (tensor<2x8xi1>) -> tensor<2x7xi1>
  %2 = stablehlo.concatenate %0, %1, dim = 1 : (tensor<2x1xi1>, tensor<2x7xi1>) -> tensor<2x8xi1>
  %c = stablehlo.constant dense<1> : tensor<i32>
  %3 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<1xi32>
  %f = stablehlo.constant dense<false> : tensor<i1>
  %4 = stablehlo.broadcast_in_dim %f, dims = [] : (tensor<i1>) -> tensor<2xi1>
  %5 = "stablehlo.scatter"(%2, %3, %4) <{indices_are_sorted = true, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [0], inserted_window_dims = [1], scatter_dims_to_operand_dims = [1]>, unique_indices = true}> ({
  ^bb0(%a: tensor<i1>, %b: tensor<i1>):
    stablehlo.return %b : tensor<i1>
  }) : (tensor<2x8xi1>, tensor<1xi32>, tensor<2xi1>) -> tensor<2x8xi1>
  return %5 : tensor<2x8xi1>
}

// -----

// concatenate([zeros((2, 1)), m[:, :-1]]): a shift, as a pad.
// CHECK-LABEL: func.func public @pads_a_concatenated_splat
// CHECK: stablehlo.pad %{{.*}}, %{{.*}}, low = [0, 1], high = [0, 0]
// CHECK-NOT: stablehlo.concatenate
func.func public @pads_a_concatenated_splat(%arg0: tensor<2x8xi1>) -> tensor<2x8xi1> {
  %f = stablehlo.constant dense<false> : tensor<i1>
  %0 = stablehlo.broadcast_in_dim %f, dims = [] : (tensor<i1>) -> tensor<2x1xi1>
  %1 = stablehlo.slice %arg0 [0:2, 0:7] : (tensor<2x8xi1>) -> tensor<2x7xi1>
  %2 = stablehlo.concatenate %0, %1, dim = 1 : (tensor<2x1xi1>, tensor<2x7xi1>) -> tensor<2x8xi1>
  return %2 : tensor<2x8xi1>
}

// -----

// A compare of constants alone is no take's bounds check: it stays (the program's settings, as its templates read
// them), and so does a compare of an iota (a position, not an argsort's ids).
// CHECK-LABEL: func.func public @no_match_compares_of_no_argsort
// CHECK: stablehlo.compare GT
// CHECK: stablehlo.compare GE
func.func public @no_match_compares_of_no_argsort(%arg0: tensor<4xi32>) -> (tensor<4xi1>, tensor<4xi1>) {
  %c = stablehlo.constant dense<16> : tensor<i32>
  %z = stablehlo.constant dense<0> : tensor<i32>
  %0 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<4xi32>
  %1 = stablehlo.broadcast_in_dim %z, dims = [] : (tensor<i32>) -> tensor<4xi32>
  %2 = stablehlo.compare GT, %0, %1, SIGNED : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi1>
  %iota = stablehlo.iota dim = 0 : tensor<4xi32>
  %3 = stablehlo.compare GE, %iota, %1, SIGNED : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi1>
  return %2, %3 : tensor<4xi1>, tensor<4xi1>
}

// -----

// zeros_like(v).at[rows, order].set(v), order an argsort's ids: every place set once, so v put back in id order, as
// sort_key_val(order, v), whatever the zeros held.
// CHECK-LABEL: func.func public @puts_back_a_scatter_of_the_rows_to_an_orders_places
// CHECK: %[[S:.*]]:2 = "stablehlo.sort"(%arg0, %{{.*}})
// CHECK: %[[B:.*]]:2 = "stablehlo.sort"(%[[S]]#1, %arg1)
// CHECK-NOT: stablehlo.scatter
// CHECK: return %[[B]]#1
func.func public @puts_back_a_scatter_of_the_rows_to_an_orders_places(%arg0: tensor<2x8xf32>, %arg1: tensor<2x8xf32>) -> tensor<2x8xf32> {
  %iota = stablehlo.iota dim = 1 : tensor<2x8xi32>
  %s:2 = "stablehlo.sort"(%arg0, %iota) <{dimension = 1 : i64, is_stable = true}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>, %c: tensor<i32>, %d: tensor<i32>):
    %lt = stablehlo.compare LT, %a, %b, TOTALORDER : (tensor<f32>, tensor<f32>) -> tensor<i1>
    stablehlo.return %lt : tensor<i1>
  }) : (tensor<2x8xf32>, tensor<2x8xi32>) -> (tensor<2x8xf32>, tensor<2x8xi32>)
  %rows = stablehlo.iota dim = 0 : tensor<2x8x1xi32>
  %ids = stablehlo.broadcast_in_dim %s#1, dims = [0, 1] : (tensor<2x8xi32>) -> tensor<2x8x1xi32>
  %indices = stablehlo.concatenate %rows, %ids, dim = 2 : (tensor<2x8x1xi32>, tensor<2x8x1xi32>) -> tensor<2x8x2xi32>
  %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %zeros = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x8xf32>
  %0 = "stablehlo.scatter"(%zeros, %indices, %arg1) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0, 1], scatter_dims_to_operand_dims = [0, 1], index_vector_dim = 2>, unique_indices = false}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    stablehlo.return %b : tensor<f32>
  }) : (tensor<2x8xf32>, tensor<2x8x2xi32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  return %0 : tensor<2x8xf32>
}

// -----

// The same scatter adding into the zeros (`.at[rows, order].add(v)`): no put-back, it stays.
// CHECK-LABEL: func.func public @no_match_scatter_add_to_an_orders_places
// CHECK: stablehlo.scatter
func.func public @no_match_scatter_add_to_an_orders_places(%arg0: tensor<2x8xf32>, %arg1: tensor<2x8xf32>) -> tensor<2x8xf32> {
  %iota = stablehlo.iota dim = 1 : tensor<2x8xi32>
  %s:2 = "stablehlo.sort"(%arg0, %iota) <{dimension = 1 : i64, is_stable = true}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>, %c: tensor<i32>, %d: tensor<i32>):
    %lt = stablehlo.compare LT, %a, %b, TOTALORDER : (tensor<f32>, tensor<f32>) -> tensor<i1>
    stablehlo.return %lt : tensor<i1>
  }) : (tensor<2x8xf32>, tensor<2x8xi32>) -> (tensor<2x8xf32>, tensor<2x8xi32>)
  %rows = stablehlo.iota dim = 0 : tensor<2x8x1xi32>
  %ids = stablehlo.broadcast_in_dim %s#1, dims = [0, 1] : (tensor<2x8xi32>) -> tensor<2x8x1xi32>
  %indices = stablehlo.concatenate %rows, %ids, dim = 2 : (tensor<2x8x1xi32>, tensor<2x8x1xi32>) -> tensor<2x8x2xi32>
  %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %zeros = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x8xf32>
  %0 = "stablehlo.scatter"(%zeros, %indices, %arg1) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0, 1], scatter_dims_to_operand_dims = [0, 1], index_vector_dim = 2>, unique_indices = false}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %sum = stablehlo.add %a, %b : tensor<f32>
    stablehlo.return %sum : tensor<f32>
  }) : (tensor<2x8xf32>, tensor<2x8x2xi32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  return %0 : tensor<2x8xf32>
}

// -----

// `jnp.sort(x)` beside `jnp.argsort(x)`: the argsort (moved up with its iota) gives the sorted values too; the row
// is sorted once.
// CHECK-LABEL: func.func public @sorts_values_once
// CHECK: %[[S:.*]]:2 = "stablehlo.sort"
// CHECK-NOT: stablehlo.sort
// CHECK: return %[[S]]#0, %[[S]]#1
func.func public @sorts_values_once(%arg0: tensor<2x8xf32>) -> (tensor<2x8xf32>, tensor<2x8xi32>) {
  %v = "stablehlo.sort"(%arg0) <{dimension = 1 : i64, is_stable = true}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %lt = stablehlo.compare LT, %a, %b, TOTALORDER : (tensor<f32>, tensor<f32>) -> tensor<i1>
    stablehlo.return %lt : tensor<i1>
  }) : (tensor<2x8xf32>) -> tensor<2x8xf32>
  %iota = stablehlo.iota dim = 1 : tensor<2x8xi32>
  %s:2 = "stablehlo.sort"(%arg0, %iota) <{dimension = 1 : i64, is_stable = true}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>, %c: tensor<i32>, %d: tensor<i32>):
    %lt = stablehlo.compare LT, %a, %b, TOTALORDER : (tensor<f32>, tensor<f32>) -> tensor<i1>
    stablehlo.return %lt : tensor<i1>
  }) : (tensor<2x8xf32>, tensor<2x8xi32>) -> (tensor<2x8xf32>, tensor<2x8xi32>)
  return %v, %s#1 : tensor<2x8xf32>, tensor<2x8xi32>
}

// -----

// An unstable sort of the values: which of equal entries (a -0 and a +0) lands where is XLA's, so both sorts stay.
// CHECK-LABEL: func.func public @no_match_unstable_value_sort
// CHECK: "stablehlo.sort"(%arg0)
// CHECK: "stablehlo.sort"(%arg0, %
func.func public @no_match_unstable_value_sort(%arg0: tensor<2x8xf32>) -> (tensor<2x8xf32>, tensor<2x8xi32>) {
  %v = "stablehlo.sort"(%arg0) <{dimension = 1 : i64, is_stable = false}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %lt = stablehlo.compare LT, %a, %b, TOTALORDER : (tensor<f32>, tensor<f32>) -> tensor<i1>
    stablehlo.return %lt : tensor<i1>
  }) : (tensor<2x8xf32>) -> tensor<2x8xf32>
  %iota = stablehlo.iota dim = 1 : tensor<2x8xi32>
  %s:2 = "stablehlo.sort"(%arg0, %iota) <{dimension = 1 : i64, is_stable = true}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>, %c: tensor<i32>, %d: tensor<i32>):
    %lt = stablehlo.compare LT, %a, %b, TOTALORDER : (tensor<f32>, tensor<f32>) -> tensor<i1>
    stablehlo.return %lt : tensor<i1>
  }) : (tensor<2x8xf32>, tensor<2x8xi32>) -> (tensor<2x8xf32>, tensor<2x8xi32>)
  return %v, %s#1 : tensor<2x8xf32>, tensor<2x8xi32>
}

// -----

// Near miss: the argsort sorts rev(x) (`argsort(x, descending=True)`), whose ties fall the other way.
// CHECK-LABEL: func.func public @near_miss_argsort_of_the_reversed_row
// CHECK: "stablehlo.sort"(%arg0)
// CHECK: "stablehlo.sort"(%
func.func public @near_miss_argsort_of_the_reversed_row(%arg0: tensor<2x8xf32>) -> (tensor<2x8xf32>, tensor<2x8xi32>) {
  %v = "stablehlo.sort"(%arg0) <{dimension = 1 : i64, is_stable = true}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>):
    %lt = stablehlo.compare LT, %a, %b, TOTALORDER : (tensor<f32>, tensor<f32>) -> tensor<i1>
    stablehlo.return %lt : tensor<i1>
  }) : (tensor<2x8xf32>) -> tensor<2x8xf32>
  %r = stablehlo.reverse %arg0, dims = [1] : tensor<2x8xf32>
  %iota = stablehlo.iota dim = 1 : tensor<2x8xi32>
  %s:2 = "stablehlo.sort"(%r, %iota) <{dimension = 1 : i64, is_stable = true}> ({
  ^bb0(%a: tensor<f32>, %b: tensor<f32>, %c: tensor<i32>, %d: tensor<i32>):
    %lt = stablehlo.compare LT, %a, %b, TOTALORDER : (tensor<f32>, tensor<f32>) -> tensor<i1>
    stablehlo.return %lt : tensor<i1>
  }) : (tensor<2x8xf32>, tensor<2x8xi32>) -> (tensor<2x8xf32>, tensor<2x8xi32>)
  return %v, %s#1 : tensor<2x8xf32>, tensor<2x8xi32>
}

// -----

// A slice of a mask of one array and a splat (`(c > p)[:, :-1]`) is the mask of the array's slice.
// CHECK-LABEL: func.func public @slices_a_masks_array
// CHECK: %[[S:.*]] = stablehlo.slice %arg0 [0:2, 0:7]
// CHECK: stablehlo.compare GT, %[[S]], %{{.*}}, FLOAT : (tensor<2x7xf32>, tensor<2x7xf32>) -> tensor<2x7xi1>
func.func public @slices_a_masks_array(%arg0: tensor<2x8xf32>) -> tensor<2x7xi1> {
  %cst = stablehlo.constant dense<9.000000e-01> : tensor<f32>
  %p = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x8xf32>
  %m = stablehlo.compare GT, %arg0, %p, FLOAT : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xi1>
  %0 = stablehlo.slice %m [0:2, 0:7] : (tensor<2x8xi1>) -> tensor<2x7xi1>
  return %0 : tensor<2x7xi1>
}

// -----

// A mask of two arrays: no one array to slice, the slice stays.
// CHECK-LABEL: func.func public @no_match_slice_of_a_mask_of_two_arrays
// CHECK: stablehlo.compare GT, %arg0, %arg1
// CHECK: stablehlo.slice
func.func public @no_match_slice_of_a_mask_of_two_arrays(%arg0: tensor<2x8xf32>, %arg1: tensor<2x8xf32>) -> tensor<2x7xi1> {
  %m = stablehlo.compare GT, %arg0, %arg1, FLOAT : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xi1>
  %0 = stablehlo.slice %m [0:2, 0:7] : (tensor<2x8xi1>) -> tensor<2x7xi1>
  return %0 : tensor<2x7xi1>
}

// -----

// Near miss: a slice of a float value computed from one array (not a mask) stays where the program has it.
// CHECK-LABEL: func.func public @near_miss_slice_of_a_float
// CHECK: stablehlo.multiply %arg0
// CHECK: stablehlo.slice
func.func public @near_miss_slice_of_a_float(%arg0: tensor<2x8xf32>) -> tensor<2x7xf32> {
  %cst = stablehlo.constant dense<9.000000e-01> : tensor<f32>
  %p = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x8xf32>
  %m = stablehlo.multiply %arg0, %p : tensor<2x8xf32>
  %0 = stablehlo.slice %m [0:2, 0:7] : (tensor<2x8xf32>) -> tensor<2x7xf32>
  return %0 : tensor<2x7xf32>
}

// -----

// mesh-transformer-jax's shift, `concatenate([zeros, r])[:, :-1]`: the slice of a pad is the pad of r's slice.
// CHECK-LABEL: func.func public @slices_a_pad_by_parts
// CHECK: %[[S:.*]] = stablehlo.slice %arg0 [0:2, 0:7]
// CHECK: stablehlo.pad %[[S]], %{{.*}}, low = [0, 1], high = [0, 0], interior = [0, 0]
func.func public @slices_a_pad_by_parts(%arg0: tensor<2x8xi1>) -> tensor<2x8xi1> {
  %c = stablehlo.constant dense<false> : tensor<i1>
  %0 = stablehlo.pad %arg0, %c, low = [0, 1], high = [0, 0], interior = [0, 0] : (tensor<2x8xi1>, tensor<i1>) -> tensor<2x9xi1>
  %1 = stablehlo.slice %0 [0:2, 0:8] : (tensor<2x9xi1>) -> tensor<2x8xi1>
  return %1 : tensor<2x8xi1>
}

// -----

// A pad with interior padding: its slice stays.
// CHECK-LABEL: func.func public @no_match_slice_of_an_interior_pad
// CHECK: stablehlo.pad %arg0
// CHECK: stablehlo.slice
func.func public @no_match_slice_of_an_interior_pad(%arg0: tensor<2x8xi1>) -> tensor<2x8xi1> {
  %c = stablehlo.constant dense<false> : tensor<i1>
  %0 = stablehlo.pad %arg0, %c, low = [0, 1], high = [0, 0], interior = [0, 1] : (tensor<2x8xi1>, tensor<i1>) -> tensor<2x16xi1>
  %1 = stablehlo.slice %0 [0:2, 0:8] : (tensor<2x16xi1>) -> tensor<2x8xi1>
  return %1 : tensor<2x8xi1>
}

// -----

// Near miss: a slice of only the padding keeps no part of the array; it stays.
// CHECK-LABEL: func.func public @near_miss_slice_of_the_padding_alone
// CHECK: stablehlo.slice
func.func public @near_miss_slice_of_the_padding_alone(%arg0: tensor<2x8xi1>) -> tensor<2x1xi1> {
  %c = stablehlo.constant dense<false> : tensor<i1>
  %0 = stablehlo.pad %arg0, %c, low = [0, 1], high = [0, 0], interior = [0, 0] : (tensor<2x8xi1>, tensor<i1>) -> tensor<2x9xi1>
  %1 = stablehlo.slice %0 [0:2, 0:1] : (tensor<2x9xi1>) -> tensor<2x1xi1>
  return %1 : tensor<2x1xi1>
}

// -----

// A float shift read as a mask, `concatenate([zeros, convert(m)]) != 0`: the pad of m itself, False in front.
// CHECK-LABEL: func.func public @masks_a_pad_by_parts
// CHECK: %[[F:.*]] = stablehlo.constant dense<false> : tensor<i1>
// CHECK: %[[P:.*]] = stablehlo.pad %arg0, %[[F]], low = [0, 1]
// CHECK: return %[[P]]
func.func public @masks_a_pad_by_parts(%arg0: tensor<2x7xi1>) -> tensor<2x8xi1> {
  %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %f = stablehlo.convert %arg0 : (tensor<2x7xi1>) -> tensor<2x7xf32>
  %0 = stablehlo.pad %f, %cst, low = [0, 1], high = [0, 0], interior = [0, 0] : (tensor<2x7xf32>, tensor<f32>) -> tensor<2x8xf32>
  %z = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x8xf32>
  %1 = stablehlo.compare NE, %0, %z, FLOAT : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xi1>
  return %1 : tensor<2x8xi1>
}

// -----

// A compare of a converted mask with 1, not 0: no fold of the convert (the pad still moves: its mask is exact).
// CHECK-LABEL: func.func public @no_match_converted_mask_against_one
// CHECK: stablehlo.convert %arg0
// CHECK: stablehlo.compare NE
func.func public @no_match_converted_mask_against_one(%arg0: tensor<2x7xi1>) -> tensor<2x7xi1> {
  %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
  %f = stablehlo.convert %arg0 : (tensor<2x7xi1>) -> tensor<2x7xf32>
  %z = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x7xf32>
  %1 = stablehlo.compare NE, %f, %z, FLOAT : (tensor<2x7xf32>, tensor<2x7xf32>) -> tensor<2x7xi1>
  return %1 : tensor<2x7xi1>
}

// -----

// Near miss: `convert(m) == 0` is `not m`, not m.
// CHECK-LABEL: func.func public @near_miss_converted_mask_equal_to_zero
// CHECK: %[[N:.*]] = stablehlo.not %arg0
// CHECK: return %[[N]]
func.func public @near_miss_converted_mask_equal_to_zero(%arg0: tensor<2x7xi1>) -> tensor<2x7xi1> {
  %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %f = stablehlo.convert %arg0 : (tensor<2x7xi1>) -> tensor<2x7xf32>
  %z = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x7xf32>
  %1 = stablehlo.compare EQ, %f, %z, FLOAT : (tensor<2x7xf32>, tensor<2x7xf32>) -> tensor<2x7xi1>
  return %1 : tensor<2x7xi1>
}

// -----

// EasyDeL's k-th largest, `jnp.sort(x)[:, ::-1][:, k - 1]`: the column of the row at the mirrored place, as
// `jnp.sort(x)[:, -k]` reads it.
// CHECK-LABEL: func.func public @slices_a_column_of_a_reverse
// CHECK-NOT: stablehlo.reverse
// CHECK: stablehlo.slice %arg0 [0:2, 5:6]
func.func public @slices_a_column_of_a_reverse(%arg0: tensor<2x8xf32>) -> tensor<2x1xf32> {
  %r = stablehlo.reverse %arg0, dims = [1] : tensor<2x8xf32>
  %0 = stablehlo.slice %r [0:2, 2:3] : (tensor<2x8xf32>) -> tensor<2x1xf32>
  return %0 : tensor<2x1xf32>
}

// -----

// The same read by a dynamic_slice at constant indices.
// CHECK-LABEL: func.func public @slices_a_dynamic_column_of_a_reverse
// CHECK-NOT: stablehlo.reverse
// CHECK: stablehlo.slice %arg0 [0:2, 5:6]
func.func public @slices_a_dynamic_column_of_a_reverse(%arg0: tensor<2x8xf32>) -> tensor<2x1xf32> {
  %r = stablehlo.reverse %arg0, dims = [1] : tensor<2x8xf32>
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %c2 = stablehlo.constant dense<2> : tensor<i32>
  %0 = stablehlo.dynamic_slice %r, %c0, %c2, sizes = [2, 1] : (tensor<2x8xf32>, tensor<i32>, tensor<i32>) -> tensor<2x1xf32>
  return %0 : tensor<2x1xf32>
}

// -----

// Ids (an argsort's order, which the take normal forms read through its reverse): the reverse stays.
// CHECK-LABEL: func.func public @no_match_column_of_reversed_ids
// CHECK: stablehlo.reverse
func.func public @no_match_column_of_reversed_ids(%arg0: tensor<2x8xi32>) -> tensor<2x1xi32> {
  %r = stablehlo.reverse %arg0, dims = [1] : tensor<2x8xi32>
  %0 = stablehlo.slice %r [0:2, 2:3] : (tensor<2x8xi32>) -> tensor<2x1xi32>
  return %0 : tensor<2x1xi32>
}

// -----

// Near miss: a two-wide slice of a reversed row keeps its two entries reversed: the reverse stays.
// CHECK-LABEL: func.func public @near_miss_two_columns_of_a_reverse
// CHECK: stablehlo.reverse
func.func public @near_miss_two_columns_of_a_reverse(%arg0: tensor<2x8xf32>) -> tensor<2x2xf32> {
  %r = stablehlo.reverse %arg0, dims = [1] : tensor<2x8xf32>
  %0 = stablehlo.slice %r [0:2, 2:4] : (tensor<2x8xf32>) -> tensor<2x2xf32>
  return %0 : tensor<2x2xf32>
}

// -----

// A slice of a slice is one slice (`jnp.sort(x)[..., -k:][..., 0:1]`, the k-th largest as some code reads it).
// CHECK-LABEL: func.func public @composes_a_slice_of_a_slice
// CHECK: stablehlo.slice %arg0 [0:2, 4:5]
// CHECK-NOT: stablehlo.slice
func.func public @composes_a_slice_of_a_slice(%arg0: tensor<2x8xf32>) -> tensor<2x1xf32> {
  %0 = stablehlo.slice %arg0 [0:2, 4:8] : (tensor<2x8xf32>) -> tensor<2x4xf32>
  %1 = stablehlo.slice %0 [0:2, 0:1] : (tensor<2x4xf32>) -> tensor<2x1xf32>
  return %1 : tensor<2x1xf32>
}

// -----

// Strides multiply: entries 1 and 3 of the odd columns are columns 3 and 7.
// CHECK-LABEL: func.func public @composes_strided_slices
// CHECK: stablehlo.slice %arg0 [0:2, 3:8:4]
// CHECK-NOT: stablehlo.slice
func.func public @composes_strided_slices(%arg0: tensor<2x8xf32>) -> tensor<2x2xf32> {
  %0 = stablehlo.slice %arg0 [0:2, 1:8:2] : (tensor<2x8xf32>) -> tensor<2x4xf32>
  %1 = stablehlo.slice %0 [0:2, 1:4:2] : (tensor<2x4xf32>) -> tensor<2x2xf32>
  return %1 : tensor<2x2xf32>
}

// -----

// A dynamic_slice at constant indices, clamped into its operand as the op clamps them (column 6 starts past the
// last window, so the window is columns 5 to 7), read by a slice: one slice.
// CHECK-LABEL: func.func public @composes_a_slice_of_a_clamped_dynamic_slice
// CHECK: stablehlo.slice %arg0 [0:2, 6:7]
// CHECK-NOT: stablehlo.dynamic_slice
func.func public @composes_a_slice_of_a_clamped_dynamic_slice(%arg0: tensor<2x8xf32>) -> tensor<2x1xf32> {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %c6 = stablehlo.constant dense<6> : tensor<i32>
  %0 = stablehlo.dynamic_slice %arg0, %c0, %c6, sizes = [2, 3] : (tensor<2x8xf32>, tensor<i32>, tensor<i32>) -> tensor<2x3xf32>
  %1 = stablehlo.slice %0 [0:2, 1:2] : (tensor<2x3xf32>) -> tensor<2x1xf32>
  return %1 : tensor<2x1xf32>
}

// -----

// Near miss: a dynamic_slice at a traced index has no window to compose: both stay.
// CHECK-LABEL: func.func public @near_miss_slice_of_a_traced_dynamic_slice
// CHECK: stablehlo.dynamic_slice
// CHECK: stablehlo.slice
func.func public @near_miss_slice_of_a_traced_dynamic_slice(%arg0: tensor<2x8xf32>, %arg1: tensor<i32>) -> tensor<2x1xf32> {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %0 = stablehlo.dynamic_slice %arg0, %c0, %arg1, sizes = [2, 3] : (tensor<2x8xf32>, tensor<i32>, tensor<i32>) -> tensor<2x3xf32>
  %1 = stablehlo.slice %0 [0:2, 1:2] : (tensor<2x3xf32>) -> tensor<2x1xf32>
  return %1 : tensor<2x1xf32>
}

// -----

// No match: one slice alone stays as it is.
// CHECK-LABEL: func.func public @no_match_one_slice
// CHECK: stablehlo.slice %arg0 [0:2, 2:5]
func.func public @no_match_one_slice(%arg0: tensor<2x8xf32>) -> tensor<2x3xf32> {
  %0 = stablehlo.slice %arg0 [0:2, 2:5] : (tensor<2x8xf32>) -> tensor<2x3xf32>
  return %0 : tensor<2x3xf32>
}

// -----

// A concatenate of a constant held as a resource blob (a large weight): no splat to read, the concatenate stays and
// the pass goes on.
// CHECK-LABEL: func.func public @no_match_concatenate_of_a_resource_constant
// CHECK: stablehlo.concatenate
func.func public @no_match_concatenate_of_a_resource_constant(%arg0: tensor<2x7xf32>) -> tensor<2x8xf32> {
  %c = stablehlo.constant dense_resource<blob1> : tensor<2x1xf32>
  %0 = stablehlo.concatenate %c, %arg0, dim = 1 : (tensor<2x1xf32>, tensor<2x7xf32>) -> tensor<2x8xf32>
  return %0 : tensor<2x8xf32>
}

{-#
  dialect_resources: {
    builtin: {
      blob1: "0x040000000000803F0000803F"
    }
  }
#-}

// -----

// `jax.vmap` broadcasts a row's `where` fill to the row, then to the batch: one broadcast, as batched code writes it.
// CHECK-LABEL: func.func public @composes_a_fills_broadcast_of_a_broadcast
// CHECK: %[[FILL:.*]] = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x8xf32>
// CHECK-NEXT: stablehlo.select %{{.*}}, %arg0, %[[FILL]]
func.func public @composes_a_fills_broadcast_of_a_broadcast(%arg0: tensor<2x8xf32>, %arg1: tensor<2x8xi1>) -> tensor<2x8xf32> {
  %cst = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<8xf32>
  %1 = stablehlo.broadcast_in_dim %0, dims = [1] : (tensor<8xf32>) -> tensor<2x8xf32>
  %2 = stablehlo.select %arg1, %arg0, %1 : tensor<2x8xi1>, tensor<2x8xf32>
  return %2 : tensor<2x8xf32>
}

// -----

// Near miss: a splat a compare reads (a threshold) keeps its broadcasts, which templates read their parameters by.
// CHECK-LABEL: func.func public @no_match_a_thresholds_broadcast_of_a_broadcast
// CHECK: stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<8xf32>
// CHECK: stablehlo.broadcast_in_dim %{{.*}}, dims = [1] : (tensor<8xf32>) -> tensor<2x8xf32>
func.func public @no_match_a_thresholds_broadcast_of_a_broadcast(%arg0: tensor<2x8xf32>) -> tensor<2x8xi1> {
  %cst = stablehlo.constant dense<0.899999976> : tensor<f32>
  %0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<8xf32>
  %1 = stablehlo.broadcast_in_dim %0, dims = [1] : (tensor<8xf32>) -> tensor<2x8xf32>
  %2 = stablehlo.compare LT, %arg0, %1, FLOAT : (tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xi1>
  return %2 : tensor<2x8xi1>
}

// -----

// Near miss: a fill broadcast that carries a sharding annotation stays as it is.
// CHECK-LABEL: func.func public @no_match_a_fills_broadcast_with_a_sharding
// CHECK: dims = [1] {mhlo.sharding
func.func public @no_match_a_fills_broadcast_with_a_sharding(%arg0: tensor<2x8xf32>, %arg1: tensor<2x8xi1>) -> tensor<2x8xf32> {
  %cst = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<8xf32>
  %1 = stablehlo.broadcast_in_dim %0, dims = [1] {mhlo.sharding = "{replicated}"} : (tensor<8xf32>) -> tensor<2x8xf32>
  %2 = stablehlo.select %arg1, %arg0, %1 : tensor<2x8xi1>, tensor<2x8xf32>
  return %2 : tensor<2x8xf32>
}

// -----

// `jax.vmap` of a row's `jnp.argsort(y, descending=True)` broadcasts the row's reversed iota to the batch: the batch's
// iota, reversed, as the batched argsort writes it.
// CHECK-LABEL: func.func public @broadcasts_before_a_reversed_iota
// CHECK: %[[IDS:.*]] = stablehlo.iota dim = 1 : tensor<2x8xi32>
// CHECK-NEXT: stablehlo.reverse %[[IDS]], dims = [1] : tensor<2x8xi32>
func.func public @broadcasts_before_a_reversed_iota() -> tensor<2x8xi32> {
  %0 = stablehlo.iota dim = 0 : tensor<8xi32>
  %1 = stablehlo.reverse %0, dims = [0] : tensor<8xi32>
  %2 = stablehlo.broadcast_in_dim %1, dims = [1] : (tensor<8xi32>) -> tensor<2x8xi32>
  return %2 : tensor<2x8xi32>
}

// -----

// Near miss: the iota's dim is a unit dim that the broadcast expands (every place counts 0): not an iota of the result.
// CHECK-LABEL: func.func public @no_match_broadcast_expanding_an_iota
// CHECK: stablehlo.broadcast_in_dim {{.*}} dims = [1] : (tensor<1xi32>) -> tensor<2x8xi32>
func.func public @no_match_broadcast_expanding_an_iota() -> tensor<2x8xi32> {
  %0 = stablehlo.iota dim = 0 : tensor<1xi32>
  %1 = stablehlo.reverse %0, dims = [0] : tensor<1xi32>
  %2 = stablehlo.broadcast_in_dim %1, dims = [1] : (tensor<1xi32>) -> tensor<2x8xi32>
  return %2 : tensor<2x8xi32>
}
