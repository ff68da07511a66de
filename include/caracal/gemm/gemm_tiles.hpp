#pragma once
// The grouped GEMMs' CTA tiles (M x N, and K: the depth of a k step) by precision and GEMM, and the
// one shape rule among them, as host code sees them: src/device/gemm/gemm_policy.cuh builds its
// policies from these numbers, the FP8 dgrad's launcher picks by fp8_dgrad_wide_tiles, and
// `caracal plan` prints what a layer runs (layer_gemm_tiles). Free of CUDA headers.
#include <cstdint>
#include <vector>

#include "caracal/gemm/grouped_gemm.hpp"
#include "caracal/layer_config.hpp"

namespace caracal::gemm {

struct GemmTile {
  int m, n, k;
};

// Every bf16 GEMM (up/gate, down, dgrad, dx, the weight gradients).
inline constexpr GemmTile kBf16Tile{kGroupedGemmTileM, 256, 64};
// FP8 (one 128-wide scaling block a k step): the up/gate, down and dx GEMMs, and the dgrad where K
// is long, in wide tiles; the dgrad where K is short in narrow ones; the weight gradients.
inline constexpr GemmTile kFp8WideTile{kGroupedGemmTileM, 256, 128};
inline constexpr GemmTile kFp8NarrowTile{kGroupedGemmTileM, 128, 128};
inline constexpr GemmTile kFp8WeightGradTile{kGroupedGemmTileM, 128, 128};

// The FP8 dgrad's tile, by shape: wide where K = D is at least this (a long K keeps the wide
// tile's mainloop ahead of its larger epilogue), else narrow (a short K leaves the epilogue
// exposed and half the tiles for the SMs).
inline constexpr int kFp8DgradWideTilesMinK = 4096;
constexpr bool fp8_dgrad_wide_tiles(int64_t hidden) { return hidden >= kFp8DgradWideTilesMinK; }

// One of a layer's grouped GEMMs: its name, tile, and why that tile where a rule chose it (empty:
// the precision's only tile for it).
struct LayerGemmTile {
  const char* gemm;
  GemmTile tile;
  const char* rule;
};

// The tiles a layer of this precision and hidden size D runs its routed and shared experts' GEMMs in.
inline std::vector<LayerGemmTile> layer_gemm_tiles(Precision precision, int64_t hidden) {
  if (precision == Precision::kBF16) {
    return {{"up/gate + SwiGLU", kBf16Tile, ""},
            {"down", kBf16Tile, ""},
            {"dgrad + SwiGLU", kBf16Tile, ""},
            {"dx", kBf16Tile, ""},
            {"weight gradients", kBf16Tile, ""}};
  }
  bool const wide = fp8_dgrad_wide_tiles(hidden);
  return {{"up/gate + SwiGLU", kFp8WideTile, ""},
          {"down", kFp8WideTile, ""},
          {"dgrad + SwiGLU", wide ? kFp8WideTile : kFp8NarrowTile,
           wide ? "K = D >= 4096: wide" : "K = D < 4096: narrow"},
          {"dx", kFp8WideTile, ""},
          {"weight gradients", kFp8WeightGradTile, ""}};
}

}  // namespace caracal::gemm
