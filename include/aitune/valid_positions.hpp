// Correctness checks that leave out the positions a model leaves undefined (padding).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "aitune/correctness.hpp"
#include "aitune/tensor.hpp"

namespace aitune {

/// Per output, which leading positions the model defines: a bool/uint8/int mask whose
/// shape is a prefix of the output's shape (an attention mask [batch, seq] for logits
/// [batch, seq, vocab]); an element is defined where the mask is non-zero. An empty view
/// (data == nullptr) means every position is defined. `source` names where the masks
/// came from ("attention_mask"), for the report.
struct ValidPositions {
  // Not an aggregate: TuneSample stays brace-initialisable as {inputs, expected, batch}
  // without a braced list being taken for the masks.
  ValidPositions() = default;
  ValidPositions(std::vector<TensorView> masks_, std::string source_)
      : masks(std::move(masks_)), source(std::move(source_)) {}

  std::vector<TensorView> masks;
  std::string source;
  bool empty() const noexcept;
};

/// compare_sample where positions a mask marks undefined take the reference's values in
/// a copy of the candidate's outputs before the comparison, so they can neither fail nor
/// count in the errors; every defined element is compared as compare_sample compares it.
/// The sample's label says how many positions were left out. A mask whose shape is not
/// a prefix of its output's shape is a failed check naming both shapes.
SampleCheck compare_sample_at_valid_positions(const std::string& sample, const std::vector<std::string>& output_names,
                                              const std::vector<TensorView>& actual,
                                              const std::vector<TensorView>& expected,
                                              const ValidPositions& valid, const ToleranceSpec& tolerances);

}  // namespace aitune
