// Round trip of every duck op and attribute: parse, print, parse again.
// RUN: duck-opt %s -split-input-file | FileCheck %s
// RUN: duck-opt %s -split-input-file | duck-opt -split-input-file | FileCheck %s
// RUN: duck-opt %s -split-input-file -mlir-print-op-generic | duck-opt -split-input-file | FileCheck %s

// A Qwen3 dense model: embedding, norm, GQA attention with q/k norms,
// residual add, dense MLP, LM head, return.
// CHECK-LABEL: duck.model @qwen3_dense
// CHECK-SAME:    attributes {config = {hidden = 64 : i64, rms_norm_eps = 9.9999999999999995E-7 : f64}, family = "qwen3"}
// CHECK-NEXT:  ^bb0(%[[TOK:.+]]: tensor<?xi32>):
// CHECK-NEXT:    %[[X:.+]] = duck.embedding %[[TOK]] {weight = #duck.weight<"model.embed_tokens.weight", bf16, [512, 64]>} : tensor<?xi32> -> tensor<?x64xf32>
// CHECK-NEXT:    %[[N:.+]] = duck.rms_norm %[[X]] {eps = 9.9999999999999995E-7 : f64, weight = #duck.weight<"model.layers.0.input_layernorm.weight", bf16, [64]>} : tensor<?x64xf32>
// CHECK-NEXT:    %[[A:.+]] = duck.attention %[[N]]
// CHECK-SAME:      head_dim = 16 : i64, kind = "gqa", layer = 0 : i64, num_heads = 4 : i64, num_kv_heads = 2 : i64
// CHECK-SAME:      weights = {k_norm = #duck.weight<"model.layers.0.self_attn.k_norm.weight", bf16, [16]>
// CHECK-SAME:                 k_proj = #duck.weight<"model.layers.0.self_attn.k_proj.weight", bf16, [32, 64]>
// CHECK-SAME:                 o_proj = #duck.weight<"model.layers.0.self_attn.o_proj.weight", bf16, [64, 64]>
// CHECK-SAME:                 q_norm = #duck.weight<"model.layers.0.self_attn.q_norm.weight", bf16, [16]>
// CHECK-SAME:                 q_proj = #duck.weight<"model.layers.0.self_attn.q_proj.weight", bf16, [64, 64]>
// CHECK-SAME:                 v_proj = #duck.weight<"model.layers.0.self_attn.v_proj.weight", bf16, [32, 64]>}
// CHECK-SAME:      : tensor<?x64xf32>
// CHECK-NEXT:    %[[R:.+]] = duck.add %[[X]], %[[A]] : tensor<?x64xf32>
// CHECK-NEXT:    %[[M:.+]] = duck.mlp %[[R]]
// CHECK-SAME:      down = #duck.weight<"model.layers.0.mlp.down_proj.weight", bf16, [64, 128]>
// CHECK-SAME:      gate = #duck.weight<"model.layers.0.mlp.gate_proj.weight", bf16, [128, 64]>
// CHECK-SAME:      hidden = 64 : i64, inter = 128 : i64, layer = 0 : i64
// CHECK-SAME:      up = #duck.weight<"model.layers.0.mlp.up_proj.weight", bf16, [128, 64]>}
// CHECK-SAME:      : tensor<?x64xf32>{{$}}
// CHECK-NEXT:    %[[L:.+]] = duck.lm_head %[[M]] {weight = #duck.weight<"lm_head.weight", bf16, [512, 64]>} : tensor<?x64xf32> -> tensor<?x512xf32>
// CHECK-NEXT:    duck.return %[[L]] : tensor<?x512xf32>
duck.model @qwen3_dense attributes {family = "qwen3", config = {hidden = 64 : i64, rms_norm_eps = 1.0e-06 : f64}} {
^bb0(%tokens: tensor<?xi32>):
  %x = duck.embedding %tokens {weight = #duck.weight<"model.embed_tokens.weight", bf16, [512, 64]>} : tensor<?xi32> -> tensor<?x64xf32>
  %n = duck.rms_norm %x {weight = #duck.weight<"model.layers.0.input_layernorm.weight", bf16, [64]>, eps = 1.0e-06 : f64} : tensor<?x64xf32>
  %a = duck.attention %n {layer = 0 : i64, kind = "gqa", num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 16 : i64,
      weights = {q_proj = #duck.weight<"model.layers.0.self_attn.q_proj.weight", bf16, [64, 64]>,
                 k_proj = #duck.weight<"model.layers.0.self_attn.k_proj.weight", bf16, [32, 64]>,
                 v_proj = #duck.weight<"model.layers.0.self_attn.v_proj.weight", bf16, [32, 64]>,
                 o_proj = #duck.weight<"model.layers.0.self_attn.o_proj.weight", bf16, [64, 64]>,
                 q_norm = #duck.weight<"model.layers.0.self_attn.q_norm.weight", bf16, [16]>,
                 k_norm = #duck.weight<"model.layers.0.self_attn.k_norm.weight", bf16, [16]>}} : tensor<?x64xf32>
  %r = duck.add %x, %a : tensor<?x64xf32>
  %m = duck.mlp %r {layer = 0 : i64, hidden = 64 : i64, inter = 128 : i64,
      gate = #duck.weight<"model.layers.0.mlp.gate_proj.weight", bf16, [128, 64]>,
      up = #duck.weight<"model.layers.0.mlp.up_proj.weight", bf16, [128, 64]>,
      down = #duck.weight<"model.layers.0.mlp.down_proj.weight", bf16, [64, 128]>} : tensor<?x64xf32>
  %l = duck.lm_head %m {weight = #duck.weight<"lm_head.weight", bf16, [512, 64]>} : tensor<?x64xf32> -> tensor<?x512xf32>
  duck.return %l : tensor<?x512xf32>
}

// -----

// #duck.weight with every optional part: a safetensors file and an FP8
// block-scale tensor, each alone or both in either order (printed file
// first); f32 and integer dtypes are weights too.
// CHECK-LABEL: duck.model @weight_attr_forms
// CHECK:         duck.embedding
// CHECK-SAME:      weight = #duck.weight<"e", f8E4M3FN, [512, 64], file = "model-00001-of-00002.safetensors", scale = "e_scale_inv">
// CHECK:         duck.rms_norm
// CHECK-SAME:      weight = #duck.weight<"n", f32, [64], file = "model-00001-of-00002.safetensors">
// CHECK:         duck.mlp
// CHECK-SAME:      down = #duck.weight<"d", f8E4M3FN, [64, 128], file = "model-00002-of-00002.safetensors", scale = "d_scale_inv">
// CHECK-SAME:      gate = #duck.weight<"g", f8E4M3FN, [128, 64], scale = "g_scale_inv">
// CHECK-SAME:      up = #duck.weight<"u", i8, [128, 64]>
duck.model @weight_attr_forms attributes {family = "qwen3", config = {}} {
^bb0(%tokens: tensor<?xi32>):
  %x = duck.embedding %tokens {weight = #duck.weight<"e", f8E4M3FN, [512, 64], scale = "e_scale_inv", file = "model-00001-of-00002.safetensors">} : tensor<?xi32> -> tensor<?x64xf32>
  %n = duck.rms_norm %x {weight = #duck.weight<"n", f32, [64], file = "model-00001-of-00002.safetensors">, eps = 1.0e-05 : f64} : tensor<?x64xf32>
  %m = duck.mlp %n {layer = 0 : i64, hidden = 64 : i64, inter = 128 : i64,
      gate = #duck.weight<"g", f8E4M3FN, [128, 64], scale = "g_scale_inv">,
      up = #duck.weight<"u", i8, [128, 64]>,
      down = #duck.weight<"d", f8E4M3FN, [64, 128], file = "model-00002-of-00002.safetensors", scale = "d_scale_inv">} : tensor<?x64xf32>
  duck.return %m : tensor<?x64xf32>
}

// -----

// A Qwen3-MoE layer: softmax router over all experts, top-k, renormalised;
// #duck.experts with and without a scale pattern; num_shared defaults to 0
// and is not printed.
// CHECK-LABEL: duck.model @qwen3_moe
// CHECK:         %[[E:.+]] = duck.moe %{{[^ ]+}} {
// CHECK-SAME:      down = #duck.experts<"model.layers.0.mlp.experts.{e}.down_proj.weight", bf16, [64, 128], count = 4>
// CHECK-SAME:      gate = #duck.experts<"model.layers.0.mlp.experts.{e}.gate_proj.weight", f8E4M3FN, [128, 64], count = 4, scale = "model.layers.0.mlp.experts.{e}.gate_proj.weight_scale_inv">
// CHECK-SAME:      hidden = 64 : i64, inter = 128 : i64, layer = 0 : i64, norm_topk_prob = true, num_experts = 4 : i64
// CHECK-SAME:      router = #duck.router_kind<softmax>
// CHECK-SAME:      router_weight = #duck.weight<"model.layers.0.mlp.gate.weight", bf16, [4, 64]>
// CHECK-SAME:      top_k = 2 : i64
// CHECK-SAME:      up = #duck.experts<"model.layers.0.mlp.experts.{e}.up_proj.weight", bf16, [128, 64], count = 4>}
// CHECK-SAME:      : tensor<?x64xf32>{{$}}
// CHECK-NOT:     num_shared
// CHECK:         duck.return %[[E]]
duck.model @qwen3_moe attributes {family = "qwen3_moe", config = {}} {
^bb0(%tokens: tensor<?xi32>):
  %x = duck.embedding %tokens {weight = #duck.weight<"e", bf16, [512, 64]>} : tensor<?xi32> -> tensor<?x64xf32>
  %e = duck.moe %x {layer = 0 : i64, hidden = 64 : i64, inter = 128 : i64, num_experts = 4 : i64, top_k = 2 : i64,
      router = #duck.router_kind<softmax>, norm_topk_prob = true,
      router_weight = #duck.weight<"model.layers.0.mlp.gate.weight", bf16, [4, 64]>,
      gate = #duck.experts<"model.layers.0.mlp.experts.{e}.gate_proj.weight", f8E4M3FN, [128, 64], count = 4, scale = "model.layers.0.mlp.experts.{e}.gate_proj.weight_scale_inv">,
      up = #duck.experts<"model.layers.0.mlp.experts.{e}.up_proj.weight", bf16, [128, 64], count = 4>,
      down = #duck.experts<"model.layers.0.mlp.experts.{e}.down_proj.weight", bf16, [64, 128], count = 4>} : tensor<?x64xf32>
  duck.return %e : tensor<?x64xf32>
}

// -----

// A DeepSeek-V3 MoE layer: sigmoid router with a correction bias,
// group-limited top-k (n_group / topk_group), routed_scaling_factor, and
// one shared expert whose weights are [num_shared * inter, hidden].
// CHECK-LABEL: duck.model @deepseek_moe
// CHECK:         duck.moe %{{[^ ]+}} {
// CHECK-SAME:      correction_bias = #duck.weight<"model.layers.3.mlp.gate.e_score_correction_bias", f32, [8]>
// CHECK-SAME:      down = #duck.experts<"model.layers.3.mlp.experts.{e}.down_proj.weight", f8E4M3FN, [64, 64], count = 8, scale = "model.layers.3.mlp.experts.{e}.down_proj.weight_scale_inv">
// CHECK-SAME:      n_group = 4 : i64
// CHECK-SAME:      norm_topk_prob = true, num_experts = 8 : i64, num_shared = 1 : i64
// CHECK-SAME:      routed_scaling_factor = 2.500000e+00 : f64
// CHECK-SAME:      router = #duck.router_kind<sigmoid>
// CHECK-SAME:      router_weight = #duck.weight<"model.layers.3.mlp.gate.weight", bf16, [8, 64]>
// CHECK-SAME:      shared_down = #duck.weight<"model.layers.3.mlp.shared_experts.down_proj.weight", f8E4M3FN, [64, 64], scale = "model.layers.3.mlp.shared_experts.down_proj.weight_scale_inv">
// CHECK-SAME:      shared_gate = #duck.weight<"model.layers.3.mlp.shared_experts.gate_proj.weight", f8E4M3FN, [64, 64]>
// CHECK-SAME:      shared_up = #duck.weight<"model.layers.3.mlp.shared_experts.up_proj.weight", f8E4M3FN, [64, 64]>
// CHECK-SAME:      top_k = 2 : i64, topk_group = 2 : i64
duck.model @deepseek_moe attributes {family = "deepseek_v3", config = {}} {
^bb0(%tokens: tensor<?xi32>):
  %x = duck.embedding %tokens {weight = #duck.weight<"e", bf16, [512, 64]>} : tensor<?xi32> -> tensor<?x64xf32>
  %e = duck.moe %x {layer = 3 : i64, hidden = 64 : i64, inter = 64 : i64, num_experts = 8 : i64, top_k = 2 : i64,
      router = #duck.router_kind<sigmoid>, norm_topk_prob = true,
      router_weight = #duck.weight<"model.layers.3.mlp.gate.weight", bf16, [8, 64]>,
      correction_bias = #duck.weight<"model.layers.3.mlp.gate.e_score_correction_bias", f32, [8]>,
      n_group = 4 : i64, topk_group = 2 : i64, routed_scaling_factor = 2.5 : f64,
      gate = #duck.experts<"model.layers.3.mlp.experts.{e}.gate_proj.weight", f8E4M3FN, [64, 64], count = 8, scale = "model.layers.3.mlp.experts.{e}.gate_proj.weight_scale_inv">,
      up = #duck.experts<"model.layers.3.mlp.experts.{e}.up_proj.weight", f8E4M3FN, [64, 64], count = 8, scale = "model.layers.3.mlp.experts.{e}.up_proj.weight_scale_inv">,
      down = #duck.experts<"model.layers.3.mlp.experts.{e}.down_proj.weight", f8E4M3FN, [64, 64], count = 8, scale = "model.layers.3.mlp.experts.{e}.down_proj.weight_scale_inv">,
      num_shared = 1 : i64,
      shared_gate = #duck.weight<"model.layers.3.mlp.shared_experts.gate_proj.weight", f8E4M3FN, [64, 64]>,
      shared_up = #duck.weight<"model.layers.3.mlp.shared_experts.up_proj.weight", f8E4M3FN, [64, 64]>,
      shared_down = #duck.weight<"model.layers.3.mlp.shared_experts.down_proj.weight", f8E4M3FN, [64, 64], scale = "model.layers.3.mlp.shared_experts.down_proj.weight_scale_inv">} : tensor<?x64xf32>
  duck.return %e : tensor<?x64xf32>
}

// -----

// DeepSeek-V3.2 MLA attention with q LoRA and the lightning indexer, whose
// weights and sizes sit in the `indexer` dictionary.
// CHECK-LABEL: duck.model @deepseek_mla
// CHECK:         duck.attention %{{[^ ]+}} {
// CHECK-SAME:      head_dim = 24 : i64
// CHECK-SAME:      indexer = {head_dim = 16 : i64
// CHECK-SAME:                 k_norm = #duck.weight<"model.layers.0.self_attn.indexer.k_norm.weight", bf16, [16]>
// CHECK-SAME:                 k_norm_bias = #duck.weight<"model.layers.0.self_attn.indexer.k_norm.bias", bf16, [16]>
// CHECK-SAME:                 n_heads = 2 : i64, topk = 8 : i64
// CHECK-SAME:                 weights_proj = #duck.weight<"model.layers.0.self_attn.indexer.weights_proj.weight", bf16, [2, 64]>
// CHECK-SAME:                 wk = #duck.weight<"model.layers.0.self_attn.indexer.wk.weight", bf16, [16, 64]>
// CHECK-SAME:                 wq_b = #duck.weight<"model.layers.0.self_attn.indexer.wq_b.weight", bf16, [32, 32]>}
// CHECK-SAME:      kind = "mla", layer = 0 : i64, num_heads = 4 : i64, num_kv_heads = 4 : i64
// CHECK-SAME:      weights = {kv_a_layernorm = #duck.weight<"model.layers.0.self_attn.kv_a_layernorm.weight", bf16, [32]>
// CHECK-SAME:                 kv_a_proj_with_mqa = #duck.weight<"model.layers.0.self_attn.kv_a_proj_with_mqa.weight", f8E4M3FN, [40, 64], scale = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv">
// CHECK-SAME:                 kv_b_proj = #duck.weight<"model.layers.0.self_attn.kv_b_proj.weight", bf16, [128, 32]>
// CHECK-SAME:                 o_proj = #duck.weight<"model.layers.0.self_attn.o_proj.weight", bf16, [64, 64]>
// CHECK-SAME:                 q_a_layernorm = #duck.weight<"model.layers.0.self_attn.q_a_layernorm.weight", bf16, [32]>
// CHECK-SAME:                 q_a_proj = #duck.weight<"model.layers.0.self_attn.q_a_proj.weight", bf16, [32, 64]>
// CHECK-SAME:                 q_b_proj = #duck.weight<"model.layers.0.self_attn.q_b_proj.weight", bf16, [96, 32]>}
// CHECK-SAME:      : tensor<?x64xf32>
duck.model @deepseek_mla attributes {family = "deepseek_v32", config = {q_lora_rank = 32 : i64, kv_lora_rank = 32 : i64}} {
^bb0(%tokens: tensor<?xi32>):
  %x = duck.embedding %tokens {weight = #duck.weight<"e", bf16, [512, 64]>} : tensor<?xi32> -> tensor<?x64xf32>
  %a = duck.attention %x {layer = 0 : i64, kind = "mla", num_heads = 4 : i64, num_kv_heads = 4 : i64, head_dim = 24 : i64,
      weights = {q_a_proj = #duck.weight<"model.layers.0.self_attn.q_a_proj.weight", bf16, [32, 64]>,
                 q_a_layernorm = #duck.weight<"model.layers.0.self_attn.q_a_layernorm.weight", bf16, [32]>,
                 q_b_proj = #duck.weight<"model.layers.0.self_attn.q_b_proj.weight", bf16, [96, 32]>,
                 kv_a_proj_with_mqa = #duck.weight<"model.layers.0.self_attn.kv_a_proj_with_mqa.weight", f8E4M3FN, [40, 64], scale = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv">,
                 kv_a_layernorm = #duck.weight<"model.layers.0.self_attn.kv_a_layernorm.weight", bf16, [32]>,
                 kv_b_proj = #duck.weight<"model.layers.0.self_attn.kv_b_proj.weight", bf16, [128, 32]>,
                 o_proj = #duck.weight<"model.layers.0.self_attn.o_proj.weight", bf16, [64, 64]>},
      indexer = {wq_b = #duck.weight<"model.layers.0.self_attn.indexer.wq_b.weight", bf16, [32, 32]>,
                 wk = #duck.weight<"model.layers.0.self_attn.indexer.wk.weight", bf16, [16, 64]>,
                 k_norm = #duck.weight<"model.layers.0.self_attn.indexer.k_norm.weight", bf16, [16]>,
                 k_norm_bias = #duck.weight<"model.layers.0.self_attn.indexer.k_norm.bias", bf16, [16]>,
                 weights_proj = #duck.weight<"model.layers.0.self_attn.indexer.weights_proj.weight", bf16, [2, 64]>,
                 n_heads = 2 : i64, head_dim = 16 : i64, topk = 8 : i64}} : tensor<?x64xf32>
  duck.return %a : tensor<?x64xf32>
}

// -----

// A partitioned dense MLP: the partition attributes, a `shards` region of
// fully annotated duck.fp9_ffn ops (kernels, modes, smp, placement), and the
// #duck.strategy and #duck.kernel attributes.
// CHECK-LABEL: duck.model @partitioned_mlp
// CHECK:         duck.mlp %{{[^ ]+}} {
// CHECK-SAME:      multiple_of = 64 : i64, strategy = #duck.strategy<intermediate>, tp = 2 : i64, tp_max = 2 : i64
// CHECK-SAME:      : tensor<?x64xf32> shards {
// CHECK-NEXT:      duck.fp9_ffn {block = 64 : i64, bytes = 28672 : i64, decode_mode = 0 : i32
// CHECK-SAME:        down_kernel = #duck.kernel<exact64, "K == 64 == block: one block a row">
// CHECK-SAME:        expert_begin = 0 : i64, expert_end = 1 : i64
// CHECK-SAME:        gate_kernel = #duck.kernel<general64, "K = 64 is 1 block of 64">
// CHECK-SAME:        inter_begin = 0 : i64, inter_end = 64 : i64, offset = 8192 : i64, prefill_mode = 5 : i32, rank = 0 : i64, slot = 0 : i64, smp = false
// CHECK-SAME:        up_kernel = #duck.kernel<general32, "K = 64 is 2 blocks of 32">}
// CHECK-NEXT:      duck.fp9_ffn {block = 64 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, inter_begin = 64 : i64, inter_end = 128 : i64, rank = 1 : i64}
// CHECK-NEXT:    }
duck.model @partitioned_mlp attributes {family = "qwen3", config = {}} {
^bb0(%tokens: tensor<?xi32>):
  %x = duck.embedding %tokens {weight = #duck.weight<"e", bf16, [512, 64]>} : tensor<?xi32> -> tensor<?x64xf32>
  %m = duck.mlp %x {layer = 0 : i64, hidden = 64 : i64, inter = 128 : i64,
      gate = #duck.weight<"g", bf16, [128, 64]>, up = #duck.weight<"u", bf16, [128, 64]>, down = #duck.weight<"d", bf16, [64, 128]>,
      tp = 2 : i64, multiple_of = 64 : i64, tp_max = 2 : i64, strategy = #duck.strategy<intermediate>} : tensor<?x64xf32> shards {
    duck.fp9_ffn {rank = 0 : i64, inter_begin = 0 : i64, inter_end = 64 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 64 : i64,
                  gate_kernel = #duck.kernel<general64, "K = 64 is 1 block of 64">,
                  up_kernel = #duck.kernel<general32, "K = 64 is 2 blocks of 32">,
                  down_kernel = #duck.kernel<exact64, "K == 64 == block: one block a row">,
                  decode_mode = 0 : i32, prefill_mode = 5 : i32, smp = false,
                  slot = 0 : i64, offset = 8192 : i64, bytes = 28672 : i64}
    duck.fp9_ffn {rank = 1 : i64, inter_begin = 64 : i64, inter_end = 128 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 64 : i64}
  }
  duck.return %m : tensor<?x64xf32>
}

// -----

// A MoE placed by experts: each fp9_ffn holds a range of expert ids (the
// shared expert is id num_experts), the remaining kernel kinds
// (general128, exact128) and the MoE modes.
// CHECK-LABEL: duck.model @partitioned_moe_experts
// CHECK:         duck.moe %{{[^ ]+}} {
// CHECK-SAME:      strategy = #duck.strategy<experts>
// CHECK-SAME:      tp = 2 : i64, tp_max = 4 : i64
// CHECK-SAME:      : tensor<?x256xf32> shards {
// CHECK-NEXT:      duck.fp9_ffn {block = 128 : i64, decode_mode = 4 : i32
// CHECK-SAME:        down_kernel = #duck.kernel<exact128, "K == 128 == block: one block a row, four rows a tile">
// CHECK-SAME:        expert_begin = 0 : i64, expert_end = 2 : i64
// CHECK-SAME:        gate_kernel = #duck.kernel<general128, "K = 256 is 2 blocks of 128">
// CHECK-SAME:        prefill_mode = 6 : i32, rank = 0 : i64, smp = true
// CHECK-NEXT:      duck.fp9_ffn {block = 128 : i64, decode_mode = 1 : i32, expert_begin = 2 : i64, expert_end = 4 : i64
// CHECK-SAME:        prefill_mode = 6 : i32, rank = 1 : i64, smp = false}
duck.model @partitioned_moe_experts attributes {family = "deepseek_v3", config = {}} {
^bb0(%x: tensor<?x256xf32>):
  %e = duck.moe %x {layer = 0 : i64, hidden = 256 : i64, inter = 128 : i64, num_experts = 3 : i64, top_k = 1 : i64,
      router = #duck.router_kind<sigmoid>, norm_topk_prob = false,
      router_weight = #duck.weight<"r", bf16, [3, 256]>,
      gate = #duck.experts<"g{e}", bf16, [128, 256], count = 3>,
      up = #duck.experts<"u{e}", bf16, [128, 256], count = 3>,
      down = #duck.experts<"d{e}", bf16, [256, 128], count = 3>,
      num_shared = 1 : i64, shared_gate = #duck.weight<"sg", bf16, [128, 256]>,
      shared_up = #duck.weight<"su", bf16, [128, 256]>, shared_down = #duck.weight<"sd", bf16, [256, 128]>,
      tp = 2 : i64, multiple_of = 128 : i64, tp_max = 4 : i64, strategy = #duck.strategy<experts>} : tensor<?x256xf32> shards {
    duck.fp9_ffn {rank = 0 : i64, inter_begin = 0 : i64, inter_end = 128 : i64, expert_begin = 0 : i64, expert_end = 2 : i64, block = 128 : i64,
                  gate_kernel = #duck.kernel<general128, "K = 256 is 2 blocks of 128">,
                  down_kernel = #duck.kernel<exact128, "K == 128 == block: one block a row, four rows a tile">,
                  decode_mode = 4 : i32, prefill_mode = 6 : i32, smp = true}
    duck.fp9_ffn {rank = 1 : i64, inter_begin = 0 : i64, inter_end = 128 : i64, expert_begin = 2 : i64, expert_end = 4 : i64, block = 128 : i64,
                  decode_mode = 1 : i32, prefill_mode = 6 : i32, smp = false}
  }
  duck.return %e : tensor<?x256xf32>
}

// -----

// A model that returns nothing: the implicit duck.return is not printed.
// CHECK-LABEL: duck.model @no_outputs
// CHECK-NEXT:  ^bb0(%{{.+}}: tensor<4xi32>):
// CHECK-NEXT:  }
duck.model @no_outputs attributes {family = "qwen3", config = {}} {
^bb0(%tokens: tensor<4xi32>):
  duck.return
}

// -----

// #duck.partition round-trips, with and without shares.
// CHECK: module attributes {duck.partition = #duck.partition<tp = 4, multiple_of = 32, strategy = experts, tp_max = 8, shares = [2.000000e+00, 1.000000e+00, 1.000000e+00, 5.000000e-01]>}
module attributes {duck.partition = #duck.partition<tp = 4, multiple_of = 32, strategy = experts, tp_max = 8, shares = [2.0, 1.0, 1.0, 0.5]>} {}

// -----

// CHECK: module attributes {duck.partition = #duck.partition<tp = 1, multiple_of = 128, strategy = intermediate, tp_max = 6>}
module attributes {duck.partition = #duck.partition<tp = 1, multiple_of = 128, strategy = intermediate, tp_max = 6>} {}
