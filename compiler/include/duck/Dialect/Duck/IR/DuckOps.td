//===- DuckOps.td - duck dialect operations ------------------*- tablegen -*-===//
#ifndef DUCK_OPS_TD
#define DUCK_OPS_TD

include "duck/Dialect/Duck/IR/DuckAttrs.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/RegionKindInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"

def Duck_Activation : RankedTensorOf<[F32]>;
def Duck_Tokens : RankedTensorOf<[I32]>;

//===----------------------------------------------------------------------===//
// Graph level
//===----------------------------------------------------------------------===//

def Duck_ModelOp : Duck_Op<"model", [Symbol, IsolatedFromAbove,
    SingleBlockImplicitTerminator<"ReturnOp">]> {
  let summary = "a whole language model";
  let description = [{
    Holds the model's forward pass for a batch of tokens, in order. `family`
    is the HF model_type; `config` keeps the typed model description the
    plan needs (sizes, eps, rope, router settings).

    ```mlir
    duck.model @tiny attributes {family = "qwen3", config = {...}} {
    ^bb0(%tokens: tensor<?xi32>):
      ...
      duck.return %logits : tensor<?x512xf32>
    }
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, StrAttr:$family,
                       DictionaryAttr:$config);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "$sym_name attr-dict-with-keyword $body";
  let hasVerifier = 1;
}

def Duck_ReturnOp : Duck_Op<"return", [Pure, Terminator, HasParent<"ModelOp">]> {
  let summary = "the model's outputs";
  let arguments = (ins Variadic<AnyType>:$operands);
  let builders = [OpBuilder<(ins), [{ build($_builder, $_state, {}); }]>];
  let assemblyFormat = "attr-dict ($operands^ `:` type($operands))?";
}

def Duck_EmbeddingOp : Duck_Op<"embedding", [Pure]> {
  let summary = "token embedding lookup (host)";
  let arguments = (ins Duck_Tokens:$tokens, Duck_WeightAttr:$weight);
  let results = (outs Duck_Activation:$result);
  let assemblyFormat = "$tokens attr-dict `:` type($tokens) `->` type($result)";
  let hasVerifier = 1;
}

def Duck_RmsNormOp : Duck_Op<"rms_norm", [Pure, SameOperandsAndResultType]> {
  let summary = "RMSNorm over the hidden dimension (host)";
  let arguments = (ins Duck_Activation:$input, Duck_WeightAttr:$weight,
                       F64Attr:$eps);
  let results = (outs Duck_Activation:$result);
  let assemblyFormat = "$input attr-dict `:` type($input)";
  let hasVerifier = 1;
}

def Duck_AttentionOp : Duck_Op<"attention", [Pure, SameOperandsAndResultType]> {
  let summary = "self-attention of one layer (host)";
  let description = [{
    `kind = "gqa"`: Qwen3 grouped-query attention with per-head q/k RMSNorm
    and NeoX RoPE. `kind = "mla"`: DeepSeek multi-head latent attention;
    DeepSeek-V3.2's lightning indexer is described by `indexer`. `weights`
    maps a role (q_proj, k_norm, kv_b_proj, ...) to its checkpoint tensor.

    The output projection (`o_proj`, [hidden, heads x v_head_dim]) runs on
    the host unless `duck-partition` (o-proj=ducks) splits its rows over
    the ducks, as it does the LM head's: `duck_rows` (tp + 1 boundaries,
    whole scale tiles), `duck_block` (K-block), then `duck-layout-weights`
    adds `duck_slot` (the same on every duck), `duck_offsets`, `duck_bytes`.
    The `q_duck_*` attributes do the same for the query projection
    (q-proj=ducks): MLA's q_b_proj, or q_proj. The `in_duck_*` attributes
    (in-proj=ducks) do it for the projections of the attention's input,
    whose rows one duck step computes together (`getInProjs`): GQA's
    q_proj, k_proj, v_proj; MLA's q_a_proj (or q_proj), kv_a_proj_with_mqa
    and, for DeepSeek-V3.2, the indexer's wk. With an
    indexer the query group (`getQProjs`) then also holds its wq_b.
  }];
  let arguments = (ins Duck_Activation:$input, I64Attr:$layer, StrAttr:$kind,
                       I64Attr:$num_heads, I64Attr:$num_kv_heads,
                       I64Attr:$head_dim, DictionaryAttr:$weights,
                       OptionalAttr<DictionaryAttr>:$indexer,
                       OptionalAttr<DenseI64ArrayAttr>:$duck_rows,
                       OptionalAttr<I64Attr>:$duck_block,
                       OptionalAttr<I64Attr>:$duck_slot,
                       OptionalAttr<DenseI64ArrayAttr>:$duck_offsets,
                       OptionalAttr<DenseI64ArrayAttr>:$duck_bytes,
                       OptionalAttr<DenseI64ArrayAttr>:$q_duck_rows,
                       OptionalAttr<I64Attr>:$q_duck_block,
                       OptionalAttr<I64Attr>:$q_duck_slot,
                       OptionalAttr<DenseI64ArrayAttr>:$q_duck_offsets,
                       OptionalAttr<DenseI64ArrayAttr>:$q_duck_bytes,
                       OptionalAttr<DenseI64ArrayAttr>:$in_duck_rows,
                       OptionalAttr<I64Attr>:$in_duck_block,
                       OptionalAttr<I64Attr>:$in_duck_slot,
                       OptionalAttr<DenseI64ArrayAttr>:$in_duck_offsets,
                       OptionalAttr<DenseI64ArrayAttr>:$in_duck_bytes,
                       OptionalAttr<DenseI64ArrayAttr>:$absorb_heads,
                       OptionalAttr<DenseI64ArrayAttr>:$absorb_index_rows);
  let results = (outs Duck_Activation:$result);
  let assemblyFormat = "$input attr-dict `:` type($input)";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// mla-absorb=ducks (an MLA with its query and output projections on
    /// the ducks): kv_b_proj runs there too, duck r holding whole heads
    /// [absorb_heads[r], absorb_heads[r+1]): its query slot is its heads'
    /// q_b_proj rows, its share of the indexer's wq_b rows
    /// (absorb_index_rows, when the query group holds wq_b) and W_UK^T of
    /// each of its heads (chained on their q_nope rows); its output slot
    /// W_UV of each of its heads (on their latent outputs) chained into
    /// its heads' o_proj columns, answering partial sums.
    struct MlaDims {
      int64_t heads = 0, kvLora = 0, nope = 0, rope = 0, v = 0;
      int64_t qk() const { return nope + rope; }
    };
    /// An MLA's head widths from its weights (all zero for GQA or an MLA
    /// without kv_b_proj / kv_a_proj_with_mqa).
    MlaDims getMlaDims() {
      MlaDims d;
      auto kvb = getWeights().getAs<WeightAttr>("kv_b_proj");
      auto kva = getWeights().getAs<WeightAttr>("kv_a_proj_with_mqa");
      if (getKind() != "mla" || !kvb || !kva || getNumHeads() <= 0 ||
          kvb.getShape()[0] % getNumHeads())
        return d;
      d.heads = getNumHeads();
      d.kvLora = kvb.getShape()[1];
      d.rope = kva.getShape()[0] - d.kvLora;
      d.nope = getHeadDim() - d.rope;
      d.v = kvb.getShape()[0] / d.heads - d.nope;
      if (d.nope <= 0 || d.v <= 0 || d.rope < 0)
        return MlaDims{};
      return d;
    }
    /// The o_proj weight (every attention kind has one).
    WeightAttr getOProj() {
      return ::llvm::cast<WeightAttr>(getWeights().get("o_proj"));
    }
    /// The query projection whose rows q-proj=ducks splits: MLA's q_b_proj
    /// (after its LoRA) or q_proj (GQA, or MLA without a query LoRA).
    WeightAttr getQProj() {
      if (auto w = getWeights().getAs<WeightAttr>("q_b_proj"))
        return w;
      return getWeights().getAs<WeightAttr>("q_proj");
    }
    /// The weights whose rows in-proj=ducks splits as one group (rows
    /// concatenated in this order, one duck step): every projection of the
    /// attention's input.
    ::llvm::SmallVector<WeightAttr, 4> getInProjs() {
      ::llvm::SmallVector<WeightAttr, 4> out;
      auto add = [&](::mlir::DictionaryAttr d, ::llvm::StringRef role) {
        if (d)
          if (auto w = d.getAs<WeightAttr>(role))
            out.push_back(w);
      };
      if (getKind() == "gqa") {
        for (const char *r : {"q_proj", "k_proj", "v_proj"})
          add(getWeights(), r);
        return out;
      }
      add(getWeights(), "q_a_proj");
      add(getWeights(), "q_proj");
      add(getWeights(), "kv_a_proj_with_mqa");
      // The indexer's wk; its weights_proj stays on the host (bf16 in the
      // checkpoint, kept exact for the selection).
      add(getIndexerAttr(), "wk");
      return out;
    }
    /// The query group (q-proj=ducks): the query projection, and with the
    /// input projections on the ducks the indexer's wq_b (same input).
    ::llvm::SmallVector<WeightAttr, 4> getQProjs() {
      ::llvm::SmallVector<WeightAttr, 4> out{getQProj()};
      if (getInDuckRows() && getIndexerAttr())
        if (auto w = getIndexerAttr().getAs<WeightAttr>("wq_b"))
          out.push_back(w);
      return out;
    }
  }];
}

def Duck_AddOp : Duck_Op<"add", [Pure, SameOperandsAndResultType, Commutative]> {
  let summary = "residual add (host)";
  let arguments = (ins Duck_Activation:$lhs, Duck_Activation:$rhs);
  let results = (outs Duck_Activation:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($result)";
}

class Duck_FfnOp<string mnemonic> : Duck_Op<mnemonic, [Pure,
    SameOperandsAndResultType, NoTerminator,
    DeclareOpInterfaceMethods<RegionKindInterface>]> {
  let results = (outs Duck_Activation:$result);
  let regions = (region AnyRegion:$shards);
  let assemblyFormat = [{
    $input attr-dict `:` type($input) (`shards` $shards^)?
  }];
  let hasVerifier = 1;
}

def Duck_MlpOp : Duck_FfnOp<"mlp"> {
  let summary = "dense FFN: down(silu(gate x) * up x)";
  let description = [{
    Runs on the ducks once partitioned: `duck-partition` sets `tp`,
    `multiple_of`, `tp_max` and `strategy` and fills `shards` with one
    `duck.fp9_ffn` per duck.
  }];
  let arguments = (ins Duck_Activation:$input, I64Attr:$layer,
                       I64Attr:$hidden, I64Attr:$inter,
                       Duck_WeightAttr:$gate, Duck_WeightAttr:$up,
                       Duck_WeightAttr:$down,
                       OptionalAttr<I64Attr>:$tp, OptionalAttr<I64Attr>:$multiple_of,
                       OptionalAttr<I64Attr>:$tp_max,
                       OptionalAttr<Duck_StrategyAttr>:$strategy);
}

def Duck_MoeOp : Duck_FfnOp<"moe"> {
  let summary = "mixture of experts FFN with its router";
  let description = [{
    Router `softmax` (Qwen3-MoE: softmax over all experts, top-k, optional
    renormalisation) or `sigmoid` (DeepSeek: sigmoid scores plus correction
    bias for selection, group-limited top-k, renormalised and scaled). The
    router runs on the host; the experts run on the ducks. Shared experts
    (DeepSeek) are `num_shared` extra always-active experts.
  }];
  let arguments = (ins Duck_Activation:$input, I64Attr:$layer,
                       I64Attr:$hidden, I64Attr:$inter, I64Attr:$num_experts,
                       I64Attr:$top_k, Duck_RouterKindAttr:$router,
                       BoolAttr:$norm_topk_prob, Duck_WeightAttr:$router_weight,
                       OptionalAttr<Duck_WeightAttr>:$correction_bias,
                       OptionalAttr<I64Attr>:$n_group,
                       OptionalAttr<I64Attr>:$topk_group,
                       OptionalAttr<F64Attr>:$routed_scaling_factor,
                       Duck_ExpertWeightsAttr:$gate, Duck_ExpertWeightsAttr:$up,
                       Duck_ExpertWeightsAttr:$down,
                       DefaultValuedAttr<I64Attr, "0">:$num_shared,
                       OptionalAttr<Duck_WeightAttr>:$shared_gate,
                       OptionalAttr<Duck_WeightAttr>:$shared_up,
                       OptionalAttr<Duck_WeightAttr>:$shared_down,
                       OptionalAttr<I64Attr>:$tp, OptionalAttr<I64Attr>:$multiple_of,
                       OptionalAttr<I64Attr>:$tp_max,
                       OptionalAttr<Duck_StrategyAttr>:$strategy);
  let extraClassDeclaration = [{
    /// Routed plus shared experts (the expert ids a duck slot holds).
    int64_t getTotalExperts() { return getNumExperts() + getNumShared(); }
  }];
}

def Duck_LmHeadOp : Duck_Op<"lm_head", [Pure]> {
  let summary = "final projection to vocabulary logits (host or ducks)";
  let description = [{
    On the host unless `duck-partition` (lm-head=ducks) splits its rows
    over the ducks: `duck_rows` holds the tp + 1 row boundaries (whole
    scale tiles, rank order), `duck_block` the K-block; `duck-layout-weights`
    adds the head slot's index (`duck_slot`, the same on every duck) and
    each duck's `duck_offsets` / `duck_bytes`.
  }];
  let arguments = (ins Duck_Activation:$input, Duck_WeightAttr:$weight,
                       OptionalAttr<DenseI64ArrayAttr>:$duck_rows,
                       OptionalAttr<I64Attr>:$duck_block,
                       OptionalAttr<I64Attr>:$duck_slot,
                       OptionalAttr<DenseI64ArrayAttr>:$duck_offsets,
                       OptionalAttr<DenseI64ArrayAttr>:$duck_bytes);
  let results = (outs Duck_Activation:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Duck_MtpInputOp : Duck_Op<"mtp_input", [Pure]> {
  let summary = "DeepSeek MTP module input: eh_proj([enorm(e) | hnorm(h)])";
  let description = [{
    The first op of DeepSeek's multi-token-prediction module (docs/mtp.md),
    on the host: `embedded` is the embedding of the token after each row's
    position, `hidden` the main model's final hidden state (after its norm)
    at that position; both are RMS-normalised (`enorm`, `hnorm`) and
    concatenated, embedding first, then projected by `eh_proj` ([hidden,
    2 * hidden]). `layer` is the module's layer index (the model's layer
    count): the decoder layer that follows carries it too.
  }];
  let arguments = (ins Duck_Activation:$embedded, Duck_Activation:$hidden,
                       I64Attr:$layer, Duck_WeightAttr:$enorm,
                       Duck_WeightAttr:$hnorm, Duck_WeightAttr:$eh_proj,
                       F64Attr:$eps);
  let results = (outs Duck_Activation:$result);
  let assemblyFormat = [{
    $embedded `,` $hidden attr-dict `:` type($embedded) `,` type($hidden)
    `->` type($result)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Partitioned level
//===----------------------------------------------------------------------===//

def Duck_Fp9FfnOp : Duck_Op<"fp9_ffn", [HasParent<"MlpOp, MoeOp">]> {
  let summary = "one duck's share of an FFN, in fp9";
  let description = [{
    Rows `[inter_begin, inter_end)` of gate/up and the same columns of down,
    for experts `[expert_begin, expert_end)` (a dense MLP has one expert),
    packed with K-block `block`. Later passes add the kernel of each weight
    (`duck-select-kernels`), the modes (`duck-assign-modes`) and the weight
    buffer slot/offset/bytes (`duck-layout-weights`).

    ```mlir
    duck.fp9_ffn {rank = 1, inter_begin = 64, inter_end = 128, expert_begin = 0,
                  expert_end = 257, block = 64}
    ```
  }];
  let arguments = (ins I64Attr:$rank, I64Attr:$inter_begin, I64Attr:$inter_end,
                       I64Attr:$expert_begin, I64Attr:$expert_end,
                       I64Attr:$block,
                       OptionalAttr<Duck_KernelAttr>:$gate_kernel,
                       OptionalAttr<Duck_KernelAttr>:$up_kernel,
                       OptionalAttr<Duck_KernelAttr>:$down_kernel,
                       OptionalAttr<I32Attr>:$decode_mode,
                       OptionalAttr<I32Attr>:$prefill_mode,
                       OptionalAttr<BoolAttr>:$smp,
                       OptionalAttr<I64Attr>:$slot,
                       OptionalAttr<I64Attr>:$offset,
                       OptionalAttr<I64Attr>:$bytes);
  let assemblyFormat = "attr-dict";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    int64_t getLocalInter() { return getInterEnd() - getInterBegin(); }
    int64_t getLocalExperts() { return getExpertEnd() - getExpertBegin(); }
  }];
}

#endif // DUCK_OPS_TD
