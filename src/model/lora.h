// LoRA adapters in mlx-lm's format (what `mlx_lm.lora` writes: adapter_config.json with
// fine_tune_type, num_layers and lora_parameters {rank, scale, dropout}, and adapters.safetensors
// with one lora_a [in, r] and lora_b [r, out] per adapted module), applied at inference as
// mlx-lm's LoRALinear does:
//   y = W·x + (scale * ((x · lora_a) · lora_b)).astype(x.dtype)
// the two small products in f32 (MLX promotes the bf16 input against the f32 adapter), the scaled
// sum rounded to the activation precision, then added. The base weights stay as they are (packed,
// quantized or not); the adapter's matrices are f32 backend weights.
//
// Modules an adapter may hold, per layer: self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj,
// per_layer_input_gate, per_layer_projection (mlx-lm's default keys on the dense models). Errors
// (one line, naming the file and tensor): DoRA or full fine-tunes, missing files or fields,
// tensors of other modules (MoE router or experts, embeddings), a module the model does not have
// (v_proj of a K=V layer, k/v of a KV-shared layer), a lora_a without its lora_b, wrong shapes or
// dtypes, ranks that differ from the config's.
#pragma once
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "core/config.h"

namespace g4 {

// One adapted module: LoraDelta (backend/backend.h, where the ops apply it).

// The adapted modules of one layer (null: no adapter on that module).
struct LayerLora {
  const LoraDelta *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  const LoraDelta *gate = nullptr, *up = nullptr, *down = nullptr;
  const LoraDelta *ple_gate = nullptr, *ple_proj = nullptr;
};

struct LoraAdapter {
  std::string path;
  int rank = 0;
  float scale = 0.f;
  int num_layers = 0;     // adapter_config.json's num_layers (informational)
  int modules = 0;        // adapted modules
  int max_out = 0;        // widest adapted output (scratch size)
  int max_in = 0;         // widest adapted input (scratch of training's dropout)
  std::vector<LayerLora> layers;  // one per model layer
  std::deque<LoraDelta> deltas;   // stable storage behind the LayerLora pointers
  std::vector<std::vector<float>> host;  // the transposed f32 matrices the host views point into
  // Tensor parallelism: this adapter's shards for the group's other ranks, in peer order
  // (Model::load_adapter of a group's leader; parallel/tp_lora.h).
  std::vector<std::unique_ptr<LoraAdapter>> peers;
};

// The modules an adapter may hold on a layer, as mlx-lm names them under the layer, in the order
// mlx-lm's linear_to_lora_layers meets them.
inline const char* const kLoraModules[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                           "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                           "mlp.down_proj",    "per_layer_input_gate", "per_layer_projection"};
// The member of a per-layer table (LayerLora here, the trainer's LayerModules) that holds `module`
// (one of kLoraModules): both name their members q, k, v, o, gate, up, down, ple_gate, ple_proj.
template <class Layer>
auto& lora_slot(Layer& l, const std::string& m) {
  if (m == "self_attn.q_proj") return l.q;
  if (m == "self_attn.k_proj") return l.k;
  if (m == "self_attn.v_proj") return l.v;
  if (m == "self_attn.o_proj") return l.o;
  if (m == "mlp.gate_proj") return l.gate;
  if (m == "mlp.up_proj") return l.up;
  if (m == "mlp.down_proj") return l.down;
  if (m == "per_layer_input_gate") return l.ple_gate;
  return l.ple_proj;
}
// A module's [out, in] on `layer` of this model, or {0, 0} when the layer does not have it (v_proj
// of a K=V layer, k/v of a KV-shared layer, per-layer-input modules without per-layer inputs).
std::pair<int64_t, int64_t> lora_module_shape(const ModelConfig& cfg, int layer, const std::string& module);
// An adapter tensor name "[prefix.]layers.N.<module>.lora_a|lora_b" -> N, module, 'a' | 'b';
// false for any other name.
bool parse_lora_tensor_name(const std::string& name, int* layer, std::string* module, char* which);

// Reads the adapter directory `dir` for a model of config `cfg`, placing its matrices on `be`.
Result<std::unique_ptr<LoraAdapter>> load_lora_adapter(const std::string& dir, const ModelConfig& cfg, Backend& be);
// Gives the matrices load_lora_adapter placed on `be` back to it (Backend::release_weight); the
// adapter must not be used afterwards.
void release_lora_adapter(LoraAdapter& a, Backend& be);

}  // namespace g4
