#pragma once
// One output tile of a grouped GEMM, as a scheduler hands it to the producer and the consumers.
namespace caracal::gemm {

struct TileCoord {
  int expert;      // local expert whose weights or rows the tile uses
  int m_begin;     // first output row: a row of the row buffers (row tiles) or of the expert's
                   // weight gradient (weight tiles)
  int n_begin;     // first output column
  int k_begin;     // first K index of the loads: 0, or the expert's first row (weight tiles)
  int k_tiles;     // kBlockK-deep steps, in order from k_begin
  int active_end;  // output rows at or past this need no tensor-core work (padding rows, rows
                   // past the gradient, an expert without rows): a consumer warpgroup whose 64
                   // rows all lie there skips its wgmmas and its epilogue stores zeros
};

}  // namespace caracal::gemm
