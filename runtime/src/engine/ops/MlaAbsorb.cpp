//===- MlaAbsorb.cpp - MLA's kv_b_proj on the ducks by heads --------------===//
#include "MlaAbsorb.h"

#include <cstring>

namespace duck::runtime::ops {

absl::Status ReadAbsorbBounds(const OpEnv &env,
                              const ::flatbuffers::Vector<uint32_t> *field,
                              uint64_t total, const char *what,
                              std::vector<uint32_t> *out) {
  out->clear();
  if (!field || field->size() == 0)
    return absl::OkStatus();
  const uint32_t ducks = env.plan.def().ducks()->size();
  bool ok = field->size() == ducks + 1 && field->Get(0) == 0 &&
            field->Get(ducks) == total;
  for (uint32_t r = 0; ok && r < ducks; ++r)
    ok = field->Get(r) <= field->Get(r + 1);
  if (!ok) {
    std::string got;
    for (uint32_t b : *field)
      absl::StrAppend(&got, got.empty() ? "" : " ", b);
    return env.Error(what, " [", got, "] are not ", ducks + 1,
                     " non-decreasing boundaries from 0 to ", total);
  }
  out->assign(field->begin(), field->end());
  return absl::OkStatus();
}

uint64_t AbsorbShape::QueryRows(size_t r) const {
  const uint64_t h = heads[r + 1] - heads[r];
  return h * (qk + kv_lora) +
         (index_rows.empty() ? 0 : index_rows[r + 1] - index_rows[r]);
}

uint64_t AbsorbShape::QueryWidth() const {
  return (uint64_t)heads.back() * (qk + kv_lora) +
         (index_rows.empty() ? 0 : index_rows.back());
}

void SplitAbsorbedQuery(const AbsorbShape &sh, const float *row, float *q,
                        float *index, float *latent) {
  for (size_t r = 0; r + 1 < sh.heads.size(); ++r) {
    const uint64_t h0 = sh.heads[r], h = sh.heads[r + 1] - h0;
    std::memcpy(q + h0 * sh.qk, row, h * sh.qk * 4);
    row += h * sh.qk;
    if (!sh.index_rows.empty()) {
      const uint64_t i0 = sh.index_rows[r], n = sh.index_rows[r + 1] - i0;
      std::memcpy(index + i0, row, n * 4);
      row += n;
    }
    std::memcpy(latent + h0 * sh.kv_lora, row, h * sh.kv_lora * 4);
    row += h * sh.kv_lora;
  }
}

namespace {
/// Duck r's head slot `slot`, or an error naming it.
absl::StatusOr<const pl::SlotDef *> HeadSlot(const OpEnv &env, uint32_t r,
                                             uint32_t slot, const char *what) {
  const auto *slots = env.plan.def().ducks()->Get(r)->slots();
  if (!slots || slot >= slots->size() || !slots->Get(slot)->head())
    return env.Error(what, " on the ducks: duck ", r, " has no head slot ",
                     slot);
  return slots->Get(slot);
}

/// A chained slot: its pieces' rows, which must be all its rows (from 0 to
/// inter_end; its OB carries [inter_begin, inter_end)), each piece `k1`
/// or `k2` wide.
bool Chained(const pl::SlotDef &sd, uint64_t k1, uint64_t k2) {
  uint64_t rows = 0;
  bool ok = sd.matrices() && sd.matrices()->size() > 0;
  for (uint32_t m = 0; ok && m < sd.matrices()->size(); ++m) {
    const pl::MatrixDef *md = sd.matrices()->Get(m);
    rows += md->rows();
    ok = md->k() == k1 || md->k() == k2;
  }
  return ok && rows == sd.inter_end() && sd.inter_begin() <= sd.inter_end();
}
} // namespace

absl::Status CheckAbsorbedQuerySlot(const OpEnv &env, uint32_t slot,
                                    const AbsorbShape &sh, uint64_t k,
                                    uint64_t nope, const char *what) {
  for (uint32_t r = 0; r + 1 < sh.heads.size(); ++r) {
    const pl::SlotDef *sd;
    DUCK_ASSIGN_OR_RETURN(sd, HeadSlot(env, r, slot, what));
    const uint64_t rows = sh.QueryRows(r);
    if (!Chained(*sd, k, nope) || sd->inter_end() - sd->inter_begin() != rows)
      return env.Error(what, " on the ducks (kv_b_proj absorbed): duck ", r,
                       " slot ", slot, " answers rows [", sd->inter_begin(),
                       ", ", sd->inter_end(), ") of its pieces, expected ",
                       rows, " (heads [", sh.heads[r], ", ", sh.heads[r + 1],
                       "), their latent queries and its indexer rows) "
                       "in pieces ",
                       k, " or ", nope, " wide");
  }
  return absl::OkStatus();
}

absl::Status CheckAbsorbedOutputSlot(const OpEnv &env, uint32_t slot,
                                     const AbsorbShape &sh) {
  for (uint32_t r = 0; r + 1 < sh.heads.size(); ++r) {
    const pl::SlotDef *sd;
    DUCK_ASSIGN_OR_RETURN(sd, HeadSlot(env, r, slot, "o_proj"));
    const uint64_t values = (uint64_t)(sh.heads[r + 1] - sh.heads[r]) * sh.v;
    if (!Chained(*sd, sh.kv_lora, values) || sd->inter_begin() != values ||
        sd->inter_end() != values + sh.hidden)
      return env.Error("o_proj on the ducks (kv_b_proj absorbed): duck ", r,
                       " slot ", slot, " answers rows [", sd->inter_begin(),
                       ", ", sd->inter_end(),
                       ") of its pieces, expected W_UV's ", values,
                       " rows of heads [", sh.heads[r], ", ", sh.heads[r + 1],
                       ") (", sh.kv_lora, " wide) and then o_proj's ",
                       sh.hidden, " (", values, " wide), answering those");
  }
  return absl::OkStatus();
}

absl::Status CheckHeadColumnsSlot(const OpEnv &env, uint32_t slot,
                                  const std::vector<uint32_t> &heads,
                                  uint64_t dim, uint64_t hidden) {
  for (uint32_t r = 0; r + 1 < heads.size(); ++r) {
    const pl::SlotDef *sd;
    DUCK_ASSIGN_OR_RETURN(sd, HeadSlot(env, r, slot, "o_proj"));
    const uint64_t k = (uint64_t)(heads[r + 1] - heads[r]) * dim;
    if (!Chained(*sd, k, k) || sd->matrices()->size() != 1 ||
        sd->inter_begin() != 0 || sd->inter_end() != hidden)
      return env.Error("o_proj on the ducks by heads: duck ", r, " slot ", slot,
                       " answers rows [", sd->inter_begin(), ", ",
                       sd->inter_end(), "), expected one matrix of ", hidden,
                       " rows over heads [", heads[r], ", ", heads[r + 1],
                       ") (", k, " wide)");
  }
  return absl::OkStatus();
}

} // namespace duck::runtime::ops
