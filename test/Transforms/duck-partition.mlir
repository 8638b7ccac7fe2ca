// Tests for --duck-partition. Each `//---` part is one behaviour and runs
// with its own options; the error parts are checked with -verify-diagnostics.
// RUN: rm -rf %t && split-file %s %t
// RUN: duck-opt %t/even-128.mlir --duck-partition="tp=2 multiple-of=128" | FileCheck %t/even-128.mlir
// RUN: duck-opt %t/uneven-64.mlir --duck-partition="tp=3 multiple-of=64" | FileCheck %t/uneven-64.mlir
// RUN: duck-opt %t/block-32.mlir --duck-partition="tp=3 multiple-of=32" | FileCheck %t/block-32.mlir
// RUN: duck-opt %t/tp1-default.mlir --duck-partition | FileCheck %t/tp1-default.mlir
// RUN: duck-opt %t/auto-tp2.mlir -split-input-file --duck-partition="tp=2" | FileCheck %t/auto-tp2.mlir
// RUN: duck-opt %t/auto-tp4.mlir --duck-partition="tp=4 multiple-of=auto" | FileCheck %t/auto-tp4.mlir
// RUN: duck-opt %t/moe-intermediate.mlir --duck-partition="tp=2 multiple-of=64" | FileCheck %t/moe-intermediate.mlir
// RUN: duck-opt %t/moe-experts.mlir --duck-partition="tp=2 multiple-of=64 strategy=experts" | FileCheck %t/moe-experts.mlir
// RUN: duck-opt %t/moe-experts-auto.mlir --duck-partition="tp=4 strategy=experts" | FileCheck %t/moe-experts-auto.mlir
// RUN: duck-opt %t/experts-uneven.mlir --duck-partition="tp=2 multiple-of=64 strategy=experts" | FileCheck %t/experts-uneven.mlir
// RUN: duck-opt %t/experts-uneven.mlir --duck-partition="tp=3 multiple-of=64 strategy=experts shares=3,1,1" | FileCheck %t/experts-uneven.mlir --check-prefix=SHARES
// RUN: duck-opt %t/shares.mlir --duck-partition="tp=4 multiple-of=32 shares=2,2,1,1" | FileCheck %t/shares.mlir
// RUN: duck-opt %t/shares.mlir --duck-partition="tp=3 multiple-of=32 shares=100,1,1" | FileCheck %t/shares.mlir --check-prefix=FLOOR
// RUN: not duck-opt %t/shares.mlir --duck-partition="tp=2 shares=1,0" 2>&1 | FileCheck %t/shares.mlir --check-prefix=BAD
// RUN: duck-opt %t/head.mlir --duck-partition="tp=3 multiple-of=64 lm-head=ducks shares=2,1,1" | FileCheck %t/head.mlir
// RUN: duck-opt %t/head.mlir --duck-partition="tp=3 multiple-of=64 lm-head=ducks" --duck-partition="tp=3 multiple-of=64" | FileCheck %t/head.mlir --check-prefix=BACK
// RUN: not duck-opt %t/head.mlir --duck-partition="tp=6 multiple-of=32 lm-head=ducks" 2>&1 | FileCheck %t/head.mlir --check-prefix=FEW
// RUN: not duck-opt %t/head.mlir --duck-partition="lm-head=gpu" 2>&1 | FileCheck %t/head.mlir --check-prefix=BADHEAD
// RUN: duck-opt %t/o-proj.mlir --duck-partition="tp=2 multiple-of=64 o-proj=ducks" | FileCheck %t/o-proj.mlir
// RUN: duck-opt %t/o-proj.mlir --duck-partition="tp=2 multiple-of=64 o-proj=ducks" --duck-partition="tp=2 multiple-of=64" | FileCheck %t/o-proj.mlir --check-prefix=BACK
// RUN: not duck-opt %t/o-proj.mlir --duck-partition="tp=3 multiple-of=64 o-proj=ducks" 2>&1 | FileCheck %t/o-proj.mlir --check-prefix=FEW
// RUN: not duck-opt %t/o-proj.mlir --duck-partition="o-proj=gpu" 2>&1 | FileCheck %t/o-proj.mlir --check-prefix=BADO
// RUN: duck-opt %t/o-proj.mlir --duck-partition="tp=1 multiple-of=64 q-proj=ducks o-proj=ducks" | FileCheck %t/o-proj.mlir --check-prefix=QPROJ
// RUN: not duck-opt %t/o-proj.mlir --duck-partition="tp=2 multiple-of=64 q-proj=ducks" 2>&1 | FileCheck %t/o-proj.mlir --check-prefix=QFEW
// RUN: not duck-opt %t/o-proj.mlir --duck-partition="q-proj=gpu" 2>&1 | FileCheck %t/o-proj.mlir --check-prefix=BADQ
// RUN: duck-opt %t/repartition.mlir --duck-partition="tp=2 multiple-of=64" --duck-partition="tp=4 multiple-of=32" | FileCheck %t/repartition.mlir
// RUN: duck-opt %t/err-tp-max.mlir --duck-partition="tp=8 multiple-of=128" -verify-diagnostics
// RUN: duck-opt %t/err-tp-max-32.mlir --duck-partition="tp=4 multiple-of=32" -verify-diagnostics
// RUN: duck-opt %t/err-not-multiple.mlir --duck-partition="tp=1 multiple-of=64" -verify-diagnostics
// RUN: duck-opt %t/err-auto.mlir --duck-partition="tp=4" -verify-diagnostics
// RUN: duck-opt %t/err-experts.mlir --duck-partition="tp=6 multiple-of=64 strategy=experts" -verify-diagnostics
// RUN: duck-opt %t/err-strategy.mlir --duck-partition="strategy=experts_by_id" -verify-diagnostics
// RUN: duck-opt %t/mixed.mlir --duck-partition="tp=2 multiple-of=64 strategy=intermediate,experts:2" | FileCheck %t/mixed.mlir
// RUN: duck-opt %t/mixed.mlir --duck-partition="tp=2 multiple-of=64 strategy=experts,intermediate:1-2,experts:2" | FileCheck %t/mixed.mlir
// RUN: duck-opt %t/mixed.mlir --duck-partition="tp=2 multiple-of=64 strategy=experts:1-2" | FileCheck %t/mixed.mlir --check-prefix=ALL
// RUN: duck-opt %t/mixed.mlir --duck-partition="tp=2 multiple-of=64 strategy=experts,intermediate:1" --duck-select-kernels --duck-assign-modes --duck-layout-weights --duck-stats | FileCheck %t/mixed.mlir --check-prefix=SPEC
// RUN: duck-opt %t/mixed.mlir --duck-partition="tp=2 multiple-of=64 strategy=experts:1,intermediate" | FileCheck %t/mixed.mlir --check-prefix=NONE
// RUN: not duck-opt %t/mixed.mlir --duck-partition="tp=2 multiple-of=64 strategy=experts:0-1" 2>&1 | FileCheck %t/mixed.mlir --check-prefix=DENSE
// RUN: not duck-opt %t/mixed.mlir --duck-partition="tp=2 multiple-of=64 strategy=experts:7-9" 2>&1 | FileCheck %t/mixed.mlir --check-prefix=NOLAYER
// RUN: not duck-opt %t/mixed.mlir --duck-partition="tp=2 multiple-of=64 strategy=experts:2-1" 2>&1 | FileCheck %t/mixed.mlir --check-prefix=RANGE
// RUN: not duck-opt %t/mixed.mlir --duck-partition="tp=2 multiple-of=64 strategy=intermediate,experts:x" 2>&1 | FileCheck %t/mixed.mlir --check-prefix=RANGE2
// RUN: not duck-opt %t/mixed.mlir --duck-partition="tp=2 multiple-of=64 strategy=mixed" 2>&1 | FileCheck %t/mixed.mlir --check-prefix=NOTMIXED
// RUN: duck-opt %t/err-multiple-of.mlir --duck-partition="multiple-of=48" -verify-diagnostics
// RUN: duck-opt %t/err-tp0.mlir --duck-partition="tp=0" -verify-diagnostics

//--- even-128.mlir
// tp=2, multiple-of=128: 256 neurons = 2 blocks, one block a duck; the op
// gets tp, multiple_of, tp_max = 256/128 and the intermediate strategy.
// CHECK-LABEL: duck.model @even
// CHECK:         duck.mlp
// CHECK-SAME:      multiple_of = 128 : i64, strategy = #duck.strategy<intermediate>, tp = 2 : i64, tp_max = 2 : i64
// CHECK-SAME:      shards {
// CHECK-NEXT:      duck.fp9_ffn {block = 128 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, inter_begin = 0 : i64, inter_end = 128 : i64, rank = 0 : i64}
// CHECK-NEXT:      duck.fp9_ffn {block = 128 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, inter_begin = 128 : i64, inter_end = 256 : i64, rank = 1 : i64}
// CHECK-NEXT:    }
duck.model @even attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 64 : i64, inter = 256 : i64,
      gate = #duck.weight<"g", bf16, [256, 64]>, up = #duck.weight<"u", bf16, [256, 64]>,
      down = #duck.weight<"d", bf16, [64, 256]>} : tensor<?x64xf32>
  duck.return %m : tensor<?x64xf32>
}

//--- uneven-64.mlir
// tp=3, multiple-of=64: 320 neurons = 5 blocks do not divide by 3; the first
// 5 % 3 = 2 ducks take one block more (2, 2, 1 blocks), slices stay whole
// blocks and contiguous.
// CHECK-LABEL: duck.model @uneven
// CHECK:         multiple_of = 64 : i64, strategy = #duck.strategy<intermediate>, tp = 3 : i64, tp_max = 5 : i64
// CHECK-NEXT:      duck.fp9_ffn {block = 64 : i64, {{.*}}inter_begin = 0 : i64, inter_end = 128 : i64, rank = 0 : i64}
// CHECK-NEXT:      duck.fp9_ffn {block = 64 : i64, {{.*}}inter_begin = 128 : i64, inter_end = 256 : i64, rank = 1 : i64}
// CHECK-NEXT:      duck.fp9_ffn {block = 64 : i64, {{.*}}inter_begin = 256 : i64, inter_end = 320 : i64, rank = 2 : i64}
// CHECK-NEXT:    }
duck.model @uneven attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 64 : i64, inter = 320 : i64,
      gate = #duck.weight<"g", bf16, [320, 64]>, up = #duck.weight<"u", bf16, [320, 64]>,
      down = #duck.weight<"d", bf16, [64, 320]>} : tensor<?x64xf32>
  duck.return %m : tensor<?x64xf32>
}

//--- block-32.mlir
// tp=3, multiple-of=32: 96 neurons are 3 blocks of 32, one a duck; 96 is
// not a multiple of 64, so only 32 (or auto) can split it.
// CHECK-LABEL: duck.model @block32
// CHECK:         multiple_of = 32 : i64, strategy = #duck.strategy<intermediate>, tp = 3 : i64, tp_max = 3 : i64
// CHECK-NEXT:      duck.fp9_ffn {block = 32 : i64, {{.*}}inter_begin = 0 : i64, inter_end = 32 : i64, rank = 0 : i64}
// CHECK-NEXT:      duck.fp9_ffn {block = 32 : i64, {{.*}}inter_begin = 32 : i64, inter_end = 64 : i64, rank = 1 : i64}
// CHECK-NEXT:      duck.fp9_ffn {block = 32 : i64, {{.*}}inter_begin = 64 : i64, inter_end = 96 : i64, rank = 2 : i64}
// CHECK-NEXT:    }
duck.model @block32 attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 64 : i64, inter = 96 : i64,
      gate = #duck.weight<"g", bf16, [96, 64]>, up = #duck.weight<"u", bf16, [96, 64]>,
      down = #duck.weight<"d", bf16, [64, 96]>} : tensor<?x64xf32>
  duck.return %m : tensor<?x64xf32>
}

//--- tp1-default.mlir
// No options: tp=1 and multiple-of=auto; one duck holds the whole layer
// with the largest block, 128.
// CHECK-LABEL: duck.model @single
// CHECK:         multiple_of = 128 : i64, strategy = #duck.strategy<intermediate>, tp = 1 : i64, tp_max = 2 : i64
// CHECK-NEXT:      duck.fp9_ffn {block = 128 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, inter_begin = 0 : i64, inter_end = 256 : i64, rank = 0 : i64}
// CHECK-NEXT:    }
duck.model @single attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 64 : i64, inter = 256 : i64,
      gate = #duck.weight<"g", bf16, [256, 64]>, up = #duck.weight<"u", bf16, [256, 64]>,
      down = #duck.weight<"d", bf16, [64, 256]>} : tensor<?x64xf32>
  duck.return %m : tensor<?x64xf32>
}

//--- auto-tp2.mlir
// multiple-of=auto, tp=2: 256 splits with 128-blocks, so auto takes 128.
// CHECK-LABEL: duck.model @auto_128
// CHECK:         multiple_of = 128 : i64
// CHECK-NEXT:      duck.fp9_ffn {block = 128 : i64, {{.*}}inter_end = 128 : i64, rank = 0 : i64}
// CHECK-NEXT:      duck.fp9_ffn {block = 128 : i64, {{.*}}inter_begin = 128 : i64, inter_end = 256 : i64, rank = 1 : i64}
duck.model @auto_128 attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 64 : i64, inter = 256 : i64,
      gate = #duck.weight<"g", bf16, [256, 64]>, up = #duck.weight<"u", bf16, [256, 64]>,
      down = #duck.weight<"d", bf16, [64, 256]>} : tensor<?x64xf32>
  duck.return %m : tensor<?x64xf32>
}

// -----

// multiple-of=auto, tp=2: 192 is not a multiple of 128, so auto falls back
// to 64 (3 blocks: 2 + 1).
// CHECK-LABEL: duck.model @auto_64
// CHECK:         multiple_of = 64 : i64, {{.*}}tp_max = 3 : i64
// CHECK-NEXT:      duck.fp9_ffn {block = 64 : i64, {{.*}}inter_begin = 0 : i64, inter_end = 128 : i64, rank = 0 : i64}
// CHECK-NEXT:      duck.fp9_ffn {block = 64 : i64, {{.*}}inter_begin = 128 : i64, inter_end = 192 : i64, rank = 1 : i64}
duck.model @auto_64 attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 64 : i64, inter = 192 : i64,
      gate = #duck.weight<"g", bf16, [192, 64]>, up = #duck.weight<"u", bf16, [192, 64]>,
      down = #duck.weight<"d", bf16, [64, 192]>} : tensor<?x64xf32>
  duck.return %m : tensor<?x64xf32>
}

// -----

// multiple-of=auto picks one block for the whole model: the 192-neuron
// layer rules out 128, so the 256-neuron layer gets 64 too.
// The module's partition records the block and the smallest tp_max.
// CHECK:       module attributes {duck.partition = #duck.partition<tp = 2, multiple_of = 64, strategy = intermediate, tp_max = 3>}
// CHECK-LABEL: duck.model @auto_common
// CHECK:         duck.mlp {{.*}}inter = 256 : i64, layer = 0 : i64, multiple_of = 64 : i64, {{.*}}tp_max = 4 : i64
// CHECK:         duck.mlp {{.*}}inter = 192 : i64, layer = 1 : i64, multiple_of = 64 : i64, {{.*}}tp_max = 3 : i64
duck.model @auto_common attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %m0 = duck.mlp %x {layer = 0 : i64, hidden = 64 : i64, inter = 256 : i64,
      gate = #duck.weight<"g0", bf16, [256, 64]>, up = #duck.weight<"u0", bf16, [256, 64]>,
      down = #duck.weight<"d0", bf16, [64, 256]>} : tensor<?x64xf32>
  %m1 = duck.mlp %m0 {layer = 1 : i64, hidden = 64 : i64, inter = 192 : i64,
      gate = #duck.weight<"g1", bf16, [192, 64]>, up = #duck.weight<"u1", bf16, [192, 64]>,
      down = #duck.weight<"d1", bf16, [64, 192]>} : tensor<?x64xf32>
  duck.return %m1 : tensor<?x64xf32>
}

//--- auto-tp4.mlir
// multiple-of=auto, tp=4: 128 neurons are 1 block of 128 or 2 of 64, too few
// for 4 ducks; auto goes down to 32 (4 blocks).
// CHECK-LABEL: duck.model @auto_32
// CHECK:         multiple_of = 32 : i64, {{.*}}tp = 4 : i64, tp_max = 4 : i64
// CHECK-NEXT:      duck.fp9_ffn {block = 32 : i64, {{.*}}inter_begin = 0 : i64, inter_end = 32 : i64, rank = 0 : i64}
// CHECK-NEXT:      duck.fp9_ffn {block = 32 : i64, {{.*}}inter_begin = 32 : i64, inter_end = 64 : i64, rank = 1 : i64}
// CHECK-NEXT:      duck.fp9_ffn {block = 32 : i64, {{.*}}inter_begin = 64 : i64, inter_end = 96 : i64, rank = 2 : i64}
// CHECK-NEXT:      duck.fp9_ffn {block = 32 : i64, {{.*}}inter_begin = 96 : i64, inter_end = 128 : i64, rank = 3 : i64}
duck.model @auto_32 attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 64 : i64, inter = 128 : i64,
      gate = #duck.weight<"g", bf16, [128, 64]>, up = #duck.weight<"u", bf16, [128, 64]>,
      down = #duck.weight<"d", bf16, [64, 128]>} : tensor<?x64xf32>
  duck.return %m : tensor<?x64xf32>
}

//--- moe-intermediate.mlir
// A MoE under the intermediate strategy: every duck holds a slice of every
// expert, the shared expert included (expert ids [0, 4 + 1)).
// CHECK-LABEL: duck.model @moe_tp
// CHECK:         duck.moe
// CHECK-SAME:      multiple_of = 64 : i64, {{.*}}strategy = #duck.strategy<intermediate>, {{.*}}tp = 2 : i64, tp_max = 2 : i64
// CHECK-NEXT:      duck.fp9_ffn {block = 64 : i64, expert_begin = 0 : i64, expert_end = 5 : i64, inter_begin = 0 : i64, inter_end = 64 : i64, rank = 0 : i64}
// CHECK-NEXT:      duck.fp9_ffn {block = 64 : i64, expert_begin = 0 : i64, expert_end = 5 : i64, inter_begin = 64 : i64, inter_end = 128 : i64, rank = 1 : i64}
duck.model @moe_tp attributes {family = "deepseek_v3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %e = duck.moe %x {layer = 0 : i64, hidden = 64 : i64, inter = 128 : i64, num_experts = 4 : i64, top_k = 2 : i64,
      router = #duck.router_kind<sigmoid>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [4, 64]>,
      gate = #duck.experts<"g{e}", bf16, [128, 64], count = 4>, up = #duck.experts<"u{e}", bf16, [128, 64], count = 4>,
      down = #duck.experts<"d{e}", bf16, [64, 128], count = 4>, num_shared = 1 : i64,
      shared_gate = #duck.weight<"sg", bf16, [128, 64]>, shared_up = #duck.weight<"su", bf16, [128, 64]>,
      shared_down = #duck.weight<"sd", bf16, [64, 128]>} : tensor<?x64xf32>
  duck.return %e : tensor<?x64xf32>
}

//--- moe-experts.mlir
// strategy=experts: each duck holds a run of whole experts of the
// MoE (E = 3 routed + 1 shared = 4, tp_max = E); the dense layer of the same
// model is still split along the intermediate dimension. The partition
// records the strategy the plan will: experts.
// CHECK:       module attributes {duck.partition = #duck.partition<tp = 2, multiple_of = 64, strategy = experts, tp_max = 2>}
// CHECK-LABEL: duck.model @experts
// CHECK:         duck.mlp
// CHECK-SAME:      strategy = #duck.strategy<intermediate>, tp = 2 : i64, tp_max = 2 : i64
// CHECK-NEXT:      duck.fp9_ffn {block = 64 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, inter_begin = 0 : i64, inter_end = 64 : i64, rank = 0 : i64}
// CHECK-NEXT:      duck.fp9_ffn {block = 64 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, inter_begin = 64 : i64, inter_end = 128 : i64, rank = 1 : i64}
// CHECK:         duck.moe
// CHECK-SAME:      strategy = #duck.strategy<experts>, {{.*}}tp = 2 : i64, tp_max = 4 : i64
// CHECK-NEXT:      duck.fp9_ffn {block = 64 : i64, expert_begin = 0 : i64, expert_end = 2 : i64, inter_begin = 0 : i64, inter_end = 64 : i64, rank = 0 : i64}
// CHECK-NEXT:      duck.fp9_ffn {block = 64 : i64, expert_begin = 2 : i64, expert_end = 4 : i64, inter_begin = 0 : i64, inter_end = 64 : i64, rank = 1 : i64}
duck.model @experts attributes {family = "deepseek_v3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 64 : i64, inter = 128 : i64,
      gate = #duck.weight<"g", bf16, [128, 64]>, up = #duck.weight<"u", bf16, [128, 64]>,
      down = #duck.weight<"d", bf16, [64, 128]>} : tensor<?x64xf32>
  %e = duck.moe %m {layer = 1 : i64, hidden = 64 : i64, inter = 64 : i64, num_experts = 3 : i64, top_k = 1 : i64,
      router = #duck.router_kind<sigmoid>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [3, 64]>,
      gate = #duck.experts<"g{e}", bf16, [64, 64], count = 3>, up = #duck.experts<"u{e}", bf16, [64, 64], count = 3>,
      down = #duck.experts<"d{e}", bf16, [64, 64], count = 3>, num_shared = 1 : i64,
      shared_gate = #duck.weight<"sg", bf16, [64, 64]>, shared_up = #duck.weight<"su", bf16, [64, 64]>,
      shared_down = #duck.weight<"sd", bf16, [64, 64]>} : tensor<?x64xf32>
  duck.return %e : tensor<?x64xf32>
}

//--- mixed.mlir
// A strategy by layer: the dense layer 0 is split, MoE layer 1 too, MoE
// layer 2 places whole experts (E = 4 over 2 ducks: 2 each). The module's
// partition says mixed; each layer's op says how it is cut. Later items
// override earlier ones ("experts,intermediate:1-2,experts:2" is the
// same cut); a range naming only some MoE layers leaves the others as
// the bare item says (intermediate unless given).
// CHECK:       module attributes {duck.partition = #duck.partition<tp = 2, multiple_of = 64, strategy = mixed, tp_max = 2>}
// CHECK:         duck.mlp
// CHECK-SAME:      strategy = #duck.strategy<intermediate>
// CHECK:         duck.moe {{.*}}layer = 1
// CHECK-SAME:      strategy = #duck.strategy<intermediate>, {{.*}}tp = 2 : i64, tp_max = 2 : i64
// CHECK-NEXT:      duck.fp9_ffn {block = 64 : i64, expert_begin = 0 : i64, expert_end = 4 : i64, inter_begin = 0 : i64, inter_end = 64 : i64, rank = 0 : i64}
// CHECK-NEXT:      duck.fp9_ffn {block = 64 : i64, expert_begin = 0 : i64, expert_end = 4 : i64, inter_begin = 64 : i64, inter_end = 128 : i64, rank = 1 : i64}
// CHECK:         duck.moe {{.*}}layer = 2
// CHECK-SAME:      strategy = #duck.strategy<experts>, {{.*}}tp = 2 : i64, tp_max = 4 : i64
// CHECK-NEXT:      duck.fp9_ffn {block = 64 : i64, expert_begin = 0 : i64, expert_end = 2 : i64, inter_begin = 0 : i64, inter_end = 128 : i64, rank = 0 : i64}
// CHECK-NEXT:      duck.fp9_ffn {block = 64 : i64, expert_begin = 2 : i64, expert_end = 4 : i64, inter_begin = 0 : i64, inter_end = 128 : i64, rank = 1 : i64}
// The statistics name the cut by its shortest list: the strategy most MoE
// layers take (intermediate on a tie), then the others' runs.
// SPEC: strategy: mixed (intermediate,experts:2)
// Every MoE layer by experts is the experts partition; none, intermediate.
// ALL: #duck.partition<tp = 2, multiple_of = 64, strategy = experts,
// NONE: #duck.partition<tp = 2, multiple_of = 64, strategy = intermediate,
// DENSE: error: 'duck.mlp' op layer 0 is dense: only MoE layers can place whole experts (strategy 'experts:0-1')
// NOLAYER: error: duck-partition: strategy 'experts:7-9' names layers 7-9, but the model's FFN layers are 0-2
// RANGE: error: duck-partition: strategy 'experts:2-1': layers are N or FIRST-LAST (0-based, FIRST <= LAST)
// RANGE2: error: duck-partition: strategy 'intermediate,experts:x': 'experts:x': layers are N or FIRST-LAST
// NOTMIXED: error: duck-partition: strategy 'mixed': 'mixed' is not a strategy (expected intermediate, experts, or a list
duck.model @mixed attributes {family = "qwen3_moe", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 64 : i64, inter = 128 : i64,
      gate = #duck.weight<"g", bf16, [128, 64]>, up = #duck.weight<"u", bf16, [128, 64]>,
      down = #duck.weight<"d", bf16, [64, 128]>} : tensor<?x64xf32>
  %a = duck.moe %m {layer = 1 : i64, hidden = 64 : i64, inter = 128 : i64, num_experts = 4 : i64, top_k = 2 : i64,
      router = #duck.router_kind<softmax>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [4, 64]>,
      gate = #duck.experts<"g{e}", bf16, [128, 64], count = 4>, up = #duck.experts<"u{e}", bf16, [128, 64], count = 4>,
      down = #duck.experts<"d{e}", bf16, [64, 128], count = 4>} : tensor<?x64xf32>
  %b = duck.moe %a {layer = 2 : i64, hidden = 64 : i64, inter = 128 : i64, num_experts = 4 : i64, top_k = 2 : i64,
      router = #duck.router_kind<softmax>, norm_topk_prob = true, router_weight = #duck.weight<"r2", bf16, [4, 64]>,
      gate = #duck.experts<"h{e}", bf16, [128, 64], count = 4>, up = #duck.experts<"v{e}", bf16, [128, 64], count = 4>,
      down = #duck.experts<"w{e}", bf16, [64, 128], count = 4>} : tensor<?x64xf32>
  duck.return %b : tensor<?x64xf32>
}

//--- moe-experts-auto.mlir
// strategy=experts with multiple-of=auto: a MoE placed by whole experts keeps
// its full intermediate size on a duck, so tp = 4 does not push its block
// below 128 (128 neurons could not be split 4 ways with 128-blocks).
// CHECK-LABEL: duck.model @experts_auto
// CHECK:         duck.moe
// CHECK-SAME:      multiple_of = 128 : i64, {{.*}}strategy = #duck.strategy<experts>, {{.*}}tp = 4 : i64, tp_max = 4 : i64
// CHECK-NEXT:      duck.fp9_ffn {block = 128 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, inter_begin = 0 : i64, inter_end = 128 : i64, rank = 0 : i64}
// CHECK-NEXT:      duck.fp9_ffn {block = 128 : i64, expert_begin = 1 : i64, expert_end = 2 : i64, {{.*}}rank = 1 : i64}
// CHECK-NEXT:      duck.fp9_ffn {block = 128 : i64, expert_begin = 2 : i64, expert_end = 3 : i64, {{.*}}rank = 2 : i64}
// CHECK-NEXT:      duck.fp9_ffn {block = 128 : i64, expert_begin = 3 : i64, expert_end = 4 : i64, {{.*}}rank = 3 : i64}
duck.model @experts_auto attributes {family = "qwen3_moe", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %e = duck.moe %x {layer = 0 : i64, hidden = 64 : i64, inter = 128 : i64, num_experts = 4 : i64, top_k = 2 : i64,
      router = #duck.router_kind<softmax>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [4, 64]>,
      gate = #duck.experts<"g{e}", bf16, [128, 64], count = 4>, up = #duck.experts<"u{e}", bf16, [128, 64], count = 4>,
      down = #duck.experts<"d{e}", bf16, [64, 128], count = 4>} : tensor<?x64xf32>
  duck.return %e : tensor<?x64xf32>
}

//--- experts-uneven.mlir
// Whole experts that tp does not divide: 8 routed + 1 shared = 9 over 2
// ducks are 5 + 4, the extra on the first duck, so the duck that holds the
// always-active shared expert (id 8) holds fewer routed ones. With shares
// 3:1:1 the runs are proportional (ideal 5.4, 1.8, 1.8: 5, 2, 2).
// CHECK-LABEL: duck.model @experts_uneven
// CHECK:         duck.moe
// CHECK-SAME:      strategy = #duck.strategy<experts>, {{.*}}tp = 2 : i64, tp_max = 9 : i64
// CHECK-NEXT:      duck.fp9_ffn {block = 64 : i64, expert_begin = 0 : i64, expert_end = 5 : i64, {{.*}}rank = 0 : i64}
// CHECK-NEXT:      duck.fp9_ffn {block = 64 : i64, expert_begin = 5 : i64, expert_end = 9 : i64, {{.*}}rank = 1 : i64}
// SHARES:        duck.moe
// SHARES-NEXT:     duck.fp9_ffn {block = 64 : i64, expert_begin = 0 : i64, expert_end = 5 : i64, {{.*}}rank = 0 : i64}
// SHARES-NEXT:     duck.fp9_ffn {block = 64 : i64, expert_begin = 5 : i64, expert_end = 7 : i64, {{.*}}rank = 1 : i64}
// SHARES-NEXT:     duck.fp9_ffn {block = 64 : i64, expert_begin = 7 : i64, expert_end = 9 : i64, {{.*}}rank = 2 : i64}
duck.model @experts_uneven attributes {family = "deepseek_v3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %e = duck.moe %x {layer = 3 : i64, hidden = 64 : i64, inter = 64 : i64, num_experts = 8 : i64, top_k = 2 : i64,
      router = #duck.router_kind<sigmoid>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [8, 64]>,
      gate = #duck.experts<"g{e}", bf16, [64, 64], count = 8>, up = #duck.experts<"u{e}", bf16, [64, 64], count = 8>,
      down = #duck.experts<"d{e}", bf16, [64, 64], count = 8>, num_shared = 1 : i64,
      shared_gate = #duck.weight<"sg", bf16, [64, 64]>, shared_up = #duck.weight<"su", bf16, [64, 64]>,
      shared_down = #duck.weight<"sd", bf16, [64, 64]>} : tensor<?x64xf32>
  duck.return %e : tensor<?x64xf32>
}

//--- shares.mlir
// shares: 256 neurons = 8 blocks of 32 in proportion 2:2:1:1 (ideal 2.67,
// 2.67, 1.33, 1.33): 3, 3, 1, 1 blocks. A duck never gets none (100:1:1:
// 6, 1, 1); shares must be positive, one a duck. The partition keeps them.
// CHECK:       module attributes {duck.partition = #duck.partition<tp = 4, multiple_of = 32, strategy = intermediate, tp_max = 8, shares = [2.000000e+00, 2.000000e+00, 1.000000e+00, 1.000000e+00]>}
// CHECK-LABEL: duck.model @shares
// CHECK:           duck.fp9_ffn {{{.*}}inter_begin = 0 : i64, inter_end = 96 : i64, rank = 0 : i64}
// CHECK-NEXT:      duck.fp9_ffn {{{.*}}inter_begin = 96 : i64, inter_end = 192 : i64, rank = 1 : i64}
// CHECK-NEXT:      duck.fp9_ffn {{{.*}}inter_begin = 192 : i64, inter_end = 224 : i64, rank = 2 : i64}
// CHECK-NEXT:      duck.fp9_ffn {{{.*}}inter_begin = 224 : i64, inter_end = 256 : i64, rank = 3 : i64}
// FLOOR:           duck.fp9_ffn {{{.*}}inter_begin = 0 : i64, inter_end = 192 : i64, rank = 0 : i64}
// FLOOR-NEXT:      duck.fp9_ffn {{{.*}}inter_begin = 192 : i64, inter_end = 224 : i64, rank = 1 : i64}
// FLOOR-NEXT:      duck.fp9_ffn {{{.*}}inter_begin = 224 : i64, inter_end = 256 : i64, rank = 2 : i64}
// BAD: duck-partition: shares needs 2 positive values (one a duck), got 2
duck.model @shares attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 64 : i64, inter = 256 : i64,
      gate = #duck.weight<"g", bf16, [256, 64]>, up = #duck.weight<"u", bf16, [256, 64]>,
      down = #duck.weight<"d", bf16, [64, 256]>} : tensor<?x64xf32>
  duck.return %m : tensor<?x64xf32>
}

//--- o-proj.mlir
// o-proj=ducks: the attention's o_proj (256 rows = 2 tiles of 128, K 128)
// goes one tile a duck; partitioning again for the host drops it; 3 ducks
// are too many for 2 tiles.
// CHECK:       duck.attention {{.*}}duck_block = 128 : i64, duck_rows = array<i64: 0, 128, 256>
// BACK-NOT:    duck_rows
// FEW:         error: 'duck.attention' op the o_proj's 256 rows are 2 tiles of 128: too few for 3 ducks (use --o-proj host)
// BADO:        duck-partition: o-proj must be host or ducks, got 'gpu'
// q-proj=ducks: q_proj's 128 rows are one tile, for one duck.
// QPROJ:       duck.attention {{.*}}duck_block = 128 : i64, duck_rows = array<i64: 0, 256>{{.*}}q_duck_block = 128 : i64, q_duck_rows = array<i64: 0, 128>
// QFEW:        error: 'duck.attention' op the query projection's 128 rows are 1 tile of 128: too few for 2 ducks (use --q-proj host)
// BADQ:        duck-partition: q-proj must be host or ducks, got 'gpu'
duck.model @oproj attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x256xf32>):
  %a = duck.attention %x {layer = 0 : i64, kind = "gqa", num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 32 : i64,
      weights = {q_proj = #duck.weight<"q", bf16, [128, 256]>, k_proj = #duck.weight<"k", bf16, [64, 256]>,
                 v_proj = #duck.weight<"v", bf16, [64, 256]>, o_proj = #duck.weight<"o", bf16, [256, 128]>}} : tensor<?x256xf32>
  %m = duck.mlp %a {layer = 0 : i64, hidden = 256 : i64, inter = 256 : i64,
      gate = #duck.weight<"g", bf16, [256, 256]>, up = #duck.weight<"u", bf16, [256, 256]>,
      down = #duck.weight<"d", bf16, [256, 256]>} : tensor<?x256xf32>
  duck.return %m : tensor<?x256xf32>
}

//--- repartition.mlir
// Partitioning again replaces the shards and the partition attributes.
// CHECK:       module attributes {duck.partition = #duck.partition<tp = 4, multiple_of = 32, strategy = intermediate, tp_max = 4>}
// CHECK-LABEL: duck.model @again
// CHECK:         multiple_of = 32 : i64, {{.*}}tp = 4 : i64, tp_max = 4 : i64{{.*}} shards {
// CHECK-NEXT:      duck.fp9_ffn {block = 32 : i64, {{.*}}rank = 0 : i64}
// CHECK-NEXT:      duck.fp9_ffn {block = 32 : i64, {{.*}}rank = 1 : i64}
// CHECK-NEXT:      duck.fp9_ffn {block = 32 : i64, {{.*}}rank = 2 : i64}
// CHECK-NEXT:      duck.fp9_ffn {block = 32 : i64, {{.*}}rank = 3 : i64}
// CHECK-NEXT:    {{^ +}}}{{$}}
duck.model @again attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 64 : i64, inter = 128 : i64,
      gate = #duck.weight<"g", bf16, [128, 64]>, up = #duck.weight<"u", bf16, [128, 64]>,
      down = #duck.weight<"d", bf16, [64, 128]>} : tensor<?x64xf32>
  duck.return %m : tensor<?x64xf32>
}

//--- err-tp-max.mlir
// tp > tp_max: Qwen3-30B-A3B's 768 neurons are 6 blocks of 128, too few for
// 8 ducks; the error names the layer, sizes, tp, multiple_of, the largest tp
// and what smaller blocks would allow.
duck.model @too_many_ducks attributes {family = "qwen3_moe", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  // expected-error @+1 {{'duck.mlp' op layer 5: cannot split intermediate size 768 over tp = 8 ducks with multiple_of = 128: each duck needs a whole number of 128-neuron blocks, so tp_max = 6; the largest tp that would work is 6 (smaller blocks: 64 allows tp <= 12, 32 allows tp <= 24)}}
  %m = duck.mlp %x {layer = 5 : i64, hidden = 64 : i64, inter = 768 : i64,
      gate = #duck.weight<"g", bf16, [768, 64]>, up = #duck.weight<"u", bf16, [768, 64]>,
      down = #duck.weight<"d", bf16, [64, 768]>} : tensor<?x64xf32>
  duck.return %m : tensor<?x64xf32>
}

//--- err-tp-max-32.mlir
// tp > tp_max at the smallest block: no smaller block to suggest.
duck.model @too_many_ducks_32 attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  // expected-error-re @+1 {{layer 0: cannot split intermediate size 96 over tp = 4 ducks with multiple_of = 32: {{.*}}tp_max = 3; the largest tp that would work is 3{{$}}}}
  %m = duck.mlp %x {layer = 0 : i64, hidden = 64 : i64, inter = 96 : i64,
      gate = #duck.weight<"g", bf16, [96, 64]>, up = #duck.weight<"u", bf16, [96, 64]>,
      down = #duck.weight<"d", bf16, [64, 96]>} : tensor<?x64xf32>
  duck.return %m : tensor<?x64xf32>
}

//--- err-not-multiple.mlir
// The intermediate size is not a multiple of multiple_of: 96 is 1.5 blocks
// of 64; the error suggests the block that does divide it.
duck.model @not_multiple attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  // expected-error @+1 {{layer 2: intermediate size 96 is not a multiple of multiple_of = 64, so it cannot be cut into 64-neuron blocks (smaller blocks: 32 allows tp <= 3)}}
  %m = duck.mlp %x {layer = 2 : i64, hidden = 64 : i64, inter = 96 : i64,
      gate = #duck.weight<"g", bf16, [96, 64]>, up = #duck.weight<"u", bf16, [96, 64]>,
      down = #duck.weight<"d", bf16, [64, 96]>} : tensor<?x64xf32>
  duck.return %m : tensor<?x64xf32>
}

//--- err-auto.mlir
// multiple-of=auto finds no block: 64 neurons are at most 2 blocks of 32,
// too few for tp = 4; the error names the layer that blocks it.
duck.model @auto_fails attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %m0 = duck.mlp %x {layer = 0 : i64, hidden = 64 : i64, inter = 256 : i64,
      gate = #duck.weight<"g0", bf16, [256, 64]>, up = #duck.weight<"u0", bf16, [256, 64]>,
      down = #duck.weight<"d0", bf16, [64, 256]>} : tensor<?x64xf32>
  // expected-error @+1 {{layer 1: no multiple_of in {128, 64, 32} splits intermediate size 64 over tp = 4 ducks; the largest tp that would work is 2 (multiple_of = 32)}}
  %m1 = duck.mlp %m0 {layer = 1 : i64, hidden = 64 : i64, inter = 64 : i64,
      gate = #duck.weight<"g1", bf16, [64, 64]>, up = #duck.weight<"u1", bf16, [64, 64]>,
      down = #duck.weight<"d1", bf16, [64, 64]>} : tensor<?x64xf32>
  duck.return %m1 : tensor<?x64xf32>
}

//--- err-experts.mlir
// strategy=experts needs at least one expert a duck, shared experts
// included: 4 routed + 1 shared = 5 experts cannot cover 6 ducks.
duck.model @experts_too_few attributes {family = "deepseek_v3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  // expected-error @+1 {{layer 3: 5 experts (shared ones included) cannot be placed whole on tp = 6 ducks: each duck needs at least one; use strategy=intermediate or tp <= 5}}
  %e = duck.moe %x {layer = 3 : i64, hidden = 64 : i64, inter = 64 : i64, num_experts = 4 : i64, top_k = 2 : i64,
      router = #duck.router_kind<sigmoid>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [4, 64]>,
      gate = #duck.experts<"g{e}", bf16, [64, 64], count = 4>, up = #duck.experts<"u{e}", bf16, [64, 64], count = 4>,
      down = #duck.experts<"d{e}", bf16, [64, 64], count = 4>, num_shared = 1 : i64,
      shared_gate = #duck.weight<"sg", bf16, [64, 64]>, shared_up = #duck.weight<"su", bf16, [64, 64]>,
      shared_down = #duck.weight<"sd", bf16, [64, 64]>} : tensor<?x64xf32>
  duck.return %e : tensor<?x64xf32>
}

//--- err-strategy.mlir
// An unknown strategy option is refused at the module.
// expected-error @+1 {{duck-partition: strategy 'experts_by_id': 'experts_by_id' is not a strategy (expected intermediate, experts, or a list by MoE layer such as intermediate,experts:3-30)}}
module {
duck.model @bad_strategy attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  duck.return
}
}

//--- err-multiple-of.mlir
// multiple-of is 128, 64, 32 or auto; 48 is not a kernel block.
// expected-error @+1 {{duck-partition: multiple-of must be 128, 64, 32 or auto, got '48'}}
module {
duck.model @bad_multiple_of attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  duck.return
}
}

//--- err-tp0.mlir
// tp is at least 1.
// expected-error @+1 {{duck-partition: tp must be at least 1, got 0}}
module {
duck.model @no_ducks attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  duck.return
}
}

//--- head.mlir
// lm-head=ducks: the head's 520 rows are 5 tiles of 128 (the last partial),
// split like the FFN blocks: in proportion 2:1:1 that is 3, 1, 1 tiles;
// the K-block divides hidden 64. Partitioning again for the host drops it.
// CHECK:       duck.lm_head {{.*}}duck_block = 64 : i64, duck_rows = array<i64: 0, 384, 512, 520>
// BACK-NOT:    duck_rows
// FEW:         error: 'duck.lm_head' op the LM head's 520 rows are 5 tiles of 128: too few for 6 ducks (use --lm-head on the host)
// BADHEAD:     duck-partition: lm-head must be host or ducks, got 'gpu'
duck.model @head attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 64 : i64, inter = 384 : i64,
      gate = #duck.weight<"g", bf16, [384, 64]>, up = #duck.weight<"u", bf16, [384, 64]>,
      down = #duck.weight<"d", bf16, [64, 384]>} : tensor<?x64xf32>
  %h = duck.lm_head %m {weight = #duck.weight<"h", bf16, [520, 64]>} : tensor<?x64xf32> -> tensor<?x520xf32>
  duck.return %h : tensor<?x520xf32>
}
