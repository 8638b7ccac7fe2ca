//===- PlanVerifier.cpp - check a plan's weight images --------------------===//
#include "duck/Target/Plan/PlanVerifier.h"

#include "duck/Target/Plan/PlanWriter.h"
#include "duck/Import/WeightSource.h"
#include "duck/plan/plan_generated.h"
#include "duck_rt/abi.h"

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

#include <xxhash.h>

#include <cmath>
#include <cstring>

using namespace mlir::duck;
using namespace mlir::duck::import;
namespace pl = ::duck::plan;

static llvm::Error err(const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg);
}

llvm::Expected<PlanCheck>
mlir::duck::verifyPlanImages(llvm::StringRef planDir, const Checkpoint &ckpt) {
  llvm::SmallString<256> planPath(planDir);
  llvm::sys::path::append(planPath, kPlanFileName);
  auto planBuf = llvm::MemoryBuffer::getFile(planPath);
  if (!planBuf)
    return err("cannot read '" + planPath + "': " +
               planBuf.getError().message());
  const uint8_t *pb =
      reinterpret_cast<const uint8_t *>((*planBuf)->getBufferStart());
  flatbuffers::Verifier fv(pb, (*planBuf)->getBufferSize());
  if (!pl::PlanDefBufferHasIdentifier(pb) || !pl::VerifyPlanDefBuffer(fv))
    return err("'" + planPath + "' is not a valid Duck plan");
  const pl::PlanDef *plan = pl::GetPlanDef(pb);
  if (!plan->ducks())
    return err("plan has no ducks");

  PlanCheck check;
  std::vector<float> row, refRow;
  for (const pl::DuckDef *duck : *plan->ducks()) {
    ++check.ducks;
    const unsigned rank = duck->rank();
    llvm::SmallString<256> imgPath(planDir);
    llvm::sys::path::append(imgPath, duck->image()->str());
    auto img = llvm::MemoryBuffer::getFile(imgPath, /*IsText=*/false,
                                           /*RequiresNullTerminator=*/false);
    if (!img)
      return err("cannot read '" + imgPath + "': " + img.getError().message());
    const uint8_t *base =
        reinterpret_cast<const uint8_t *>((*img)->getBufferStart());
    uint64_t size = (*img)->getBufferSize();
    if (size != duck->image_bytes())
      return err(llvm::formatv("duck {0}: image is {1} bytes, plan says {2}",
                               rank, size, duck->image_bytes()));
    duck_image_header h;
    std::memcpy(&h, base, sizeof h);
    uint64_t want = h.header_checksum;
    h.header_checksum = 0;
    if (h.magic != DUCK_IMAGE_MAGIC || h.format_version != DUCK_IMAGE_FORMAT_VERSION)
      return err(llvm::formatv("duck {0}: image header has a bad magic or "
                               "format version",
                               rank));
    if (XXH3_64bits(&h, sizeof h) != want)
      return err(llvm::formatv("duck {0}: image header checksum mismatch", rank));
    if (h.tp_rank != rank || h.tp_size != plan->tp() ||
        h.slot_count != duck->slots()->size())
      return err(llvm::formatv("duck {0}: image header (rank {1}, tp {2}, {3} "
                               "slots) disagrees with the plan",
                               rank, h.tp_rank, h.tp_size, h.slot_count));
    const auto *table = reinterpret_cast<const duck_slot_entry *>(
        base + h.slot_table_offset);
    for (unsigned si = 0; si < duck->slots()->size(); ++si) {
      const pl::SlotDef *sd = duck->slots()->Get(si);
      const duck_slot_entry &e = table[si];
      ++check.slots;
      if (e.offset != sd->offset() || e.bytes != sd->bytes() ||
          e.checksum != sd->checksum() || e.offset + e.bytes > size)
        return err(llvm::formatv("duck {0} slot {1}: slot table disagrees with "
                                 "the plan",
                                 rank, si));
      if (XXH3_64bits(base + e.offset, e.bytes) != e.checksum)
        return err(llvm::formatv("duck {0} slot {1} (layer {2}): checksum "
                                 "mismatch",
                                 rank, si, e.layer));
      const uint8_t *slot = base + e.offset;
      duck_slot_header sh;
      std::memcpy(&sh, slot, sizeof sh);
      if (sh.magic != DUCK_SLOT_MAGIC)
        return err(llvm::formatv("duck {0} slot {1}: bad slot magic", rank, si));
      const auto *descs =
          reinterpret_cast<const duck_ffn_desc *>(slot + sizeof sh);
      // Routed experts of this layer (the rest are shared ones).
      // and the full (unsliced) width of one expert.
      int64_t routed = 1, width = 0;
      if (const auto *ops = plan->ops())
        for (const pl::OpDef *op : *ops)
          if (op->kind() == pl::OpKind::MoeFfn && op->layer() == (int)sh.layer) {
            routed = op->num_experts();
            width = op->inter();
          }
      for (unsigned ex = 0; ex < sh.n_experts; ++ex) {
        const duck_ffn_desc &d = descs[ex];
        if (!d.present)
          continue;
        ExpertTensorNames names = expertTensorNames(
            sh.layer, sh.kind == DUCK_SLOT_MOE, ex, routed, width);
        struct Role {
          const duck_matrix_ref *ref;
          const std::string *name;
          bool down;
        } roles[] = {{&d.gate, &names.gate, false},
                     {&d.up, &names.up, false},
                     {&d.down, &names.down, true}};
        for (const Role &r : roles) {
          auto src = openWeightSource(ckpt, *r.name);
          if (!src)
            return src.takeError();
          const duck_fp9_desc &desc = r.ref->desc;
          ++check.matrices;
          int64_t row0 = r.down ? 0 : sd->inter_begin() + names.base;
          int64_t col0 = r.down ? sd->inter_begin() + names.base : 0;
          bool exact = true;
          row.resize(desc.k);
          refRow.resize(desc.k);
          for (uint32_t i = 0; i < desc.rows; ++i) {
            duck_fp9_unpack_row(&desc, slot + r.ref->offset, i, row.data());
            float rowMax = 0;
            for (uint32_t k = 0; k < desc.k; ++k) {
              refRow[k] = duck_fp9_source_value(&src->src, row0 + i, col0 + k);
              rowMax = std::max(rowMax, std::fabs(refRow[k]));
            }
            for (uint32_t k = 0; k < desc.k; ++k) {
              float ref = refRow[k];
              ++check.elements;
              uint32_t a, b;
              std::memcpy(&a, &row[k], 4);
              std::memcpy(&b, &ref, 4);
              if (a == b)
                continue;
              exact = false;
              double rel = ref != 0 ? std::fabs(row[k] - ref) / std::fabs(ref)
                                    : std::fabs(row[k]);
              check.worstRelError = std::max(check.worstRelError, rel);
              bool fp8 = src->src.type == DUCK_FP9_SRC_E4M3;
              // Half a step of a 3-bit mantissa (plus fp32 rounding); only
              // values 2^-28 below the row's largest may flush to zero (the
              // fp9 range under a block scale is 2^-30 of the block's max).
              bool flushed = row[k] == 0.0f &&
                             std::fabs(ref) <= std::ldexp(rowMax, -28);
              if (fp8 || (rel > 0x1p-4 * (1 + 1e-5) && !flushed))
                return err(llvm::formatv(
                    "duck {0} slot {1} (layer {2}) expert {3}: '{4}'[{5}, {6}] "
                    "is {7} in the image but {8} in the checkpoint{9}",
                    rank, si, sh.layer, ex, *r.name, row0 + i, col0 + k, row[k],
                    ref, fp8 ? " (FP8 must convert exactly)" : ""));
            }
          }
          if (exact)
            ++check.exactMatrices;
        }
      }
    }
  }
  return check;
}
