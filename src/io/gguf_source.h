// WeightSource over the tensors of a GGUF file (llama.cpp naming), viewed in place.
//
// Canonical -> GGUF names (llama.cpp gguf-py `TensorNameMap` for gemma3 and gemma4):
//   embed_tokens -> token_embd            lm_head -> output (falls back to token_embd: tied)
//   norm.weight -> output_norm.weight
//   layers.N.self_attn.{q,k,v}_proj -> blk.N.attn_{q,k,v}      o_proj -> blk.N.attn_output
//   layers.N.self_attn.{q,k}_norm.weight -> blk.N.attn_{q,k}_norm.weight
//   layers.N.input_layernorm -> blk.N.attn_norm     post_attention_layernorm -> post_attention_norm
//   layers.N.pre_feedforward_layernorm -> blk.N.ffn_norm
//   layers.N.post_feedforward_layernorm -> blk.N.post_ffw_norm
//   layers.N.mlp.{gate,up,down}_proj -> blk.N.ffn_{gate,up,down}
//   layers.N.experts.switch_glu.{gate,up,down}_proj -> blk.N.ffn_{gate,up,down}_exps (stacked),
//     gate and up also as the two halves of each expert's rows in blk.N.ffn_gate_up_exps
//   Gemma 4: router.{proj,scale} -> blk.N.ffn_gate_inp.{weight,scale},
//     router.per_expert_scale -> blk.N.ffn_down_exps.scale, pre_feedforward_layernorm_2 ->
//     pre_ffw_norm_2, post_feedforward_layernorm_{1,2} -> post_ffw_norm_{1,2}, layer_scalar ->
//     layer_output_scale, per_layer_input_gate -> inp_gate, per_layer_projection -> proj,
//     post_per_layer_input_norm -> post_norm; embed_tokens_per_layer -> per_layer_token_embd,
//     per_layer_model_projection -> per_layer_model_proj, per_layer_projection_norm ->
//     per_layer_proj_norm
// A matrix [rows, cols] = [out, in] is stored by ggml as ne = {cols, rows}; each row of `cols`
// elements is row_bytes() contiguous bytes in the tensor's ggml block format.
// Note: llama.cpp's converter stores Gemma norm weights with the +1 already added, so the
// vectors returned here are used as y = x/rms * w (NormStyle::Plain).
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "io/gguf.h"
#include "io/weight_source.h"

namespace g4 {

// The WFormat of a ggml tensor type, or nullopt when our kernels do not read it.
std::optional<WFormat> wformat_from_ggml(uint32_t ggml_type);

// The GGUF tensor name (with ".weight" where the canonical name is a module) for a canonical
// module or tensor name, or "" when there is no mapping.
std::string gguf_name_for(std::string_view canonical);

// The n values of an F32 / F16 / BF16 tensor as floats; errors name the file and tensor.
Result<std::vector<float>> read_float_tensor(const GgufFile& file, const GgufTensor& tensor, int64_t n);

class GgufSource : public WeightSource {
 public:
  explicit GgufSource(std::shared_ptr<const GgufFile> file) : file_(std::move(file)) {}

  bool has(std::string_view canonical) const override;
  Result<WeightView> matrix(std::string_view module, int64_t rows, int64_t cols) const override;
  Result<WeightView> stacked_matrix(std::string_view module, int64_t index, int64_t count,
                                    int64_t rows, int64_t cols) const override;
  Result<std::vector<float>> vector(std::string_view tensor, int64_t n) const override;
  std::string describe() const override;

  const GgufFile& file() const { return *file_; }

 private:
  // Resolves a canonical name to its tensor (lm_head falls back to token_embd).
  Result<const GgufTensor*> resolve(std::string_view canonical) const;
  std::shared_ptr<const GgufFile> file_;
};

}  // namespace g4
