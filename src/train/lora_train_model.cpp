#include "train/lora_train_model.h"

#include <algorithm>
#include <cmath>

#include "model/weights.h"
#include "train/dense_ops.h"

namespace g4::train {

int target_count(const Example& ex, int max_len) {
  const int L = std::min<int>(int(ex.tokens.size()), max_len);
  const int first = std::max(ex.offset, 1);
  return std::max(0, L - first);
}

LoraTrainModel::LoraTrainModel(const Model& model, LoraParams& params, std::unique_ptr<GradArith> arith)
    : cfg_(model.config()), p_(params), head_(model.weights().lm_head) {
  const bool device = arith != nullptr;
  auto be = device ? std::make_unique<GradBackend>(std::move(arith)) : std::make_unique<GradBackend>();
  be_ = be.get();
  // The host arithmetic reads `model`'s weights where they are; a device's places them anew.
  ModelWeights w = model.weights();
  if (device) {
    auto placed = load_weights(model.config(), *model.source(), *be_);
    G4_CHECK(placed && "LoraTrainModel: the model's weights could not be placed on the training backend");
    w = std::move(placed).value();
  }
  model_ = std::make_unique<Model>(model.config(), std::move(w), model.source(), std::move(be));
  // The parameters as an adapter of the model's own kind (model/lora.h: a [rank, in], b [out, rank]),
  // its matrices and their gradients in the backend's memory.
  auto ad = std::make_unique<LoraAdapter>();
  const LoraConfig& lc = p_.config();
  ad->path = "(training)";
  ad->rank = lc.rank;
  ad->scale = lc.scale;
  ad->num_layers = lc.num_layers;
  ad->layers.resize(cfg_.layers.size());
  // Every module's a [rank, in] then b [out, rank], back to back, in one buffer; their gradients
  // at the same offsets in another (one copy each way per step).
  size_t total = 0;
  for (const LoraModule& m : p_.modules()) {
    offsets_.push_back(total);
    total += size_t(m.rank) * size_t(m.in) + size_t(m.out) * size_t(m.rank);
  }
  mats_ = be_->alloc_f32(std::max<size_t>(total, 1));
  grads_ = be_->alloc_f32(std::max<size_t>(total, 1));
  be_->zero(mats_, total);
  be_->zero(grads_, total);
  size_t i = 0;
  for (const LoraModule& m : p_.modules()) {
    const size_t a_at = offsets_[i++], b_at = a_at + size_t(m.rank) * size_t(m.in);
    LoraDelta d;
    d.a = f32_view(mats_.f32() + a_at, m.rank, m.in);
    d.b = f32_view(mats_.f32() + b_at, m.out, m.rank);
    d.scale = lc.scale;
    d.dropout = lc.dropout;
    d.id = uint32_t(ad->deltas.size());
    ad->deltas.push_back(d);
    lora_slot(ad->layers[size_t(m.layer)], m.module) = &ad->deltas.back();
    ad->max_out = std::max(ad->max_out, m.out);
    ad->max_in = std::max(ad->max_in, m.in);
    ++ad->modules;
    be_->add_param(d.a.data, grads_.f32() + a_at);
    be_->add_param(d.b.data, grads_.f32() + b_at);
  }
  total_ = total;
  adapter_ = ad.get();
  model_->set_adapter(std::move(ad));
}

LoraTrainModel::~LoraTrainModel() = default;

void LoraTrainModel::sync_adapter() {
  std::vector<float> host(total_);
  size_t i = 0;
  for (const LoraModule& m : p_.modules()) {
    float* a = host.data() + offsets_[i++];
    float* b = a + size_t(m.rank) * size_t(m.in);
    for (int j = 0; j < m.in; ++j)
      for (int r = 0; r < m.rank; ++r) a[size_t(r) * m.in + j] = m.a[size_t(j) * m.rank + r];
    for (int r = 0; r < m.rank; ++r)
      for (int o = 0; o < m.out; ++o) b[size_t(o) * m.rank + r] = m.b[size_t(r) * m.out + o];
  }
  be_->from_host(host.data(), host.size(), mats_);
}

std::vector<float> LoraTrainModel::normed_rows_host(int T) {
  std::vector<float> x(size_t(T) * size_t(cfg_.hidden));
  be_->to_host(model_->normed_rows(), x.size(), x.data());
  return x;
}

std::vector<std::unique_ptr<KvCache>> LoraTrainModel::forward(const std::vector<std::vector<int32_t>>& seqs) {
  std::vector<std::unique_ptr<KvCache>> caches;
  std::vector<SeqInput> batch;
  for (const std::vector<int32_t>& s : seqs) {
    caches.push_back(model_->new_cache());
    batch.push_back(SeqInput{caches.back().get(), s.data(), int(s.size()), true});
  }
  model_->forward_hidden(batch, ActPrecision::F32);
  return caches;
}

SeqLoss LoraTrainModel::run(const std::vector<const Example*>& batch, int max_len, float grad_weight,
                            uint64_t dropout_seed) {
  SeqLoss res;
  // Each sequence with targets contributes L - 1 rows (positions 0 .. L-2), row t predicting
  // token t + 1; the sequences' rows follow each other.
  std::vector<std::vector<int32_t>> seqs;
  std::vector<int32_t> targets;
  for (const Example* ex : batch) {
    const int L = std::min<int>(int(ex->tokens.size()), max_len);
    const int count = target_count(*ex, max_len);
    if (count == 0) continue;
    res.count += count;
    seqs.emplace_back(ex->tokens.begin(), ex->tokens.begin() + (L - 1));
    for (int t = 0; t + 1 < L; ++t) targets.push_back(t + 1 >= ex->offset ? ex->tokens[size_t(t) + 1] : -1);
  }
  if (res.count == 0) return res;
  const bool train = grad_weight != 0.f;
  const int T = int(targets.size());
  sync_adapter();
  model_->set_lora_dropout(train && p_.config().dropout > 0.f ? dropout_seed * 2 + 1 : 0);
  if (train) be_->arm();
  const auto caches = forward(seqs);
  res.sum = be_->head_loss(model_->normed_rows(), T, model_->weights().lm_head, cfg_.final_softcap, targets,
                          grad_weight, train);
  if (!train) return res;
  be_->backward();
  // The delta's gradients [rank, in] / [out, rank] into the parameters' [in, rank] / [rank, out],
  // then cleared.
  std::vector<float> host(total_);
  be_->to_host(grads_, host.size(), host.data());
  be_->zero(grads_, total_);
  size_t i = 0;
  for (LoraModule& m : p_.modules()) {
    const float* ga = host.data() + offsets_[i++];
    const float* gb = ga + size_t(m.rank) * size_t(m.in);
    for (int j = 0; j < m.in; ++j)
      for (int r = 0; r < m.rank; ++r) m.ga[size_t(j) * m.rank + r] += ga[size_t(r) * m.in + j];
    for (int r = 0; r < m.rank; ++r)
      for (int o = 0; o < m.out; ++o) m.gb[size_t(r) * m.out + o] += gb[size_t(o) * m.rank + r];
  }
  return res;
}

std::vector<float> LoraTrainModel::logits(const std::vector<int32_t>& tokens) {
  const int T = int(tokens.size());
  sync_adapter();
  model_->set_lora_dropout(0);
  const auto caches = forward({tokens});
  std::vector<float> z(size_t(T) * cfg_.vocab);
  matmul_wt(normed_rows_host(T).data(), T, head_, z.data());
  if (cfg_.final_softcap > 0)
    for (float& v : z) v = std::tanh(v / cfg_.final_softcap) * cfg_.final_softcap;
  return z;
}

}  // namespace g4::train
