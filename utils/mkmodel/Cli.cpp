//===- Cli.cpp - duck-mkmodel command line --------------------------------===//

#include "Cli.h"
#include "duck_rt/wrap_text.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"

#include <optional>

using llvm::Error;
using llvm::StringRef;

namespace duck::mkmodel {

static Error makeError(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

static std::string familyList(unsigned mask) {
  std::vector<std::string> names;
  for (Family f : {Family::Qwen3, Family::Qwen3Moe, Family::DeepseekV3,
                   Family::DeepseekV32})
    if (mask & familyBit(f))
      names.push_back(familyName(f).str());
  return llvm::join(names, ", ");
}

static std::string presetList() {
  std::vector<std::string> names;
  for (const PresetInfo &p : presets())
    names.push_back(p.name);
  return llvm::join(names, ", ");
}

/// A family may replace the preset's only within the same tensor layout
/// (DeepSeek-V3 <-> V3.2 differ by the indexer alone).
static bool familyFitsPreset(Family preset_family, Family family) {
  if (preset_family == family)
    return true;
  unsigned both = familyBit(preset_family) | familyBit(family);
  return (both & kDeepseekFamilies) == both;
}

llvm::Expected<CliRequest> parseCommandLine(llvm::ArrayRef<std::string> args) {
  CliRequest request;
  for (const std::string &arg : args)
    if (arg == "-h" || arg == "--help" || arg == "-help") {
      request.help = true;
      return request;
    }

  std::optional<std::string> preset, family, dtype, seed, shards, out;
  std::optional<bool> tie;
  std::vector<std::pair<const ShapeOption *, std::string>> shape_values;
  WriteOptions &write = request.write;

  for (size_t i = 0; i < args.size(); ++i) {
    StringRef arg = args[i];
    auto takeValue = [&](StringRef spelled,
                         std::optional<StringRef> inline_value)
        -> llvm::Expected<std::string> {
      if (inline_value)
        return inline_value->str();
      if (i + 1 >= args.size())
        return makeError(spelled + " needs a value");
      return args[++i];
    };
    if (arg == "-o" || (arg.starts_with("-o") && !arg.starts_with("--"))) {
      std::optional<StringRef> inline_value;
      if (arg.size() > 2)
        inline_value = arg.drop_front(2);
      auto value = takeValue("-o", inline_value);
      if (!value)
        return value.takeError();
      out = *value;
      continue;
    }
    if (arg == "-q") {
      write.quiet = true;
      continue;
    }
    if (!arg.starts_with("--") || arg == "--")
      return makeError("unexpected argument '" + arg + "' (see --help)");

    StringRef body = arg.drop_front(2);
    auto [name, value_text] = body.split('=');
    std::optional<StringRef> inline_value;
    if (body.contains('='))
      inline_value = value_text;
    std::string spelled = ("--" + name).str();

    if (name == "force" || name == "quiet" || name == "progress" ||
        name == "no-tie-embeddings") {
      if (inline_value)
        return makeError(spelled + " takes no value");
      if (name == "force")
        write.force = true;
      else if (name == "quiet")
        write.quiet = true;
      else if (name == "progress")
        write.progress = true;
      else
        tie = false;
      continue;
    }
    if (name == "tie-embeddings") {
      if (!inline_value) {
        tie = true;
      } else if (*inline_value == "true" || *inline_value == "1") {
        tie = true;
      } else if (*inline_value == "false" || *inline_value == "0") {
        tie = false;
      } else {
        return makeError("--tie-embeddings takes true or false, got '" +
                         *inline_value + "'");
      }
      continue;
    }

    std::optional<std::string> *slot = nullptr;
    if (name == "output")
      slot = &out;
    else if (name == "preset")
      slot = &preset;
    else if (name == "family")
      slot = &family;
    else if (name == "dtype")
      slot = &dtype;
    else if (name == "seed")
      slot = &seed;
    else if (name == "shards")
      slot = &shards;
    const ShapeOption *shape = slot ? nullptr : findShapeOption(name);
    if (!slot && !shape)
      return makeError("unknown option '" + spelled + "' (see --help)");
    auto value = takeValue(spelled, inline_value);
    if (!value)
      return value.takeError();
    if (slot)
      *slot = *value;
    else
      shape_values.emplace_back(shape, *value);
  }

  // The base spec: a preset, or the tiny preset of a family.
  ModelSpec &spec = request.spec;
  std::optional<Family> chosen_family;
  if (family) {
    chosen_family = parseFamily(*family);
    if (!chosen_family)
      return makeError("--family must be one of " + familyList(kAllFamilies) +
                       ", got '" + *family + "'");
  }
  if (preset) {
    const PresetInfo *info = findPreset(*preset);
    if (!info)
      return makeError("unknown --preset '" + *preset + "' (expected one of " +
                       presetList() + ")");
    spec = info->make();
    if (chosen_family) {
      if (!familyFitsPreset(spec.family, *chosen_family))
        return makeError("--family " + *family + " does not fit --preset " +
                         *preset + ", which is a " + familyName(spec.family) +
                         " model");
      spec.family = *chosen_family;
    }
  } else if (chosen_family) {
    spec = tinyPresetFor(*chosen_family);
  } else {
    return makeError("one of --preset or --family is required (see --help)");
  }

  if (dtype) {
    std::optional<WeightFormat> format = parseFormat(*dtype);
    if (!format)
      return makeError("--dtype must be bf16 or fp8, got '" + *dtype + "'");
    spec.format = *format;
  }
  if (seed && StringRef(*seed).getAsInteger(0, spec.seed))
    return makeError("--seed expects an unsigned 64-bit integer, got '" +
                     *seed + "'");
  if (shards) {
    if (StringRef(*shards).getAsInteger(10, write.shards) || write.shards < 1)
      return makeError("--shards expects a positive integer, got '" + *shards +
                       "'");
  }
  for (const auto &[option, text] : shape_values) {
    if (!(option->families & familyBit(spec.family)))
      return makeError(llvm::formatv(
          "--{0} does not apply to family {1} (only to {2})", option->name,
          familyName(spec.family), familyList(option->families)));
    int64_t value;
    if (StringRef(text).getAsInteger(10, value))
      return makeError(llvm::formatv("--{0} expects an integer, got '{1}'",
                                     option->name, text));
    spec.*option->field = value;
  }
  if (tie)
    spec.tie_embeddings = *tie;
  if (Error e = validateSpec(spec))
    return e;
  if (!out || out->empty())
    return makeError("an output directory is required: -o DIR");
  write.out_dir = *out;
  return request;
}

/// `text` wrapped at 79 columns, every line after the first indented to
/// `column`; the first continues from `col`, where the caller left it.
static void printWrapped(llvm::raw_ostream &os, StringRef text, size_t column,
                         size_t col) {
  os << duck::WrapWords(std::string_view(text.data(), text.size()), 79, col,
                        column)
     << "\n";
}

/// One option of --help: `left` then `text` from column 24 (the general
/// options' column), wrapped; a `left` that reaches column 23 puts the
/// text on the next line.
static void printOption(llvm::raw_ostream &os, const std::string &left,
                        StringRef text) {
  constexpr size_t kColumn = 24;
  os << left;
  size_t col = left.size();
  if (col + 1 >= kColumn) {
    os << "\n";
    col = 0;
  }
  os.indent(kColumn - col);
  printWrapped(os, text, kColumn, kColumn);
}

void printHelp(llvm::raw_ostream &os) {
  os << R"(OVERVIEW: duck-mkmodel - synthetic HF checkpoints for Duck

USAGE: duck-mkmodel (--preset NAME | --family NAME) [options] -o DIR

Writes DIR/config.json, DIR/generation_config.json, DIR/tokenizer.json,
DIR/tokenizer_config.json and the weights as safetensors
(DIR/model.safetensors, or with --shards N the files
model-0000i-of-0000N.safetensors plus model.safetensors.index.json). Tensor
names, shapes and dtypes follow the real checkpoints of the family. Every
value is a pure function of --seed and the tensor name: the same arguments
give byte-identical files. Weights are generated and written in bands, so
multi-GiB models need little memory. DIR appears atomically (written as
DIR.tmp-<pid>, then renamed).

GENERAL OPTIONS:
  -o, --output DIR      output directory (required); must not exist
  --force               replace DIR if it exists
  --preset NAME         start from a preset (below); options override it
  --family NAME         qwen3 | qwen3_moe | deepseek_v3 | deepseek_v32; alone
                        it selects that family's tiny preset; with a
                        DeepSeek preset it picks V3 or V3.2
  --dtype bf16|fp8      bf16: every tensor BF16 (default). fp8: every Linear
                        except lm_head, the MoE router and the V3.2 indexer
                        weights_proj is F8_E4M3 with a F32 <name>_scale_inv
                        of [ceil(N/128), ceil(K/128)] (scale = tile amax/448),
                        and config.json gets a quantization_config
  --seed N              random seed (unsigned 64-bit, default 0)
  --shards N            split the weights into N files (default 1)
  --tie-embeddings[=true|false], --no-tie-embeddings
                        tie_word_embeddings; tied models have no lm_head
  --progress            report progress even when stderr is not a terminal
  -q, --quiet           no progress report and no summary line
  -h, --help            this text

SHAPE OPTIONS (families they apply to in brackets):
)";
  for (const ShapeOption &option : shapeOptions()) {
    std::string text =
        (StringRef(option.help) + " [" +
         (option.families == kAllFamilies ? std::string("all")
                                          : familyList(option.families)) +
         "]")
            .str();
    printOption(os, ("  --" + StringRef(option.name) + " N").str(), text);
  }
  os << R"(
Checks: --hidden, --intermediate and --moe-intermediate are multiples of 32
(the smallest fp9 block); --kv-heads divides --heads; RoPE dims are even;
--top-k <= --experts; DeepSeek: --n-group divides --experts with at least 2
experts a group, --topk-group <= --n-group, --top-k fits the kept groups.

PRESETS:
)";
  for (const PresetInfo &preset : presets()) {
    os << "  " << preset.name << "\n      ";
    printWrapped(os, preset.help, 6, 6);
    std::string shape;
    llvm::raw_string_ostream shape_os(shape);
    describeShape(preset.make(), shape_os);
    os.indent(6);
    printWrapped(os, shape_os.str(), 6, 6);
  }
  os << R"(
Values: Linear weights ~ N(0, 1/fan_in) with a per-128x128-tile spread
(0.375x..2x), about 1/1024 exact zeros, 1/1024 values near 1e-4 std (FP8
subnormals) and 1/512 outliers at 3x; norms ~ 1 + 0.05 noise; embeddings
std 0.75; router weights std 0.5/sqrt(hidden).

DeepSeek's MTP module: --mtp 1 sets num_nextn_predict_layers to 1 and
writes model.layers.<layers>.* after the main model (whose tensors stay as
without it): a MoE decoder layer, enorm, hnorm, eh_proj [hidden, 2*hidden]
(FP8 with its scale under --dtype fp8), shared_head.norm, and
shared_head.head and embed_tokens equal to the LM head and the embedding
(docs/mtp.md). Default 0: no MTP module. Other families refuse --mtp.

Tokenizer (every family): a Qwen2-style byte-level BPE tokenizer.json of
exactly --vocab ids: 0..255 the byte tokens (id = byte), then merges learned
from a built-in English text (continued with joins of printable tokens when
the vocab is larger than the text supports), then <|endoftext|>,
<|im_start|>, <|im_end|> as the last three ids. config.json's bos/eos are
<|endoftext|>; generation_config.json's eos_token_id is [<|endoftext|>,
<|im_end|>]; tokenizer_config.json has a ChatML chat_template. The
tokenizer does not depend on --seed.

EXAMPLES:
  duck-mkmodel --preset tiny-qwen3 -o /tmp/tiny
  duck-mkmodel --preset tiny-deepseek --family deepseek_v3 --dtype fp8 -o m
  duck-mkmodel --preset qwen3-30b-a3b-shape --layers 2 --shards 4 -o bench
)";
}

std::string formatSummary(const ModelSpec &spec, const WriteSummary &summary) {
  return llvm::formatv("duck-mkmodel: wrote {0}: family={1} dtype={2} "
                       "layers={3} params={4} tensors={5} bytes={6} files={7}",
                       summary.out_dir, familyName(spec.family),
                       formatName(spec.format), spec.layers, summary.params,
                       summary.tensors, summary.bytes, summary.files.size())
      .str();
}

int runMkModel(llvm::ArrayRef<std::string> args, llvm::raw_ostream &out,
               llvm::raw_ostream &err, bool err_is_tty) {
  auto fail = [&](Error e) {
    err << "duck-mkmodel: error: " << llvm::toString(std::move(e)) << "\n";
    err.flush();
    return 1;
  };
  llvm::Expected<CliRequest> request = parseCommandLine(args);
  if (!request)
    return fail(request.takeError());
  if (request->help) {
    printHelp(out);
    return 0;
  }
  llvm::Expected<WriteSummary> summary =
      writeModelDirectory(request->spec, request->write, err, err_is_tty);
  if (!summary)
    return fail(summary.takeError());
  if (!request->write.quiet)
    out << formatSummary(request->spec, *summary) << "\n";
  out.flush();
  return 0;
}

} // namespace duck::mkmodel
