//===- DuckDialect.td - the duck dialect ---------------------*- tablegen -*-===//
// The duck dialect: a language model as imported from a checkpoint (graph
// level) and its FFN work split onto ducks as fp9 ops (partitioned level).
//===----------------------------------------------------------------------===//
#ifndef DUCK_DIALECT_TD
#define DUCK_DIALECT_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"

def Duck_Dialect : Dialect {
  let name = "duck";
  let cppNamespace = "::mlir::duck";
  let summary = "Models for a host plus a cluster of AVX2 ducks";
  let description = [{
    Graph-level ops mirror a Qwen3 / DeepSeek checkpoint: embedding,
    RMSNorm, attention, dense MLP, MoE, LM head. Weights are symbolic
    references to checkpoint tensors. The partitioning passes fill the
    FFN ops' `shards` region with `duck.fp9_ffn` ops, one per duck, that carry
    the slice, block size, kernels, modes and weight-buffer placement.
  }];
  let useDefaultAttributePrinterParser = 1;
}

class Duck_Op<string mnemonic, list<Trait> traits = []>
    : Op<Duck_Dialect, mnemonic, traits>;

class Duck_Attr<string name, string attrMnemonic, list<Trait> traits = []>
    : AttrDef<Duck_Dialect, name, traits> {
  let mnemonic = attrMnemonic;
}

#endif // DUCK_DIALECT_TD
