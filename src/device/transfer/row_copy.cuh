#pragma once
// The row-copy engine: token rows of bf16 move as 16-byte vectors, one warp per row, lanes
// interleaved so each warp-wide access covers 512 contiguous bytes. A lane keeps kCopyUnroll
// vectors in flight before storing them, which with a full grid of warps is enough outstanding
// bytes to saturate HBM (loopback) or NVLink (a peer's heap). Loads come in two kinds (below),
// because the non-coherent path may serve stale data for memory written during the same launch.
#include <cuda_bf16.h>

#include <cstdint>

#include "device/common/bf16_pairs.cuh"

namespace caracal::transfer {

inline constexpr int kWarpSize = 32;
inline constexpr int kBf16PerVector = 8;
inline constexpr int kCopyUnroll = 4;  // 16-byte vectors in flight per lane
inline constexpr bool kCoherentPulls = true;  // the pulls load with load_coherent16 (the faster)

// Data nothing writes during this launch (inputs, rows published before the launch, peers' rows
// behind the launch's entry barrier): ld.global.nc, without L1 allocation as every row is read
// once by this SM. Correct for rows another GPU wrote: the non-coherent (texture) path caches
// lines in this SM's L1/texture cache, which no other SM or GPU invalidates, so it is only unsafe
// for data written while the kernel runs. A pulled home row is written by its home rank before
// the home rank arrives at the pulling launch's entry barrier (in an earlier launch, or by the
// host), and nobody writes it again until a later launch's entry barrier; the entry barrier's
// acquire orders this kernel's loads after those writes, and no line of those rows can be in this
// SM's L1 from before: nothing reads them before the barrier, and the driver invalidates global L1
// lines between dependent grids (PTX ISA, "Cache operators"), so no stale line can be served.
__device__ __forceinline__ uint4 load_immutable16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Data stored earlier in this launch by another CTA or rank and ordered by a world barrier (the
// home side of combine and reverse dispatch): ld.global. The "memory" clobber keeps the compiler
// from moving these above the barrier that orders them.
__device__ __forceinline__ uint4 load_coherent16(const void* p) {
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

__device__ __forceinline__ float load_coherent_f32(const float* p) {
  float v;
  asm volatile("ld.global.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void store16(void* p, uint4 v) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

// The first vector of row `row` in a [rows][hidden] bf16 buffer.
__device__ __forceinline__ uint4* row_vectors(__nv_bfloat16* base, int64_t row, int hidden) {
  return reinterpret_cast<uint4*>(base + row * hidden);
}
__device__ __forceinline__ const uint4* row_vectors(const __nv_bfloat16* base, int64_t row, int hidden) {
  return reinterpret_cast<const uint4*>(base + row * hidden);
}

// The 16-byte load of a row copy: ld.global.nc (kCoherent = false: src is immutable during the
// launch) or ld.global.
template <bool kCoherent>
__device__ __forceinline__ uint4 load_row16(const void* p) {
  if constexpr (kCoherent) {
    return load_coherent16(p);
  } else {
    return load_immutable16(p);
  }
}

// One warp copies `vectors` 16-byte vectors from src (immutable during the launch unless
// kCoherent) to dst.
template <bool kCoherent = false>
__device__ __forceinline__ void warp_copy_row(uint4* dst, const uint4* src, int vectors, int lane) {
  int i = lane;
  for (; i + (kCopyUnroll - 1) * kWarpSize < vectors; i += kCopyUnroll * kWarpSize) {
    uint4 v[kCopyUnroll];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) v[u] = load_row16<kCoherent>(src + i + u * kWarpSize);
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) store16(dst + i + u * kWarpSize, v[u]);
  }
  for (; i < vectors; i += kWarpSize) store16(dst + i, load_row16<kCoherent>(src + i));
}

// One warp copies vectors [first, end) of src into the row of each lane in `members` (lanes whose
// `mine` names a row; dst_of(mine): that row's first vector), each vector loaded once (kCoherent
// as warp_copy_row). first and end are warp-uniform: the shuffles need every lane.
template <bool kCoherent, typename DstOf>
__device__ __forceinline__ void warp_fan_out_vectors(const uint4* src, int first, int end, unsigned members, int mine,
                                                     DstOf&& dst_of, int lane) {
  for (int base = first; base < end; base += kCopyUnroll * kWarpSize) {
    uint4 v[kCopyUnroll];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      const int i = base + u * kWarpSize + lane;
      if (i < end) v[u] = load_row16<kCoherent>(src + i);
    }
    for (unsigned rest = members; rest != 0u; rest &= rest - 1u) {
      uint4* const dst = dst_of(__shfl_sync(~0u, mine, __ffs(rest) - 1));
#pragma unroll
      for (int u = 0; u < kCopyUnroll; ++u) {
        const int i = base + u * kWarpSize + lane;
        if (i < end) store16(dst + i, v[u]);
      }
    }
  }
}

// One warp zeroes `vectors` 16-byte vectors at dst.
__device__ __forceinline__ void warp_zero_row(uint4* dst, int vectors, int lane) {
  for (int i = lane; i < vectors; i += kWarpSize) store16(dst + i, make_uint4(0u, 0u, 0u, 0u));
}

// bf16 <-> fp32 for 8 values of one vector; bf16 -> fp32 is exact, fp32 -> bf16 rounds to
// nearest even (what caracal::bf16_bits does on the host).
__device__ __forceinline__ void unpack_bf16x8(uint4 v, float (&out)[kBf16PerVector]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    out[2 * w] = __uint_as_float(words[w] << 16);
    out[2 * w + 1] = __uint_as_float(words[w] & 0xffff0000u);
  }
}

__device__ __forceinline__ uint4 pack_bf16x8(const float (&in)[kBf16PerVector]) {
  return make_uint4(pack_bf16x2(in[0], in[1]), pack_bf16x2(in[2], in[3]), pack_bf16x2(in[4], in[5]),
                    pack_bf16x2(in[6], in[7]));
}

}  // namespace caracal::transfer
