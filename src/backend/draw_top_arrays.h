// Backend::draw_top on host arrays, for checks and tests (runtime/engine_ahead.cpp's check of a
// device's draw, tests/backend/draw_top_test.cpp).
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace g4 {

// Uploads vals / ids [rows, k], lse [rows] and the packed parameters fparams / iparams [rows,
// kTopDrawFields] (sampling/top_draw.h: pack_top_draw), draws with be.draw_top, and returns the
// rows' tokens (one synchronous round trip; rows = lse.size()).
std::vector<int32_t> draw_top_arrays(Backend& be, const std::vector<float>& vals, const std::vector<int32_t>& ids,
                                     const std::vector<float>& lse, int k, const std::vector<float>& fparams,
                                     const std::vector<int32_t>& iparams);

}  // namespace g4
