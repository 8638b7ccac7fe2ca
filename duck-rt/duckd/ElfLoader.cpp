// duckd's loader for the duck ELF (see ElfLoader.h). Every offset, size and
// address read from the file is bounds-checked before use.
#include "ElfLoader.h"

#include "absl/strings/str_cat.h"

#include <cerrno>
#include <cstring>
#include <elf.h>
#include <string>
#include <sys/mman.h>
#include <vector>

namespace duck::duckd {
namespace {

constexpr uint64_t kPage = 4096;

bool InRange(uint64_t offset, uint64_t length, uint64_t size) {
  return offset <= size && length <= size - offset;
}

uint64_t PageUp(uint64_t v) { return (v + kPage - 1) & ~(kPage - 1); }
uint64_t PageDown(uint64_t v) { return v & ~(kPage - 1); }

absl::Status Refuse(const std::string &why) {
  return absl::InvalidArgumentError(absl::StrCat("bad ELF: ", why));
}

struct Segment {
  uint64_t vaddr, memsz, offset, filesz;
  uint32_t flags;
};

/// Everything parsed from the file before mapping.
struct Plan {
  std::vector<Segment> loads;
  bool has_dynamic = false;
  uint64_t dynamic_vaddr = 0, dynamic_bytes = 0;
  bool has_relro = false;
  uint64_t relro_vaddr = 0, relro_bytes = 0;
  uint64_t span = 0;
};

// The ELF header on its own: size limits, identity and where the program
// headers lie, checked before any program header is read.
absl::Status CheckElfHeader(absl::Span<const uint8_t> file,
                            const ElfLimits &limits, Elf64_Ehdr &eh) {
  if (file.size() < sizeof(Elf64_Ehdr))
    return Refuse(absl::StrCat("truncated: ", file.size(),
                               " bytes, the ELF header alone needs ",
                               sizeof(Elf64_Ehdr)));
  if (file.size() > limits.max_file_bytes)
    return absl::ResourceExhaustedError(
        absl::StrCat("bad ELF: ", file.size(), " bytes exceed the ",
                     limits.max_file_bytes, "-byte limit"));
  std::memcpy(&eh, file.data(), sizeof eh);
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0)
    return Refuse("not an ELF file (bad magic)");
  if (eh.e_ident[EI_CLASS] != ELFCLASS64)
    return Refuse(absl::StrCat("class ", eh.e_ident[EI_CLASS],
                               ", need ELFCLASS64"));
  if (eh.e_ident[EI_DATA] != ELFDATA2LSB)
    return Refuse("not little-endian");
  if (eh.e_ident[EI_VERSION] != EV_CURRENT || eh.e_version != EV_CURRENT)
    return Refuse("unknown ELF version");
  if (eh.e_machine != EM_X86_64)
    return Refuse(absl::StrCat("machine ", eh.e_machine, ", need x86-64 (",
                               EM_X86_64, ")"));
  if (eh.e_type != ET_DYN)
    return Refuse(absl::StrCat("type ", eh.e_type,
                               ", need ET_DYN (a position-independent shared "
                               "object or static-pie)"));
  if (eh.e_ehsize != sizeof(Elf64_Ehdr) ||
      eh.e_phentsize != sizeof(Elf64_Phdr))
    return Refuse("unexpected header or program header entry size");
  if (eh.e_phnum == 0 || eh.e_phnum > limits.max_program_headers)
    return Refuse(absl::StrCat(eh.e_phnum, " program headers (1..",
                               limits.max_program_headers, " allowed)"));
  if (!InRange(eh.e_phoff, uint64_t(eh.e_phnum) * sizeof(Elf64_Phdr),
               file.size()))
    return Refuse(absl::StrCat("program headers at ", eh.e_phoff,
                               " run past the end of the ", file.size(),
                               "-byte file"));
  return absl::OkStatus();
}

// One PT_LOAD: its bounds and permissions checked, then added to the plan.
absl::Status AddLoad(const Elf64_Phdr &ph, uint32_t i, uint64_t file_size,
                     const ElfLimits &limits, Plan &plan, bool &executable) {
  if (ph.p_filesz > ph.p_memsz)
    return Refuse(absl::StrCat("segment ", i, ": file size ", ph.p_filesz,
                               " > memory size ", ph.p_memsz));
  if (!InRange(ph.p_offset, ph.p_filesz, file_size))
    return Refuse(absl::StrCat("segment ", i, " at file offset ", ph.p_offset,
                               " (+", ph.p_filesz,
                               ") runs past the end of the ", file_size,
                               "-byte file"));
  if (!InRange(ph.p_vaddr, ph.p_memsz, limits.max_image_bytes))
    return absl::ResourceExhaustedError(absl::StrCat(
        "bad ELF: segment ", i, " at ", ph.p_vaddr, " (+", ph.p_memsz,
        ") exceeds the ", limits.max_image_bytes, "-byte image limit"));
  if ((ph.p_flags & PF_W) && (ph.p_flags & PF_X))
    return Refuse(absl::StrCat("segment ", i,
                               " is both writable and executable"));
  executable |= (ph.p_flags & PF_X) != 0;
  plan.loads.push_back(
      {ph.p_vaddr, ph.p_memsz, ph.p_offset, ph.p_filesz, ph.p_flags});
  plan.span = std::max(plan.span, PageUp(ph.p_vaddr + ph.p_memsz));
  return absl::OkStatus();
}

absl::StatusOr<Plan> ParseHeaders(absl::Span<const uint8_t> file,
                                  const ElfLimits &limits) {
  Elf64_Ehdr eh;
  if (absl::Status s = CheckElfHeader(file, limits, eh); !s.ok())
    return s;

  Plan plan;
  bool executable = false;
  for (uint32_t i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph;
    std::memcpy(&ph, file.data() + eh.e_phoff + i * sizeof ph, sizeof ph);
    switch (ph.p_type) {
    case PT_LOAD:
      if (absl::Status s =
              AddLoad(ph, i, file.size(), limits, plan, executable);
          !s.ok())
        return s;
      break;
    case PT_DYNAMIC:
      if (plan.has_dynamic)
        return Refuse("more than one PT_DYNAMIC");
      plan.has_dynamic = true;
      plan.dynamic_vaddr = ph.p_vaddr;
      plan.dynamic_bytes = ph.p_memsz;
      break;
    case PT_GNU_RELRO:
      plan.has_relro = true;
      plan.relro_vaddr = ph.p_vaddr;
      plan.relro_bytes = ph.p_memsz;
      break;
    case PT_INTERP:
      return Refuse("has an interpreter (PT_INTERP): it must be freestanding");
    case PT_TLS:
      return Refuse("uses thread-local storage (PT_TLS)");
    default:
      break; // PT_NOTE, PT_GNU_STACK, PT_GNU_EH_FRAME, PT_PHDR: not needed
    }
  }
  if (plan.loads.empty() || !executable)
    return Refuse("no executable PT_LOAD segment");
  if (!plan.has_dynamic)
    return Refuse("no PT_DYNAMIC: the entry points cannot be found");
  if (plan.dynamic_bytes % sizeof(Elf64_Dyn) != 0 ||
      !InRange(plan.dynamic_vaddr, plan.dynamic_bytes, plan.span))
    return Refuse("PT_DYNAMIC out of the image");
  return plan;
}

/// The mapped image while it is being checked and relocated.
class Image {
public:
  Image(uint8_t *base, uint64_t span, const Plan &plan)
      : base_(base), span_(span), plan_(plan) {}

  bool Contains(uint64_t vaddr, uint64_t bytes) const {
    return InRange(vaddr, bytes, span_);
  }
  /// True when [vaddr, vaddr+bytes) lies inside one segment with `flag`.
  bool InSegment(uint64_t vaddr, uint64_t bytes, uint32_t flag) const {
    for (const Segment &s : plan_.loads)
      if ((s.flags & flag) && vaddr >= s.vaddr &&
          InRange(vaddr - s.vaddr, bytes, s.memsz))
        return true;
    return false;
  }
  template <typename T> T Read(uint64_t vaddr) const {
    T v;
    std::memcpy(&v, base_ + vaddr, sizeof v);
    return v;
  }
  uint8_t *At(uint64_t vaddr) const { return base_ + vaddr; }

private:
  uint8_t *base_;
  uint64_t span_;
  const Plan &plan_;
};

struct Dynamic {
  uint64_t rela = 0, relasz = 0, relaent = sizeof(Elf64_Rela);
  uint64_t jmprel = 0, pltrelsz = 0, pltrel = DT_RELA;
  uint64_t symtab = 0, strtab = 0, strsz = 0, syment = sizeof(Elf64_Sym);
  uint64_t hash = 0, gnu_hash = 0;
  bool has_hash = false, has_gnu_hash = false, has_symtab = false,
       has_strtab = false;
};

absl::StatusOr<Dynamic> ParseDynamic(const Image &img, const Plan &plan) {
  Dynamic d;
  const uint64_t n = plan.dynamic_bytes / sizeof(Elf64_Dyn);
  for (uint64_t i = 0; i < n; ++i) {
    auto e = img.Read<Elf64_Dyn>(plan.dynamic_vaddr + i * sizeof(Elf64_Dyn));
    const uint64_t v = e.d_un.d_val;
    switch (e.d_tag) {
    case DT_NULL:
      return d;
    case DT_NEEDED:
      return Refuse("needs a shared library (DT_NEEDED): it must be "
                    "self-contained");
    case DT_REL:
    case DT_RELSZ:
      if (v)
        return Refuse("has REL relocations; only RELA R_X86_64_RELATIVE");
      break;
    case DT_TEXTREL:
      return Refuse("has text relocations");
    case DT_INIT:
    case DT_FINI:
      return Refuse("has constructors or destructors (DT_INIT/DT_FINI)");
    case DT_INIT_ARRAYSZ:
    case DT_PREINIT_ARRAYSZ:
    case DT_FINI_ARRAYSZ:
      if (v)
        return Refuse("has constructors or destructors (init/fini arrays)");
      break;
    case DT_RELA: d.rela = v; break;
    case DT_RELASZ: d.relasz = v; break;
    case DT_RELAENT: d.relaent = v; break;
    case DT_JMPREL: d.jmprel = v; break;
    case DT_PLTRELSZ: d.pltrelsz = v; break;
    case DT_PLTREL: d.pltrel = v; break;
    case DT_SYMTAB: d.symtab = v; d.has_symtab = true; break;
    case DT_STRTAB: d.strtab = v; d.has_strtab = true; break;
    case DT_STRSZ: d.strsz = v; break;
    case DT_SYMENT: d.syment = v; break;
    case DT_HASH: d.hash = v; d.has_hash = true; break;
    case DT_GNU_HASH: d.gnu_hash = v; d.has_gnu_hash = true; break;
    default:
      break; // DT_FLAGS, DT_SONAME, DT_RELACOUNT, ...: nothing to do
    }
  }
  return Refuse("dynamic section without DT_NULL");
}

absl::Status ApplyRelocations(const Image &img, uint64_t table, uint64_t bytes,
                              uint64_t entsize, uint64_t base,
                              const ElfLimits &limits, uint64_t *count) {
  if (!bytes)
    return absl::OkStatus();
  if (entsize != sizeof(Elf64_Rela) || bytes % entsize != 0 ||
      !img.Contains(table, bytes))
    return Refuse("relocation table out of the image");
  const uint64_t n = bytes / entsize;
  if (*count + n > limits.max_relocations)
    return Refuse(absl::StrCat("more than ", limits.max_relocations,
                               " relocations"));
  for (uint64_t i = 0; i < n; ++i) {
    auto r = img.Read<Elf64_Rela>(table + i * entsize);
    const uint32_t type = ELF64_R_TYPE(r.r_info);
    if (type == R_X86_64_NONE)
      continue;
    if (type != R_X86_64_RELATIVE)
      return Refuse(absl::StrCat("relocation ", i, " at 0x",
                                 absl::Hex(r.r_offset), " has type ", type,
                                 "; only R_X86_64_RELATIVE is allowed"));
    if (!img.InSegment(r.r_offset, 8, PF_W))
      return Refuse(absl::StrCat("relocation ", i, " targets 0x",
                                 absl::Hex(r.r_offset),
                                 ", outside every writable segment"));
    const uint64_t value = base + static_cast<uint64_t>(r.r_addend);
    std::memcpy(img.At(r.r_offset), &value, sizeof value);
    ++*count;
  }
  return absl::OkStatus();
}

/// Number of .dynsym entries, from DT_HASH or DT_GNU_HASH.
absl::StatusOr<uint64_t> SymbolCount(const Image &img, const Dynamic &d) {
  if (d.has_hash) {
    if (!img.Contains(d.hash, 8))
      return Refuse("DT_HASH out of the image");
    return uint64_t(img.Read<uint32_t>(d.hash + 4)); // nchain
  }
  if (!d.has_gnu_hash)
    return Refuse("no DT_HASH or DT_GNU_HASH: symbols cannot be counted");
  if (!img.Contains(d.gnu_hash, 16))
    return Refuse("DT_GNU_HASH out of the image");
  const uint32_t nbuckets = img.Read<uint32_t>(d.gnu_hash);
  const uint32_t symoffset = img.Read<uint32_t>(d.gnu_hash + 4);
  const uint32_t bloom = img.Read<uint32_t>(d.gnu_hash + 8);
  const uint64_t buckets = d.gnu_hash + 16 + uint64_t(bloom) * 8;
  if (!img.Contains(buckets, uint64_t(nbuckets) * 4))
    return Refuse("DT_GNU_HASH buckets out of the image");
  uint32_t last = 0;
  for (uint32_t b = 0; b < nbuckets; ++b)
    last = std::max(last, img.Read<uint32_t>(buckets + 4ull * b));
  if (last < symoffset)
    return uint64_t(symoffset);
  const uint64_t chain = buckets + uint64_t(nbuckets) * 4;
  for (uint64_t idx = last;; ++idx) {
    const uint64_t at = chain + (idx - symoffset) * 4;
    if (!img.Contains(at, 4))
      return Refuse("DT_GNU_HASH chain out of the image");
    if (img.Read<uint32_t>(at) & 1)
      return idx + 1;
  }
}

struct Entries {
  uint64_t run = 0, step = 0;
};

absl::StatusOr<Entries> FindEntries(const Image &img, const Dynamic &d,
                                    const ElfLimits &limits) {
  if (!d.has_symtab || !d.has_strtab)
    return Refuse("no dynamic symbol table");
  if (d.syment != sizeof(Elf64_Sym))
    return Refuse("unexpected symbol entry size");
  if (!img.Contains(d.strtab, d.strsz))
    return Refuse("string table out of the image");
  absl::StatusOr<uint64_t> n = SymbolCount(img, d);
  if (!n.ok())
    return n.status();
  if (*n > limits.max_symbols)
    return Refuse(absl::StrCat(*n, " symbols (at most ", limits.max_symbols,
                               ")"));
  if (!img.Contains(d.symtab, *n * sizeof(Elf64_Sym)))
    return Refuse("symbol table out of the image");
  Entries out;
  for (uint64_t i = 1; i < *n; ++i) {
    auto sym = img.Read<Elf64_Sym>(d.symtab + i * sizeof(Elf64_Sym));
    if (sym.st_name >= d.strsz)
      return Refuse(absl::StrCat("symbol ", i, " name out of the string table"));
    const char *name = reinterpret_cast<const char *>(img.At(d.strtab)) +
                       sym.st_name;
    const size_t maxLen = d.strsz - sym.st_name;
    const size_t len = strnlen(name, maxLen);
    if (len == maxLen)
      return Refuse(absl::StrCat("symbol ", i, " name is not terminated"));
    const std::string sname(name, len);
    if (sym.st_shndx == SHN_UNDEF) {
      if (!sname.empty())
        return Refuse(absl::StrCat("undefined symbol '", sname,
                                   "': the ELF must not import anything"));
      continue;
    }
    const bool isRun = sname == DUCK_ENTRY_RUN_SYMBOL;
    const bool isStep = sname == DUCK_ENTRY_STEP_SYMBOL;
    if (!isRun && !isStep)
      continue;
    if (ELF64_ST_TYPE(sym.st_info) != STT_FUNC ||
        !img.InSegment(sym.st_value, std::max<uint64_t>(sym.st_size, 1), PF_X))
      return Refuse(absl::StrCat("'", sname,
                                 "' is not a function in an executable "
                                 "segment"));
    (isRun ? out.run : out.step) = sym.st_value;
  }
  if (!out.run || !out.step)
    return Refuse(absl::StrCat("missing entry point ",
                               !out.run ? DUCK_ENTRY_RUN_SYMBOL
                                        : DUCK_ENTRY_STEP_SYMBOL,
                               " in .dynsym"));
  return out;
}

/// Page protections: the union of the segments covering each page.
absl::Status Protect(uint8_t *base, const Plan &plan) {
  const uint64_t pages = plan.span / kPage;
  std::vector<int> prot(pages, PROT_NONE);
  for (const Segment &s : plan.loads) {
    int p = ((s.flags & PF_R) ? PROT_READ : 0) |
            ((s.flags & PF_W) ? PROT_WRITE : 0) |
            ((s.flags & PF_X) ? PROT_EXEC : 0);
    for (uint64_t pg = PageDown(s.vaddr) / kPage;
         pg < PageUp(s.vaddr + s.memsz) / kPage; ++pg)
      prot[pg] |= p;
  }
  if (plan.has_relro) {
    // Read-only after relocation: whole pages inside the RELRO range.
    uint64_t b = PageDown(plan.relro_vaddr),
             e = PageDown(plan.relro_vaddr + plan.relro_bytes);
    for (uint64_t pg = b / kPage; pg < e / kPage && pg < pages; ++pg)
      prot[pg] &= ~PROT_WRITE;
  }
  for (uint64_t pg = 0; pg < pages; ++pg)
    if ((prot[pg] & PROT_WRITE) && (prot[pg] & PROT_EXEC))
      return Refuse(absl::StrCat("page 0x", absl::Hex(pg * kPage),
                                 " would be writable and executable"));
  uint64_t run = 0;
  for (uint64_t pg = 1; pg <= pages; ++pg) {
    if (pg < pages && prot[pg] == prot[run])
      continue;
    if (::mprotect(base + run * kPage, (pg - run) * kPage, prot[run]) != 0)
      return absl::InternalError(
          absl::StrCat("mprotect: ", std::strerror(errno)));
    run = pg;
  }
  return absl::OkStatus();
}

} // namespace

absl::StatusOr<std::unique_ptr<LoadedElf>>
LoadedElf::Load(absl::Span<const uint8_t> file, const ElfLimits &limits) {
  absl::StatusOr<Plan> plan = ParseHeaders(file, limits);
  if (!plan.ok())
    return plan.status();
  void *mem = ::mmap(nullptr, plan->span, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED)
    return absl::ResourceExhaustedError(
        absl::StrCat("mmap of ", plan->span, " bytes: ", std::strerror(errno)));
  std::unique_ptr<LoadedElf> elf(new LoadedElf());
  elf->base_ = static_cast<uint8_t *>(mem);
  elf->span_ = plan->span;
  for (const Segment &s : plan->loads)
    std::memcpy(elf->base_ + s.vaddr, file.data() + s.offset, s.filesz);

  Image img(elf->base_, plan->span, *plan);
  absl::StatusOr<Dynamic> dyn = ParseDynamic(img, *plan);
  if (!dyn.ok())
    return dyn.status();
  if (dyn->pltrelsz && dyn->pltrel != DT_RELA)
    return Refuse("PLT relocations are not RELA");
  const uint64_t base = reinterpret_cast<uint64_t>(elf->base_);
  if (absl::Status s = ApplyRelocations(img, dyn->rela, dyn->relasz,
                                        dyn->relaent, base, limits,
                                        &elf->relocations_);
      !s.ok())
    return s;
  if (absl::Status s =
          ApplyRelocations(img, dyn->jmprel, dyn->pltrelsz, sizeof(Elf64_Rela),
                           base, limits, &elf->relocations_);
      !s.ok())
    return s;
  absl::StatusOr<Entries> entries = FindEntries(img, *dyn, limits);
  if (!entries.ok())
    return entries.status();
  if (absl::Status s = Protect(elf->base_, *plan); !s.ok())
    return s;
  elf->run_ = reinterpret_cast<duck_entry_fn>(elf->base_ + entries->run);
  elf->step_ = reinterpret_cast<duck_entry_fn>(elf->base_ + entries->step);
  return elf;
}

LoadedElf::~LoadedElf() {
  if (base_)
    ::munmap(base_, span_);
}

absl::Status CheckElf(absl::Span<const uint8_t> file, const ElfLimits &limits) {
  return LoadedElf::Load(file, limits).status();
}

} // namespace duck::duckd
