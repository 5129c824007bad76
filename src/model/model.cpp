#include "model/model.h"
#include "model/model_scratch.h"

#include "core/token_mask.h"

#include <algorithm>
#include <cmath>

#include "model/drafter.h"
#include "model/expert_trace.h"

namespace g4 {

Model::Model(ModelConfig cfg, ModelWeights w, std::shared_ptr<const WeightSource> src,
             std::unique_ptr<Backend> be)
    : cfg_(std::move(cfg)), w_(std::move(w)), src_(std::move(src)), be_(std::move(be)),
      s_(std::make_unique<Scratch>()) {
  for (const LayerSpec& ls : cfg_.layers) rope_.push_back(make_rope_table(ls.rope, ls.head_dim));
  for (int l = 0; l < int(cfg_.layers.size()); ++l)
    if (cfg_.layers[size_t(l)].moe) moe_layers_.push_back(l);
}

Model::~Model() = default;  // buffers are owned (and freed) by the backend

void Model::set_drafter(std::unique_ptr<Drafter> d) { drafter_ = std::move(d); }

void Model::set_expert_trace(std::shared_ptr<ExpertTrace> t) {
  trace_ = std::move(t);
  if (trace_) pad_cache_.reset();  // a trace records every row: no pad rows
}

void Model::record_experts(const std::vector<SeqInput>& batch, int R) {
  const size_t n = moe_layers_.size() * size_t(R) * size_t(cfg_.top_k_experts);
  std::vector<int32_t> idx(n);
  std::vector<float> w(n);
  be_->to_host(s_->tr_idx, n, idx.data());
  be_->to_host(s_->tr_w, n, w.data());
  std::vector<ExpertTrace::Row> rows;
  rows.reserve(size_t(R));
  for (size_t i = 0; i < batch.size(); ++i)
    for (int t = 0; t < batch[i].n; ++t) rows.push_back({int(i), batch[i].cache->size() + t, batch[i].tokens[t]});
  trace_->record(cfg_.n_experts, cfg_.top_k_experts, moe_layers_, rows, idx.data(), w.data());
}

const Buf& Model::normed_rows() const { return s_->last; }

int image_block_chunk_end(const ModelConfig& c, const int32_t* tokens, int n, int end) {
  if (!c.bidi_images || end <= 0 || end >= n) return end;
  while (end < n && tokens[end - 1] == c.image_token && tokens[end] == c.image_token) ++end;
  return end;
}

void Model::set_adapter(std::unique_ptr<LoraAdapter> a) {
  lora_ = std::move(a);
  be_->free(s_->lora_t);
  be_->free(s_->lora_z);
  s_->lora_t = s_->lora_z = Buf();
  s_->lora_rows = s_->lora_rank = s_->lora_out = 0;
}

void Model::set_lora_runs(const std::vector<SeqInput>& batch) {
  lora_runs_.clear();
  int row = 0;
  for (const SeqInput& s : batch) {
    const LoraAdapter* a = s.adapter ? s.adapter : lora_.get();
    if (a && !lora_runs_.empty() && lora_runs_.back().adapter == a && lora_runs_.back().row0 + lora_runs_.back().rows == row)
      lora_runs_.back().rows += s.n;
    else if (a)
      lora_runs_.push_back(AdapterRun{row, s.n, a});
    row += s.n;
  }
}

const LoraApply* Model::lora(int l, LoraModule m) {
  static constexpr LoraModule kSlots[] = {&LayerLora::q,    &LayerLora::k,  &LayerLora::v,
                                          &LayerLora::o,    &LayerLora::gate, &LayerLora::up,
                                          &LayerLora::down, &LayerLora::ple_gate, &LayerLora::ple_proj};
  size_t slot = 0;
  while (kSlots[slot] != m) ++slot;
  LoraApply& a = lora_apply_[slot];
  a.runs.clear();
  for (const AdapterRun& r : lora_runs_)
    if (const LoraDelta* d = r.adapter->layers[size_t(l)].*m) a.runs.push_back(LoraRun{r.row0, r.rows, d});
  if (a.runs.empty()) return nullptr;
  const Scratch& S = *s_;
  a.t = S.lora_t;
  a.z = S.lora_z;
  a.xd = S.lora_x;
  a.dropout_seed = lora_dropout_seed_;
  return &a;
}

void Model::matmul_norm_add(const Buf& x, int M, const WeightView& W, const LoraApply* lora, const Buf& y_scratch,
                            const float* norm_w, ActPrecision P, bool row_parallel, const char* tap_proj, int l) {
  Backend& be = *be_;
  const Buf& resid = s_->x;
  const size_t n = size_t(M) * size_t(W.rows);
  if (!(row_parallel && comm_)) {
    if (tap_ && tap_proj) {  // beside the fused op: the projection alone (y_scratch is the op's scratch)
      be.linear(x, M, W, lora, P, y_scratch);
      tap(tap_proj, l, y_scratch, n);
    }
    return be.matmul_norm_add(x, M, W, y_scratch, resid, norm_w, cfg_.rms_eps, P, lora);
  }
  be.linear(x, M, W, lora, P, y_scratch);
  all_reduce(y_scratch, n);
  if (tap_proj) tap(tap_proj, l, y_scratch, n);  // a collective beside the op would not match the other ranks'
  be.norm_add(resid, y_scratch, M, cfg_.hidden, norm_w, cfg_.rms_eps, P);
}

Status Model::set_kv_options(const KvCacheOptions& opt) {
  G4_TRY(validate_kv_options(opt, cfg_, *be_));
  for (int i = 0; peers_ && i < peers_->count(); ++i) G4_TRY(peers_->peer(i).set_kv_options(opt));
  kv_opt_ = opt;
  if (pad_cache_) set_decode_padding(true);  // the pad cache takes the new options
  return Status::ok();
}

void Model::set_kv_pool(std::shared_ptr<KvPool> pool) {
  for (int i = 0; peers_ && i < peers_->count(); ++i) {  // a pool of the same blocks for each peer
    Model& m = peers_->peer(i);
    m.set_kv_pool(!pool ? nullptr
                        : std::make_shared<KvPool>(m.config(), m.backend(), pool->block(),
                                                   std::array<int64_t, KvPool::kGroups>{
                                                       pool->total_blocks(KvPool::kFull),
                                                       pool->total_blocks(KvPool::kSliding)},
                                                   pool->max_positions()));
  }
  kv_pool_ = std::move(pool);
  if (pad_cache_) set_decode_padding(true);  // and the new storage
}

bool Model::set_decode_padding(bool on) {
  pad_cache_.reset();
  std::unique_ptr<KvCache> c;
  bool ok = on && !trace_;
  if (ok) {
    c = std::make_unique<KvCache>(cfg_, *be_, kv_opt_, kv_pool_);  // this rank's alone
    if (c->paged()) ok = c->reserve(1);  // a block a group from the pool
    else c->fix_capacity(1);              // one slot a layer: it only ever holds position 0
  }
  for (int i = 0; peers_ && i < peers_->count(); ++i) ok = peers_->peer(i).set_decode_padding(ok) && ok;
  if (!ok) {  // every rank pads, or none
    for (int i = 0; peers_ && i < peers_->count(); ++i) peers_->peer(i).set_decode_padding(false);
    return false;
  }
  pad_cache_ = std::move(c);
  pad_token_ = cfg_.pad_id;
  return true;
}

int Model::decode_bucket(int rows) {
  const int step = rows <= 8 ? 1 : rows <= 64 ? 8 : rows <= 256 ? 32 : 64;
  return (rows + step - 1) / step * step;
}

const std::vector<SeqInput>& Model::pad_to_bucket(const std::vector<SeqInput>& batch, std::vector<SeqInput>* padded) {
  if (!pad_cache_ || trace_) return batch;
  for (const SeqInput& s : batch)
    if (s.n != 1 || s.all_logits || s.soft) return batch;
  const int rows = int(batch.size()), bucket = decode_bucket(rows);
  if (bucket == rows) return batch;
  *padded = batch;
  padded->resize(size_t(bucket), SeqInput{pad_cache_.get(), &pad_token_, 1, false});
  return *padded;
}

int Model::logit_rows(const std::vector<SeqInput>& batch) {
  int n = 0;
  for (const SeqInput& s : batch) n += s.all_logits ? s.n : 1;
  return n;
}

void Model::ensure_scratch(int rows, int lrows, int top_k, int masks, bool head, int pick_k) {
  Scratch& s = *s_;
  if (comm_ && pick_k > 0 && (lrows > s.pk_rows || pick_k > s.pk_k)) {
    for (const Buf& p : {s.pk_vals, s.pk_ids, s.pk_lse, s.gk_vals, s.gk_ids, s.gk_lse}) be_->free(p);
    s.pk_rows = std::max(lrows, s.pk_rows);
    s.pk_k = std::max(pick_k, s.pk_k);
    const size_t n = size_t(comm_->size()), rk = size_t(s.pk_rows) * size_t(s.pk_k);
    s.pk_vals = be_->alloc_f32(rk);
    s.pk_ids = be_->alloc_i32(rk);
    s.pk_lse = be_->alloc_f32(size_t(s.pk_rows));
    s.gk_vals = be_->alloc_f32(n * rk);
    s.gk_ids = be_->alloc_i32(n * rk);
    s.gk_lse = be_->alloc_f32(n * size_t(s.pk_rows));
  }
  if (masks > s.allow_rows) {
    be_->free(s.allow);
    be_->free(s.allow_ids);
    s.allow = be_->alloc_i32(size_t(masks) * size_t(token_mask_words(cfg_.vocab)));
    s.allow_ids = be_->alloc_i32(size_t(masks));
    s.allow_rows = masks;
  }
  if (rows > s.rows) {
    Backend& be = *be_;
    for (const Buf& p : {s.x, s.xn, s.q, s.k, s.v, s.att, s.o, s.gate, s.up, s.f, s.h1, s.h2, s.xr, s.ple, s.ple_tok,
                         s.ple_idx, s.pg, s.scores, s.rw, s.ids, s.ridx})
      be.free(p);
    const size_t R = size_t(rows), d = size_t(cfg_.hidden);
    size_t qw = 0, kw = 0, iw = 0;
    for (const LayerSpec& ls : cfg_.layers) {
      qw = std::max(qw, size_t(cfg_.n_heads) * ls.head_dim);
      kw = std::max(kw, size_t(ls.n_kv_heads) * ls.head_dim);
      iw = std::max(iw, size_t(ls.mlp_width));
    }
    const size_t np = size_t(cfg_.n_layers) * size_t(cfg_.ple_width);
    s.x = be.alloc_act(R * d); s.xn = be.alloc_act(R * d); s.o = be.alloc_act(R * d); s.f = be.alloc_act(R * d);
    s.h1 = be.alloc_act(R * d); s.h2 = be.alloc_act(R * d); s.xr = be.alloc_act(cfg_.n_experts > 0 ? R * d : 1);
    s.q = be.alloc_act(R * qw); s.att = be.alloc_act(R * qw);
    s.k = be.alloc_act(R * kw); s.v = be.alloc_act(R * kw);
    s.gate = be.alloc_act(R * std::max<size_t>(iw, 1)); s.up = be.alloc_act(R * std::max<size_t>(iw, 1));
    s.ple = be.alloc_act(R * std::max<size_t>(np, 1)); s.ple_tok = be.alloc_act(R * std::max<size_t>(np, 1));
    s.ple_idx = be.alloc_i32(R * std::max<size_t>(size_t(cfg_.n_layers), 1));
    s.pg = be.alloc_act(R * std::max(1, cfg_.ple_width));
    s.scores = be.alloc_act(R * std::max(1, cfg_.n_experts));
    s.rw = be.alloc_f32(R * std::max(1, cfg_.top_k_experts));
    s.ids = be.alloc_i32(R);
    s.ridx = be.alloc_i32(R * std::max(1, cfg_.top_k_experts));
    s.rows = rows;
  }
  int rank = 0, out = 0;  // the widest the runs' adapters need (set_lora_runs comes first)
  for (const AdapterRun& r : lora_runs_) {
    rank = std::max(rank, r.adapter->rank);
    out = std::max(out, r.adapter->max_out);
  }
  if (rank > 0 && (rows > s.lora_rows || rank > s.lora_rank || out > s.lora_out)) {
    be_->free(s.lora_t);
    be_->free(s.lora_z);
    s.lora_rows = std::max(rows, s.lora_rows);
    s.lora_rank = std::max(rank, s.lora_rank);
    s.lora_out = std::max(out, s.lora_out);
    s.lora_t = be_->alloc_act(size_t(s.lora_rows) * size_t(s.lora_rank));
    s.lora_z = be_->alloc_act(size_t(s.lora_rows) * size_t(s.lora_out));
  }
  if (lora_dropout_seed_ != 0) {
    int in = 0;
    for (const AdapterRun& r : lora_runs_) in = std::max(in, r.adapter->max_in);
    if (size_t(rows) * size_t(in) > size_t(s.lora_x_size)) {
      be_->free(s.lora_x);
      s.lora_x = be_->alloc_act(size_t(rows) * size_t(in));
      s.lora_x_size = rows * in;
    }
  }
  if (trace_ && cfg_.n_experts > 0 && rows > s.tr_rows) {
    be_->free(s.tr_idx);
    be_->free(s.tr_w);
    const size_t n = std::max<size_t>(1, moe_layers_.size()) * size_t(rows) * size_t(std::max(1, cfg_.top_k_experts));
    s.tr_idx = be_->alloc_i32(n);
    s.tr_w = be_->alloc_f32(n);
    s.tr_rows = rows;
  }
  if (top_k > 0 && (lrows > s.tk_rows || top_k > s.tk_k)) {
    for (const Buf& p : {s.tk_vals, s.tk_lse, s.tk_ids}) be_->free(p);
    s.tk_rows = std::max(lrows, s.tk_rows);
    s.tk_k = std::max(top_k, s.tk_k);
    s.tk_vals = be_->alloc_f32(size_t(s.tk_rows) * s.tk_k);
    s.tk_ids = be_->alloc_i32(size_t(s.tk_rows) * s.tk_k);
    s.tk_lse = be_->alloc_f32(size_t(s.tk_rows));
  }
  if (lrows > s.last_rows) {
    be_->free(s.last); be_->free(s.last_idx);
    s.last = be_->alloc_act(size_t(lrows) * cfg_.hidden);
    s.last_idx = be_->alloc_i32(size_t(lrows));
    s.last_rows = lrows;
  }
  if (head && lrows > s.logit_rows) {
    be_->free(s.logits); be_->free(s.argmax);
    s.logits = be_->alloc_f32(size_t(lrows) * cfg_.vocab);
    if (comm_) {
      be_->free(s.lpart);
      be_->free(s.lgather);
      s.lpart = be_->alloc_f32(size_t(lrows) * size_t(vocab_max_));
      s.lgather = be_->alloc_f32(size_t(lrows) * size_t(vocab_max_) * size_t(comm_->size()));
    }
    s.argmax = be_->alloc_i32(size_t(lrows));
    s.argmax_rows = 0;
    s.logit_rows = lrows;
  }
  if (top_k > 0 && lrows > s.draw_rows) {  // a queued draw's parameters (forward_queued)
    be_->free(s.draw_f);
    be_->free(s.draw_i);
    s.draw_rows = std::max(lrows, s.logit_rows);
    s.draw_f = be_->alloc_f32(size_t(s.draw_rows) * kTopDrawFields);
    s.draw_i = be_->alloc_i32(size_t(s.draw_rows) * kTopDrawFields);
  }
}

void Model::tap(const char* name, int layer, const Buf& p, size_t n) {
  if (!tap_) return;
  std::vector<float> h(n);
  be_->to_host(p, n, h.data());
  tap_(name, layer, h.data(), n);
}

void Model::gelu_mul(const Buf& gate, const Buf& up, size_t n, ActPrecision P, const Buf& out) {
  // The ggml table is the GGUF files' GELU; the host's bf16 mode is MLX's parity mode (tanh form).
  if (cfg_.gelu == GeluImpl::GgmlF16Table && (P == ActPrecision::F32 || be_->on_device()))
    be_->gelu_mul_ggml(gate, up, n, out);
  else be_->gelu_mul(gate, up, n, P, out);
}

void Model::forward_hidden(const std::vector<SeqInput>& batch, ActPrecision P) {
  G4_CHECK(!peers_ && !pad_cache_ && "Model::forward_hidden: one rank, no decode padding");
  forward_rank(batch, P, nullptr, nullptr, nullptr, nullptr, 0, false);
}

void Model::forward_queued(const std::vector<SeqInput>& batch, ActPrecision P, int slot, const QueuedDraw* draw) {
  G4_CHECK(can_queue_forwards() && "Model::forward_queued: one rank, no expert trace");
  G4_CHECK((!draw || (draw->k >= 1 && draw->k <= cfg_.vocab && int(draw->rows.size()) == logit_rows(batch))) &&
           "Model::forward_queued: a draw's k within the vocabulary and parameters for every row");
  forward_rank(batch, P, nullptr, nullptr, nullptr, nullptr, 0, true, slot, draw);
}

void Model::forward_rank(const std::vector<SeqInput>& seqs_in, ActPrecision P, float* logits_out,
                         int32_t* argmax_out, const TopK* topk, const TokenMasks* masks, int pick_k, bool head,
                         int argmax_slot, const QueuedDraw* draw) {
  std::vector<SeqInput> padded;
  const std::vector<SeqInput>& batch = pad_to_bucket(seqs_in, &padded);  // pad rows last
  // Tokens on the device: the previous forward's argmax rows, one a sequence, in batch order.
  const bool tokens_on_device = !seqs_in.empty() && seqs_in[0].token_on_device;
  for (const SeqInput& s : seqs_in)
    G4_CHECK(s.token_on_device == tokens_on_device && (!tokens_on_device || (s.n == 1 && !s.soft && !s.all_logits)) &&
             "Model::forward: every sequence's token on the device (one each, no image rows), or none");
  const int LR_out = logit_rows(seqs_in);  // the rows whose outputs are returned
  Backend& be = *be_;
  const int d = cfg_.hidden, H = cfg_.n_heads, N = cfg_.n_layers, Pw = cfg_.ple_width;
  auto T = [P](double c) { return P == ActPrecision::BF16 ? round_bf16(float(c)) : float(c); };

  // Rows of the batch: sequence after sequence.
  int R = 0;
  for (const SeqInput& s : batch) R += s.n;
  const int LR = logit_rows(batch);
  set_lora_runs(batch);
  const int n_masks = masks ? masks->count : 0;
  G4_CHECK(n_masks <= LR_out);
  if (!comm_) pick_k = 0;
  ensure_scratch(R, LR, draw ? draw->k : topk ? topk->k : 0, n_masks, head, pick_k);
  Scratch& S = *s_;
  G4_CHECK((!tokens_on_device || (!trace_ && S.argmax_rows >= int(batch.size()))) &&
           "Model::forward: tokens on the device need the previous forward's argmax rows (as many, no trace)");
  for (const SeqInput& s : batch)  // a paged pool's room is the engine's to check first (Engine::fit_pool)
    G4_CHECK(s.cache->reserve(s.n) && "Model::forward: the KV pool has no free block for a step");
  be.begin_step();  // no allocation from here to end_step (backend.h)
  // The rows' token ids: the previous argmax where it stays on the device, read by the embeddings
  // before this step's argmax overwrites it.
  const Buf& ids_buf = tokens_on_device ? S.argmax : S.ids;
  if (!tokens_on_device) {
    std::vector<int32_t> ids;
    ids.reserve(size_t(R));
    for (const SeqInput& s : batch) {
      for (int t = 0; t < s.n; ++t)
        ids.push_back(s.soft && s.tokens[t] == cfg_.image_token ? cfg_.pad_id : s.tokens[t]);
    }
    be.from_host(ids.data(), size_t(R), S.ids);
  }
  S.argmax_rows = 0;  // until this step's argmax (or draw) is written
  const size_t Rd = size_t(R) * d;

  // §2.1 embedding: h0 = E[ids] * T(sqrt(d)); image rows take their features (§8.4).
  be.embed(w_.embed, ids_buf, R, T(std::sqrt(double(d))), P, S.x);
  for (size_t i = 0, row = 0; i < batch.size(); row += size_t(batch[i].n), ++i) {
    const SeqInput& s = batch[i];
    if (!s.soft) continue;
    const float* f = s.soft;
    for (int t = 0; t < s.n; ++t) {
      if (s.tokens[t] != cfg_.image_token) continue;
      be.from_host(f, size_t(d), S.x.at(int64_t(row + size_t(t)) * d));
      f += d;
    }
  }
  tap("embed", -1, S.x, Rd);

  // §2.2 per-layer inputs: ((rmsnorm(h0 @ Wmp^T * d^-.5) + Eple[ids] * sqrt(P)) * 2^-.5.
  if (Pw > 0) {
    const size_t np = size_t(N) * Pw;
    be.embed(w_.embed_ple, ids_buf, R, T(std::sqrt(double(Pw))), P, S.ple_tok);
    be.matmul(S.x, R, w_.ple_model_proj, P, S.ple);
    be.scale(S.ple, T(std::pow(double(d), -0.5)), size_t(R) * np, P, S.ple);
    be.rms_norm(S.ple, R * N, Pw, w_.ple_proj_norm.data, cfg_.rms_eps, P, S.ple);
    be.add(S.ple, S.ple_tok, size_t(R) * np, P, S.ple);
    be.scale(S.ple, T(std::pow(2.0, -0.5)), size_t(R) * np, P, S.ple);
    if (R > 1) {  // layer-major into ple_tok, so that each layer's [R, Pw] slice is contiguous
      std::vector<int32_t> idx(size_t(R) * size_t(N));
      for (int l = 0; l < N; ++l)
        for (int r = 0; r < R; ++r) idx[size_t(l) * size_t(R) + size_t(r)] = r * N + l;
      be.from_host(idx.data(), idx.size(), S.ple_idx);
      be.gather_rows(S.ple, S.ple_idx, R * N, Pw, S.ple_tok);
    }
  }

  // Per-sequence attention descriptors; the KvBuffer is filled per layer.
  std::vector<AttnSeq> seqs(batch.size());
  std::vector<std::vector<int32_t>> blocks(batch.size());  // bidirectional image blocks (§8.4)
  {
    int row = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      const SeqInput& in = batch[i];
      seqs[i].row0 = row;
      seqs[i].n = in.n;
      seqs[i].pos0 = in.cache->size();
      row += in.n;
      if (!cfg_.bidi_images || !in.soft) continue;
      G4_CHECK(be.supports_image_blocks());  // callers refuse such prompts first
      blocks[i].assign(size_t(in.n) * 2, 0);
      for (int t = 0; t < in.n;) {
        if (in.tokens[t] != cfg_.image_token) {
          ++t;
          continue;
        }
        int e = t;
        while (e < in.n && in.tokens[e] == cfg_.image_token) ++e;
        for (int u = t; u < e; ++u) {
          blocks[i][size_t(u) * 2] = seqs[i].pos0 + t;
          blocks[i][size_t(u) * 2 + 1] = seqs[i].pos0 + e;
        }
        t = e;
      }
      seqs[i].blocks = blocks[i].data();
    }
  }

  int moe_seen = 0;  // MoE layers passed (the expert trace's layer index)
  for (int l = 0; l < N; ++l) {
    be.begin_layer(l);
    const LayerSpec& ls = cfg_.layers[size_t(l)];
    const LayerWeights& lw = w_.layers[size_t(l)];
    const int D = ls.head_dim, Hk = ls.n_kv_heads;
    const int kv_layer = ls.kv_source >= 0 ? ls.kv_source : l;

    // --- attention block (§2.4) ---
    // q (and k, v when the layer owns its KV) from the normed input, each with its adapters.
    const bool own_kv = ls.kv_source < 0;
    const InputNorm in_norm{lw.input_ln.data, cfg_.rms_eps, S.xn};
    const LoraApply* lq = lora(l, &LayerLora::q);
    if (!own_kv) {
      be.norm_matmuls(S.x, R, in_norm, {{&lw.q, S.q, lq}}, P);
    } else if (ls.k_eq_v) {
      be.norm_matmuls(S.x, R, in_norm, {{&lw.q, S.q, lq}, {&lw.k, S.k, lora(l, &LayerLora::k)}}, P);
    } else {
      be.norm_matmuls(S.x, R, in_norm, {{&lw.q, S.q, lq}, {&lw.k, S.k, lora(l, &LayerLora::k)},
                                        {&lw.v, S.v, lora(l, &LayerLora::v)}}, P);
    }
    for (size_t i = 0; i < batch.size(); ++i) seqs[i].kv = batch[i].cache->layer(kv_layer);
    if (own_kv && ls.k_eq_v) be.copy_cols(S.k, R, Hk * D, 0, Hk * D, S.v);  // V = raw K projection (before k_norm)
    // Taps observe the ops the forward runs; what lies inside a fused op (q normed before its RoPE;
    // the MLP's normed input, gate and up; the down projection before its post-norm) is computed
    // beside the forward from the op's inputs, into scratch the op overwrites, and never feeds it.
    if (tap_) {
      if (cfg_.qk_norm) be.rms_norm(S.q, R * H, D, lw.q_norm.data, cfg_.rms_eps, P, S.att);
      tap("q_normed", l, cfg_.qk_norm ? S.att : S.q, size_t(R) * H * D);
    }
    // Norms and RoPE of q (and k, v: in place) and the cache writes, in one op.
    be.attn_prep(S.q, H, own_kv ? S.k : Buf(), S.v, Hk, D, cfg_.qk_norm ? lw.q_norm.data : nullptr,
                 cfg_.qk_norm ? lw.k_norm.data : nullptr, cfg_.v_norm, cfg_.rms_eps, seqs, rope_[size_t(l)], P);
    tap("q_roped", l, S.q, size_t(R) * H * D);
    if (ls.kv_source < 0) tap("k_roped", l, S.k, size_t(R) * Hk * D);
    if (ls.kv_source < 0) tap("v_normed", l, S.v, size_t(R) * Hk * D);
    be.attention(S.q, H, seqs, cfg_.query_scale, P, S.att);
    tap("attn", l, S.att, size_t(R) * H * D);
    matmul_norm_add(S.att, R, lw.o, lora(l, &LayerLora::o), S.o, lw.post_attn_ln.data, P, true);
    tap("attn_residual", l, S.x, Rd);

    // --- feed-forward block (§2.7, §2.8) ---
    const size_t RI = size_t(R) * ls.mlp_width;
    const LoraApply* lgate = lora(l, &LayerLora::gate);
    const LoraApply* lup = lora(l, &LayerLora::up);
    if (tap_) {  // beside the forward: the fused op's normed input, gate and up
      be.rms_norm(S.x, R, d, lw.pre_ffw_ln.data, cfg_.rms_eps, P, S.xn);
      be.linear(S.xn, R, lw.gate, lgate, P, S.gate);
      be.linear(S.xn, R, lw.up, lup, P, S.up);
      tap("mlp_in", l, S.xn, Rd);
      tap("mlp_gate", l, S.gate, RI);
      tap("mlp_up", l, S.up, RI);
    }
    be.gate_up_gelu(S.x, R, InputNorm{lw.pre_ffw_ln.data, cfg_.rms_eps, S.xn}, lw.gate, lw.up,
                    cfg_.gelu == GeluImpl::GgmlF16Table, P, S.gate, S.up, lgate, lup);
    tap("mlp_act", l, S.gate, RI);
    const LoraApply* ldown = lora(l, &LayerLora::down);
    if (!ls.moe) {  // down projection, post-norm and residual add
      matmul_norm_add(S.gate, R, lw.down, ldown, S.f, lw.post_ffw_ln.data, P, true, "mlp_out", l);
    } else {
      be.linear(S.gate, R, lw.down, ldown, P, S.f);
      all_reduce(S.f, Rd);
      tap("mlp_out", l, S.f, Rd);
    }
    // Without a per-layer input the layer scalar joins the MoE exit (one op fewer a layer).
    const bool scalar_in_exit = ls.moe && Pw == 0;
    const float exit_scale = scalar_in_exit ? T(lw.layer_scalar) : 1.f;
    if (ls.moe) {
      const int E = cfg_.n_experts, K = cfg_.top_k_experts;
      // The router's output: this layer's slice of the trace buffers when tracing.
      const int64_t tr_at = int64_t(moe_seen++) * R * K;
      const Buf ridx = trace_ ? S.tr_idx.at(tr_at) : S.ridx;
      const Buf rw = trace_ ? S.tr_w.at(tr_at) : S.rw;
      // h1: the dense branch post-normed; the router reads the un-normed residual h, normed with
      // its own weight (xr); the experts read it normed by pre_ffw_ln2 (xn).
      be.moe_norms(S.f, S.x, R, d, lw.post_ffw_ln1.data, lw.router_norm_w[P == ActPrecision::BF16 ? 1 : 0].data,
                   lw.pre_ffw_ln2.data, cfg_.rms_eps, P, S.h1, S.xr, S.xn);
      be.matmul(S.xr, R, lw.router, P, S.scores);
      be.router_topk(S.scores, R, E, K, lw.per_expert_scale.data, P, ridx, rw);
      tap("router_scores", l, S.scores, size_t(R) * E);
      be.moe_experts(S.xn, R, d, ridx, rw, K, lw.ex_gate, lw.ex_up, lw.ex_down, P, S.h2);
      all_reduce(S.h2, Rd);  // expert parallel: each rank's experts' part of the sum
      tap("experts_out", l, S.h2, Rd);
      be.moe_exit(S.x, S.h1, S.h2, R, d, lw.post_ffw_ln2.data, lw.post_ffw_ln.data, cfg_.rms_eps, exit_scale, P, S.f);
    }

    // --- per-layer input (§2.9) ---
    if (Pw > 0) {
      // This layer's slice of the per-layer inputs [R, Pw]: in place for one row (decode), from
      // the layer-major copy else.
      const Buf ple_l = R > 1 ? S.ple_tok.at(int64_t(l) * R * Pw) : S.ple.at(int64_t(l) * Pw);
      be.linear(S.x, R, lw.ple_gate, lora(l, &LayerLora::ple_gate), P, S.pg);
      gelu_mul(S.pg, ple_l, size_t(R) * Pw, P, S.pg);
      matmul_norm_add(S.pg, R, lw.ple_proj, lora(l, &LayerLora::ple_proj), S.o, lw.post_ple_ln.data, P, false);
    }
    if (lw.layer_scalar != 1.f && !scalar_in_exit) be.scale(S.x, T(lw.layer_scalar), Rd, P, S.x);
    tap("layer_out", l, S.x, Rd);
  }

  // --- final norm and logits for the requested rows ---
  be.begin_layer(N);
  {
    std::vector<int32_t> idx;
    idx.reserve(size_t(LR));
    for (size_t i = 0; i < batch.size(); ++i) {
      if (batch[i].all_logits) {
        for (int t = 0; t < batch[i].n; ++t) idx.push_back(seqs[i].row0 + t);
      } else {
        idx.push_back(seqs[i].row0 + batch[i].n - 1);
      }
    }
    be.from_host(idx.data(), idx.size(), S.last_idx);
  }
  be.gather_rows(S.x, S.last_idx, LR, d, S.last);
  be.rms_norm(S.last, LR, d, w_.final_norm.data, cfg_.rms_eps, P, S.last);
  if (!head) {
    be.end_step();
    for (const SeqInput& s : seqs_in) s.cache->advance(s.n);
    return;
  }
  if (!comm_) {
    be.matmul(S.last, LR, w_.lm_head, P, S.logits);
    if (cfg_.final_softcap > 0) be.softcap(S.logits, size_t(LR) * cfg_.vocab, cfg_.final_softcap, P);
  } else {  // this rank's vocabulary rows, softcapped (elementwise) before the gather
    be.matmul(S.last, LR, w_.lm_head, P, S.lpart);
    if (cfg_.final_softcap > 0) be.softcap(S.lpart, size_t(LR) * size_t(w_.lm_head.rows), cfg_.final_softcap, P);
    if (pick_k > 0) gather_picks(LR, pick_k);
    else gather_logits(LR);
  }
  if (n_masks > 0) {
    be.from_host(reinterpret_cast<const int32_t*>(masks->words), size_t(n_masks) * token_mask_words(cfg_.vocab),
                 S.allow);
    be.from_host(masks->rows, size_t(n_masks), S.allow_ids);
    be.mask_logits(S.logits, cfg_.vocab, S.allow, S.allow_ids, n_masks);
  }
  if (draw) {  // forward_queued (one rank): every row's token drawn from its top k, pad rows greedy
    be.top_k(S.logits, LR, cfg_.vocab, draw->k, S.tk_vals, S.tk_ids, S.tk_lse);
    std::vector<float> f(size_t(LR) * kTopDrawFields);
    std::vector<int32_t> ip(size_t(LR) * kTopDrawFields);
    for (int r = 0; r < LR; ++r)
      pack_top_draw(r < LR_out ? draw->rows[size_t(r)] : TopDraw{}, f.data() + size_t(r) * kTopDrawFields,
                    ip.data() + size_t(r) * kTopDrawFields);
    be.from_host(f.data(), f.size(), S.draw_f);
    be.from_host(ip.data(), ip.size(), S.draw_i);
    be.draw_top(S.tk_vals, S.tk_ids, S.tk_lse, LR, draw->k, S.draw_f, S.draw_i, S.argmax);
    S.argmax_rows = LR;
  } else if ((argmax_out || argmax_slot >= 0) && pick_k == 0) {
    be.argmax(S.logits, LR, cfg_.vocab, S.argmax);
    S.argmax_rows = LR;
  }
  if (topk && pick_k == 0) be.top_k(S.logits, LR, cfg_.vocab, topk->k, S.tk_vals, S.tk_ids, S.tk_lse);
  be.end_step();
  if (logits_out) be.to_host(S.logits, size_t(LR_out) * cfg_.vocab, logits_out);
  if (pick_k > 0) {
    if (argmax_out || topk) combine_picks(LR, LR_out, pick_k, argmax_out, topk);
  } else if (argmax_out) {
    be.to_host(S.argmax, size_t(LR_out), argmax_out);
  }
  if (argmax_slot >= 0) be.queue_read(S.argmax, size_t(LR_out) * sizeof(int32_t), argmax_slot);
  if (topk && pick_k == 0) {
    be.to_host(S.tk_vals, size_t(LR_out) * topk->k, topk->vals);
    be.to_host(S.tk_ids, size_t(LR_out) * topk->k, topk->ids);
    be.to_host(S.tk_lse, size_t(LR_out), topk->lse);
  }
  if (trace_ && moe_seen > 0) record_experts(batch, R);  // (never padded)
  for (const SeqInput& s : seqs_in) s.cache->advance(s.n);
}

}  // namespace g4
