// What the AMX kernels (cpu_amx.cc: bf16; cpu_amx_int8.cc: the 32-weight
// interleaved int8 layouts) share: the 64-byte operand of LDTILECFG.
//
// Thread-safety: a tile configuration is per thread; each kernel call loads
// its own and releases the tiles (TILERELEASE) before it returns.
#ifndef MOECACHE_KERNELS_AMX_TILES_H_
#define MOECACHE_KERNELS_AMX_TILES_H_

#include <cstdint>

namespace moe {

// Palette 1: up to 8 tiles of up to 16 rows of up to 64 bytes.
struct alignas(64) AmxTileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row, per tile
  uint8_t rows[16] = {};    // rows, per tile

  void Set(int tile, int tile_rows, int bytes_per_row) {
    rows[tile] = static_cast<uint8_t>(tile_rows);
    colsb[tile] = static_cast<uint16_t>(bytes_per_row);
  }
};

}  // namespace moe

#endif  // MOECACHE_KERNELS_AMX_TILES_H_
