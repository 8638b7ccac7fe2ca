// Every verifier rule of the duck dialect's ops and attributes, one case each.
// (#duck.weight's "at least one dimension" rule is not reachable from text:
// the assembly format cannot parse an empty shape `[]`.)
// RUN: duck-opt %s -split-input-file -verify-diagnostics

// #duck.weight: a weight needs a tensor name.
duck.model @weight_no_name attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?xi32>):
  // expected-error @+1 {{weight needs a tensor name}}
  %m = duck.embedding %x {weight = #duck.weight<"", bf16, [8, 32]>} : tensor<?xi32> -> tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// #duck.weight: every dimension is positive.
duck.model @weight_zero_dim attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?xi32>):
  // expected-error @+1 {{weight dimensions must be positive, got 0}}
  %m = duck.embedding %x {weight = #duck.weight<"e", bf16, [0, 32]>} : tensor<?xi32> -> tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// #duck.weight: the dtype is a float or integer type (index is neither).
duck.model @weight_bad_dtype attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?xi32>):
  // expected-error @+1 {{weight dtype must be a float or integer type, got 'index'}}
  %m = duck.embedding %x {weight = #duck.weight<"e", index, [8, 32]>} : tensor<?xi32> -> tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// #duck.experts: the name pattern has an {e} to substitute.
duck.model @experts_no_placeholder attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+3 {{expert name pattern 'g' must contain {e}}}
  %m = duck.moe %x {layer = 1 : i64, hidden = 32 : i64, inter = 64 : i64, num_experts = 4 : i64, top_k = 2 : i64,
      router = #duck.router_kind<softmax>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [4, 32]>,
      gate = #duck.experts<"g", bf16, [64, 32], count = 4>,
      up = #duck.experts<"u{e}", bf16, [64, 32], count = 4>,
      down = #duck.experts<"d{e}", bf16, [32, 64], count = 4>} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// #duck.experts: the expert count is positive.
duck.model @experts_zero_count attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+3 {{expert count must be positive, got 0}}
  %m = duck.moe %x {layer = 1 : i64, hidden = 32 : i64, inter = 64 : i64, num_experts = 4 : i64, top_k = 2 : i64,
      router = #duck.router_kind<softmax>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [4, 32]>,
      gate = #duck.experts<"g{e}", bf16, [64, 32], count = 0>,
      up = #duck.experts<"u{e}", bf16, [64, 32], count = 4>,
      down = #duck.experts<"d{e}", bf16, [32, 64], count = 4>} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// #duck.experts: a scale pattern has an {e} too.
duck.model @experts_scale_no_placeholder attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+3 {{expert scale pattern must contain {e}}}
  %m = duck.moe %x {layer = 1 : i64, hidden = 32 : i64, inter = 64 : i64, num_experts = 4 : i64, top_k = 2 : i64,
      router = #duck.router_kind<softmax>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [4, 32]>,
      gate = #duck.experts<"g{e}", bf16, [64, 32], count = 4, scale = "gs">,
      up = #duck.experts<"u{e}", bf16, [64, 32], count = 4>,
      down = #duck.experts<"d{e}", bf16, [32, 64], count = 4>} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// #duck.experts: the shape rules of #duck.weight apply to experts.
duck.model @experts_negative_dim attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+3 {{weight dimensions must be positive, got -1}}
  %m = duck.moe %x {layer = 1 : i64, hidden = 32 : i64, inter = 64 : i64, num_experts = 4 : i64, top_k = 2 : i64,
      router = #duck.router_kind<softmax>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [4, 32]>,
      gate = #duck.experts<"g{e}", bf16, [-1, 32], count = 4>,
      up = #duck.experts<"u{e}", bf16, [64, 32], count = 4>,
      down = #duck.experts<"d{e}", bf16, [32, 64], count = 4>} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.model: the body takes the token ids, and with an MTP module the
// tokens after them; nothing more.
// expected-error @+1 {{body must take the token ids (and, with an MTP module, the tokens after them)}}
duck.model @three_args attributes {family = "qwen3", config = {}} {
^bb0(%t: tensor<?xi32>, %u: tensor<?xi32>, %v: tensor<?xi32>):
  duck.return
}

// -----

// duck.mtp_input: eh_proj maps the concatenation [hidden, 2 * hidden].
duck.model @mtp_eh_shape attributes {family = "deepseek_v3", config = {}} {
^bb0(%t: tensor<?xi32>, %n: tensor<?xi32>):
  %e = duck.embedding %n {weight = #duck.weight<"e", bf16, [8, 32]>} : tensor<?xi32> -> tensor<?x32xf32>
  // expected-error @+1 {{eh_proj weight has shape [32, 32], expected [32, 64]}}
  %x = duck.mtp_input %e, %e {layer = 2 : i64, enorm = #duck.weight<"a", bf16, [32]>, hnorm = #duck.weight<"b", bf16, [32]>, eh_proj = #duck.weight<"c", bf16, [32, 32]>, eps = 1.0e-06 : f64} : tensor<?x32xf32>, tensor<?x32xf32> -> tensor<?x32xf32>
  duck.return %x : tensor<?x32xf32>
}

// -----

// duck.mtp_input: the norms are [hidden].
duck.model @mtp_norm_shape attributes {family = "deepseek_v3", config = {}} {
^bb0(%t: tensor<?xi32>, %n: tensor<?xi32>):
  %e = duck.embedding %n {weight = #duck.weight<"e", bf16, [8, 32]>} : tensor<?xi32> -> tensor<?x32xf32>
  // expected-error @+1 {{hnorm weight has shape [16], expected [32]}}
  %x = duck.mtp_input %e, %e {layer = 2 : i64, enorm = #duck.weight<"a", bf16, [32]>, hnorm = #duck.weight<"b", bf16, [16]>, eh_proj = #duck.weight<"c", bf16, [32, 64]>, eps = 1.0e-06 : f64} : tensor<?x32xf32>, tensor<?x32xf32> -> tensor<?x32xf32>
  duck.return %x : tensor<?x32xf32>
}

// -----

// Activations need a hidden dimension: a rank-0 result is refused (it used to crash).
duck.model @rank0_activation attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?xi32>):
  // expected-error @+1 {{activations must have a hidden dimension, got 'tensor<f32>'}}
  %m = duck.embedding %x {weight = #duck.weight<"e", bf16, [8, 32]>} : tensor<?xi32> -> tensor<f32>
  duck.return %m : tensor<f32>
}

// -----

// duck.embedding: the weight is 2-D [vocab, hidden].
duck.model @embedding_1d attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?xi32>):
  // expected-error @+1 {{embedding weight must be 2-D [vocab, hidden]}}
  %m = duck.embedding %x {weight = #duck.weight<"e", bf16, [256]>} : tensor<?xi32> -> tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.embedding: the weight's width is the result's hidden size.
duck.model @embedding_width attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?xi32>):
  // expected-error @+1 {{embedding width 64 does not match the result's hidden size 32}}
  %m = duck.embedding %x {weight = #duck.weight<"e", bf16, [8, 64]>} : tensor<?xi32> -> tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.rms_norm: the weight is [hidden].
duck.model @norm_shape attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{norm weight has shape [64], expected [32]}}
  %m = duck.rms_norm %x {weight = #duck.weight<"n", bf16, [64]>, eps = 1.0e-06 : f64} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.rms_norm: eps is positive.
duck.model @norm_eps attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{eps must be positive}}
  %m = duck.rms_norm %x {weight = #duck.weight<"n", bf16, [32]>, eps = 0.0 : f64} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.attention: kind is gqa or mla.
duck.model @attention_kind attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{attention kind must be "gqa" or "mla", got "mha"}}
  %m = duck.attention %x {layer = 0 : i64, kind = "mha", num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 8 : i64, weights = {q_proj = #duck.weight<"q", bf16, [32, 32]>, k_proj = #duck.weight<"k", bf16, [16, 32]>, v_proj = #duck.weight<"v", bf16, [16, 32]>, o_proj = #duck.weight<"o", bf16, [32, 32]>}} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.attention: head counts and head_dim are positive.
duck.model @attention_heads attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{head counts and head_dim must be positive}}
  %m = duck.attention %x {layer = 0 : i64, kind = "gqa", num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 0 : i64, weights = {q_proj = #duck.weight<"q", bf16, [32, 32]>, k_proj = #duck.weight<"k", bf16, [16, 32]>, v_proj = #duck.weight<"v", bf16, [16, 32]>, o_proj = #duck.weight<"o", bf16, [32, 32]>}} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.attention: num_heads is a multiple of num_kv_heads.
duck.model @attention_groups attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{num_heads 4 is not a multiple of num_kv_heads 3}}
  %m = duck.attention %x {layer = 0 : i64, kind = "gqa", num_heads = 4 : i64, num_kv_heads = 3 : i64, head_dim = 8 : i64, weights = {q_proj = #duck.weight<"q", bf16, [32, 32]>, k_proj = #duck.weight<"k", bf16, [16, 32]>, v_proj = #duck.weight<"v", bf16, [16, 32]>, o_proj = #duck.weight<"o", bf16, [32, 32]>}} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.attention: every weights entry is a #duck.weight.
duck.model @attention_entry attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{weights entry 'q_norm' is not a #duck.weight}}
  %m = duck.attention %x {layer = 0 : i64, kind = "gqa", num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 8 : i64, weights = {q_proj = #duck.weight<"q", bf16, [32, 32]>, k_proj = #duck.weight<"k", bf16, [16, 32]>, v_proj = #duck.weight<"v", bf16, [16, 32]>, o_proj = #duck.weight<"o", bf16, [32, 32]>, q_norm = 1 : i64}} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.attention: gqa needs q/k/v/o projections.
duck.model @attention_gqa_missing attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{attention is missing its 'v_proj' weight}}
  %m = duck.attention %x {layer = 0 : i64, kind = "gqa", num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 8 : i64, weights = {q_proj = #duck.weight<"q", bf16, [32, 32]>, k_proj = #duck.weight<"k", bf16, [16, 32]>, o_proj = #duck.weight<"o", bf16, [32, 32]>}} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.attention: mla needs kv_a_proj_with_mqa, kv_b_proj and o_proj.
duck.model @attention_mla_missing attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{attention is missing its 'kv_b_proj' weight}}
  %m = duck.attention %x {layer = 0 : i64, kind = "mla", num_heads = 4 : i64, num_kv_heads = 4 : i64, head_dim = 8 : i64, weights = {q_proj = #duck.weight<"q", bf16, [32, 32]>, kv_a_proj_with_mqa = #duck.weight<"kva", bf16, [24, 32]>, o_proj = #duck.weight<"o", bf16, [32, 32]>}} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.lm_head: the weight is [vocab, hidden].
duck.model @lm_head_shape attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{lm_head weight must be [vocab, hidden]}}
  %m = duck.lm_head %x {weight = #duck.weight<"h", bf16, [32, 512]>} : tensor<?x32xf32> -> tensor<?x512xf32>
  duck.return %m : tensor<?x512xf32>
}

// -----

// duck.lm_head: the result width is the vocab size.
duck.model @lm_head_vocab attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{result width 256 does not match vocab 512}}
  %m = duck.lm_head %x {weight = #duck.weight<"h", bf16, [512, 32]>} : tensor<?x32xf32> -> tensor<?x256xf32>
  duck.return %m : tensor<?x256xf32>
}

// -----

// duck.mlp: the input's hidden size is `hidden`.
duck.model @mlp_input attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{input hidden size 32 does not match hidden = 16}}
  %m = duck.mlp %x {layer = 0 : i64, hidden = 16 : i64, inter = 64 : i64,
      gate = #duck.weight<"g", bf16, [64, 32]>, up = #duck.weight<"u", bf16, [64, 32]>, down = #duck.weight<"d", bf16, [32, 64]>} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.mlp: gate is [inter, hidden].
duck.model @mlp_gate attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{gate weight has shape [32, 64], expected [64, 32]}}
  %m = duck.mlp %x {layer = 0 : i64, hidden = 32 : i64, inter = 64 : i64,
      gate = #duck.weight<"g", bf16, [32, 64]>, up = #duck.weight<"u", bf16, [64, 32]>, down = #duck.weight<"d", bf16, [32, 64]>} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.mlp: up is [inter, hidden].
duck.model @mlp_up attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{up weight has shape [64, 64], expected [64, 32]}}
  %m = duck.mlp %x {layer = 0 : i64, hidden = 32 : i64, inter = 64 : i64,
      gate = #duck.weight<"g", bf16, [64, 32]>, up = #duck.weight<"u", bf16, [64, 64]>, down = #duck.weight<"d", bf16, [32, 64]>} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.mlp: down is [hidden, inter].
duck.model @mlp_down attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{down weight has shape [64, 32], expected [32, 64]}}
  %m = duck.mlp %x {layer = 0 : i64, hidden = 32 : i64, inter = 64 : i64,
      gate = #duck.weight<"g", bf16, [64, 32]>, up = #duck.weight<"u", bf16, [64, 32]>, down = #duck.weight<"d", bf16, [64, 32]>} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.moe: the input's hidden size is `hidden`.
duck.model @moe_input attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{input hidden size 32 does not match hidden = 64}}
  %m = duck.moe %x {layer = 1 : i64, hidden = 64 : i64, inter = 64 : i64, num_experts = 4 : i64, top_k = 2 : i64,
      router = #duck.router_kind<softmax>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [4, 32]>,
      gate = #duck.experts<"g{e}", bf16, [64, 32], count = 4>,
      up = #duck.experts<"u{e}", bf16, [64, 32], count = 4>,
      down = #duck.experts<"d{e}", bf16, [32, 64], count = 4>} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.moe: top_k is at least 1.
duck.model @moe_topk_zero attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{top_k = 0 must be in [1, 4]}}
  %m = duck.moe %x {layer = 1 : i64, hidden = 32 : i64, inter = 64 : i64, num_experts = 4 : i64, top_k = 0 : i64,
      router = #duck.router_kind<softmax>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [4, 32]>,
      gate = #duck.experts<"g{e}", bf16, [64, 32], count = 4>,
      up = #duck.experts<"u{e}", bf16, [64, 32], count = 4>,
      down = #duck.experts<"d{e}", bf16, [32, 64], count = 4>} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.moe: top_k is at most num_experts.
duck.model @moe_topk_big attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{top_k = 5 must be in [1, 4]}}
  %m = duck.moe %x {layer = 1 : i64, hidden = 32 : i64, inter = 64 : i64, num_experts = 4 : i64, top_k = 5 : i64,
      router = #duck.router_kind<softmax>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [4, 32]>,
      gate = #duck.experts<"g{e}", bf16, [64, 32], count = 4>,
      up = #duck.experts<"u{e}", bf16, [64, 32], count = 4>,
      down = #duck.experts<"d{e}", bf16, [32, 64], count = 4>} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.moe: each #duck.experts count is num_experts.
duck.model @moe_count attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{up experts count 8 does not match num_experts = 4}}
  %m = duck.moe %x {layer = 1 : i64, hidden = 32 : i64, inter = 64 : i64, num_experts = 4 : i64, top_k = 2 : i64,
      router = #duck.router_kind<softmax>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [4, 32]>,
      gate = #duck.experts<"g{e}", bf16, [64, 32], count = 4>,
      up = #duck.experts<"u{e}", bf16, [64, 32], count = 8>,
      down = #duck.experts<"d{e}", bf16, [32, 64], count = 4>} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.moe: an expert's gate is [inter, hidden].
duck.model @moe_gate attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{expert gate weight has shape [32, 64], expected [64, 32]}}
  %m = duck.moe %x {layer = 1 : i64, hidden = 32 : i64, inter = 64 : i64, num_experts = 4 : i64, top_k = 2 : i64,
      router = #duck.router_kind<softmax>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [4, 32]>,
      gate = #duck.experts<"g{e}", bf16, [32, 64], count = 4>,
      up = #duck.experts<"u{e}", bf16, [64, 32], count = 4>,
      down = #duck.experts<"d{e}", bf16, [32, 64], count = 4>} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.moe: an expert's up is [inter, hidden].
duck.model @moe_up attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{expert up weight has shape [64], expected [64, 32]}}
  %m = duck.moe %x {layer = 1 : i64, hidden = 32 : i64, inter = 64 : i64, num_experts = 4 : i64, top_k = 2 : i64,
      router = #duck.router_kind<softmax>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [4, 32]>,
      gate = #duck.experts<"g{e}", bf16, [64, 32], count = 4>,
      up = #duck.experts<"u{e}", bf16, [64], count = 4>,
      down = #duck.experts<"d{e}", bf16, [32, 64], count = 4>} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.moe: an expert's down is [hidden, inter].
duck.model @moe_down attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{expert down weight has shape [64, 32], expected [32, 64]}}
  %m = duck.moe %x {layer = 1 : i64, hidden = 32 : i64, inter = 64 : i64, num_experts = 4 : i64, top_k = 2 : i64,
      router = #duck.router_kind<softmax>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [4, 32]>,
      gate = #duck.experts<"g{e}", bf16, [64, 32], count = 4>,
      up = #duck.experts<"u{e}", bf16, [64, 32], count = 4>,
      down = #duck.experts<"d{e}", bf16, [64, 32], count = 4>} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.moe: the router is [num_experts, hidden].
duck.model @moe_router attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{router weight has shape [8, 32], expected [4, 32]}}
  %m = duck.moe %x {layer = 1 : i64, hidden = 32 : i64, inter = 64 : i64, num_experts = 4 : i64, top_k = 2 : i64,
      router = #duck.router_kind<softmax>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [8, 32]>,
      gate = #duck.experts<"g{e}", bf16, [64, 32], count = 4>,
      up = #duck.experts<"u{e}", bf16, [64, 32], count = 4>,
      down = #duck.experts<"d{e}", bf16, [32, 64], count = 4>} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.moe: n_group divides num_experts.
duck.model @moe_n_group attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{n_group = 3 must divide num_experts = 4}}
  %m = duck.moe %x {layer = 1 : i64, hidden = 32 : i64, inter = 64 : i64, num_experts = 4 : i64, top_k = 2 : i64,
      router = #duck.router_kind<softmax>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [4, 32]>,
      gate = #duck.experts<"g{e}", bf16, [64, 32], count = 4>,
      up = #duck.experts<"u{e}", bf16, [64, 32], count = 4>,
      down = #duck.experts<"d{e}", bf16, [32, 64], count = 4>, n_group = 3 : i64, topk_group = 1 : i64} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.moe: n_group is positive (negative values are not read as unsigned).
duck.model @moe_n_group_negative attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{n_group = -2 must divide num_experts = 4}}
  %m = duck.moe %x {layer = 1 : i64, hidden = 32 : i64, inter = 64 : i64, num_experts = 4 : i64, top_k = 2 : i64,
      router = #duck.router_kind<softmax>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [4, 32]>,
      gate = #duck.experts<"g{e}", bf16, [64, 32], count = 4>,
      up = #duck.experts<"u{e}", bf16, [64, 32], count = 4>,
      down = #duck.experts<"d{e}", bf16, [32, 64], count = 4>, n_group = -2 : i64} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.moe: topk_group does not exceed n_group.
duck.model @moe_topk_group attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{topk_group must not exceed n_group}}
  %m = duck.moe %x {layer = 1 : i64, hidden = 32 : i64, inter = 64 : i64, num_experts = 4 : i64, top_k = 2 : i64,
      router = #duck.router_kind<softmax>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [4, 32]>,
      gate = #duck.experts<"g{e}", bf16, [64, 32], count = 4>,
      up = #duck.experts<"u{e}", bf16, [64, 32], count = 4>,
      down = #duck.experts<"d{e}", bf16, [32, 64], count = 4>, n_group = 2 : i64, topk_group = 3 : i64} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.moe: topk_group is at least 1.
duck.model @moe_topk_group_zero attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{topk_group = 0 must be at least 1}}
  %m = duck.moe %x {layer = 1 : i64, hidden = 32 : i64, inter = 64 : i64, num_experts = 4 : i64, top_k = 2 : i64,
      router = #duck.router_kind<softmax>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [4, 32]>,
      gate = #duck.experts<"g{e}", bf16, [64, 32], count = 4>,
      up = #duck.experts<"u{e}", bf16, [64, 32], count = 4>,
      down = #duck.experts<"d{e}", bf16, [32, 64], count = 4>, n_group = 2 : i64, topk_group = 0 : i64} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.moe: the correction bias is [num_experts].
duck.model @moe_bias attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{correction_bias weight has shape [8], expected [4]}}
  %m = duck.moe %x {layer = 1 : i64, hidden = 32 : i64, inter = 64 : i64, num_experts = 4 : i64, top_k = 2 : i64,
      router = #duck.router_kind<softmax>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [4, 32]>,
      gate = #duck.experts<"g{e}", bf16, [64, 32], count = 4>,
      up = #duck.experts<"u{e}", bf16, [64, 32], count = 4>,
      down = #duck.experts<"d{e}", bf16, [32, 64], count = 4>, correction_bias = #duck.weight<"b", f32, [8]>} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.moe: num_shared is not negative.
duck.model @moe_shared_negative attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{num_shared = -1 must not be negative}}
  %m = duck.moe %x {layer = 1 : i64, hidden = 32 : i64, inter = 64 : i64, num_experts = 4 : i64, top_k = 2 : i64,
      router = #duck.router_kind<softmax>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [4, 32]>,
      gate = #duck.experts<"g{e}", bf16, [64, 32], count = 4>,
      up = #duck.experts<"u{e}", bf16, [64, 32], count = 4>,
      down = #duck.experts<"d{e}", bf16, [32, 64], count = 4>, num_shared = -1 : i64} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.moe: shared experts need all three shared weights.
duck.model @moe_shared_missing attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{num_shared > 0 needs shared_gate, shared_up and shared_down weights}}
  %m = duck.moe %x {layer = 1 : i64, hidden = 32 : i64, inter = 64 : i64, num_experts = 4 : i64, top_k = 2 : i64,
      router = #duck.router_kind<softmax>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [4, 32]>,
      gate = #duck.experts<"g{e}", bf16, [64, 32], count = 4>,
      up = #duck.experts<"u{e}", bf16, [64, 32], count = 4>,
      down = #duck.experts<"d{e}", bf16, [32, 64], count = 4>, num_shared = 1 : i64, shared_gate = #duck.weight<"sg", bf16, [64, 32]>, shared_up = #duck.weight<"su", bf16, [64, 32]>} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.moe: the shared experts are one FFN of num_shared * inter neurons.
duck.model @moe_shared_shape attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{shared down weight has shape [32, 64], expected [32, 128]}}
  %m = duck.moe %x {layer = 1 : i64, hidden = 32 : i64, inter = 64 : i64, num_experts = 4 : i64, top_k = 2 : i64,
      router = #duck.router_kind<softmax>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [4, 32]>,
      gate = #duck.experts<"g{e}", bf16, [64, 32], count = 4>,
      up = #duck.experts<"u{e}", bf16, [64, 32], count = 4>,
      down = #duck.experts<"d{e}", bf16, [32, 64], count = 4>, num_shared = 2 : i64, shared_gate = #duck.weight<"sg", bf16, [128, 32]>, shared_up = #duck.weight<"su", bf16, [128, 32]>, shared_down = #duck.weight<"sd", bf16, [32, 64]>} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// Shards need the layer's tp.
duck.model @shards_no_tp attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{has shards but no 'tp' attribute}}
  %m = duck.mlp %x {layer = 0 : i64, hidden = 32 : i64, inter = 64 : i64,
      gate = #duck.weight<"g", bf16, [64, 32]>, up = #duck.weight<"u", bf16, [64, 32]>, down = #duck.weight<"d", bf16, [32, 64]>} : tensor<?x32xf32> shards {
    duck.fp9_ffn {rank = 0 : i64, inter_begin = 0 : i64, inter_end = 64 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 64 : i64}
  }
  duck.return %m : tensor<?x32xf32>
}

// -----

// The shards region holds only duck.fp9_ffn.
duck.model @shards_foreign_op attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{shards region may only hold duck.fp9_ffn ops}}
  %m = duck.mlp %x {layer = 0 : i64, hidden = 32 : i64, inter = 64 : i64,
      gate = #duck.weight<"g", bf16, [64, 32]>, up = #duck.weight<"u", bf16, [64, 32]>, down = #duck.weight<"d", bf16, [32, 64]>, tp = 1 : i64} : tensor<?x32xf32> shards {
    %y = duck.add %x, %x : tensor<?x32xf32>
  }
  duck.return %m : tensor<?x32xf32>
}

// -----

// multiple_of is positive (a zero used to divide by zero in the verifier).
duck.model @shards_multiple_of_zero attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{multiple_of must be positive, got 0}}
  %m = duck.mlp %x {layer = 0 : i64, hidden = 32 : i64, inter = 64 : i64,
      gate = #duck.weight<"g", bf16, [64, 32]>, up = #duck.weight<"u", bf16, [64, 32]>, down = #duck.weight<"d", bf16, [32, 64]>, tp = 1 : i64, multiple_of = 0 : i64} : tensor<?x32xf32> shards {
    duck.fp9_ffn {rank = 0 : i64, inter_begin = 0 : i64, inter_end = 64 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 64 : i64}
  }
  duck.return %m : tensor<?x32xf32>
}

// -----

// A shard's rank is below tp.
duck.model @rank_past_tp attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 32 : i64, inter = 64 : i64,
      gate = #duck.weight<"g", bf16, [64, 32]>, up = #duck.weight<"u", bf16, [64, 32]>, down = #duck.weight<"d", bf16, [32, 64]>, tp = 2 : i64, multiple_of = 32 : i64} : tensor<?x32xf32> shards {
    duck.fp9_ffn {rank = 0 : i64, inter_begin = 0 : i64, inter_end = 32 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 32 : i64}
    // expected-error @+1 {{rank 2 is outside the cluster of tp = 2}}
    duck.fp9_ffn {rank = 2 : i64, inter_begin = 32 : i64, inter_end = 64 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 32 : i64}
  }
  duck.return %m : tensor<?x32xf32>
}

// -----

// A shard's rank is not negative.
duck.model @rank_negative attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 32 : i64, inter = 64 : i64,
      gate = #duck.weight<"g", bf16, [64, 32]>, up = #duck.weight<"u", bf16, [64, 32]>, down = #duck.weight<"d", bf16, [32, 64]>, tp = 2 : i64, multiple_of = 32 : i64} : tensor<?x32xf32> shards {
    // expected-error @+1 {{rank -1 is outside the cluster of tp = 2}}
    duck.fp9_ffn {rank = -1 : i64, inter_begin = 0 : i64, inter_end = 32 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 32 : i64}
    duck.fp9_ffn {rank = 1 : i64, inter_begin = 32 : i64, inter_end = 64 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 32 : i64}
  }
  duck.return %m : tensor<?x32xf32>
}

// -----

// Each rank has one shard.
duck.model @rank_duplicate attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 32 : i64, inter = 64 : i64,
      gate = #duck.weight<"g", bf16, [64, 32]>, up = #duck.weight<"u", bf16, [64, 32]>, down = #duck.weight<"d", bf16, [32, 64]>, tp = 2 : i64, multiple_of = 32 : i64} : tensor<?x32xf32> shards {
    duck.fp9_ffn {rank = 0 : i64, inter_begin = 0 : i64, inter_end = 32 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 32 : i64}
    // expected-error @+1 {{duplicate shard for rank 0}}
    duck.fp9_ffn {rank = 0 : i64, inter_begin = 32 : i64, inter_end = 64 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 32 : i64}
  }
  duck.return %m : tensor<?x32xf32>
}

// -----

// A slice ends inside the layer's intermediate size.
duck.model @slice_past_inter attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 32 : i64, inter = 64 : i64,
      gate = #duck.weight<"g", bf16, [64, 32]>, up = #duck.weight<"u", bf16, [64, 32]>, down = #duck.weight<"d", bf16, [32, 64]>, tp = 2 : i64, multiple_of = 32 : i64} : tensor<?x32xf32> shards {
    duck.fp9_ffn {rank = 0 : i64, inter_begin = 0 : i64, inter_end = 32 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 32 : i64}
    // expected-error @+1 {{intermediate slice ends at 96, past the layer's intermediate size 64}}
    duck.fp9_ffn {rank = 1 : i64, inter_begin = 32 : i64, inter_end = 96 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 32 : i64}
  }
  duck.return %m : tensor<?x32xf32>
}

// -----

// A dense MLP has one expert.
duck.model @experts_past_dense attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 32 : i64, inter = 64 : i64,
      gate = #duck.weight<"g", bf16, [64, 32]>, up = #duck.weight<"u", bf16, [64, 32]>, down = #duck.weight<"d", bf16, [32, 64]>, tp = 2 : i64, multiple_of = 32 : i64} : tensor<?x32xf32> shards {
    duck.fp9_ffn {rank = 0 : i64, inter_begin = 0 : i64, inter_end = 32 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 32 : i64}
    // expected-error @+1 {{expert range ends at 2, past the 1 experts of the layer}}
    duck.fp9_ffn {rank = 1 : i64, inter_begin = 32 : i64, inter_end = 64 : i64, expert_begin = 0 : i64, expert_end = 2 : i64, block = 32 : i64}
  }
  duck.return %m : tensor<?x32xf32>
}

// -----

// A MoE shard's experts end at num_experts + num_shared.
duck.model @experts_past_moe attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  %m = duck.moe %x {layer = 1 : i64, hidden = 32 : i64, inter = 64 : i64, num_experts = 4 : i64, top_k = 2 : i64,
      router = #duck.router_kind<softmax>, norm_topk_prob = true, router_weight = #duck.weight<"r", bf16, [4, 32]>,
      gate = #duck.experts<"g{e}", bf16, [64, 32], count = 4>,
      up = #duck.experts<"u{e}", bf16, [64, 32], count = 4>,
      down = #duck.experts<"d{e}", bf16, [32, 64], count = 4>, num_shared = 1 : i64, shared_gate = #duck.weight<"sg", bf16, [64, 32]>, shared_up = #duck.weight<"su", bf16, [64, 32]>, shared_down = #duck.weight<"sd", bf16, [32, 64]>, tp = 2 : i64, strategy = #duck.strategy<experts>} : tensor<?x32xf32> shards {
    duck.fp9_ffn {rank = 0 : i64, inter_begin = 0 : i64, inter_end = 64 : i64, expert_begin = 0 : i64, expert_end = 3 : i64, block = 32 : i64}
    // expected-error @+1 {{expert range ends at 6, past the 5 experts of the layer}}
    duck.fp9_ffn {rank = 1 : i64, inter_begin = 0 : i64, inter_end = 64 : i64, expert_begin = 3 : i64, expert_end = 6 : i64, block = 32 : i64}
  }
  duck.return %m : tensor<?x32xf32>
}

// -----

// A slice is a whole number of multiple_of blocks.
duck.model @local_not_multiple_of attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 32 : i64, inter = 64 : i64,
      gate = #duck.weight<"g", bf16, [64, 32]>, up = #duck.weight<"u", bf16, [64, 32]>, down = #duck.weight<"d", bf16, [32, 64]>, tp = 2 : i64, multiple_of = 64 : i64} : tensor<?x32xf32> shards {
    // expected-error @+1 {{local intermediate size 32 is not a multiple of multiple_of = 64}}
    duck.fp9_ffn {rank = 0 : i64, inter_begin = 0 : i64, inter_end = 32 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 32 : i64}
    duck.fp9_ffn {rank = 1 : i64, inter_begin = 32 : i64, inter_end = 64 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 32 : i64}
  }
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.fp9_ffn: the intermediate slice is not empty.
duck.model @slice_empty attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 32 : i64, inter = 64 : i64,
      gate = #duck.weight<"g", bf16, [64, 32]>, up = #duck.weight<"u", bf16, [64, 32]>, down = #duck.weight<"d", bf16, [32, 64]>, tp = 1 : i64} : tensor<?x32xf32> shards {
    // expected-error @+1 {{intermediate slice [32, 32) is empty or negative}}
    duck.fp9_ffn {rank = 0 : i64, inter_begin = 32 : i64, inter_end = 32 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 32 : i64}
  }
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.fp9_ffn: the intermediate slice does not end below zero (read as signed).
duck.model @slice_negative attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 32 : i64, inter = 64 : i64,
      gate = #duck.weight<"g", bf16, [64, 32]>, up = #duck.weight<"u", bf16, [64, 32]>, down = #duck.weight<"d", bf16, [32, 64]>, tp = 1 : i64} : tensor<?x32xf32> shards {
    // expected-error @+1 {{intermediate slice [0, -64) is empty or negative}}
    duck.fp9_ffn {rank = 0 : i64, inter_begin = 0 : i64, inter_end = -64 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 32 : i64}
  }
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.fp9_ffn: the expert range is not empty.
duck.model @experts_empty attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 32 : i64, inter = 64 : i64,
      gate = #duck.weight<"g", bf16, [64, 32]>, up = #duck.weight<"u", bf16, [64, 32]>, down = #duck.weight<"d", bf16, [32, 64]>, tp = 1 : i64} : tensor<?x32xf32> shards {
    // expected-error @+1 {{expert range [1, 1) is empty or negative}}
    duck.fp9_ffn {rank = 0 : i64, inter_begin = 0 : i64, inter_end = 64 : i64, expert_begin = 1 : i64, expert_end = 1 : i64, block = 32 : i64}
  }
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.fp9_ffn: block is 32, 64 or 128.
duck.model @block_bad attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 32 : i64, inter = 64 : i64,
      gate = #duck.weight<"g", bf16, [64, 32]>, up = #duck.weight<"u", bf16, [64, 32]>, down = #duck.weight<"d", bf16, [32, 64]>, tp = 1 : i64} : tensor<?x32xf32> shards {
    // expected-error @+1 {{block must be 32, 64 or 128, got 16}}
    duck.fp9_ffn {rank = 0 : i64, inter_begin = 0 : i64, inter_end = 64 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 16 : i64}
  }
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.fp9_ffn: the local intermediate size (down_proj's K) is a multiple of block.
duck.model @block_local attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 32 : i64, inter = 64 : i64,
      gate = #duck.weight<"g", bf16, [64, 32]>, up = #duck.weight<"u", bf16, [64, 32]>, down = #duck.weight<"d", bf16, [32, 64]>, tp = 2 : i64} : tensor<?x32xf32> shards {
    // expected-error @+1 {{local intermediate size 32 is not a multiple of the block 64 (down_proj's K)}}
    duck.fp9_ffn {rank = 0 : i64, inter_begin = 0 : i64, inter_end = 32 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 64 : i64}
    duck.fp9_ffn {rank = 1 : i64, inter_begin = 32 : i64, inter_end = 64 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 32 : i64}
  }
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.fp9_ffn: decode_mode is a duck mode 0..6.
duck.model @decode_mode_bad attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 32 : i64, inter = 64 : i64,
      gate = #duck.weight<"g", bf16, [64, 32]>, up = #duck.weight<"u", bf16, [64, 32]>, down = #duck.weight<"d", bf16, [32, 64]>, tp = 1 : i64} : tensor<?x32xf32> shards {
    // expected-error @+1 {{decode_mode must be a duck mode 0..6}}
    duck.fp9_ffn {rank = 0 : i64, inter_begin = 0 : i64, inter_end = 64 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 64 : i64, decode_mode = 7 : i32}
  }
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.fp9_ffn: prefill_mode is a duck mode 0..6 (a negative one too).
duck.model @prefill_mode_bad attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  %m = duck.mlp %x {layer = 0 : i64, hidden = 32 : i64, inter = 64 : i64,
      gate = #duck.weight<"g", bf16, [64, 32]>, up = #duck.weight<"u", bf16, [64, 32]>, down = #duck.weight<"d", bf16, [32, 64]>, tp = 1 : i64} : tensor<?x32xf32> shards {
    // expected-error @+1 {{prefill_mode must be a duck mode 0..6}}
    duck.fp9_ffn {rank = 0 : i64, inter_begin = 0 : i64, inter_end = 64 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 64 : i64, prefill_mode = -1 : i32}
  }
  duck.return %m : tensor<?x32xf32>
}

// -----

// duck.fp9_ffn lives only in the shards of duck.mlp or duck.moe.
duck.model @shard_outside attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{expects parent op to be one of 'duck.mlp, duck.moe'}}
  duck.fp9_ffn {rank = 0 : i64, inter_begin = 0 : i64, inter_end = 64 : i64, expert_begin = 0 : i64, expert_end = 1 : i64, block = 64 : i64}
  duck.return
}

// -----

// #duck.partition: tp is at least 1.
// expected-error @+1 {{partition: tp must be at least 1, got 0}}
module attributes {duck.partition = #duck.partition<tp = 0, multiple_of = 64, strategy = intermediate, tp_max = 1>} {}

// -----

// #duck.partition: multiple_of is one of the kernel blocks.
// expected-error @+1 {{partition: multiple_of must be 128, 64 or 32, got 48}}
module attributes {duck.partition = #duck.partition<tp = 2, multiple_of = 48, strategy = intermediate, tp_max = 2>} {}

// -----

// #duck.partition: tp_max is not negative.
// expected-error @+1 {{partition: tp_max must not be negative, got -1}}
module attributes {duck.partition = #duck.partition<tp = 2, multiple_of = 64, strategy = intermediate, tp_max = -1>} {}

// -----

// #duck.partition: one share a duck.
// expected-error @+1 {{partition: shares has 1 values for tp = 2}}
module attributes {duck.partition = #duck.partition<tp = 2, multiple_of = 64, strategy = intermediate, tp_max = 2, shares = [1.0]>} {}

// -----

// #duck.partition: shares are positive.
// expected-error @+1 {{partition: every share must be positive}}
module attributes {duck.partition = #duck.partition<tp = 2, multiple_of = 64, strategy = experts, tp_max = 2, shares = [1.0, 0.0]>} {}

// -----

// duck.lm_head on the ducks: the row boundaries run from 0 to the vocab.
duck.model @head_rows_end attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{duck_rows must run from 0 to the vocab 512 in tp + 1 boundaries}}
  %m = duck.lm_head %x {weight = #duck.weight<"h", bf16, [512, 32]>, duck_rows = array<i64: 0, 256, 500>, duck_block = 32 : i64} : tensor<?x32xf32> -> tensor<?x512xf32>
  duck.return %m : tensor<?x512xf32>
}

// -----

// duck.lm_head on the ducks: every duck gets rows.
duck.model @head_rows_empty attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{duck_rows must increase: duck 1 gets no rows}}
  %m = duck.lm_head %x {weight = #duck.weight<"h", bf16, [512, 32]>, duck_rows = array<i64: 0, 256, 256, 512>, duck_block = 32 : i64} : tensor<?x32xf32> -> tensor<?x512xf32>
  duck.return %m : tensor<?x512xf32>
}

// -----

// duck.lm_head on the ducks: a block that divides the hidden size.
duck.model @head_block attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{duck_block must be 32, 64 or 128 and divide the hidden size 32}}
  %m = duck.lm_head %x {weight = #duck.weight<"h", bf16, [512, 32]>, duck_rows = array<i64: 0, 512>, duck_block = 64 : i64} : tensor<?x32xf32> -> tensor<?x512xf32>
  duck.return %m : tensor<?x512xf32>
}

// -----

// duck.lm_head on the ducks: one offset a duck.
duck.model @head_offsets attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{duck_offsets needs 2 values, one a duck}}
  %m = duck.lm_head %x {weight = #duck.weight<"h", bf16, [512, 32]>, duck_rows = array<i64: 0, 256, 512>, duck_block = 32 : i64, duck_offsets = array<i64: 8192>} : tensor<?x32xf32> -> tensor<?x512xf32>
  duck.return %m : tensor<?x512xf32>
}

// -----

// duck.attention: an o_proj on the ducks runs its rows from 0 to o_proj's
// rows (the same rules as the LM head's).
duck.model @oproj_rows attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{duck_rows must run from 0 to the o_proj rows 32 in tp + 1 boundaries}}
  %m = duck.attention %x {layer = 0 : i64, kind = "gqa", num_heads = 4 : i64, num_kv_heads = 2 : i64, head_dim = 8 : i64, weights = {q_proj = #duck.weight<"q", bf16, [32, 32]>, k_proj = #duck.weight<"k", bf16, [16, 32]>, v_proj = #duck.weight<"v", bf16, [16, 32]>, o_proj = #duck.weight<"o", bf16, [32, 32]>}, duck_rows = array<i64: 0, 16, 40>, duck_block = 32 : i64} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// A layer is cut one way: mixed only describes a module's partition.
duck.model @mlp_mixed attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{a layer's strategy is intermediate or experts; mixed only describes a module's partition}}
  %m = duck.mlp %x {layer = 0 : i64, hidden = 32 : i64, inter = 64 : i64,
      gate = #duck.weight<"g", bf16, [64, 32]>, up = #duck.weight<"u", bf16, [64, 32]>, down = #duck.weight<"d", bf16, [32, 64]>,
      strategy = #duck.strategy<mixed>} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}

// -----

// A dense layer has no experts to place whole.
duck.model @mlp_experts attributes {family = "qwen3", config = {}} {
^bb0(%x: tensor<?x32xf32>):
  // expected-error @+1 {{a dense layer has no experts to place: its strategy is intermediate}}
  %m = duck.mlp %x {layer = 0 : i64, hidden = 32 : i64, inter = 64 : i64,
      gate = #duck.weight<"g", bf16, [64, 32]>, up = #duck.weight<"u", bf16, [64, 32]>, down = #duck.weight<"d", bf16, [32, 64]>,
      strategy = #duck.strategy<experts>} : tensor<?x32xf32>
  duck.return %m : tensor<?x32xf32>
}
