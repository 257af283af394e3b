// AcceptedShapes: the input shapes a session's calls were last found to satisfy its
// graph's shape conditions with, so that the per-call check evaluates the conditions once
// per distinct set of shapes. An export of a windowed vision model carries twenty
// conditions of a hundred nodes each (about 6 us a call to evaluate, on the host), while a
// steady stream of calls repeats a handful of shapes.
#pragma once
#include <cstddef>
#include <mutex>
#include <vector>

#include "aitune/shape_condition.hpp"

namespace aitune::detail {

class AcceptedShapes {
 public:
  static constexpr std::size_t kCapacity = 8;  // most recent first; the oldest goes

  bool contains(ShapeRefs shapes) const {
    std::lock_guard lock(mutex_);  // sessions run concurrently
    for (const auto& seen : seen_)
      if (equal(seen, shapes)) return true;
    return false;
  }

  void add(ShapeRefs shapes) {
    std::vector<Shape> copy;
    copy.reserve(shapes.size());
    for (const Shape* s : shapes) copy.push_back(*s);
    std::lock_guard lock(mutex_);
    for (const auto& seen : seen_)
      if (equal(seen, shapes)) return;
    if (seen_.size() == kCapacity) seen_.pop_back();
    seen_.insert(seen_.begin(), std::move(copy));
  }

 private:
  static bool equal(const std::vector<Shape>& seen, ShapeRefs shapes) {
    if (seen.size() != shapes.size()) return false;
    for (std::size_t i = 0; i < seen.size(); ++i)
      if (seen[i] != *shapes[i]) return false;
    return true;
  }

  mutable std::mutex mutex_;
  std::vector<std::vector<Shape>> seen_;
};

}  // namespace aitune::detail
