// Tests for --duck-select-kernels: the kernel of gate/up (K = hidden) and
// down (K = the shard's local intermediate size), with its reason.
// RUN: duck-opt %s -split-input-file -verify-diagnostics --duck-select-kernels | FileCheck %s

// K == 64 == block: exact64 for gate/up (hidden 64) and down (64 local
// neurons).
// CHECK-LABEL: duck.model @exact64
// CHECK:         duck.fp9_ffn
// CHECK-SAME:      down_kernel = #duck.kernel<exact64, "K == 64 == block: one block a row, four rows a tile">
// CHECK-SAME:      gate_kernel = #duck.kernel<exact64, "K == 64 == block: one block a row, four rows a tile">
// CHECK-SAME:      up_kernel = #duck.kernel<exact64, "K == 64 == block: one block a row, four rows a tile">
duck.model @exact64 attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 64 : i64, inter = 64 : i64,
      gate = #duck.weight<"g", bf16, [64, 64]>, up = #duck.weight<"u", bf16, [64, 64]>,
      down = #duck.weight<"d", bf16, [64, 64]>, tp = 1 : i64, multiple_of = 64 : i64} : tensor<?x64xf32> shards {
    duck.fp9_ffn {rank = 0 : i64, inter_begin = 0 : i64, inter_end = 64 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 64 : i64}
  }
  duck.return %m : tensor<?x64xf32>
}

// -----

// K == 128 == block: exact128 for all three.
// CHECK-LABEL: duck.model @exact128
// CHECK:         duck.fp9_ffn
// CHECK-SAME:      down_kernel = #duck.kernel<exact128, "K == 128 == block: one block a row, two rows a tile">
// CHECK-SAME:      gate_kernel = #duck.kernel<exact128, "K == 128 == block: one block a row, two rows a tile">
// CHECK-SAME:      up_kernel = #duck.kernel<exact128, "K == 128 == block: one block a row, two rows a tile">
duck.model @exact128 attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x128xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 128 : i64, inter = 128 : i64,
      gate = #duck.weight<"g", bf16, [128, 128]>, up = #duck.weight<"u", bf16, [128, 128]>,
      down = #duck.weight<"d", bf16, [128, 128]>, tp = 1 : i64, multiple_of = 128 : i64} : tensor<?x128xf32> shards {
    duck.fp9_ffn {rank = 0 : i64, inter_begin = 0 : i64, inter_end = 128 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 128 : i64}
  }
  duck.return %m : tensor<?x128xf32>
}

// -----

// Gate/up and down differ: hidden 256 is 2 blocks of 128 (general128) while
// each duck's 128 local neurons make down exact128; every shard gets its own.
// CHECK-LABEL: duck.model @general128
// CHECK:         duck.fp9_ffn
// CHECK-SAME:      down_kernel = #duck.kernel<exact128, "K == 128 == block: one block a row, two rows a tile">
// CHECK-SAME:      gate_kernel = #duck.kernel<general128, "K = 256 is 2 blocks of 128">
// CHECK-SAME:      rank = 0
// CHECK-SAME:      up_kernel = #duck.kernel<general128, "K = 256 is 2 blocks of 128">
// CHECK-NEXT:    duck.fp9_ffn
// CHECK-SAME:      down_kernel = #duck.kernel<exact128,
// CHECK-SAME:      gate_kernel = #duck.kernel<general128,
// CHECK-SAME:      rank = 1
duck.model @general128 attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x256xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 256 : i64, inter = 256 : i64,
      gate = #duck.weight<"g", bf16, [256, 256]>, up = #duck.weight<"u", bf16, [256, 256]>,
      down = #duck.weight<"d", bf16, [256, 256]>, tp = 2 : i64, multiple_of = 128 : i64} : tensor<?x256xf32> shards {
    duck.fp9_ffn {rank = 0 : i64, inter_begin = 0 : i64, inter_end = 128 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 128 : i64}
    duck.fp9_ffn {rank = 1 : i64, inter_begin = 128 : i64, inter_end = 256 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 128 : i64}
  }
  duck.return %m : tensor<?x256xf32>
}

// -----

// K == 128 with block 64 is not exact128: general64 (2 blocks); down's 192
// local neurons are 3 blocks of 64.
// CHECK-LABEL: duck.model @general64
// CHECK:         duck.fp9_ffn
// CHECK-SAME:      down_kernel = #duck.kernel<general64, "K = 192 is 3 blocks of 64">
// CHECK-SAME:      gate_kernel = #duck.kernel<general64, "K = 128 is 2 blocks of 64">
// CHECK-SAME:      up_kernel = #duck.kernel<general64, "K = 128 is 2 blocks of 64">
duck.model @general64 attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x128xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 128 : i64, inter = 192 : i64,
      gate = #duck.weight<"g", bf16, [192, 128]>, up = #duck.weight<"u", bf16, [192, 128]>,
      down = #duck.weight<"d", bf16, [128, 192]>, tp = 1 : i64, multiple_of = 64 : i64} : tensor<?x128xf32> shards {
    duck.fp9_ffn {rank = 0 : i64, inter_begin = 0 : i64, inter_end = 192 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 64 : i64}
  }
  duck.return %m : tensor<?x128xf32>
}

// -----

// K == 64 with block 32 is not exact64: general32 (2 blocks of 32); K == 32
// with block 32 is exact32; the same for a MoE shard, whose kernels serve
// every expert it holds.
// CHECK-LABEL: duck.model @general32
// CHECK:         duck.moe
// CHECK:         duck.fp9_ffn
// CHECK-SAME:      down_kernel = #duck.kernel<exact32, "K == 32 == block: one block a row, four rows a tile">
// CHECK-SAME:      gate_kernel = #duck.kernel<general32, "K = 64 is 2 blocks of 32">
// CHECK-SAME:      up_kernel = #duck.kernel<general32, "K = 64 is 2 blocks of 32">
duck.model @general32 attributes {family = "qwen3_moe", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %e = duck.moe %x {layer = 0 : i64, hidden = 64 : i64, inter = 32 : i64, num_experts = 2 : i64, top_k = 1 : i64,
      router = #duck.router_kind<softmax>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [2, 64]>,
      gate = #duck.experts<"g{e}", bf16, [32, 64], count = 2>, up = #duck.experts<"u{e}", bf16, [32, 64], count = 2>,
      down = #duck.experts<"d{e}", bf16, [64, 32], count = 2>, tp = 1 : i64, multiple_of = 32 : i64} : tensor<?x64xf32> shards {
    duck.fp9_ffn {rank = 0 : i64, inter_begin = 0 : i64, inter_end = 32 : i64, expert_begin = 0 : i64, expert_end = 2 : i64, block = 32 : i64}
  }
  duck.return %e : tensor<?x64xf32>
}

// -----

// An unpartitioned model has no shards: the pass leaves it unchanged.
// CHECK-LABEL: duck.model @unpartitioned
// CHECK:         duck.mlp
// CHECK-NOT:     kernel
// CHECK-NOT:     shards
// CHECK:         duck.return
duck.model @unpartitioned attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 64 : i64, inter = 64 : i64,
      gate = #duck.weight<"g", bf16, [64, 64]>, up = #duck.weight<"u", bf16, [64, 64]>,
      down = #duck.weight<"d", bf16, [64, 64]>} : tensor<?x64xf32>
  duck.return %m : tensor<?x64xf32>
}

// -----

// A hidden size that is not a whole number of blocks has no gate/up kernel.
duck.model @hidden_not_blocks attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x96xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 96 : i64, inter = 64 : i64,
      gate = #duck.weight<"g", bf16, [64, 96]>, up = #duck.weight<"u", bf16, [64, 96]>,
      down = #duck.weight<"d", bf16, [96, 64]>, tp = 1 : i64, multiple_of = 64 : i64} : tensor<?x96xf32> shards {
    // expected-error @+1 {{hidden size 96 (gate/up K) is not a multiple of block 64}}
    duck.fp9_ffn {rank = 0 : i64, inter_begin = 0 : i64, inter_end = 64 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 64 : i64}
  }
  duck.return %m : tensor<?x96xf32>
}
