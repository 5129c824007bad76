// ExpertStack (expert_stack.h): views of single experts, and stacks checked from per-expert views.
#include "quant/expert_stack.h"

namespace g4 {

int64_t ExpertStack::expert_scale_bytes() const {
  if (base.fmt != WFormat::MlxAffine || base.group_size <= 0) return 0;
  return base.rows * (base.cols / base.group_size) * int64_t(dtype_size(base.scale_dtype));
}

WeightView ExpertStack::expert(int e) const {
  WeightView w = base;
  if (!holds(e)) {
    w.rows = 0;
    w.data = w.scales = w.biases = nullptr;
    return w;
  }
  const int64_t i = e - first;
  w.data = static_cast<const uint8_t*>(base.data) + i * stride;
  if (base.scales) w.scales = static_cast<const uint8_t*>(base.scales) + i * scale_stride;
  if (base.biases) w.biases = static_cast<const uint8_t*>(base.biases) + i * scale_stride;
  return w;
}

bool ExpertStack::back_to_back() const {
  return held <= 1 || (stride == expert_bytes() && scale_stride == expert_scale_bytes());
}

WeightView ExpertStack::as_matrix() const {
  WeightView w = base;
  w.rows = base.rows * held;
  return w;
}

ExpertStack ExpertStack::of_matrix(const WeightView& all, int count) {
  ExpertStack s;
  s.base = all;
  s.base.rows = count > 0 ? all.rows / count : 0;
  s.count = s.held = count;
  s.stride = s.expert_bytes();
  s.scale_stride = s.expert_scale_bytes();
  return s;
}

Result<ExpertStack> stack_experts(const std::vector<WeightView>& views, const std::string& what) {
  ExpertStack s;
  s.count = int(views.size());
  int last = -1;
  for (int e = 0; e < s.count; ++e) {
    const WeightView& v = views[size_t(e)];
    if (v.rows == 0) continue;  // another rank's expert
    if (s.held == 0) {
      s.base = v;
      s.first = e;
    } else {
      if (e != last + 1)
        return err("%s: the experts held are not one range (%d follows %d)", what.c_str(), e, last);
      if (v.fmt != s.base.fmt || v.rows != s.base.rows || v.cols != s.base.cols || v.row_bytes != s.base.row_bytes ||
          v.bits != s.base.bits || v.group_size != s.base.group_size || v.scale_dtype != s.base.scale_dtype)
        return err("%s: expert %d's format or shape differs from expert %d's", what.c_str(), e, s.first);
      const auto gap = [&](const void* p, const void* p0) {
        return static_cast<const uint8_t*>(p) - static_cast<const uint8_t*>(p0);
      };
      const int64_t stride = gap(v.data, s.base.data) / (e - s.first);
      const int64_t sstride = v.scales ? gap(v.scales, s.base.scales) / (e - s.first) : 0;
      if (s.held == 1) s.stride = stride, s.scale_stride = sstride;
      const int64_t i = e - s.first;
      if (gap(v.data, s.base.data) != i * s.stride || (v.scales && gap(v.scales, s.base.scales) != i * s.scale_stride) ||
          (v.biases && gap(v.biases, s.base.biases) != i * s.scale_stride))
        return err("%s: expert %d is not stored at the stride of the experts before it", what.c_str(), e);
    }
    ++s.held;
    last = e;
  }
  if (s.held == 0 && s.count > 0) s.base = views[0];  // none held: the shape and format alone
  if (s.held == 1) s.stride = s.expert_bytes(), s.scale_stride = s.expert_scale_bytes();
  return s;
}

}  // namespace g4
