// Data set statistics for `gputrain data inspect`: one pass over the loaded tensors (or the token shards).
#include "data/inspect.h"

#include "core/json.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace gt {

namespace {

// Every token of the shards, read with the shard reader the loader uses (not only those in full windows).
DataStats inspect_tokens(const TokenWindows& w, const std::string& glob, DataStats s) {
  s.tokens = true;
  s.vocab_size = w.vocab_size();
  std::vector<int64_t> seen(static_cast<size_t>(w.vocab_size()), 0);  // every token is below it (TokenWindows checks)
  std::vector<uint32_t> chunk(size_t{1} << 20);
  for (const std::string& path : glob_files(glob)) {
    const TokenShard shard(path);
    for (int64_t i = 0; i < shard.size(); i += static_cast<int64_t>(chunk.size())) {
      const int64_t n = std::min(static_cast<int64_t>(chunk.size()), shard.size() - i);
      shard.read(i, n, chunk.data());
      for (int64_t k = 0; k < n; ++k) ++seen.at(chunk[static_cast<size_t>(k)]);
    }
    s.token_count += shard.size();
  }
  bool first = true;
  for (size_t t = 0; t < seen.size(); ++t) {
    if (!seen[t]) continue;
    ++s.distinct_tokens;
    if (first) s.min_token = static_cast<int64_t>(t);
    s.max_token = static_cast<int64_t>(t);
    first = false;
  }
  return s;
}

std::string json_number(double v) { return std::isfinite(v) ? fmt::format("{}", v) : "null"; }

std::string json_numbers(const std::vector<double>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + json_number(v[i]);
  return out + "]";
}

std::string numbers_text(const std::vector<double>& v) {
  constexpr size_t kShown = 16;  // a CSV of 784 features: the first ones, and --json has them all
  std::string out = "[";
  for (size_t i = 0; i < std::min(v.size(), kShown); ++i) out += fmt::format("{}{:.4g}", i ? ", " : "", v[i]);
  if (v.size() > kShown) out += fmt::format(", … {} more (--json lists all)", v.size() - kShown);
  return out + "]";
}

}  // namespace

DataStats inspect_dataset(const Dataset& data, const std::string& split, const std::string& token_glob) {
  DataStats s;
  s.split = split;
  s.source = data.source;
  s.samples = data.size();
  const Shape in = data.input_shape(), tgt = data.target_shape();
  s.input_shape = in.dims();
  s.target_shape = tgt.dims();
  if (data.tokens) return inspect_tokens(*data.tokens, token_glob, s);
  s.num_classes = data.num_classes;
  s.class_names = data.class_names;
  if (!data.class_names.empty()) s.bad_files = data.bad_files;
  if (s.num_classes > 0) {
    s.class_counts.assign(static_cast<size_t>(s.num_classes), 0);
    const int32_t* y = data.targets.data<int32_t>();
    for (int64_t i = 0; i < s.samples; ++i)
      if (y[i] >= 0 && y[i] < s.num_classes) ++s.class_counts[static_cast<size_t>(y[i])];
  }
  // A sample [C, rest...] is C channels of `per` values; a sample [F] is F channels of one value.
  const int64_t channels = in.rank() >= 1 ? in[0] : 1;
  const int64_t per = channels > 0 ? in.numel() / channels : 0;
  std::vector<double> sum(static_cast<size_t>(channels), 0.0), sq(static_cast<size_t>(channels), 0.0);
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  // Mapped inputs are converted (and checked) a sample at a time, as the loader reads them.
  const float* x = s.samples > 0 && data.inputs.defined() ? data.inputs.data<float>() : nullptr;
  std::vector<float> row(data.mapped ? static_cast<size_t>(in.numel()) : 0);
  for (int64_t n = 0; n < s.samples; ++n) {
    if (data.mapped) data.mapped->row(n, row.data());
    const float* sample = data.mapped ? row.data() : x + n * in.numel();
    for (int64_t c = 0; c < channels; ++c) {
      const float* v = sample + c * per;
      double a = 0, b = 0;
      for (int64_t i = 0; i < per; ++i) {
        const double d = v[i];
        a += d;
        b += d * d;
        lo = std::min(lo, d);
        hi = std::max(hi, d);
      }
      sum[static_cast<size_t>(c)] += a;
      sq[static_cast<size_t>(c)] += b;
    }
  }
  const double count = static_cast<double>(s.samples * per);
  for (int64_t c = 0; c < channels && count > 0; ++c) {
    const double m = sum[static_cast<size_t>(c)] / count;
    s.mean.push_back(m);
    s.std.push_back(std::sqrt(std::max(0.0, sq[static_cast<size_t>(c)] / count - m * m)));
  }
  if (s.samples > 0) {
    s.min = lo;
    s.max = hi;
  }
  return s;
}

std::string data_stats_text(const DataStats& s) {
  std::string out = fmt::format("{}: {} samples from {}\n", s.split, s.samples, s.source);
  if (s.tokens) {
    out += fmt::format("  windows of {} tokens; {} tokens in the shards, {} distinct, ids {}..{} (vocabulary {})\n",
                       s.input_shape.empty() ? 0 : s.input_shape[0], s.token_count, s.distinct_tokens, s.min_token,
                       s.max_token, s.vocab_size);
    return out;
  }
  out += fmt::format("  input shape [{}], values {:.6g}..{:.6g}\n", fmt::join(s.input_shape, ", "), s.min, s.max);
  out += fmt::format("  mean per channel {}\n  std per channel  {}\n", numbers_text(s.mean), numbers_text(s.std));
  // Images ([C, H, W] samples): the line data.normalize takes, as it stands (std 0 cannot be divided by).
  if (s.input_shape.size() == 3 && !s.mean.empty() &&
      std::all_of(s.std.begin(), s.std.end(), [](double v) { return v > 0 && std::isfinite(v); })) {
    auto list = [](const std::vector<double>& v) {
      std::string t;
      for (size_t i = 0; i < v.size(); ++i) t += fmt::format("{}{:.6g}", i ? ", " : "", v[i]);
      return t;
    };
    out += fmt::format("  normalize: {{mean: [{}], std: [{}]}}\n", list(s.mean), list(s.std));
  }
  if (s.bad_files >= 0) out += fmt::format("  bad files skipped: {}\n", s.bad_files);
  if (s.num_classes > 0) {
    out += fmt::format("  {} classes, samples per class:", s.num_classes);
    for (size_t c = 0; c < s.class_counts.size(); ++c)
      out += c < s.class_names.size() ? fmt::format(" {}:{}", s.class_names[c], s.class_counts[c])
                                      : fmt::format(" {}:{}", c, s.class_counts[c]);
    out += "\n";
  } else {
    out += fmt::format("  regression targets of shape [{}]\n", fmt::join(s.target_shape, ", "));
  }
  return out;
}

std::string data_stats_json(const DataStats& s) {
  // JsonObject holds no list of numbers: the object is written here, its strings quoted as JsonObject quotes them.
  std::string out = fmt::format(
      R"({{"split": {}, "source": {}, "samples": {}, "input_shape": [{}], "target_shape": [{}])", json_quote(s.split),
      json_quote(s.source), s.samples, fmt::join(s.input_shape, ", "), fmt::join(s.target_shape, ", "));
  if (s.tokens)
    return out +
           fmt::format(R"(, "tokens": {}, "distinct_tokens": {}, "min_token": {}, "max_token": {}, "vocab_size": {}}})",
                       s.token_count, s.distinct_tokens, s.min_token, s.max_token, s.vocab_size);
  out += fmt::format(R"(, "min": {}, "max": {}, "mean": {}, "std": {}, "num_classes": {})", json_number(s.min),
                     json_number(s.max), json_numbers(s.mean), json_numbers(s.std), s.num_classes);
  if (s.num_classes > 0) out += fmt::format(R"(, "class_counts": [{}])", fmt::join(s.class_counts, ", "));
  if (!s.class_names.empty()) {
    std::string names;
    for (size_t c = 0; c < s.class_names.size(); ++c) names += (c ? ", " : "") + json_quote(s.class_names[c]);
    out += fmt::format(R"(, "class_names": [{}])", names);
  }
  if (s.bad_files >= 0) out += fmt::format(R"(, "bad_files": {})", s.bad_files);
  return out + "}";
}

}  // namespace gt
