//===- PrefixStore.h - finished sequences' KV caches by token prefix -*- C++
//-*-===//
//
// duckrun serve's prefix store (--kv-budget): the KV cache rows of
// sequences whose slot was given to another prompt, kept in a radix tree
// over token ids (SGLang's RadixCache: an edge is a run of tokens, a node
// holds the cache rows of its edge's positions) so that a later prompt
// sharing a prefix with any of them finds the longest one, token by token,
// and copies those rows into its slot instead of computing them. A row
// depends only on its token and the rows before it, so the rows found are
// the very rows a cold prefill would compute.
//
// Rows live in pages of `page_tokens` positions (bytes_per_token a
// position, every attention cache of the engine together), aligned to
// positions (page i: positions i x page_tokens on), so that splitting an
// edge copies nothing: the two halves share the page they meet in. A new
// branch starts a page of its own (the positions before it in that page
// stay unused). The store holds at most `budget` bytes of pages; inserting
// past it evicts whole leaves, least recently used first (a node's use is
// the last Find or Insert whose path went through it; a page goes when no
// node uses it), and a sequence that does not fit even then is stored as
// far as it does. A budget under one page disables the store. Not
// thread-safe: the batcher's thread owns it.
//===----------------------------------------------------------------------===//
#ifndef DUCK_RUNTIME_PREFIXSTORE_H
#define DUCK_RUNTIME_PREFIXSTORE_H

#include "absl/types/span.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace duck::runtime {

struct PrefixStoreStats {
  uint64_t budget = 0;         // bytes
  uint64_t bytes = 0;          // pages held (page_tokens positions each)
  uint64_t tokens = 0;         // positions held
  uint64_t entries = 0;        // radix tree nodes (edges)
  uint64_t evicted_tokens = 0; // positions evicted so far
};

class PrefixStore {
public:
  /// Fills `n` positions' rows, from position `pos` of the sequence being
  /// stored, into `out` (n x bytes_per_token bytes, position-major); asked
  /// once a page or part of one.
  using SaveRows = std::function<void(uint32_t pos, uint32_t n, uint8_t *out)>;
  /// Takes `n` positions' rows, for position `pos` on, from `in`.
  using LoadRows =
      std::function<void(uint32_t pos, uint32_t n, const uint8_t *in)>;

  static constexpr uint32_t kPageTokens = 16;
  PrefixStore(uint64_t budget_bytes, uint64_t bytes_per_token,
              uint32_t page_tokens = kPageTokens);
  ~PrefixStore();
  PrefixStore(const PrefixStore &) = delete;
  PrefixStore &operator=(const PrefixStore &) = delete;

  /// False when the budget holds not even one page.
  bool enabled() const { return bpt_ > 0 && budget_ >= page_bytes_; }

  /// The length of the longest stored prefix of `tokens` (0 when
  /// disabled); its nodes count as used now.
  uint32_t Find(absl::Span<const int32_t> tokens);
  /// Hands the stored rows of positions [from, to) of `tokens` to `load`
  /// (in one or more pieces, in order); `to` at most Find(tokens).
  void Read(absl::Span<const int32_t> tokens, uint32_t from, uint32_t to,
            const LoadRows &load) const;
  /// Stores `tokens`'s rows: `save` is asked only for the positions not
  /// held yet. Evicts least recently used leaves to stay within the
  /// budget, never the prefixes of `tokens` or of `keep` (a prompt about
  /// to be Read); stores only as many positions as fit then.
  void Insert(absl::Span<const int32_t> tokens, const SaveRows &save,
              absl::Span<const int32_t> keep = {});

  PrefixStoreStats stats() const;

private:
  using Page = std::shared_ptr<uint8_t>; // page_tokens x bpt_ bytes
  struct Node {
    std::vector<int32_t> key; // the edge's tokens
    /// The pages of its positions, the first holding position `depth`.
    std::vector<Page> pages;
    std::map<int32_t, std::unique_ptr<Node>> children; // by first token
    Node *parent = nullptr;
    uint32_t depth = 0; // positions before the edge
    uint64_t used = 0;  // tick of the last use
  };
  /// The row of position `p` (in n's edge).
  uint8_t *Row(const Node *n, uint32_t p) const;
  /// A new page (its bytes counted until the last node using it goes).
  Page NewPage();
  /// Walks the longest stored prefix of `tokens`: its length, and the
  /// deepest node reached (the last one may match only part of its edge,
  /// `*partial` then says how much; 0: whole).
  uint32_t Walk(absl::Span<const int32_t> tokens, Node **last,
                uint32_t *partial) const;
  /// Marks the path from the root to `n` used at `tick`.
  void Touch(Node *n, uint64_t tick);
  /// Splits `n`'s edge after `k` tokens; returns the new upper node.
  Node *Split(Node *n, uint32_t k);
  /// Evicts least recently used leaves used before `tick` until `need`
  /// more bytes fit; false when they cannot.
  bool MakeRoom(uint64_t need, uint64_t tick);
  void SetLeaf(Node *n, bool leaf);

  uint64_t budget_, bpt_, page_tokens_, page_bytes_;
  uint64_t tick_ = 0;
  uint64_t bytes_ = 0, tokens_ = 0, entries_ = 0, evicted_ = 0;
  Node root_; // after bytes_: its pages' deleters count down bytes_
  std::set<std::pair<uint64_t, Node *>> leaves_; // (used, node), LRU first
};

/// "2GiB", "512MiB", "1.5G", "100000" (bytes) into bytes; false when the
/// text is not a size (units: K, M, G, T with or without "iB", powers of
/// 1024; "B" or none: bytes).
bool ParseByteSize(const std::string &text, uint64_t *out);

} // namespace duck::runtime

#endif
