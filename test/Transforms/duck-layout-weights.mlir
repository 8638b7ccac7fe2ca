// Tests for --duck-layout-weights: slots, offsets and bytes of every shard in
// its duck's weight image, and the module's per-rank image attributes.
//
// Sizes by hand (duck-rt/include/duck_rt/fp9_pack.h, abi.h): a packed
// [rows, k] matrix is magnitudes rows*k, signs rows*k/8, scales
// tiles*(k/block)*4 (tiles = row tiles of 128 source rows the slice
// touches), each plane 64-byte aligned. A slot is a 32-byte header plus a
// 128-byte descriptor per expert (aligned to 64), then gate, up, down of
// every expert held, rounded up to 4096. An image starts with a 4096-byte
// header and the slot table (32 bytes a slot), rounded up to 4096.
//
// RUN: rm -rf %t && split-file %s %t
// RUN: duck-opt %t/two-layers.mlir --duck-partition="tp=2 multiple-of=64" --duck-select-kernels --duck-assign-modes --duck-layout-weights | FileCheck %t/two-layers.mlir
// RUN: duck-opt %t/uneven.mlir --duck-partition="tp=3 multiple-of=64" --duck-select-kernels --duck-assign-modes --duck-layout-weights | FileCheck %t/uneven.mlir
// RUN: duck-opt %t/experts.mlir --duck-partition="tp=2 multiple-of=64 strategy=experts" --duck-select-kernels --duck-assign-modes --duck-layout-weights | FileCheck %t/experts.mlir
// RUN: not duck-opt %t/unpartitioned.mlir --duck-layout-weights 2>&1 | FileCheck %t/unpartitioned.mlir
//
// The model key: stable for the same input, different per rank, and changed
// by tp, by the block and by the model id.
// RUN: duck-opt %t/key.mlir --duck-partition="tp=2 multiple-of=64" --duck-select-kernels --duck-assign-modes --duck-layout-weights > %t/tp2-64.a
// RUN: duck-opt %t/key.mlir --duck-partition="tp=2 multiple-of=64" --duck-select-kernels --duck-assign-modes --duck-layout-weights > %t/tp2-64.b
// RUN: diff %t/tp2-64.a %t/tp2-64.b
// RUN: duck-opt %t/key.mlir --duck-partition="tp=4 multiple-of=64" --duck-select-kernels --duck-assign-modes --duck-layout-weights > %t/tp4-64
// RUN: duck-opt %t/key.mlir --duck-partition="tp=2 multiple-of=32" --duck-select-kernels --duck-assign-modes --duck-layout-weights > %t/tp2-32
// RUN: duck-opt %t/key.mlir --duck-partition="tp=2 multiple-of=64" --duck-select-kernels --duck-assign-modes --duck-layout-weights="model-id=other" > %t/tp2-64-other
// RUN: FileCheck %t/key.mlir --check-prefix=RANK < %t/tp2-64.a
// RUN: cat %t/tp2-64.a %t/tp4-64 | FileCheck %t/key.mlir --check-prefix=TP
// RUN: cat %t/tp2-64.a %t/tp2-32 | FileCheck %t/key.mlir --check-prefix=BLOCK
// RUN: cat %t/tp2-64.a %t/tp2-64-other | FileCheck %t/key.mlir --check-prefix=MODEL
//
// RUN: duck-opt %t/no-kernels.mlir --duck-partition="tp=1 multiple-of=64" --duck-layout-weights -verify-diagnostics
// RUN: duck-opt %t/no-modes.mlir --duck-layout-weights -verify-diagnostics

//--- two-layers.mlir
// Two FFN layers on 2 ducks: each duck has slot 0 = layer 0 and slot 1 =
// layer 1, in layer order, at 4096-aligned offsets after the 8192-byte
// prologue (4096 + 2*32 rounded up).
//
// Dense layer, 128 neurons a duck, block 64:
//   gate, up [128, 64]: 8192 + 1024 (at 8192) + 1*1*4 (at 9216) -> 9280
//   down [64, 128]:     8192 + 1024 (at 8192) + 1*2*4 (at 9216) -> 9280
//   slot: 192 (32 + 128, aligned to 64) + 3*9280 = 28032 -> 28672
// MoE layer, 8 experts, 64 neurons a duck:
//   gate, up, down [64, 64]: 4096 + 512 (at 4096) + 4 (at 4608) -> 4672
//   slot: 1088 (32 + 8*128 = 1056, aligned to 64) + 8*3*4672 = 113216 -> 114688
// Image: 8192 + 28672 + 114688 = 151552 bytes a duck.
// CHECK:       module attributes {duck.image_bytes = [151552, 151552], duck.model_key = ["{{[0-9a-f]{32}"}}, "{{[0-9a-f]{32}"}}], duck.partition = #duck.partition<tp = 2, multiple_of = 64, strategy = intermediate, tp_max = 2>, duck.slot_count = [2, 2]}
// CHECK-LABEL: duck.model @two_layers
// CHECK:         duck.mlp
// CHECK-NEXT:      duck.fp9_ffn {block = 64 : i64, bytes = 28672 : i64, {{.*}}offset = 8192 : i64, {{.*}}rank = 0 : i64, slot = 0 : i64,
// CHECK-NEXT:      duck.fp9_ffn {block = 64 : i64, bytes = 28672 : i64, {{.*}}offset = 8192 : i64, {{.*}}rank = 1 : i64, slot = 0 : i64,
// CHECK:         duck.moe
// CHECK-NEXT:      duck.fp9_ffn {block = 64 : i64, bytes = 114688 : i64, {{.*}}offset = 36864 : i64, {{.*}}rank = 0 : i64, slot = 1 : i64,
// CHECK-NEXT:      duck.fp9_ffn {block = 64 : i64, bytes = 114688 : i64, {{.*}}offset = 36864 : i64, {{.*}}rank = 1 : i64, slot = 1 : i64,
duck.model @two_layers attributes {family = "qwen3_moe", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 64 : i64, inter = 256 : i64,
      gate = #duck.weight<"g", bf16, [256, 64]>, up = #duck.weight<"u", bf16, [256, 64]>,
      down = #duck.weight<"d", bf16, [64, 256]>} : tensor<?x64xf32>
  %e = duck.moe %m {layer = 1 : i64, hidden = 64 : i64, inter = 128 : i64, num_experts = 8 : i64, top_k = 2 : i64,
      router = #duck.router_kind<softmax>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [8, 64]>,
      gate = #duck.experts<"g{e}", f8E4M3FN, [128, 64], count = 8, scale = "g{e}_scale_inv">,
      up = #duck.experts<"u{e}", f8E4M3FN, [128, 64], count = 8, scale = "u{e}_scale_inv">,
      down = #duck.experts<"d{e}", f8E4M3FN, [64, 128], count = 8, scale = "d{e}_scale_inv">} : tensor<?x64xf32>
  duck.return %e : tensor<?x64xf32>
}

//--- uneven.mlir
// 448 neurons = 7 blocks of 64 on 3 ducks (3, 2, 2 blocks): each duck's
// image has its own size.
//   rank 0, [0, 192): gate/up [192, 64]: 12288 + 1536 + 2 tiles*1*4 = 13832 -> 13888
//                     down [64, 192]:    12288 + 1536 + 1 tile*3*4 = 13836 -> 13888
//                     slot: 192 + 3*13888 = 41856 -> 45056
//   ranks 1, 2, [192, 320) and [320, 448): 128 rows starting mid-tile (phase
//                     64) touch 2 tiles: 8192 + 1024 + 8 -> 9280; down 9280
//                     slot: 192 + 3*9280 = 28032 -> 28672
// Images: 8192 (4096 + 32 rounded up) + the slot.
// CHECK:       module attributes {duck.image_bytes = [53248, 36864, 36864], {{.*}}duck.slot_count = [1, 1, 1]}
// CHECK-LABEL: duck.model @uneven
// CHECK:         duck.fp9_ffn {block = 64 : i64, bytes = 45056 : i64, {{.*}}inter_end = 192 : i64, offset = 8192 : i64, {{.*}}rank = 0 : i64, slot = 0 : i64,
// CHECK-NEXT:    duck.fp9_ffn {block = 64 : i64, bytes = 28672 : i64, {{.*}}inter_end = 320 : i64, offset = 8192 : i64, {{.*}}rank = 1 : i64, slot = 0 : i64,
// CHECK-NEXT:    duck.fp9_ffn {block = 64 : i64, bytes = 28672 : i64, {{.*}}inter_end = 448 : i64, offset = 8192 : i64, {{.*}}rank = 2 : i64, slot = 0 : i64,
duck.model @uneven attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 64 : i64, inter = 448 : i64,
      gate = #duck.weight<"g", bf16, [448, 64]>, up = #duck.weight<"u", bf16, [448, 64]>,
      down = #duck.weight<"d", bf16, [64, 448]>} : tensor<?x64xf32>
  duck.return %m : tensor<?x64xf32>
}

//--- experts.mlir
// Expert placement: the descriptor table covers all 4 experts (absent ones
// marked not present) but only the 2 experts a duck holds are stored:
//   gate, up, down [64, 64]: 4672 each (see two-layers)
//   slot: 576 (32 + 4*128 = 544, aligned to 64) + 2*3*4672 = 28608 -> 28672
// CHECK:       module attributes {duck.image_bytes = [36864, 36864], {{.*}}duck.slot_count = [1, 1]}
// CHECK-LABEL: duck.model @experts
// CHECK:         duck.fp9_ffn {block = 64 : i64, bytes = 28672 : i64, {{.*}}expert_begin = 0 : i64, expert_end = 2 : i64, {{.*}}offset = 8192 : i64, {{.*}}rank = 0 : i64, slot = 0 : i64,
// CHECK-NEXT:    duck.fp9_ffn {block = 64 : i64, bytes = 28672 : i64, {{.*}}expert_begin = 2 : i64, expert_end = 4 : i64, {{.*}}offset = 8192 : i64, {{.*}}rank = 1 : i64, slot = 0 : i64,
duck.model @experts attributes {family = "qwen3_moe", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %e = duck.moe %x {layer = 0 : i64, hidden = 64 : i64, inter = 64 : i64, num_experts = 4 : i64, top_k = 2 : i64,
      router = #duck.router_kind<softmax>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [4, 64]>,
      gate = #duck.experts<"g{e}", bf16, [64, 64], count = 4>, up = #duck.experts<"u{e}", bf16, [64, 64], count = 4>,
      down = #duck.experts<"d{e}", bf16, [64, 64], count = 4>} : tensor<?x64xf32>
  duck.return %e : tensor<?x64xf32>
}

//--- unpartitioned.mlir
// Layout reads tp from the partition: without one it says what to run.
// CHECK: error: duck-layout-weights needs a partitioned module (a duck.partition = #duck.partition<...> attribute): run duck-partition first
duck.model @host_only attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 64 : i64, inter = 64 : i64,
      gate = #duck.weight<"g", bf16, [64, 64]>, up = #duck.weight<"u", bf16, [64, 64]>,
      down = #duck.weight<"d", bf16, [64, 64]>} : tensor<?x64xf32>
  duck.return %m : tensor<?x64xf32>
}

//--- key.mlir
// Each rank has its own 128-bit key (32 hex digits): rank 1's differs from
// rank 0's. The second run's keys share none with the first when tp, the
// block or the model id differ.
// RANK:        duck.model_key = ["[[R0:[0-9a-f]{32}]]",
// RANK-NOT:    [[R0]]
// RANK-SAME:   "]
// TP:          duck.model_key = ["[[A0:[0-9a-f]{32}]]", "[[A1:[0-9a-f]{32}]]"]
// TP:          duck.model_key = [
// TP-NOT:      [[A0]]
// TP-NOT:      [[A1]]
// BLOCK:       duck.model_key = ["[[A0:[0-9a-f]{32}]]", "[[A1:[0-9a-f]{32}]]"]
// BLOCK:       duck.model_key = [
// BLOCK-NOT:   [[A0]]
// BLOCK-NOT:   [[A1]]
// MODEL:       duck.model_key = ["[[A0:[0-9a-f]{32}]]", "[[A1:[0-9a-f]{32}]]"]
// MODEL:       duck.model_key = [
// MODEL-NOT:   [[A0]]
// MODEL-NOT:   [[A1]]
duck.model @keyed attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 64 : i64, inter = 256 : i64,
      gate = #duck.weight<"g", bf16, [256, 64]>, up = #duck.weight<"u", bf16, [256, 64]>,
      down = #duck.weight<"d", bf16, [64, 256]>} : tensor<?x64xf32>
  duck.return %m : tensor<?x64xf32>
}

//--- no-kernels.mlir
// Layout needs the kernels: partitioned but not through duck-select-kernels.
duck.model @no_kernels attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  // expected-error @+1 {{'duck.fp9_ffn' op needs kernels and modes before layout: run duck-select-kernels and duck-assign-modes first}}
  %m = duck.mlp %x {layer = 0 : i64, hidden = 64 : i64, inter = 64 : i64,
      gate = #duck.weight<"g", bf16, [64, 64]>, up = #duck.weight<"u", bf16, [64, 64]>,
      down = #duck.weight<"d", bf16, [64, 64]>} : tensor<?x64xf32>
  duck.return %m : tensor<?x64xf32>
}

//--- no-modes.mlir
// Layout needs the modes too: kernels alone are not enough.
module attributes {duck.partition = #duck.partition<tp = 1, multiple_of = 64, strategy = intermediate, tp_max = 1>} {
duck.model @no_modes attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 64 : i64, inter = 64 : i64,
      gate = #duck.weight<"g", bf16, [64, 64]>, up = #duck.weight<"u", bf16, [64, 64]>,
      down = #duck.weight<"d", bf16, [64, 64]>, tp = 1 : i64, multiple_of = 64 : i64} : tensor<?x64xf32> shards {
    // expected-error @+1 {{needs kernels and modes before layout}}
    duck.fp9_ffn {rank = 0 : i64, inter_begin = 0 : i64, inter_end = 64 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 64 : i64,
                  gate_kernel = #duck.kernel<exact64, "K == 64 == block: one block a row">,
                  up_kernel = #duck.kernel<exact64, "K == 64 == block: one block a row">,
                  down_kernel = #duck.kernel<exact64, "K == 64 == block: one block a row">}
  }
  duck.return %m : tensor<?x64xf32>
}
}
