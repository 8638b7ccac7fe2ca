//===- Plan.cpp - a compiled plan, loaded and verified --------------------===//
#include "duck/runtime/plan/Plan.h"
#include "duck/runtime/plan/OpKinds.h"

#include "plan_trailer.h"

#include "duck_rt/abi.h"

#include "absl/strings/str_cat.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace duck::runtime {
namespace pl = ::duck::plan;

absl::StatusOr<std::unique_ptr<MappedFile>>
MappedFile::Open(const std::string &path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return absl::NotFoundError(
        absl::StrCat("cannot open '", path, "': ", std::strerror(errno)));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("cannot stat '", path, "'"));
  }
  std::unique_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = st.st_size;
  if (f->size_ > 0) {
    void *p = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      return absl::InternalError(
          absl::StrCat("cannot map '", path, "': ", std::strerror(errno)));
    }
    f->data_ = static_cast<const uint8_t *>(p);
  }
  ::close(fd);
  return f;
}

MappedFile::~MappedFile() {
  if (data_)
    munmap(const_cast<uint8_t *>(data_), size_);
}

static uint64_t elementSize(pl::DType t) {
  switch (t) {
  case pl::DType::F32:
  case pl::DType::I32:
    return 4;
  case pl::DType::BF16:
  case pl::DType::F16:
    return 2;
  case pl::DType::I64:
    return 8;
  default:
    return 1;
  }
}

/// [offset, offset + bytes) inside a file of `size` bytes, without the sum
/// (a plan's fields are untrusted: offset + bytes can wrap).
static bool Within(uint64_t offset, uint64_t bytes, uint64_t size) {
  return offset <= size && bytes <= size - offset;
}

HostTensors LoadedPlan::OpTensors(const pl::OpDef &op) const {
  HostTensors out;
  if (const OpKind *k = kinds_->Find(op.params_type()); k && op.params())
    k->host_tensors(op, &out);
  return out;
}

const pl::OpDef *LoadedPlan::Producer(uint32_t id) const {
  for (const pl::OpDef *op : pl::AllOps(*def_))
    if (op->result() == id)
      return op;
  return nullptr;
}

namespace {
/// The root table's version field, verified on its own (the root offset,
/// the table's vtable and the field's bytes in bounds); false when even
/// that does not hold.
bool PeekPlanVersion(const uint8_t *buf, uint64_t size, uint32_t *out) {
  if (size < 8 || size > FLATBUFFERS_MAX_BUFFER_SIZE)
    return false;
  flatbuffers::Verifier v(buf, size);
  const flatbuffers::uoffset_t root =
      flatbuffers::ReadScalar<flatbuffers::uoffset_t>(buf);
  if (root > size - 4 || root % 4 != 0)
    return false;
  const auto *table = reinterpret_cast<const flatbuffers::Table *>(buf + root);
  if (!table->VerifyTableStart(v) ||
      !table->VerifyField<uint32_t>(v, pl::PlanDef::VT_VERSION, 4))
    return false;
  *out = table->GetField<uint32_t>(pl::PlanDef::VT_VERSION, 0);
  return true;
}
} // namespace

absl::StatusOr<std::unique_ptr<LoadedPlan>>
LoadedPlan::Load(const std::string &dir, const OpKindTable &kinds,
                 const PlanLoadOptions &options) {
  std::unique_ptr<LoadedPlan> p(new LoadedPlan());
  p->dir_ = dir;
  p->kinds_ = &kinds;
  std::string path = dir + "/model.duckplan";
  auto f = MappedFile::Open(path);
  if (!f.ok()) {
    // A checkpoint given where its plan belongs: say what to run.
    struct stat st;
    const bool model = ::stat((dir + "/config.json").c_str(), &st) == 0;
    return absl::NotFoundError(absl::StrCat(
        "'", dir, "' is not a plan directory: ", f.status().message(),
        model ? absl::StrCat(" (it holds a config.json: a model; compile it "
                             "first with 'duckc compile ",
                             dir, " -o <plan-dir>')")
              : ""));
  }
  p->plan_file_ = std::move(*f);
  const uint8_t *buf = p->plan_file_->data();
  const uint64_t fileSize = p->plan_file_->size();
  if (fileSize < 8 || !pl::PlanDefBufferHasIdentifier(buf))
    return absl::InvalidArgumentError(absl::StrCat(
        "'", path, "' is not a Duck plan (no 'DKPL' file identifier)"));
  // The FlatBuffer, then (from duckc) the 16-byte checksum trailer.
  const bool trailer =
      fileSize >= 8 + DUCK_PLAN_TRAILER_BYTES &&
      std::memcmp(buf + fileSize - DUCK_PLAN_TRAILER_BYTES,
                  DUCK_PLAN_TRAILER_MAGIC, 4) == 0;
  const uint64_t size = trailer ? fileSize - DUCK_PLAN_TRAILER_BYTES : fileSize;
  // A plan of another version is laid out by another schema, so it may
  // not verify under this one: read its version field alone first, so the
  // error says "recompile" rather than "corrupt".
  if (uint32_t version = 0;
      PeekPlanVersion(buf, size, &version) && version != kPlanVersion)
    return absl::InvalidArgumentError(absl::StrCat(
        "plan '", dir, "': plan version ", version,
        " but this runtime reads version ", kPlanVersion,
        "; recompile the model with this duckc"));
  flatbuffers::Verifier v(buf, size);
  if (!pl::VerifyPlanDefBuffer(v))
    return absl::DataLossError(absl::StrCat(
        "'", path, "' is corrupt or truncated (FlatBuffers verifier failed)"));
  p->def_ = pl::GetPlanDef(buf);
  // Versions first (a plan of another version may predate the trailer),
  // then the checksum, then the semantic checks.
  if (absl::Status s = p->CheckVersions(); !s.ok())
    return s;
  uint64_t planSize = 0;
  if (!trailer)
    return absl::DataLossError(absl::StrCat(
        "'", path, "' has no checksum trailer (truncated, or not written by "
        "duckc); recompile the model"));
  if (!duck_plan_trailer_ok(buf, fileSize, &planSize))
    return absl::DataLossError(absl::StrCat(
        "'", path, "' is corrupt: its checksum does not match its bytes"));
  if (absl::Status s = p->Check(options); !s.ok())
    return s;
  return p;
}

absl::Status LoadedPlan::CheckVersions() const {
  const pl::PlanDef &d = *def_;
  auto bad = [&](auto &&...parts) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan '", dir_, "': ", parts...));
  };
  if (d.version() != kPlanVersion)
    return bad("plan version ", d.version(), " but this runtime reads version ",
               kPlanVersion, "; recompile the model with this duckc");
  if (d.abi_version() != DUCK_ABI_VERSION)
    return bad("duck ABI ", d.abi_version(), " but this runtime speaks ",
               DUCK_ABI_VERSION, "; recompile the model");
  if (d.fp9_version() != DUCK_FP9_FORMAT_VERSION)
    return bad("fp9 format ", d.fp9_version(), " but this runtime reads ",
               DUCK_FP9_FORMAT_VERSION, "; recompile the model");
  return absl::OkStatus();
}

namespace {
using MappedFiles = std::vector<std::unique_ptr<MappedFile>>;

/// Every semantic check's error: "plan '<dir>': ..." as InvalidArgument.
template <typename... Parts>
absl::Status BadPlan(const std::string &dir, const Parts &...parts) {
  return absl::InvalidArgumentError(
      absl::StrCat("plan '", dir, "': ", parts...));
}

/// Checkpoint files: present, same size, same header; mapped into `files`.
absl::Status OpenCheckpointFiles(const pl::PlanDef &d, const std::string &dir,
                                 const std::string &checkpointDir,
                                 MappedFiles &files) {
  for (uint32_t i = 0; i < d.files()->size(); ++i) {
    const pl::FileDef *fd = d.files()->Get(i);
    if (!fd->path())
      return BadPlan(dir, "files[", i, "] has no path");
    std::string path = checkpointDir + "/" + fd->path()->str();
    auto mf = MappedFile::Open(path);
    if (!mf.ok())
      return absl::NotFoundError(absl::StrCat(
          "plan '", dir, "' needs checkpoint file ", mf.status().message(),
          " (compile-time checkpoint: ", checkpointDir, ")"));
    if ((*mf)->size() != fd->size())
      return BadPlan(dir, "checkpoint file '", path, "' is ", (*mf)->size(),
                     " bytes but was ", fd->size(),
                     " when the plan was compiled; recompile");
    uint64_t n = 0;
    if ((*mf)->size() >= 8)
      std::memcpy(&n, (*mf)->data(), 8);
    if (n + 8 > (*mf)->size() ||
        XXH3_64bits((*mf)->data(), 8 + n) != fd->header_hash())
      return BadPlan(dir, "checkpoint file '", path,
                     "' is not the one the plan was compiled from (header "
                     "differs); recompile");
    files.push_back(std::move(*mf));
  }
  return absl::OkStatus();
}

/// A tensor's shape is a vector of int64. The FlatBuffers verifier (2.0)
/// checks a vector's length word for 4-byte alignment only, so a damaged
/// offset can leave the elements misaligned: refuse that before reading
/// them (found by fuzz-plan).
bool ShapeAligned(const pl::TensorDef &t) {
  return reinterpret_cast<uintptr_t>(t.shape()->data()) % alignof(int64_t) ==
         0;
}

/// FP8: a 2-D weight with a declared block and a scale grid of exactly
/// ceil(rows / block_rows) x ceil(cols / block_cols).
absl::Status CheckFp8Blocks(const std::string &dir, const pl::TensorDef &t,
                            uint32_t op) {
  const std::string name = t.name()->str();
  if (t.shape()->size() != 2 || !t.scale() || !t.scale()->shape() ||
      t.scale()->shape()->size() != 2 || !ShapeAligned(*t.scale()))
    return BadPlan(dir, "ops[", op, "] FP8 tensor '", name,
                   "' is not a 2-D matrix with a 2-D scale grid");
  if (t.block_rows() == 0 || t.block_cols() == 0)
    return BadPlan(dir, "ops[", op, "] FP8 tensor '", name,
                   "' has no quantization block size (a plan from an older "
                   "duckc); recompile the model");
  const uint64_t rows = t.shape()->Get(0), cols = t.shape()->Get(1);
  const uint64_t wantR = (rows + t.block_rows() - 1) / t.block_rows(),
                 wantC = (cols + t.block_cols() - 1) / t.block_cols();
  if ((uint64_t)t.scale()->shape()->Get(0) != wantR ||
      (uint64_t)t.scale()->shape()->Get(1) != wantC)
    return BadPlan(dir, "ops[", op, "] FP8 tensor '", name, "' [", rows, ", ",
                   cols, "] with ", t.block_rows(), "x", t.block_cols(),
                   " blocks needs a ", wantR, "x", wantC, " scale grid, found ",
                   t.scale()->shape()->Get(0), "x",
                   t.scale()->shape()->Get(1));
  return absl::OkStatus();
}

/// FFN ops: the slot every duck runs exists, is this layer's and of the
/// op's kind, and the modes are the ones the duck ELF has for that kind.
absl::Status CheckFfnOp(const std::string &dir, const pl::PlanDef &d,
                        const pl::OpDef &op, const OpKind *kind, uint32_t i) {
  if (!kind->duck_step)
    return absl::OkStatus();
  const pl::DuckStepDef *step = kind->duck_step(op);
  if (!step)
    return BadPlan(dir, "ops[", i, "] (layer ", op.layer(),
                   ") has no duck step");
  if (!kind->modes_ok(step->decode_mode(), step->prefill_mode()))
    return BadPlan(dir, "ops[", i, "] (layer ", op.layer(), ") has modes ",
                   step->decode_mode(), "/", step->prefill_mode(), ", not a ",
                   kind->modes, " pair");
  for (uint32_t r = 0; r < d.ducks()->size(); ++r) {
    const auto *slots = d.ducks()->Get(r)->slots();
    if (!slots || step->slot() >= slots->size())
      return BadPlan(dir, "ops[", i, "] (layer ", op.layer(), ") runs slot ",
                     step->slot(), " but duck ", r, " has ",
                     slots ? slots->size() : 0, " slots");
    const pl::SlotDef *sd = slots->Get(step->slot());
    if ((int64_t)sd->layer() != op.layer() || sd->moe() != kind->moe)
      return BadPlan(dir, "ops[", i, "] (layer ", op.layer(), ") runs slot ",
                     step->slot(), " of duck ", r, ", which holds ",
                     sd->moe() ? "the MoE" : "the dense", " layer ",
                     sd->layer());
  }
  return absl::OkStatus();
}

/// An op's tensor: complete, of a known dtype, sized by its shape and
/// inside its (already mapped) checkpoint file.
absl::Status CheckTensor(const std::string &dir, const MappedFiles &files,
                         const pl::TensorDef *t, uint32_t op) {
  if (!t || !t->name() || !t->shape())
    return BadPlan(dir, "ops[", op, "] has an incomplete tensor");
  if (!ShapeAligned(*t))
    return BadPlan(dir, "ops[", op, "] tensor '", t->name()->str(),
                   "' has a misaligned shape (a corrupt plan)");
  if (!pl::EnumNameDType(t->dtype())[0])
    return BadPlan(dir, "ops[", op, "] tensor '", t->name()->str(),
                   "' has dtype ", (int)t->dtype(), ", not one of the plan's");
  if (t->file() >= files.size())
    return BadPlan(dir, "ops[", op, "] tensor '", t->name()->str(),
                   "' names file ", t->file(), " of ", files.size());
  uint64_t elems = 1;
  for (int64_t dim : *t->shape())
    elems *= (uint64_t)dim;
  if (elems * elementSize(t->dtype()) != t->bytes())
    return BadPlan(dir, "ops[", op, "] tensor '", t->name()->str(),
                   "' has a byte size that disagrees with its shape");
  if (!Within(t->offset(), t->bytes(), files[t->file()]->size()))
    return BadPlan(dir, "ops[", op, "] tensor '", t->name()->str(),
                   "' lies outside its file");
  if (t->dtype() == pl::DType::F8_E4M3)
    return CheckFp8Blocks(dir, *t, op);
  return absl::OkStatus();
}

/// Ops: a known kind, FFN steps, value ids, tensors in bounds (op by op,
/// in that order).
absl::Status CheckOps(const std::string &dir, const pl::PlanDef &d,
                      const MappedFiles &files, const OpKindTable &kinds) {
  const std::vector<const pl::OpDef *> all = pl::AllOps(d);
  for (uint32_t i = 0; i < all.size(); ++i) {
    const pl::OpDef *op = all[i];
    const OpKind *kind = kinds.Find(op->params_type());
    if (!op->params() || !kind)
      return BadPlan(dir, "ops[", i,
                     "] has no parameters or an unknown kind (",
                     (int)op->params_type(), ")");
    if (absl::Status s = CheckFfnOp(dir, d, *op, kind, i); !s.ok())
      return s;
    if (std::string e = kind->check ? kind->check(*op) : ""; !e.empty())
      return BadPlan(dir, "ops[", i, "] (layer ", op->layer(), ") ", e);
    if (op->result() >= d.num_values())
      return BadPlan(dir, "ops[", i, "] writes value ", op->result(), " of ",
                     d.num_values());
    if (op->inputs())
      for (uint32_t in : *op->inputs())
        if (in >= d.num_values())
          return BadPlan(dir, "ops[", i, "] reads value ", in, " of ",
                         d.num_values());
    HostTensors tensors;
    kind->host_tensors(*op, &tensors);
    for (const pl::TensorDef *t : tensors) {
      if (absl::Status s = CheckTensor(dir, files, t, i); !s.ok())
        return s;
      if (t->scale())
        if (absl::Status s = CheckTensor(dir, files, t->scale(), i); !s.ok())
          return s;
    }
  }
  return absl::OkStatus();
}

/// The MTP module: a program that starts with its input op and reads the
/// main program's hidden state, values in range.
absl::Status CheckMtp(const std::string &dir, const pl::PlanDef &d) {
  const pl::MtpDef *m = d.mtp();
  if (!m)
    return absl::OkStatus();
  if (!m->ops() || m->ops()->size() < 2 ||
      !m->ops()->Get(1)->params_as_MtpInputOpDef())
    return BadPlan(dir, "mtp: its program must start with an embedding and "
                        "its input op");
  if (m->hidden() >= d.num_values() || m->result() >= d.num_values())
    return BadPlan(dir, "mtp: hidden value ", m->hidden(), " or result ",
                   m->result(), " out of ", d.num_values());
  return absl::OkStatus();
}

/// Step limits: the compiler's word for how big a duck step can get; the
/// runtime sizes the ducks' scratch and buffers from it, so every slot
/// and MoE op must keep within it.
absl::Status CheckStepLimits(const std::string &dir, const pl::PlanDef &d) {
  const pl::StepLimitsDef *lim = d.step_limits();
  if (!lim)
    return BadPlan(dir, "has no step limits");
  for (const pl::OpDef *op : pl::AllOps(d))
    if (const pl::MoeFfnOpDef *moe = op->params_as_MoeFfnOpDef())
      if (moe->num_experts() + moe->num_shared() > lim->max_experts() ||
          moe->top_k() + moe->num_shared() > lim->max_active())
        return BadPlan(dir, "layer ", op->layer(), " routes top ",
                       moe->top_k(), " + ", moe->num_shared(), " shared of ",
                       moe->num_experts(),
                       " experts, beyond the step limits (",
                       lim->max_active(), " of ", lim->max_experts(), ")");
  for (uint32_t r = 0; r < d.ducks()->size(); ++r) {
    const auto *slots = d.ducks()->Get(r)->slots();
    for (uint32_t i = 0; slots && i < slots->size(); ++i) {
      const pl::SlotDef *sd = slots->Get(i);
      const uint64_t n = (uint64_t)sd->inter_end() - sd->inter_begin();
      for (uint32_t m = 0; sd->head() && sd->matrices() &&
                           m < sd->matrices()->size();
           ++m)
        if (sd->matrices()->Get(m)->k() >
            std::max(d.model()->hidden(), lim->max_k()))
          return BadPlan(dir, "duck ", r, " slot ", i, " reads rows ",
                         sd->matrices()->Get(m)->k(),
                         " wide, beyond the step limits (", lim->max_k(), ")");
      if (sd->inter_end() < sd->inter_begin() ||
          n > (sd->head() ? lim->max_head_rows() : lim->max_inter()) ||
          sd->expert_end() > lim->max_experts())
        return BadPlan(dir, "duck ", r, " slot ", i, " (",
                       sd->head() ? "head rows" : "intermediate", " [",
                       sd->inter_begin(), ", ", sd->inter_end(),
                       "), experts to ", sd->expert_end(),
                       ") exceeds the step limits (", lim->max_inter(),
                       " intermediate, ", lim->max_head_rows(), " head rows, ",
                       lim->max_experts(), " experts)");
    }
  }
  return absl::OkStatus();
}

/// Weight images: present, of the size the plan says, with the header of
/// this plan's rank; with the option, every slot's checksum too.
absl::Status CheckWeightImages(const LoadedPlan &p,
                               const PlanLoadOptions &options) {
  const pl::PlanDef &d = p.def();
  const std::string &dir = p.dir();
  for (uint32_t r = 0; r < d.ducks()->size(); ++r) {
    const pl::DuckDef *dk = d.ducks()->Get(r);
    if (dk->rank() != r || !dk->image() || !dk->slots())
      return BadPlan(dir, "ducks[", r, "] is incomplete or out of order");
    std::string path = p.ImagePath(r);
    struct stat st;
    if (stat(path.c_str(), &st) != 0)
      return absl::NotFoundError(absl::StrCat("plan '", dir,
                                              "': weight image '", path,
                                              "' is missing"));
    if ((uint64_t)st.st_size != dk->image_bytes())
      return absl::DataLossError(absl::StrCat(
          "plan '", dir, "': weight image '", path, "' is ", st.st_size,
          " bytes, the plan says ", dk->image_bytes(), " (truncated?)"));
    auto img = MappedFile::Open(path);
    if (!img.ok())
      return img.status();
    duck_image_header h;
    if ((*img)->size() < sizeof h)
      return absl::DataLossError(absl::StrCat("'", path, "' is truncated"));
    std::memcpy(&h, (*img)->data(), sizeof h);
    uint64_t sum = h.header_checksum;
    h.header_checksum = 0;
    if (h.magic != DUCK_IMAGE_MAGIC || XXH3_64bits(&h, sizeof h) != sum ||
        h.tp_rank != r || h.slot_count != dk->slots()->size())
      return absl::DataLossError(absl::StrCat(
          "weight image '", path, "' has a bad header (corrupt, or from "
          "another plan)"));
    if (options.verify_weight_checksums)
      for (uint32_t s = 0; s < dk->slots()->size(); ++s) {
        const pl::SlotDef *sd = dk->slots()->Get(s);
        if (!Within(sd->offset(), sd->bytes(), (*img)->size()) ||
            XXH3_64bits((*img)->data() + sd->offset(), sd->bytes()) !=
                sd->checksum())
          return absl::DataLossError(absl::StrCat(
              "weight image '", path, "' slot ", s, " (layer ", sd->layer(),
              ") fails its checksum"));
      }
  }
  return absl::OkStatus();
}
} // namespace

absl::Status LoadedPlan::Check(const PlanLoadOptions &options) {
  const pl::PlanDef &d = *def_;
  if (!d.model() || !d.ops() || d.ops()->size() == 0 || !d.ducks() ||
      !d.files())
    return BadPlan(dir_, "missing model, ops, ducks or files");
  if (d.ducks()->size() != d.tp() || d.tp() == 0)
    return BadPlan(dir_, "tp is ", d.tp(), " but the plan lists ",
                   d.ducks()->size(), " ducks");
  const pl::ModelDef &m = *d.model();
  if (m.hidden() == 0 || m.vocab() == 0 || m.layers() == 0)
    return BadPlan(dir_, "model sizes are zero");

  checkpoint_dir_ = options.checkpoint_dir.empty()
                        ? (d.checkpoint_dir() ? d.checkpoint_dir()->str() : "")
                        : options.checkpoint_dir;
  if (absl::Status s = OpenCheckpointFiles(d, dir_, checkpoint_dir_, files_);
      !s.ok())
    return s;
  if (absl::Status s = CheckOps(dir_, d, files_, *kinds_); !s.ok())
    return s;
  if (absl::Status s = CheckMtp(dir_, d); !s.ok())
    return s;
  if (absl::Status s = CheckStepLimits(dir_, d); !s.ok())
    return s;
  return CheckWeightImages(*this, options);
}

std::string LoadedPlan::ImagePath(uint32_t rank) const {
  return dir_ + "/" + def_->ducks()->Get(rank)->image()->str();
}

const uint8_t *LoadedPlan::TensorData(const pl::TensorDef &t) const {
  return files_[t.file()]->data() + t.offset();
}

uint64_t LoadedPlan::MapHostTensors() const {
  const uint64_t page = uint64_t(sysconf(_SC_PAGESIZE));
  uint64_t mapped = 0;
  auto populate = [&](const pl::TensorDef *t) {
    if (!t || t->file() >= files_.size() || t->bytes() == 0)
      return;
    const MappedFile &f = *files_[t->file()];
    if (t->offset() >= f.size())
      return;
    const uint64_t end = t->bytes() > f.size() - t->offset()
                             ? f.size()
                             : t->offset() + t->bytes();
    const uint64_t begin = t->offset() / page * page;
    void *at = const_cast<uint8_t *>(f.data()) + begin;
    // MADV_POPULATE_READ (Linux 5.14) maps the pages; older kernels only
    // read ahead, which is what WILLNEED does.
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
    if (madvise(at, end - begin, MADV_POPULATE_READ) != 0)
      (void)madvise(at, end - begin, MADV_WILLNEED);
    mapped += end - begin;
  };
  for (const pl::OpDef *op : pl::AllOps(*def_))
    for (const pl::TensorDef *t : OpTensors(*op)) {
      populate(t);
      populate(t->scale());
    }
  return mapped;
}

std::string LoadedPlan::TokenizerPath() const {
  std::string p = checkpoint_dir_ + "/tokenizer.json";
  struct stat st;
  return stat(p.c_str(), &st) == 0 ? p : "";
}

} // namespace duck::runtime
