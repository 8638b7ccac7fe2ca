//===- PrefixStore.cpp - finished sequences' KV caches by token prefix ----===//
#include "duck/runtime/serve/PrefixStore.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

namespace duck::runtime {

PrefixStore::PrefixStore(uint64_t budget_bytes, uint64_t bytes_per_token,
                         uint32_t page_tokens)
    : budget_(budget_bytes), bpt_(bytes_per_token),
      page_tokens_(std::max(1u, page_tokens)),
      page_bytes_(page_tokens_ * bytes_per_token) {}

PrefixStore::~PrefixStore() = default;

PrefixStore::Page PrefixStore::NewPage() {
  bytes_ += page_bytes_;
  // Not zeroed: every row is written before a node that covers it exists.
  return Page(new uint8_t[page_bytes_], [this](uint8_t *p) {
    delete[] p;
    bytes_ -= page_bytes_;
  });
}

uint8_t *PrefixStore::Row(const Node *n, uint32_t p) const {
  const uint64_t page = p / page_tokens_ - n->depth / page_tokens_;
  return n->pages[page].get() + (p % page_tokens_) * bpt_;
}

uint32_t PrefixStore::Walk(absl::Span<const int32_t> tokens, Node **last,
                           uint32_t *partial) const {
  const Node *n = &root_;
  uint32_t i = 0;
  *partial = 0;
  while (i < tokens.size()) {
    auto it = n->children.find(tokens[i]);
    if (it == n->children.end())
      break;
    const Node *c = it->second.get();
    const size_t most = std::min(c->key.size(), tokens.size() - i);
    uint32_t k = 0;
    while (k < most && c->key[k] == tokens[i + k])
      ++k;
    i += k;
    n = c;
    if (k < c->key.size()) {
      *partial = k;
      break;
    }
  }
  *last = const_cast<Node *>(n);
  return i;
}

void PrefixStore::SetLeaf(Node *n, bool leaf) {
  if (leaf)
    leaves_.emplace(n->used, n);
  else
    leaves_.erase({n->used, n});
}

void PrefixStore::Touch(Node *n, uint64_t tick) {
  for (; n && n != &root_; n = n->parent) {
    const bool leaf = n->children.empty();
    if (leaf)
      SetLeaf(n, false);
    n->used = tick;
    if (leaf)
      SetLeaf(n, true);
  }
}

uint32_t PrefixStore::Find(absl::Span<const int32_t> tokens) {
  if (!enabled())
    return 0;
  Node *last = nullptr;
  uint32_t partial = 0;
  const uint32_t n = Walk(tokens, &last, &partial);
  Touch(last, ++tick_);
  return n;
}

void PrefixStore::Read(absl::Span<const int32_t> tokens, uint32_t from,
                       uint32_t to, const LoadRows &load) const {
  const Node *n = &root_;
  uint32_t i = 0;
  while (i < to && i < tokens.size()) {
    auto it = n->children.find(tokens[i]);
    if (it == n->children.end())
      return;
    n = it->second.get();
    const uint32_t edge = i + (uint32_t)n->key.size();
    const uint32_t end = std::min<uint32_t>(to, edge);
    uint32_t k = i; // past the stored prefix (a caller's bug) it stops
    while (k < end && k < tokens.size() && n->key[k - i] == tokens[k])
      ++k;
    // A piece a page.
    for (uint32_t p = std::max(from, i); p < k;) {
      const uint32_t stop = (uint32_t)std::min<uint64_t>(
          k, (p / page_tokens_ + 1) * page_tokens_);
      load(p, stop - p, Row(n, p));
      p = stop;
    }
    if (k < edge)
      return;
    i = k;
  }
}

PrefixStore::Node *PrefixStore::Split(Node *n, uint32_t k) {
  Node *parent = n->parent;
  auto upper = std::make_unique<Node>();
  upper->key.assign(n->key.begin(), n->key.begin() + k);
  // The pages of [depth, q) and of [q, end): the one q is in, if q is not
  // its first position, goes to both.
  const uint64_t q = n->depth + k, first = n->depth / page_tokens_;
  upper->pages.assign(n->pages.begin(),
                      n->pages.begin() + ((q - 1) / page_tokens_ - first + 1));
  upper->parent = parent;
  upper->depth = n->depth;
  upper->used = n->used;
  n->key.erase(n->key.begin(), n->key.begin() + k);
  n->pages.erase(n->pages.begin(),
                 n->pages.begin() + (q / page_tokens_ - first));
  n->depth += k;
  n->parent = upper.get();
  std::unique_ptr<Node> &slot = parent->children[upper->key[0]];
  Node *u = upper.get();
  u->children[n->key[0]] = std::move(slot);
  slot = std::move(upper);
  ++entries_;
  return u;
}

bool PrefixStore::MakeRoom(uint64_t need, uint64_t tick) {
  while (bytes_ + need > budget_) {
    if (leaves_.empty() || leaves_.begin()->first >= tick)
      return false;
    Node *victim = leaves_.begin()->second;
    leaves_.erase(leaves_.begin());
    Node *parent = victim->parent;
    tokens_ -= victim->key.size();
    evicted_ += victim->key.size();
    --entries_;
    const int32_t first = victim->key[0]; // erase destroys the victim
    parent->children.erase(first);
    if (parent != &root_ && parent->children.empty())
      SetLeaf(parent, true);
  }
  return true;
}

void PrefixStore::Insert(absl::Span<const int32_t> tokens, const SaveRows &save,
                         absl::Span<const int32_t> keep) {
  if (!enabled() || tokens.empty())
    return;
  const uint64_t tick = ++tick_;
  Node *last = nullptr;
  uint32_t partial = 0;
  if (!keep.empty()) {
    Walk(keep, &last, &partial);
    Touch(last, tick);
  }
  const uint32_t have = Walk(tokens, &last, &partial);
  Touch(last, tick);
  if (have >= tokens.size())
    return;
  // Pages of its own from the page `have` is in.
  const uint64_t firstPage = have / page_tokens_;
  const auto pagesFor = [&](uint64_t n) {
    return (have + n + page_tokens_ - 1) / page_tokens_ - firstPage;
  };
  uint64_t n = tokens.size() - have;
  if (!MakeRoom(pagesFor(n) * page_bytes_, tick)) {
    // As many positions as the pages that fit now hold.
    const uint64_t pages =
        bytes_ < budget_ ? (budget_ - bytes_) / page_bytes_ : 0;
    n = pages ? std::min(n, (firstPage + pages) * page_tokens_ - have) : 0;
  }
  if (n == 0)
    return;
  if (partial)
    last = Split(last, partial);
  auto leaf = std::make_unique<Node>();
  leaf->key.assign(tokens.begin() + have, tokens.begin() + have + n);
  leaf->parent = last;
  leaf->depth = have;
  leaf->used = tick;
  for (uint64_t i = pagesFor(n); i-- > 0;)
    leaf->pages.push_back(NewPage());
  for (uint64_t p = have; p < have + n;) {
    const uint64_t stop =
        std::min(have + n, (p / page_tokens_ + 1) * page_tokens_);
    save((uint32_t)p, (uint32_t)(stop - p), Row(leaf.get(), (uint32_t)p));
    p = stop;
  }
  if (last != &root_ && last->children.empty())
    SetLeaf(last, false);
  SetLeaf(leaf.get(), true);
  last->children[leaf->key[0]] = std::move(leaf);
  tokens_ += n;
  ++entries_;
}

PrefixStoreStats PrefixStore::stats() const {
  PrefixStoreStats s;
  s.budget = budget_;
  s.bytes = bytes_;
  s.tokens = tokens_;
  s.entries = entries_;
  s.evicted_tokens = evicted_;
  return s;
}

bool ParseByteSize(const std::string &text, uint64_t *out) {
  const char *s = text.c_str();
  char *end = nullptr;
  const double v = std::strtod(s, &end);
  if (end == s || !std::isfinite(v) || v < 0 ||
      !std::isdigit((unsigned char)*s))
    return false;
  std::string unit(end);
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char c) { return (char)std::tolower(c); });
  double scale = 1;
  static const std::pair<const char *, double> kUnits[] = {
      {"k", 1024.0},
      {"m", 1048576.0},
      {"g", 1073741824.0},
      {"t", 1099511627776.0}};
  if (!unit.empty() && unit != "b") {
    bool found = false;
    for (const auto &[name, mult] : kUnits)
      if (unit == name || unit == std::string(name) + "b" ||
          unit == std::string(name) + "ib") {
        scale = mult;
        found = true;
      }
    if (!found)
      return false;
  }
  const double bytes = v * scale;
  if (bytes >= 18446744073709551615.0)
    return false;
  *out = (uint64_t)bytes;
  return true;
}

} // namespace duck::runtime
