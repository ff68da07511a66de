#pragma once
// One output tile of a grouped GEMM, as a scheduler hands it to the producer and the consumers.
namespace caracal::gemm {

struct TileCoord {
  int expert;      // local expert whose weights or rows the tile uses
  int m_begin;     // first output row: a schedule row (row tiles) or a row of the expert's
                   // weight gradient (weight tiles)
  int m_buffer;    // where row m_begin lies in the row buffers (ScheduleView::buffer_row; weight
                   // tiles: m_begin): the row tiles' loads of A and stores of rows use it
  int n_begin;     // first output column
  int k_begin;     // first K index of the loads: 0, or the buffer row of the expert's first row
                   // in the window (weight tiles)
  int k_tiles;     // kBlockK-deep steps, in order from k_begin
  int active_end;  // output rows at or past this need no tensor-core work (padding rows, rows
                   // past the gradient, an expert without rows): a consumer warpgroup whose 64
                   // rows all lie there skips its wgmmas and its epilogue stores zeros
};

}  // namespace caracal::gemm
