//===- DuckAttrs.td - duck dialect attributes ----------------*- tablegen -*-===//
#ifndef DUCK_ATTRS_TD
#define DUCK_ATTRS_TD

include "duck/Dialect/Duck/IR/DuckDialect.td"
include "mlir/IR/EnumAttr.td"
include "mlir/IR/BuiltinAttributeInterfaces.td"

// Values match duck_kernel_id in duck-rt/include/duck_rt/kernels.h.
def Duck_KernelKind : I32EnumAttr<"KernelKind", "fp9 GEMV kernel variant", [
    I32EnumAttrCase<"general128", 0>, I32EnumAttrCase<"general64", 1>,
    I32EnumAttrCase<"general32", 2>, I32EnumAttrCase<"exact64", 3>,
    I32EnumAttrCase<"exact128", 4>, I32EnumAttrCase<"exact32", 5>]> {
  let cppNamespace = "::mlir::duck";
  let genSpecializedAttr = 0;
}
def Duck_KernelKindAttr : EnumAttr<Duck_Dialect, Duck_KernelKind, "kernel_kind"> {
  let assemblyFormat = "`<` $value `>`";
}

def Duck_RouterKind : I32EnumAttr<"RouterKind", "MoE router", [
    I32EnumAttrCase<"softmax", 0>, I32EnumAttrCase<"sigmoid", 1>]> {
  let cppNamespace = "::mlir::duck";
  let genSpecializedAttr = 0;
}
def Duck_RouterKindAttr : EnumAttr<Duck_Dialect, Duck_RouterKind, "router_kind"> {
  let assemblyFormat = "`<` $value `>`";
}

def Duck_Strategy : I32EnumAttr<"Strategy", "how FFN work is split over ducks", [
    I32EnumAttrCase<"intermediate", 0>, I32EnumAttrCase<"experts", 1>,
    I32EnumAttrCase<"mixed", 2>]> {
  let cppNamespace = "::mlir::duck";
  let genSpecializedAttr = 0;
}
def Duck_StrategyAttr : EnumAttr<Duck_Dialect, Duck_Strategy, "strategy"> {
  let assemblyFormat = "`<` $value `>`";
}

def Duck_WeightAttr : Duck_Attr<"Weight", "weight"> {
  let summary = "a checkpoint tensor, by reference";
  let description = [{
    `#duck.weight<"model.layers.0.mlp.gate_proj.weight", bf16, [3072, 1024],
    file = "model.safetensors">`. FP8 weights name their block-scale tensor:
    `scale = "...weight_scale_inv"`. Never holds data.
  }];
  let parameters = (ins
    StringRefParameter<"tensor name">:$name,
    "::mlir::Type":$dtype,
    ArrayRefParameter<"int64_t", "shape">:$shape,
    OptionalParameter<"::mlir::StringAttr", "safetensors file">:$file,
    OptionalParameter<"::mlir::StringAttr", "block-scale tensor">:$scale
  );
  // One optional group for both: with two groups that each start with `,`
  // the parser commits to `file` at the comma and rejects a lone `scale`.
  let assemblyFormat = [{
    `<` $name `,` $dtype `,` `[` $shape `]` (`,` struct($file, $scale)^)? `>`
  }];
  let genVerifyDecl = 1;
}

def Duck_ExpertWeightsAttr : Duck_Attr<"ExpertWeights", "experts"> {
  let summary = "one weight of every expert of a MoE layer, by name pattern";
  let description = [{
    `#duck.experts<"model.layers.3.mlp.experts.{e}.down_proj.weight", bf16,
    [2048, 768], count = 128>`: tensor `{e}` = 0..count-1, all of one dtype
    and shape. FP8 experts name their scale pattern with `scale = "..."`.
  }];
  let parameters = (ins
    StringRefParameter<"name pattern with {e}">:$pattern,
    "::mlir::Type":$dtype,
    ArrayRefParameter<"int64_t", "shape">:$shape,
    "int64_t":$count,
    OptionalParameter<"::mlir::StringAttr", "scale name pattern">:$scale
  );
  let assemblyFormat = [{
    `<` $pattern `,` $dtype `,` `[` $shape `]` `,` `count` `=` $count
    (`,` `scale` `=` $scale^)? `>`
  }];
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// The tensor name of expert `e`.
    std::string nameOf(int64_t e) const;
    std::string scaleNameOf(int64_t e) const;
  }];
}

def Duck_KernelAttr : Duck_Attr<"Kernel", "kernel"> {
  let summary = "a selected fp9 kernel and why";
  let parameters = (ins
    EnumParameter<Duck_KernelKind>:$kind,
    StringRefParameter<"reason">:$reason
  );
  let assemblyFormat = "`<` $kind `,` $reason `>`";
}

def Duck_PartitionAttr : Duck_Attr<"Partition", "partition"> {
  let summary = "how the module's FFN work is cut over the ducks";
  let description = [{
    `#duck.partition<tp = 4, multiple_of = 64, strategy = intermediate,
    tp_max = 12>`, with `shares = array<f64: ...>` (one positive value a
    duck) when the ducks are unequal. Set once on the module by
    `duck-partition` as `duck.partition`; every later pass and the plan
    writer read tp, multiple_of and the strategy from it. `strategy` is the
    one the plan records: experts when every MoE layer is placed by whole
    experts (dense layers are always split by intermediate), mixed when
    some MoE layers are and others are split (each layer's own `strategy`
    says which; `mixed` is never a layer's); `tp_max` is the smallest
    tp_max over the layers.
  }];
  let parameters = (ins
    "int64_t":$tp,
    "int64_t":$multiple_of,
    EnumParameter<Duck_Strategy>:$strategy,
    "int64_t":$tp_max,
    OptionalParameter<"::mlir::DenseF64ArrayAttr", "per-duck shares">:$shares
  );
  let assemblyFormat = [{
    `<` `tp` `=` $tp `,` `multiple_of` `=` $multiple_of `,` `strategy` `=`
    $strategy `,` `tp_max` `=` $tp_max (`,` `shares` `=` $shares^)? `>`
  }];
  let genVerifyDecl = 1;
}

#endif // DUCK_ATTRS_TD
