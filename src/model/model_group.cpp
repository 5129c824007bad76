// Model's tensor-parallel parts (model/model.h set_communicator, set_peers): the collectives inside
// a rank's forward, and a group leader driving its peers.
#include <algorithm>

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
  if (!peers_) return forward_rank(batch, P, logits, argmax, topk, masks);
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
    m.forward_rank(theirs[size_t(i)], P, nullptr, nullptr, nullptr, nullptr);
  };
  peers_->start(job);
  forward_rank(batch, P, logits, argmax, topk, masks);
  peers_->join();
}

}  // namespace g4
