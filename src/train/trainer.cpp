#include "train/trainer.h"

#include <chrono>
#include <cstdio>
#include <filesystem>

namespace g4::train {
namespace fs = std::filesystem;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Σ CE and the target count of one batch; when training also its gradients, scaled by 1 / targets
// (the gradient of the batch's mean loss).
Result<SeqLoss> batch_loss(LoraTrainModel& m, const Dataset& d, const std::vector<int>& batch, int max_len,
                           bool train, uint64_t seed, int iteration) {
  int ntoks = 0;
  for (int i : batch) ntoks += target_count(d.examples[size_t(i)], max_len);
  if (ntoks == 0)
    return err("%s: a batch at iteration %d has no target tokens (all of its records are masked or truncated: "
               "check --mask-prompt and --max-seq-length)", d.path.c_str(), iteration);
  std::vector<const Example*> exs;
  for (int i : batch) exs.push_back(&d.examples[size_t(i)]);
  SeqLoss total = m.run(exs, max_len, train ? 1.f / float(ntoks) : 0.f, seed * 1000003ull + uint64_t(iteration));
  return total;
}

}  // namespace

Result<double> evaluate(LoraTrainModel& m, const Dataset& d, int batch_size, int num_batches, int max_seq_length,
                        NumpyLegacyRng& rng, const std::function<void(int, int)>& progress) {
  G4_ASSIGN_OR_RETURN(BatchIterator it, BatchIterator::create(d, batch_size, &rng, false));
  const int available = int(d.size()) / batch_size;
  const int n = num_batches < 0 ? available : std::min(num_batches, available);
  double sum = 0.0;
  long toks = 0;
  std::vector<int> batch;
  if (progress) progress(0, n);
  for (int i = 0; i < n && it.next(&batch); ++i) {
    G4_ASSIGN_OR_RETURN(SeqLoss s, batch_loss(m, d, batch, max_seq_length, false, 0, 0));
    sum += s.sum;  // mlx-lm: Σ (loss · toks) = Σ CE
    toks += s.count;
    if (progress) progress(i + 1, n);
  }
  return toks > 0 ? sum / double(toks) : 0.0;
}

namespace {

// What a saved state must share with this run to continue it.
nlohmann::ordered_json fingerprint(const TrainOptions& o, const Optimizer& opt, const Dataset& train,
                                   const LoraParams& params) {
  nlohmann::ordered_json shapes = nlohmann::ordered_json::array();
  for (const LoraModule& m : params.modules()) shapes.push_back({m.name, m.in, m.out, m.rank});
  return {{"train_records", train.size()},   {"batch_size", o.batch_size},
          {"seed", o.seed},                  {"grad_accumulation_steps", o.grad_accumulation_steps},
          {"max_seq_length", o.max_seq_length}, {"optimizer", opt.name()},
          {"learning_rate", opt.learning_rate()}, {"modules", shapes}};
}

// The first field two fingerprints differ in, as "NAME: saved X, now Y" (empty: none).
std::string fingerprint_difference(const nlohmann::ordered_json& saved, const nlohmann::ordered_json& now) {
  for (auto it = now.begin(); it != now.end(); ++it) {
    const auto s = saved.find(it.key());
    if (s == saved.end() || *s != it.value())
      return it.key() + ": saved " + (s == saved.end() ? std::string("nothing") : s->dump()) + ", now " +
             (it.key() == "modules" ? std::string("other adapter shapes") : it.value().dump());
  }
  return "";
}

}  // namespace

Result<int> train(LoraTrainModel& m, LoraParams& params, Optimizer& opt, const Dataset& train, const Dataset& valid,
                  const TrainOptions& o, NumpyLegacyRng& rng, const std::function<void(const Report&)>& report,
                  const std::function<void(int)>& step) {
  if (o.grad_accumulation_steps < 1) return err("--grad-accumulation-steps must be at least 1");
  G4_ASSIGN_OR_RETURN(BatchIterator batches, BatchIterator::create(train, o.batch_size, &rng, true));
  const std::string adapter_file = (fs::path(o.adapter_dir) / "adapters.safetensors").string();
  const nlohmann::ordered_json print = fingerprint(o, opt, train, params);
  double losses = 0.0, train_time = 0.0;
  long n_tokens = 0, trained_tokens = 0;
  int steps = 0, first = 1;
  params.zero_grads();
  if (const TrainState* r = o.resume) {
    if (std::string d = fingerprint_difference(r->fingerprint, print); !d.empty())
      return err("the training state to resume was saved by another run (%s): pass that run's flags and data",
                 d.c_str());
    if (r->iteration >= o.iters)
      return err("the training state to resume is at iteration %d, not before --iters %d", r->iteration, o.iters);
    if (!rng.load(r->rng)) return err("the training state's generator is malformed");
    G4_TRY(batches.restore(r->batches));
    size_t g = 0;
    for (LoraModule& mod : params.modules())
      for (std::vector<float>* v : {&mod.ga, &mod.gb}) {
        if (g >= r->grads.size() || r->grads[g].size() != v->size())
          return err("the training state's gradients do not fit the adapter");
        *v = r->grads[g++];
      }
    opt.set_moments(r->opt_m, r->opt_v);
    losses = r->losses;
    train_time = r->train_time;
    n_tokens = r->n_tokens;
    trained_tokens = r->trained_tokens;
    steps = r->steps;
    first = r->iteration + 1;
  }
  // The adapter and its state at the end of iteration `it` (name: the adapter file).
  auto save = [&](int it, const std::string& file) -> Status {
    G4_TRY(params.save(file));
    TrainState st;
    st.iteration = it;
    st.rng = rng.save();
    st.batches = batches.position();
    st.opt_m = opt.first_moments();
    st.opt_v = opt.second_moments();
    for (const LoraModule& mod : params.modules()) {
      st.grads.push_back(mod.ga);
      st.grads.push_back(mod.gb);
    }
    st.losses = losses;
    st.train_time = train_time;
    st.n_tokens = n_tokens;
    st.trained_tokens = trained_tokens;
    st.steps = steps;
    st.fingerprint = print;
    return save_train_state(train_state_path(file), st);
  };
  auto report_saved = [&](const char* kind, int it, const std::string& path) {
    Report r;
    r.kind = kind;
    r.iteration = it;
    r.path = path;
    report(r);
  };
  std::vector<int> batch;
  for (int it = first; it <= o.iters; ++it) {
    batches.next(&batch);  // drawn before this iteration's validation, as mlx-lm's zip does
    double tic = now_s();
    if (valid.size() > 0 && (it == 1 || it % o.steps_per_eval == 0 || it == o.iters)) {
      G4_ASSIGN_OR_RETURN(double vl, evaluate(m, valid, o.batch_size, o.val_batches, o.max_seq_length, rng,
                                                         o.val_progress));
      Report r;
      r.kind = "val";
      r.iteration = it;
      r.loss = vl;
      r.seconds = now_s() - tic;
      report(r);
      tic = now_s();
    }
    G4_ASSIGN_OR_RETURN(SeqLoss s, batch_loss(m, train, batch, o.max_seq_length, true, o.seed, it));
    if (it % o.grad_accumulation_steps == 0) {
      if (o.grad_accumulation_steps > 1) {
        const float inv = 1.f / float(o.grad_accumulation_steps);
        for (LoraModule& mod : params.modules()) {
          for (float& g : mod.ga) g *= inv;
          for (float& g : mod.gb) g *= inv;
        }
      }
      opt.step(params);
      params.zero_grads();
    }
    losses += s.sum / double(s.count);
    n_tokens += s.count;
    ++steps;
    train_time += now_s() - tic;
    if (step) step(it);

    if (it % o.steps_per_report == 0 || it == o.iters) {
      trained_tokens += n_tokens;
      Report r;
      r.kind = "train";
      r.iteration = it;
      r.loss = losses / steps;
      r.seconds = train_time;
      r.it_per_sec = train_time > 0 ? steps / train_time : 0.0;
      r.tokens_per_sec = train_time > 0 ? double(n_tokens) / train_time : 0.0;
      r.trained_tokens = trained_tokens;
      r.learning_rate = opt.learning_rate();
      report(r);
      losses = 0.0;
      n_tokens = 0;
      steps = 0;
      train_time = 0.0;
    }
    if (it % o.save_every == 0) {
      char name[48];
      std::snprintf(name, sizeof name, "%07d_adapters.safetensors", it);
      const std::string checkpoint = (fs::path(o.adapter_dir) / name).string();
      G4_TRY(save(it, adapter_file));
      G4_TRY(save(it, checkpoint));
      report_saved("save", it, checkpoint);
    }
    if (o.stop && o.stop->load() && it < o.iters) {
      G4_TRY(save(it, adapter_file));
      report_saved("interrupted", it, adapter_file);
      return it;
    }
  }
  G4_TRY(save(o.iters, adapter_file));
  report_saved("save", o.iters, adapter_file);
  return o.iters;
}

}  // namespace g4::train
