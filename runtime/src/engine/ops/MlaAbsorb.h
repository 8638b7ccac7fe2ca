//===- MlaAbsorb.h - MLA's kv_b_proj on the ducks by heads ------*- C++ -*-===//
//
// duckc --mla-absorb ducks (MlaAttentionOpDef.absorb_heads): duck r holds
// heads [heads[r], heads[r+1]) of kv_b_proj. Its query step answers, a row,
// [its heads' q rows (qk each) | its indexer rows (V3.2; IndexerOpDef.
// absorb_index_rows) | its heads' latent queries (kv_lora each)], and its
// output step takes its heads' latent outputs and answers partial sums of
// the hidden vector. What the MLA op and the indexer share of that.
//===----------------------------------------------------------------------===//
#ifndef DUCK_RUNTIME_OPS_MLAABSORB_H
#define DUCK_RUNTIME_OPS_MLAABSORB_H

#include "HostOp.h"

#include <cstdint>
#include <vector>

namespace duck::runtime::ops {

/// Boundaries a duck (tp + 1 of them, the first 0, the last `total`,
/// non-decreasing) read from the plan into `out`; `what` names the field
/// in the error. An absent or empty field leaves `out` empty.
absl::Status ReadAbsorbBounds(const OpEnv &env,
                              const ::flatbuffers::Vector<uint32_t> *field,
                              uint64_t total, const char *what,
                              std::vector<uint32_t> *out);

/// The widths of an absorbed MLA's steps.
struct AbsorbShape {
  uint64_t qk = 0;      // floats of a head's query (nope + rope)
  uint64_t kv_lora = 0; // of its latent query and output
  uint64_t v = 0;       // of its value (W_UV's rows a head)
  uint64_t hidden = 0;  // of the output step's answer
  std::vector<uint32_t> heads;
  std::vector<uint32_t> index_rows; // empty: no indexer rows in the step
  /// Floats duck r answers a row in the query step.
  uint64_t QueryRows(size_t r) const;
  /// Floats every duck together answers a row in the query step.
  uint64_t QueryWidth() const;
};

/// One row of a query step's answer (the ducks' in rank order) apart:
/// every head's q into q (heads x qk), the indexer rows into index (when
/// the step has them) and every head's latent query into latent (heads x
/// kv_lora).
void SplitAbsorbedQuery(const AbsorbShape &sh, const float *row, float *q,
                        float *index, float *latent);

/// Head slot `slot` holds each duck's query step, a chain (abi.h: its
/// pieces' rows from 0 to inter_end, the OB carrying [inter_begin,
/// inter_end)): QueryRows(r) rows answered, its pieces `k` wide (on x) or
/// `nope` wide (W_UK^T on a head's query).
absl::Status CheckAbsorbedQuerySlot(const OpEnv &env, uint32_t slot,
                                    const AbsorbShape &sh, uint64_t k,
                                    uint64_t nope, const char *what);
/// Head slot `slot` holds each duck's output step: its heads' W_UV rows
/// (kv_lora wide, working rows) and then its o_proj columns (hidden rows
/// over its heads' values), which the OB carries.
absl::Status CheckAbsorbedOutputSlot(const OpEnv &env, uint32_t slot,
                                     const AbsorbShape &sh);
/// Head slot `slot` holds each duck's o_proj by heads (GQA, duckc --o-proj
/// heads): one matrix of `hidden` rows over its heads' outputs (heads x
/// `dim` wide), answering all of them (partial sums).
absl::Status CheckHeadColumnsSlot(const OpEnv &env, uint32_t slot,
                                  const std::vector<uint32_t> &heads,
                                  uint64_t dim, uint64_t hidden);

} // namespace duck::runtime::ops

#endif
