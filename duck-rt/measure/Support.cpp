//===- Support.cpp - Clock, memory, random numbers (Support.h) ------------===//
#include "Support.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace duck::bench {

double nowSeconds() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

Buffer::Buffer(uint64_t bytes) {
  if (bytes == 0)
    return;
  const uint64_t page = 4096;
  uint64_t size = (bytes + page - 1) / page * page;
  void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::fprintf(stderr, "duck-bench: cannot allocate %llu bytes\n",
                 (unsigned long long)size);
    std::exit(1);
  }
#ifdef MADV_HUGEPAGE
  madvise(p, size, MADV_HUGEPAGE); // fewer TLB misses when streaming
#endif
  std::memset(p, 0, size); // fault every page in now, not while timing
  data_ = static_cast<uint8_t *>(p);
  size_ = size;
}

Buffer::~Buffer() {
  if (data_)
    munmap(data_, size_);
}

Buffer::Buffer(Buffer &&other) noexcept
    : data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

Buffer &Buffer::operator=(Buffer &&other) noexcept {
  if (this != &other) {
    if (data_)
      munmap(data_, size_);
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

} // namespace duck::bench
