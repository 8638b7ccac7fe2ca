// Tests for --duck-stats: the per-duck report of a laid-out module, as text
// and as JSON, and its refusal of a module that is not laid out.
// RUN: rm -rf %t && split-file %s %t
// RUN: duck-opt %t/two-layers.mlir --duck-partition="tp=2 multiple-of=64" --duck-select-kernels --duck-assign-modes --duck-layout-weights --duck-stats | FileCheck %t/two-layers.mlir --check-prefix=TEXT
// RUN: duck-opt %t/two-layers.mlir --duck-partition="tp=2 multiple-of=64" --duck-select-kernels --duck-assign-modes --duck-layout-weights --duck-stats="json=true bandwidth-gbs=20 step-overhead-us=0" | FileCheck %t/two-layers.mlir --check-prefix=JSON
// RUN: duck-opt %t/experts.mlir --duck-partition="tp=2 multiple-of=64 strategy=experts" --duck-select-kernels --duck-assign-modes --duck-layout-weights --duck-stats | FileCheck %t/experts.mlir
// RUN: duck-opt %t/not-laid-out.mlir --duck-partition="tp=2 multiple-of=64" --duck-select-kernels --duck-assign-modes --duck-stats -verify-diagnostics

//--- two-layers.mlir
// The model of duck-layout-weights.mlir: 151552 bytes a duck. Per token a
// duck reads the dense layer once (3 * 64 * 128 weights) and top_k = 2 of
// the MoE's 8 expert slices (2 * 3 * 64 * 64): 49152 parameters. Bytes per
// token on a duck: 27840 (dense gate + up + down) + 2 * 14016 (two experts)
// = 55872, i.e. 0.0055872 ms at 10 GB/s; 2 FFN steps at 80 us = 0.160 ms;
// 1000 / 0.1655872 ms = 6039.11 tok/s.
// TEXT:      tp: 2
// TEXT-NEXT: multiple_of: 64
// TEXT-NEXT: tp_max: 2
// TEXT-NEXT: strategy: intermediate
// TEXT-NEXT: ffn layers: 2
// TEXT-NEXT: duck    slots            bytes         size     params/token
// TEXT-NEXT: 0           2           151552    148.0 KiB            49152
// TEXT-NEXT: 1           2           151552    148.0 KiB            49152
// TEXT-NEXT: total prepare traffic: 303104 bytes (296.0 KiB)
// TEXT-NEXT: estimated decode: 6039.11 tok/s (fp9 stream 0.006 ms + dispatch 0.160 ms per token at 10.0 GB/s per duck, 80 us per step; host work not counted)
// The pass does not change the IR.
// TEXT-NEXT: module attributes {duck.image_bytes = [151552, 151552], {{.*}}duck.slot_count = [2, 2]}
//
// The same in JSON, with 20 GB/s and no step overhead: 0.0027936 ms a
// token, 357961.05 tok/s; by layer (what --strategy auto weighs), the
// dense layer's 27840 bytes (1.392 us) and the MoE's two expert slices
// (1.4016 us), and each duck's slot of each.
// JSON:      {"bandwidth_gbs":20,"dispatch_ms_per_token":0,"estimated_decode_tok_s":357961.05{{[0-9]*}},
// JSON-SAME: "ffn_layer_costs":[{"duck_bytes":[28672,28672],"layer":0,"moe":false,"ms_per_token":0.001392,"strategy":"intermediate"},{"duck_bytes":[114688,114688],"layer":1,"moe":true,"ms_per_token":0.0014016,"strategy":"intermediate"}],
// JSON-SAME: "ffn_layers":2,"fp9_gparam_s":0,{{.*}}"host_ms_per_token":0,{{.*}}"lm_head_on_ducks":false,"mla_absorbed_bytes_per_token":0,"mtp_ffn_layers":0,"multiple_of":64,"network_back_ms_per_token":0,"network_latency_ms_per_token":0,"network_ms_per_token":0,"network_out_ms_per_token":0,"o_proj_ms_per_token":0,"o_proj_on_ducks":false,"per_duck_bytes":[151552,151552],"per_duck_params_per_token":[49152,49152],
// JSON-SAME: "step_overhead_us":0,"steps_per_token":2,"strategy":"intermediate","strategy_by_layer":"intermediate","stream_ms_per_token":0.002793{{[0-9]*}},
// JSON-SAME: "total_bytes":303104,"tp":2,"tp_max":2,"wire_activations":"f32","wire_results":"f32"}
// JSON-NEXT: module attributes
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

//--- experts.mlir
// Expert placement, 3 routed experts (top_k = 1) and 1 shared expert on 2
// ducks: duck 0 holds routed experts 0-1, each picked with probability 1/3:
// 2/3 * 3 * 64 * 64 = 8192 parameters a token; duck 1 holds routed expert 2
// and the always-active shared expert: (1/3 + 1) * 12288 = 16384. The
// slowest duck sets the speed: 4/3 * 14016 bytes = 18688 -> 0.0018688 ms,
// plus one 80 us step: 1000 / 0.0818688 = 12214.67 tok/s.
// CHECK:      tp: 2
// CHECK-NEXT: multiple_of: 64
// CHECK-NEXT: tp_max: 4
// CHECK-NEXT: strategy: experts
// CHECK-NEXT: ffn layers: 1
// CHECK-NEXT: duck    slots            bytes         size     params/token
// CHECK-NEXT: 0           1            36864     36.0 KiB             8192
// CHECK-NEXT: 1           1            36864     36.0 KiB            16384
// CHECK-NEXT: total prepare traffic: 73728 bytes (72.0 KiB)
// CHECK-NEXT: estimated decode: 12214.67 tok/s (fp9 stream 0.002 ms + dispatch 0.080 ms per token
duck.model @experts attributes {family = "deepseek_v3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %e = duck.moe %x {layer = 0 : i64, hidden = 64 : i64, inter = 64 : i64, num_experts = 3 : i64, top_k = 1 : i64,
      router = #duck.router_kind<sigmoid>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [3, 64]>,
      gate = #duck.experts<"g{e}", bf16, [64, 64], count = 3>, up = #duck.experts<"u{e}", bf16, [64, 64], count = 3>,
      down = #duck.experts<"d{e}", bf16, [64, 64], count = 3>, num_shared = 1 : i64,
      shared_gate = #duck.weight<"sg", bf16, [64, 64]>, shared_up = #duck.weight<"su", bf16, [64, 64]>,
      shared_down = #duck.weight<"sd", bf16, [64, 64]>} : tensor<?x64xf32>
  duck.return %e : tensor<?x64xf32>
}

//--- not-laid-out.mlir
// Without duck-layout-weights there are no image sizes to report.
// expected-error @+1 {{duck-stats needs a laid-out module: run duck-layout-weights first}}
module {
duck.model @not_laid_out attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x64xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 64 : i64, inter = 128 : i64,
      gate = #duck.weight<"g", bf16, [128, 64]>, up = #duck.weight<"u", bf16, [128, 64]>,
      down = #duck.weight<"d", bf16, [64, 128]>} : tensor<?x64xf32>
  duck.return %m : tensor<?x64xf32>
}
}
