// Tests for --duck-assign-modes: decode/prefill modes and the smp flag of
// every shard, for one and for several cores per duck.
// RUN: rm -rf %t && split-file %s %t
// RUN: duck-opt %t/modes.mlir -split-input-file --duck-assign-modes | FileCheck %t/modes.mlir --check-prefix=ONE
// RUN: duck-opt %t/modes.mlir -split-input-file --duck-assign-modes="cores-per-duck=1" | FileCheck %t/modes.mlir --check-prefix=ONE
// RUN: duck-opt %t/modes.mlir -split-input-file --duck-assign-modes="cores-per-duck=2" | FileCheck %t/modes.mlir --check-prefix=SMP
// RUN: duck-opt %t/modes.mlir -split-input-file --duck-assign-modes="cores-per-duck=4" | FileCheck %t/modes.mlir --check-prefix=SMP
// RUN: duck-opt %t/bad-cores.mlir --duck-assign-modes="cores-per-duck=0" -verify-diagnostics

//--- modes.mlir
// Dense shards: decode mode 0 (dense GEMV) and prefill mode 5 (dense
// batched GEMM) whatever the cores; smp says whether all cores run.
// ONE-LABEL: duck.model @dense
// ONE:         duck.fp9_ffn {block = 64 : i64, decode_mode = 0 : i32, {{.*}}prefill_mode = 5 : i32, rank = 0 : i64, smp = false}
// ONE-NEXT:    duck.fp9_ffn {block = 64 : i64, decode_mode = 0 : i32, {{.*}}prefill_mode = 5 : i32, rank = 1 : i64, smp = false}
// SMP-LABEL: duck.model @dense
// SMP:         duck.fp9_ffn {block = 64 : i64, decode_mode = 0 : i32, {{.*}}prefill_mode = 5 : i32, rank = 0 : i64, smp = true}
// SMP-NEXT:    duck.fp9_ffn {block = 64 : i64, decode_mode = 0 : i32, {{.*}}prefill_mode = 5 : i32, rank = 1 : i64, smp = true}
duck.model @dense attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 64 : i64, inter = 128 : i64,
      gate = #duck.weight<"g", bf16, [128, 64]>, up = #duck.weight<"u", bf16, [128, 64]>,
      down = #duck.weight<"d", bf16, [64, 128]>, tp = 2 : i64, multiple_of = 64 : i64} : tensor<?x64xf32> shards {
    duck.fp9_ffn {rank = 0 : i64, inter_begin = 0 : i64, inter_end = 64 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 64 : i64}
    duck.fp9_ffn {rank = 1 : i64, inter_begin = 64 : i64, inter_end = 128 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 64 : i64}
  }
  duck.return %m : tensor<?x64xf32>
}

// -----

// MoE shards: one core decodes with mode 1 (single-core MoE), several with
// mode 4 (SMP MoE); prefill is mode 6 either way.
// ONE-LABEL: duck.model @moe
// ONE:         duck.fp9_ffn {block = 64 : i64, decode_mode = 1 : i32, {{.*}}prefill_mode = 6 : i32, rank = 0 : i64, smp = false}
// SMP-LABEL: duck.model @moe
// SMP:         duck.fp9_ffn {block = 64 : i64, decode_mode = 4 : i32, {{.*}}prefill_mode = 6 : i32, rank = 0 : i64, smp = true}
duck.model @moe attributes {family = "qwen3_moe", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %e = duck.moe %x {layer = 0 : i64, hidden = 64 : i64, inter = 64 : i64, num_experts = 2 : i64, top_k = 1 : i64,
      router = #duck.router_kind<softmax>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [2, 64]>,
      gate = #duck.experts<"g{e}", bf16, [64, 64], count = 2>, up = #duck.experts<"u{e}", bf16, [64, 64], count = 2>,
      down = #duck.experts<"d{e}", bf16, [64, 64], count = 2>, tp = 1 : i64, multiple_of = 64 : i64} : tensor<?x64xf32> shards {
    duck.fp9_ffn {rank = 0 : i64, inter_begin = 0 : i64, inter_end = 64 : i64, expert_begin = 0 : i64, expert_end = 2 : i64, block = 64 : i64}
  }
  duck.return %e : tensor<?x64xf32>
}

// -----

// Modes already set (e.g. by an earlier run) are overwritten, not kept.
// ONE-LABEL: duck.model @reassign
// ONE:         duck.fp9_ffn {block = 64 : i64, decode_mode = 1 : i32, {{.*}}prefill_mode = 6 : i32, rank = 0 : i64, smp = false}
// SMP-LABEL: duck.model @reassign
// SMP:         duck.fp9_ffn {block = 64 : i64, decode_mode = 4 : i32, {{.*}}prefill_mode = 6 : i32, rank = 0 : i64, smp = true}
duck.model @reassign attributes {family = "qwen3_moe", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %e = duck.moe %x {layer = 0 : i64, hidden = 64 : i64, inter = 64 : i64, num_experts = 2 : i64, top_k = 1 : i64,
      router = #duck.router_kind<softmax>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [2, 64]>,
      gate = #duck.experts<"g{e}", bf16, [64, 64], count = 2>, up = #duck.experts<"u{e}", bf16, [64, 64], count = 2>,
      down = #duck.experts<"d{e}", bf16, [64, 64], count = 2>, tp = 1 : i64, multiple_of = 64 : i64} : tensor<?x64xf32> shards {
    duck.fp9_ffn {rank = 0 : i64, inter_begin = 0 : i64, inter_end = 64 : i64, expert_begin = 0 : i64, expert_end = 2 : i64, block = 64 : i64,
                  decode_mode = 2 : i32, prefill_mode = 3 : i32}
  }
  duck.return %e : tensor<?x64xf32>
}

//--- bad-cores.mlir
// A duck has at least one core; the error names the value given.
// expected-error @+1 {{duck-assign-modes: cores-per-duck must be at least 1, got 0}}
module {
duck.model @no_cores attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  duck.return
}
}
