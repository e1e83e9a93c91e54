// Fuzz target: the llm.c token shard reader (gt::TokenWindows) and the windows cut from a shard.
// Input: one byte giving the block size (1 + byte % 16), then the shard file.
#include "data/tokens.h"
#include "fuzz_input.h"

#include "core/error.h"

#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static gt::fuzz::ScratchFile shard("shard.bin");
  if (size < 1) return 0;
  const int64_t block = 1 + data[0] % 16;
  shard.write(std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  try {
    const gt::TokenWindows w({shard.path()}, block, 0);
    std::vector<float> x(static_cast<size_t>(block));
    std::vector<int32_t> y(static_cast<size_t>(block));
    for (int64_t i = 0; i < w.windows(); ++i) {
      w.window(i, x.data(), y.data());
      for (int64_t t = 0; t < block; ++t)
        if (y[static_cast<size_t>(t)] >= w.vocab_size() || x[static_cast<size_t>(t)] >= w.vocab_size())
          __builtin_trap();
    }
  } catch (const gt::Error&) {
  }
  return 0;
}
