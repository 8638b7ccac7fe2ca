//===- Passes.td - duck dialect passes -----------------------*- tablegen -*-===//
#ifndef DUCK_PASSES_TD
#define DUCK_PASSES_TD

include "mlir/Pass/PassBase.td"

def DuckPartition : Pass<"duck-partition", "::mlir::ModuleOp"> {
  let summary = "Split every dense and MoE FFN over the ducks";
  let description = [{
    Tensor parallelism along the intermediate dimension (`strategy =
    intermediate`, the default): each of `tp` ducks gets a contiguous slice of
    the intermediate neurons, a whole number of `multiple_of` blocks (slices
    differ by at most one block when the blocks do not divide evenly), for
    every expert. `multiple_of` is down_proj's K-block (128, 64 or 32) and
    bounds the cluster: `tp_max = intermediate / multiple_of`. `auto` picks
    the largest block that admits `tp` for every layer.

    Refuses, naming the layer, the intermediate size, tp, multiple_of and the
    largest tp that would work, when `tp > tp_max`, and when the intermediate
    size is not a multiple of `multiple_of`.

    `strategy = experts` places whole experts: each duck holds a
    contiguous run of every MoE layer's E experts (E counts the shared
    experts, numbered after the routed ones), apportioned like blocks: equal
    shares give the first `E % tp` ducks one more (so the last duck, which
    holds the always-active shared experts, holds the fewest routed ones);
    `shares` give runs in proportion, at least one expert a duck. Refused
    when `tp > E`. Dense layers are still split along the intermediate
    dimension.

    Each MoE layer can be cut its own way: `strategy =
    intermediate,experts:3-30` splits every MoE layer but 3 to 30, which
    place whole experts (layers are the checkpoint's, 0-based; later items
    override earlier ones). The module's partition then says `mixed` and
    each layer's op its own strategy.

    ```mlir
    // before
    %1 = duck.mlp %0 {layer = 0, hidden = 64, inter = 256, ...} : tensor<?x64xf32>
    // after --duck-partition="tp=2 multiple-of=128"
    %1 = duck.mlp %0 {..., multiple_of = 128, strategy = #duck.strategy<intermediate>,
                      tp = 2, tp_max = 2} : tensor<?x64xf32> shards {
      duck.fp9_ffn {block = 128, expert_begin = 0, expert_end = 1,
                    inter_begin = 0, inter_end = 128, rank = 0}
      duck.fp9_ffn {block = 128, expert_begin = 0, expert_end = 1,
                    inter_begin = 128, inter_end = 256, rank = 1}
    }
    ```
  }];
  let options = [
    Option<"tp", "tp", "int64_t", /*default=*/"1", "number of ducks">,
    Option<"multipleOf", "multiple-of", "std::string", /*default=*/"\"auto\"",
           "down_proj K-block: 128, 64, 32 or auto">,
    Option<"strategy", "strategy", "std::string", /*default=*/"\"intermediate\"",
           "intermediate (tensor parallel), experts (expert placement), or "
           "per MoE layer: a list of STRATEGY and STRATEGY:FIRST-LAST items, "
           "later ones overriding (intermediate,experts:3-30)">,
    ListOption<"shares", "shares", "double",
           "relative speed of each duck (tp values): an intermediate split "
           "gives each duck whole blocks in proportion, expert placement "
           "whole experts (at least one each), so unequal ducks finish "
           "together; default: equal">,
    Option<"lmHead", "lm-head", "std::string", /*default=*/"\"host\"",
           "host, or ducks: the LM head's vocabulary rows split over the "
           "ducks in whole scale tiles (in proportion to the shares)">,
    Option<"oProj", "o-proj", "std::string", /*default=*/"\"host\"",
           "host, or ducks: every attention's output projection rows split "
           "over the ducks in whole scale tiles (in proportion to the "
           "shares)">,
    Option<"qProj", "q-proj", "std::string", /*default=*/"\"host\"",
           "host, or ducks: every attention's query projection (MLA's "
           "q_b_proj, or q_proj) rows split over the ducks likewise">,
    Option<"inProj", "in-proj", "std::string", /*default=*/"\"host\"",
           "host, or ducks: every attention's input projections (q/k/v_proj; "
           "MLA's q_a_proj or q_proj, kv_a_proj_with_mqa and the indexer's "
           "wk) as one group of rows over the ducks, one "
           "step a layer">,
    Option<"mlaAbsorb", "mla-absorb", "std::string", /*default=*/"\"host\"",
           "host, or ducks: an MLA whose query and output projections are "
           "on the ducks runs kv_b_proj there too, whole heads a duck "
           "(absorb_heads)">,
  ];
  let dependentDialects = ["::mlir::duck::DuckDialect"];
}

def DuckSelectKernels : Pass<"duck-select-kernels", "::mlir::ModuleOp"> {
  let summary = "Choose the fp9 GEMV kernel of every weight shard by shape";
  let description = [{
    Per `duck.fp9_ffn`, for gate and up (K = hidden) and down (K = local
    intermediate size): K == 32 with block 32 -> `exact32`; K == 64 with
    block 64 -> `exact64`; K == 128 with block 128 -> `exact128`; otherwise
    `general<block>`. The decision is an
    attribute with its reason, made once here and never inside a kernel loop.
    A module without shards (not partitioned yet) is left unchanged; a shard
    whose hidden size is not a multiple of its block is refused.

    ```mlir
    duck.fp9_ffn {block = 64, ..., down_kernel = #duck.kernel<exact64, "K == 64 == block: one block a row, four rows a tile">}
    ```
  }];
  let dependentDialects = ["::mlir::duck::DuckDialect"];
}

def DuckAssignModes : Pass<"duck-assign-modes", "::mlir::ModuleOp"> {
  let summary = "Assign the duck ELF's decode and prefill modes to each shard";
  let description = [{
    Dense shards: decode mode 0, prefill mode 5. MoE shards: decode mode 4
    (SMP) when a duck has more than one core, else mode 1; prefill mode 6.
    `smp` records that the duck runs the shard on all its cores (dense modes
    0 and 5 split rows over the cores too).
  }];
  let options = [
    Option<"coresPerDuck", "cores-per-duck", "int64_t", /*default=*/"1",
           "cores of each duck">,
  ];
  let dependentDialects = ["::mlir::duck::DuckDialect"];
}

def DuckLayoutWeights : Pass<"duck-layout-weights", "::mlir::ModuleOp"> {
  let summary = "Place every shard in its duck's weight buffer";
  let description = [{
    Per duck: one slot per FFN layer in layer order, each 4096-byte aligned,
    holding the slot header, one descriptor per expert and the packed fp9
    matrices (64-byte aligned planes, sizes from duck_fp9_compute_layout).
    Sets `slot`, `offset` and `bytes` on each `duck.fp9_ffn`, and on the
    module `duck.slot_count`, `duck.image_bytes` (per rank) and
    `duck.model_key` (per rank: a stable hash of the model identity, every
    shape and dtype, tp, rank, block and the format versions).
    Refuses shards without kernels.
  }];
  let options = [
    Option<"modelId", "model-id", "std::string", /*default=*/"\"\"",
           "identity of the checkpoint (hash of its config and headers)">,
  ];
  let dependentDialects = ["::mlir::duck::DuckDialect"];
}

def DuckStats : Pass<"duck-stats", "::mlir::ModuleOp"> {
  let summary = "Report per-duck bytes, traffic and an estimated decode speed";
  let description = [{
    Prints, for a laid-out module: bytes per duck, total prepare traffic,
    fp9 parameters touched per decoded token per duck, and an estimated
    decode tok/s from `bandwidth-gbs` (a duck's streaming bandwidth) and
    `step-overhead-us` (dispatch cost per FFN step). Text, or JSON with
    `json=true`. Does not change the IR.
  }];
  let options = [
    Option<"bandwidthGbs", "bandwidth-gbs", "double", /*default=*/"10.0",
           "memory bandwidth of one duck, GB/s">,
    Option<"stepOverheadUs", "step-overhead-us", "double", /*default=*/"80.0",
           "host<->duck overhead per FFN step, microseconds">,
    Option<"json", "json", "bool", /*default=*/"false", "print JSON">,
  ];
}

#endif // DUCK_PASSES_TD
