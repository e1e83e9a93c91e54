// safetensors files (the format PyTorch's safetensors, numpy and others read): writing atomically, reading checked.
#pragma once

#include "core/tensor.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace gt {

/// Writes `tensors` (f32, f64 or i32, any device) to `path`: into `path.tmp`, flushed and fsync'ed, then renamed
/// over `path`, so a reader (or a crash) never sees a half-written file. Throws gt::Error naming the file.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// Reads every tensor of a safetensors file onto the CPU, in file order. Corrupt or truncated files are DataErrors
/// naming the file and what is wrong.
std::vector<std::pair<std::string, Tensor>> read_safetensors(const std::string& path);

}  // namespace gt
