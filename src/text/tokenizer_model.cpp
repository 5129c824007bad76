// Tokenizer models: BPE by merge rank (tokenizers `BPE::merge_word` + `Word::merge_all`) and
// SentencePiece merge-by-score (llama.cpp `llm_tokenizer_spm_session::tokenize`), plus the
// hash tables and the added-token matcher they use.
#include <cstring>
#include <queue>

#include "text/tokenizer_impl.h"
#include "text/utf8.h"

namespace g4::tok {

uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t v;
    std::memcpy(&v, s.data() + i, 8);
    h = mix64(h ^ v);
  }
  uint64_t v = 0;
  std::memcpy(&v, s.data() + i, s.size() - i);
  return mix64(h ^ v ^ (uint64_t(s.size() - i) << 56));
}

void StrIndex::build(const std::vector<std::string>& strings) {
  strings_ = &strings;
  size_t cap = 16;
  while (cap < strings.size() * 2) cap <<= 1;
  slots_.assign(cap, Slot{-1, 0});
  size_t m = cap - 1;
  for (size_t id = 0; id < strings.size(); ++id) {
    if (strings[id].empty()) continue;  // holes in the id space are not findable
    const uint64_t h = hash_bytes(strings[id]);
    const uint32_t tag = uint32_t(h >> 32);
    for (size_t i = h & m;; i = (i + 1) & m) {
      Slot& e = slots_[i];
      if (e.id < 0 || (e.tag == tag && strings[e.id] == strings[id])) {  // duplicates: keep the later id
        e = Slot{int32_t(id), tag};
        break;
      }
    }
  }
}

void MergeTable::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  if (cap > slots_.size()) {
    std::vector<Entry> old = std::move(slots_);
    slots_.assign(cap, Entry{0, 0, -1});
    size_ = 0;
    for (const Entry& e : old)
      if (e.id >= 0) insert(int(e.key >> 32), int(uint32_t(e.key)), e.rank, e.id);
  }
}

void MergeTable::grow() { reserve(slots_.empty() ? 8 : slots_.size()); }

void MergeTable::insert(int left, int right, uint32_t rank, int merged) {
  if ((size_ + 1) * 2 > slots_.size()) grow();
  uint64_t key = (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
  size_t m = slots_.size() - 1, h = mix64(key) & m;
  for (;; h = (h + 1) & m) {
    Entry& e = slots_[h];
    if (e.id < 0) {
      e = Entry{key, rank, merged};
      ++size_;
      return;
    }
    if (e.key == key) {
      e.rank = rank;
      e.id = merged;
      return;
    }
  }
}

void AddedMatcher::add(std::string_view s, int id) {
  if (s.empty()) return;
  int node = 0;
  for (unsigned char b : s) {
    uint64_t key = (uint64_t(node) << 8) | b;
    auto it = edges_.find(key);
    if (it == edges_.end()) {
      int next = int(term_.size());
      term_.push_back(-1);
      edges_.emplace(key, next);
      node = next;
    } else {
      node = it->second;
    }
  }
  term_[node] = id;  // a later token with the same text wins
  first_[static_cast<unsigned char>(s[0])] = true;
}

int AddedMatcher::match_at(std::string_view text, size_t i, size_t* len) const {
  int node = 0, best = -1;
  for (size_t j = i; j < text.size(); ++j) {
    node = child(node, static_cast<unsigned char>(text[j]));
    if (node < 0) break;
    if (term_[node] >= 0) {
      best = term_[node];
      *len = j - i + 1;
    }
  }
  return best;
}

}  // namespace g4::tok

namespace g4 {

int parse_byte_token(std::string_view s) {
  if (s.size() != 6 || s.substr(0, 3) != "<0x" || s[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  int a = hex(s[3]), b = hex(s[4]);
  if (s[3] == '+' && b >= 0) return b;  // Rust's from_str_radix accepts a leading '+'
  if (a < 0 || b < 0) return -1;
  return a * 16 + b;
}

void Tokenizer::Impl::encode_word(std::string_view word, std::vector<int>& out) const {
  if (word.empty()) return;
  if (model == Model::kSpm)
    spm_word(word, out);
  else
    bpe_word(word, out);
}

// tokenizers `BPE::merge_word` (no continuing_subword_prefix / end_of_word_suffix) followed by
// `Word::merge_all` without dropout.
void Tokenizer::Impl::bpe_word(std::string_view w, std::vector<int>& out) const {
  if (ignore_merges) {
    int id = index.find(w);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  struct Sym { int c, prev, next, len; };
  std::vector<Sym> syms;
  syms.reserve(w.size());
  auto add = [&](int c, int len) {
    int n = int(syms.size());
    syms.push_back(Sym{c, n - 1, -1, len});
    if (n > 0) syms[n - 1].next = n;
  };
  int unk_id = -1, unk_len = 0;  // pending (possibly fused) unk
  for (size_t i = 0; i < w.size();) {
    size_t n = utf8::char_len(w, i);
    std::string_view ch = w.substr(i, n);
    i += n;
    int id = index.find(ch);
    if (id >= 0) {
      if (unk_id >= 0) {
        add(unk_id, unk_len);
        unk_id = -1;
      }
      add(id, int(n));
      continue;
    }
    if (byte_fallback) {
      bool all = true;
      for (unsigned char b : ch) all &= byte_ids[b] >= 0;
      if (all) {
        // Note: like tokenizers, a pending unk is not flushed here (it stays pending).
        for (unsigned char b : ch) add(byte_ids[b], 1);
        continue;
      }
    }
    if (unk >= 0) {
      if (unk_id >= 0 && fuse_unk) {
        unk_len += int(n);
      } else {
        if (unk_id >= 0) add(unk_id, unk_len);
        unk_id = unk;
        unk_len = int(n);
      }
    }
  }
  if (unk_id >= 0) add(unk_id, unk_len);

  struct Merge { int pos; uint32_t rank; int new_id; };
  auto worse = [](const Merge& a, const Merge& b) {  // min-heap on (rank, pos)
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  std::vector<Merge> heap_store;
  heap_store.reserve(syms.size());
  std::priority_queue<Merge, std::vector<Merge>, decltype(worse)> queue(worse, std::move(heap_store));
  for (size_t i = 0; i + 1 < syms.size(); ++i)
    if (auto* m = merges.find(syms[i].c, syms[i + 1].c)) queue.push(Merge{int(i), m->rank, m->id});

  while (!queue.empty()) {
    Merge top = queue.top();
    queue.pop();
    Sym& cur = syms[top.pos];
    if (cur.len == 0 || cur.next < 0) continue;
    const int next_pos = cur.next;
    const Sym right = syms[next_pos];
    auto* m = merges.find(cur.c, right.c);
    if (!m || m->id != top.new_id) continue;  // expired entry
    cur.c = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    syms[next_pos].len = 0;
    if (right.next >= 0) syms[right.next].prev = top.pos;
    if (cur.prev >= 0)
      if (auto* pm = merges.find(syms[cur.prev].c, cur.c)) queue.push(Merge{cur.prev, pm->rank, pm->id});
    if (cur.next >= 0)
      if (auto* nm = merges.find(cur.c, syms[cur.next].c)) queue.push(Merge{top.pos, nm->rank, nm->id});
  }
  for (const Sym& s : syms)
    if (s.len != 0) out.push_back(s.c);
}

// llama.cpp `llm_tokenizer_spm_session::tokenize` + `resegment`: merge the adjacent pair whose
// concatenation is a vocabulary token with the highest score (ties: leftmost), until none is left.
// Every merged symbol is a token, so resegmentation only byte-falls-back unknown single chars.
void Tokenizer::Impl::spm_word(std::string_view text, std::vector<int>& out) const {
  struct Sym { const char* text; int n, prev, next; };
  std::vector<Sym> syms;
  syms.reserve(text.size());
  for (size_t offs = 0; offs < text.size();) {
    // llama.cpp uses the lead byte's length (clamped to the text); we use the validated length so
    // that ill-formed input never swallows following characters.
    size_t n = utf8::char_len(text, offs);
    int idx = int(syms.size());
    offs += n;
    syms.push_back(Sym{text.data() + offs - n, int(n), idx - 1, offs == text.size() ? -1 : idx + 1});
  }
  struct Bigram { int left, right; float score; int size; };
  auto lower = [](const Bigram& l, const Bigram& r) {
    return l.score < r.score || (l.score == r.score && l.left > r.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(lower)> queue(lower);
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    std::string_view s(syms[left].text, size_t(syms[left].n + syms[right].n));
    int id = index.find(s);
    if (id < 0) return;
    queue.push(Bigram{left, right, scores.empty() ? 0.f : scores[id], int(s.size())});
  };
  for (int i = 1; i < int(syms.size()); ++i) try_add(i - 1, i);
  while (!queue.empty()) {
    Bigram b = queue.top();
    queue.pop();
    Sym& l = syms[b.left];
    Sym& r = syms[b.right];
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }
  for (int i = syms.empty() ? -1 : 0; i != -1; i = syms[i].next) {
    std::string_view s(syms[i].text, size_t(syms[i].n));
    int id = index.find(s);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    for (unsigned char b : s) {
      if (byte_ids[b] >= 0)
        out.push_back(byte_ids[b]);
      else if (unk >= 0)
        out.push_back(unk);
    }
  }
}

}  // namespace g4
