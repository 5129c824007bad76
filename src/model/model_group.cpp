// Model's tensor-parallel parts (model/model.h set_communicator, set_peers): the collectives inside
// a rank's forward, and a group leader driving its peers.
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "core/shard_range.h"
#include "model/model.h"
#include "model/model_scratch.h"

namespace g4 {

void Model::set_communicator(Communicator* comm) {
  comm_ = comm;
  vocab_max_ = 0;
  if (!comm) return;
  auto r = shard_range(cfg_.vocab, 1, 0, comm->size(), "vocabulary");  // rank 0 holds the most rows
  G4_CHECK(r && "Model::set_communicator: fewer vocabulary rows than ranks");
  vocab_max_ = r.value().size();
  G4_CHECK(s_->logit_rows == 0 && "Model::set_communicator: call it before the first forward");
}

void Model::all_reduce(const Buf& y, size_t n) {
  if (comm_) be_->all_reduce(*comm_, y, n);
}

void Model::gather_logits(int LR) {
  Scratch& S = *s_;
  const int n = comm_->size(), V = cfg_.vocab;
  const size_t part = size_t(LR) * size_t(vocab_max_);  // each rank's [LR, its rows], padded
  be_->all_gather(*comm_, S.lpart, part, S.lgather);
  // Rank r's block holds [LR, Vr] contiguously; it becomes columns [v0, v0 + Vr) of every row.
  for (int r = 0; r < n; ++r) {
    const ShardRange v = shard_range(V, 1, r, n, "vocabulary").value();
    be_->place_cols(S.lgather.at(int64_t(size_t(r) * part)), LR, int(v.size()), S.logits, V, int(v.begin));
  }
}

void Model::gather_picks(int LR, int k) {
  Scratch& S = *s_;
  be_->top_k(S.lpart, LR, int(w_.lm_head.rows), k, S.pk_vals, S.pk_ids, S.pk_lse);
  const size_t n = size_t(LR) * size_t(k);
  be_->all_gather(*comm_, S.pk_vals, n, S.gk_vals);
  be_->all_gather(*comm_, S.pk_ids, n, S.gk_ids);
  be_->all_gather(*comm_, S.pk_lse, size_t(LR), S.gk_lse);
}

int Model::shard_pick_k(const float* logits, const int32_t* argmax, const TopK* topk, const TokenMasks* masks) const {
  if (!comm_ || logits || (masks && masks->count > 0) || (!argmax && !topk)) return 0;
  const int k = topk ? topk->k : 1;
  const int64_t smallest = cfg_.vocab / comm_->size();  // every shard holds at least this many rows
  return k >= 1 && k <= 1024 && k <= smallest ? k : 0;
}

void Model::combine_picks(int LR, int LR_out, int k, int32_t* argmax, const TopK* topk) {
  Scratch& S = *s_;
  const int n = comm_->size();
  const size_t per = size_t(LR) * size_t(k);
  std::vector<float> vals(per * size_t(n)), lse(size_t(LR) * size_t(n));
  std::vector<int32_t> ids(per * size_t(n));
  be_->to_host(S.gk_vals, vals.size(), vals.data());
  be_->to_host(S.gk_ids, ids.size(), ids.data());
  be_->to_host(S.gk_lse, lse.size(), lse.data());
  std::vector<int64_t> v0(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) v0[size_t(r)] = shard_range(cfg_.vocab, 1, r, n, "vocabulary").value().begin;
  // A candidate ranks before another with a larger value, or an equal one and a lower token id
  // (argmax: the first largest; top_k: the lowest ids at the k-th); NaN ranks last (as -inf).
  auto key = [](float v) { return std::isnan(v) ? -std::numeric_limits<float>::infinity() : v; };
  std::vector<std::pair<float, int32_t>> cand(size_t(n) * size_t(k));
  for (int i = 0; i < LR_out; ++i) {
    for (int r = 0; r < n; ++r)
      for (int j = 0; j < k; ++j) {
        const size_t at = size_t(r) * per + size_t(i) * size_t(k) + size_t(j);
        cand[size_t(r) * size_t(k) + size_t(j)] = {vals[at], int32_t(v0[size_t(r)] + ids[at])};
      }
    std::partial_sort(cand.begin(), cand.begin() + k, cand.end(), [&](const auto& a, const auto& b) {
      return key(a.first) != key(b.first) ? key(a.first) > key(b.first) : a.second < b.second;
    });
    if (argmax) argmax[i] = cand[0].second;
    if (!topk) continue;
    for (int j = 0; j < k; ++j) {
      topk->vals[size_t(i) * size_t(k) + size_t(j)] = cand[size_t(j)].first;
      topk->ids[size_t(i) * size_t(k) + size_t(j)] = cand[size_t(j)].second;
    }
    // log Σ exp over the row = log Σ_r exp(lse_r): the shards' sums combined.
    float m = -std::numeric_limits<float>::infinity();
    for (int r = 0; r < n; ++r) m = std::max(m, lse[size_t(r) * size_t(LR) + size_t(i)]);
    double acc = 0;
    for (int r = 0; r < n && std::isfinite(m); ++r) acc += std::exp(double(lse[size_t(r) * size_t(LR) + size_t(i)]) - m);
    topk->lse[i] = std::isfinite(m) ? m + float(std::log(acc)) : m;
  }
}

void Model::set_peers(std::unique_ptr<ModelPeers> peers) {
  G4_CHECK(comm_ && comm_->rank() == 0 && peers && peers->count() == comm_->size() - 1 &&
           "Model::set_peers: the leader is rank 0 of a group of its peers and itself");
  peers_ = std::move(peers);
  if (kv_pool_) set_kv_pool(kv_pool_);
  if (pad_cache_) set_decode_padding(true);
}

Result<std::unique_ptr<LoraAdapter>> Model::load_adapter(const std::string& dir) {
  if (!peers_) return load_lora_adapter(dir, cfg_, *be_);
  return peers_->load_adapter(dir, *this);
}

void Model::release_adapter(LoraAdapter& a) {
  for (size_t i = 0; peers_ && i < a.peers.size(); ++i)
    if (a.peers[i]) release_lora_adapter(*a.peers[i], peers_->peer(int(i)).backend());
  release_lora_adapter(a, *be_);
}

std::unique_ptr<KvCache> Model::new_cache() {
  auto c = std::make_unique<KvCache>(cfg_, *be_, kv_opt_, kv_pool_);
  for (int i = 0; peers_ && i < peers_->count(); ++i) c->add_peer(peers_->peer(i).new_cache());
  return c;
}

void Model::forward(const std::vector<SeqInput>& batch, ActPrecision P, float* logits, int32_t* argmax,
                    const TopK* topk, const TokenMasks* masks) {
  const int pick_k = shard_pick_k(logits, argmax, topk, masks);
  if (!peers_) return forward_rank(batch, P, logits, argmax, topk, masks, pick_k);
  std::vector<std::vector<SeqInput>> theirs(static_cast<size_t>(peers_->count()), batch);
  for (size_t i = 0; i < theirs.size(); ++i)
    for (size_t s = 0; s < batch.size(); ++s) {
      G4_CHECK(batch[s].cache->peers() == theirs.size() && "Model::forward: a cache not made by this group");
      theirs[i][s].cache = batch[s].cache->peer(i);
      // The peers hold no adapter of their own: each row's adapter (or the leader's) as its shard.
      const LoraAdapter* a = batch[s].adapter ? batch[s].adapter : lora_.get();
      G4_CHECK((!a || a->peers.size() == theirs.size()) && "Model::forward: an adapter not loaded by this group");
      theirs[i][s].adapter = a ? a->peers[i].get() : nullptr;
    }
  // The outputs are the leader's; the peers compute the same collectives (the logits' gather
  // included) and drop theirs.
  const std::function<void(int, Model&)> job = [&](int i, Model& m) {
    m.forward_rank(theirs[size_t(i)], P, nullptr, nullptr, nullptr, nullptr, pick_k);
  };
  peers_->start(job);
  forward_rank(batch, P, logits, argmax, topk, masks, pick_k);
  peers_->join();
}

}  // namespace g4
