//===- ConfigJson.h - config.json and friends for a ModelSpec ---*- C++ -*-===//
//
// Renders the JSON files of a HF model directory: config.json with the field
// names and JSON types of the real configs in reference/models/,
// generation_config.json and model.safetensors.index.json (tokenizer.json
// and tokenizer_config.json: TokenizerJson.h). Output is
// deterministic: keys sorted, 2-space indent, floats as Python's json module
// writes them (1e-06, 1000000.0), as in the published files.
//
//===----------------------------------------------------------------------===//

#ifndef DUCK_MKMODEL_CONFIGJSON_H
#define DUCK_MKMODEL_CONFIGJSON_H

#include "ModelSpec.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace duck::mkmodel {

/// `value` the way Python's repr(float) spells it: shortest round-trip
/// digits, "1e-06", "0.02", "1000000.0", "1e+16".
std::string formatPythonFloat(double value);

/// config.json text (ends with a newline).
std::string renderConfigJson(const ModelSpec &spec);
/// generation_config.json text.
std::string renderGenerationConfig(const ModelSpec &spec);
/// model.safetensors.index.json text for (tensor name, file) pairs.
std::string
renderIndexJson(uint64_t total_size,
                llvm::ArrayRef<std::pair<std::string, std::string>> weight_map);

/// config.json's bos/eos ids, for every family: both <|endoftext|> of the
/// generated tokenizer.json (vocab - 3; see TokenizerJson.h).
int64_t bosTokenId(const ModelSpec &spec);
int64_t eosTokenId(const ModelSpec &spec);
/// generation_config.json's eos_token_id list: <|endoftext|>, <|im_end|>.
std::vector<int64_t> generationEosTokenIds(const ModelSpec &spec);

} // namespace duck::mkmodel

#endif // DUCK_MKMODEL_CONFIGJSON_H
