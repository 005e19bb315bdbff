#pragma once
/// @file llama/output_projections.hpp
/// @brief The attention output projections `wo` of a model's layers in the form output-aware
/// scorers read (`OutputProjection`, token_scorer.hpp: float, row-major
/// `[dim][n_heads * head_dim]`), for every weight form the engine runs.
///
/// A layer whose `wo` is float32 (llama2.c checkpoints, F32 GGUFs, `GgufLoadOptions::dequantize`)
/// is viewed in place. A layer whose `wo` is kept in its stored type (`wo_quant`: F16, BF16 or a
/// block type such as Q8_0 or Q4_K, in place in a GGUF mapping) is converted once to a float copy
/// with `dequantize_row` (quant/dequantize.hpp), so the scores read exactly the weight values the
/// engine's `QuantKernel::kDequantize` products multiply. Each such copy costs
/// `dim * n_heads * head_dim` floats per layer (16 MiB per layer at dim = n_heads * head_dim =
/// 2048, 64 MiB at 4096), on top of the stored bytes, which stay in the mapping.

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "depthkv/error.hpp"
#include "depthkv/llama/model.hpp"
#include "depthkv/llama/quant/dequantize.hpp"
#include "depthkv/llama/quant/ggml_type.hpp"
#include "depthkv/token_scorer.hpp"

namespace depthkv {
namespace llama {

/// The output projections of every layer of a model, owning the float copies of the layers whose
/// `wo` is stored as F16, BF16 or a block type (file comment: the memory they cost), viewing the
/// float32 ones in place. `views()` is what `score_and_evict`, `EvictionSchedule`
/// and `layer_scores` take (their `wo`). The model must outlive the
/// object (views of float32 layers point into it); copies share the float copies, which are
/// never modified, so every copy's views stay valid while any copy lives.
///
/// @code
/// const depthkv::llama::LlamaModel model = depthkv::llama::load_gguf("model-Q4_K_M.gguf");
/// const depthkv::llama::OutputProjections wo(model);            // dequantizes each layer's wo once
/// depthkv::score_and_evict(cache, scorers, spec, curves.data(), &wo.views());  // output-aware
/// std::vector<depthkv::LayerScores> s = depthkv::layer_scores(scorers, cache, &wo.views());
/// @endcode
class OutputProjections {
 public:
  /// No layer (what a run without output-aware scorers holds).
  OutputProjections() = default;

  /// Views or float copies of every layer's `wo`.
  /// @param model the model (must outlive this object and its copies)
  /// @throws Error naming the layer when its `wo` is not `[dim][n_heads * head_dim]` (naming both
  ///   shapes), is held both as float and in a stored type, has rows of the wrong byte size, or
  ///   is stored in a type `dequantize_row` does not convert
  explicit OutputProjections(const LlamaModel& model) {
    const LlamaConfig& c = model.config;
    const std::int64_t cols = static_cast<std::int64_t>(c.n_heads) * c.head_dim;
    DEPTHKV_CHECK(static_cast<int>(model.layers.size()) == c.n_layers,
                  model.layers.size() << " layer weight sets for " << c.n_layers << " layers");
    std::vector<int> copy_of(static_cast<std::size_t>(c.n_layers), -1);  // layer -> index into the copies
    int n_copies = 0;
    for (int l = 0; l < c.n_layers; ++l) {
      const LlamaLayerWeights& w = model.layers[static_cast<std::size_t>(l)];
      if (w.wo_quant.empty()) {
        DEPTHKV_CHECK(w.wo.rows() == c.dim && w.wo.cols() == cols,
                      "layer " << l << ": output-aware scoring needs the output projection wo [" << c.dim << "]["
                               << cols << "], the model holds [" << w.wo.rows() << "][" << w.wo.cols() << "]");
        continue;
      }
      const QuantWeight& q = w.wo_quant;
      const std::string type = ggml_type_name(q.type);
      DEPTHKV_CHECK(q.rows == c.dim && q.cols == cols, "layer " << l << ": output-aware scoring needs the output projection wo ["
                                                               << c.dim << "][" << cols << "], the model holds " << type
                                                               << " [" << q.rows << "][" << q.cols << "]");
      DEPTHKV_CHECK(w.wo.size() == 0, "layer " << l << ": wo is held both as float and as " << type);
      DEPTHKV_CHECK(ggml_type_dequantizable(static_cast<std::uint32_t>(q.type)),
                    "layer " << l << ": wo is stored as " << type << ", which has no float conversion (supported: "
                             << ggml_dequantizable_names() << ")");
      DEPTHKV_CHECK(q.row_bytes == ggml_row_bytes(q.type, q.cols), "layer " << l << ": wo (" << type << ") has rows of "
                                                                              << q.row_bytes << " bytes, expected "
                                                                              << ggml_row_bytes(q.type, q.cols));
      copy_of[static_cast<std::size_t>(l)] = n_copies++;
    }
    if (n_copies > 0) {
      auto copies = std::make_shared<std::vector<RowMatrix>>(static_cast<std::size_t>(n_copies));
      for (int l = 0; l < c.n_layers; ++l) {
        const int i = copy_of[static_cast<std::size_t>(l)];
        if (i < 0) continue;
        const QuantWeight& q = model.layers[static_cast<std::size_t>(l)].wo_quant;
        RowMatrix& m = (*copies)[static_cast<std::size_t>(i)];
        m.resize(q.rows, q.cols);
        for (std::int64_t r = 0; r < q.rows; ++r)
          dequantize_row(q.type, q.data + static_cast<std::size_t>(r) * q.row_bytes, m.row(r).data(), q.cols);
      }
      copies_ = std::move(copies);
    }
    views_.reserve(static_cast<std::size_t>(c.n_layers));
    for (int l = 0; l < c.n_layers; ++l) {
      const int i = copy_of[static_cast<std::size_t>(l)];
      const float* data = i < 0 ? model.layers[static_cast<std::size_t>(l)].wo.data()
                                : (*copies_)[static_cast<std::size_t>(i)].data();
      views_.push_back({data, c.dim, c.n_heads, c.head_dim});
    }
  }

  /// @return one view per layer (empty for a default-constructed object)
  const std::vector<OutputProjection>& views() const { return views_; }
  /// @param l a layer in [0, n_layers())
  /// @return layer l's view
  const OutputProjection& layer(int l) const {
    assert(l >= 0 && l < n_layers());
    return views_[static_cast<std::size_t>(l)];
  }
  /// @return the number of layers (0 when default-constructed)
  int n_layers() const { return static_cast<int>(views_.size()); }
  /// @return true when no layer is held
  bool empty() const { return views_.empty(); }
  /// @return the number of layers whose `wo` was converted to a float copy
  int n_copied() const { return copies_ ? static_cast<int>(copies_->size()) : 0; }
  /// @return the bytes of the float copies (0 when every layer is viewed in place)
  std::size_t copied_bytes() const {
    std::size_t b = 0;
    if (copies_)
      for (const RowMatrix& m : *copies_) b += static_cast<std::size_t>(m.size()) * sizeof(float);
    return b;
  }

 private:
  std::shared_ptr<const std::vector<RowMatrix>> copies_;  // float copies of the stored layers (null: none)
  std::vector<OutputProjection> views_;                    // per layer: into the model or into copies_
};

/// Views of the model's float32 output projections `wo`, row-major `[dim][n_heads * head_dim]`
/// (`OutputProjection`'s default layout), without a copy. The model must outlive them.
/// `OutputProjections` also converts layers whose `wo` is stored as F16, BF16 or a block type.
/// @throws Error naming the layer when a `wo` is stored in another type than float32 (use
///   `OutputProjections`) or is not `[dim][n_heads * head_dim]`
inline std::vector<OutputProjection> output_projections(const LlamaModel& model) {
  for (std::size_t l = 0; l < model.layers.size(); ++l) {
    const QuantWeight& q = model.layers[l].wo_quant;
    DEPTHKV_CHECK(q.empty(), "layer " << l << ": wo is stored as " << ggml_type_name(q.type)
                                      << "; output_projections views float32 weights only (OutputProjections "
                                         "holds a float copy)");
  }
  return OutputProjections(model).views();
}

}  // namespace llama
}  // namespace depthkv
