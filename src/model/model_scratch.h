// Model's scratch buffers (model.cpp, model_group.cpp): private to the Model's own files.
#pragma once
#include "model/model.h"

namespace g4 {

// Activation buffers sized for the largest batch seen so far (allocated outside the decode step).
// Activations are in the backend's activation dtype; logits, top-k outputs and router weights f32;
// ids I32.
struct Model::Scratch {
  int rows = 0, logit_rows = 0;
  Buf x, xn, q, k, v, att, o, gate, up, f, h1, h2, xr;  // xr: the MoE router's normed input
  Buf ple, ple_tok, pg;  // ple_tok, once consumed: the per-layer inputs layer-major [N, rows, Pw] (rows > 1)
  Buf ple_idx;          // I32 [rows * N]: the gather that makes them layer-major
  Buf scores, rw, last, logits;
  Buf lpart, lgather;  // with a communicator: this rank's logits [logit_rows, vocab_max], all ranks' [n, ...]
  // With a communicator and a shard pick: this rank's top k per row (values f32, ids I32 [rows, k],
  // lse [rows]) and every rank's, gathered ([n, rows, k], [n, rows]).
  Buf pk_vals, pk_ids, pk_lse, gk_vals, gk_ids, gk_lse;
  int pk_rows = 0, pk_k = 0;
  Buf tr_idx, tr_w;  // with an expert trace: every MoE layer's router output [moe layers, rows, K]
  int tr_rows = 0;
  Buf lora_t, lora_z;  // [rows, rank], [rows, widest adapted output]
  Buf lora_x;          // training's dropout: [rows, widest adapted input]
  int lora_x_size = 0;
  int last_rows = 0;   // what last holds
  Buf tk_vals, tk_lse, tk_ids;  // top_k outputs [logit_rows, k_cap] (f32, I32), [logit_rows]
  int tk_rows = 0, tk_k = 0;
  int lora_rows = 0, lora_rank = 0, lora_out = 0;  // what lora_t / lora_z hold
  Buf ids, ridx, last_idx, argmax;
  int argmax_rows = 0;  // the rows of argmax the last forward wrote (its argmax or draw; 0: none since allocated)
  Buf draw_f, draw_i;   // forward_queued's draw parameters [draw_rows, kTopDrawFields] (f32, I32)
  int draw_rows = 0;
  Buf allow, allow_ids;  // I32 [allow_rows, token_mask_words(vocab)], [allow_rows]: forward's masks
  int allow_rows = 0;
};

}  // namespace g4
