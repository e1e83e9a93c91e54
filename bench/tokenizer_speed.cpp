// gputrain's byte-level BPE encoder on a file of documents, for bench/tokenizer_speed.py: loads a tokenizer.json,
// splits the text into documents at lines that hold only SEPARATOR (fortune files' "%"), and encodes them all on
// THREADS threads (each takes the next 64 documents), PASSES times: the first pass starts with empty word caches,
// the later ones find them filled, as a long-running tokenizer does. Prints one JSON line: the load time, each
// pass's seconds, the bytes and tokens. With IDS_OUT, writes every document's ids (uint32, in order) there, so that
// the script can compare them with the other libraries'.
// Usage: bench_tokenizer_speed TOKENIZER_JSON TEXT [THREADS] [PASSES] [SEPARATOR] [IDS_OUT]
#include "bench_main.h"
#include "text/hf_bpe.h"
#include "timing.h"

#include <fmt/format.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using gt::bench::Clock;
using gt::bench::since;

std::vector<std::string> documents(const std::string& text, const std::string& separator) {
  std::vector<std::string> docs;
  std::string doc;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line == separator) {
      if (!doc.empty()) docs.push_back(std::move(doc));
      doc.clear();
    } else {
      doc += line + "\n";
    }
  }
  if (!doc.empty()) docs.push_back(std::move(doc));
  return docs;
}

}  // namespace

int main(int argc, char** argv) {
  return gt::bench::guarded_main("bench_tokenizer_speed", [&] {
    if (argc < 3)
      throw gt::ConfigError("usage: bench_tokenizer_speed TOKENIZER_JSON TEXT [THREADS] [PASSES] [SEP] [IDS_OUT]");
    const int threads = argc > 3 ? std::atoi(argv[3]) : 2, passes = argc > 4 ? std::atoi(argv[4]) : 2;
    const std::string separator = argc > 5 ? argv[5] : "%";
    std::ifstream in(argv[2], std::ios::binary);
    if (!in) throw gt::ConfigError(fmt::format("{}: cannot open", argv[2]));
    std::ostringstream text;
    text << in.rdbuf();
    const std::vector<std::string> docs = documents(text.str(), separator);
    const Clock::time_point load_start = Clock::now();
    const auto tok = gt::load_hf_tokenizer(argv[1]);
    const double load_s = since(load_start);
    std::vector<std::vector<uint32_t>> ids(docs.size());
    std::vector<double> seconds;
    for (int pass = 0; pass < passes; ++pass) {
      std::atomic<size_t> next{0};
      const auto work = [&] {
        for (size_t begin; (begin = next.fetch_add(64)) < docs.size();)
          for (size_t i = begin; i < std::min(begin + 64, docs.size()); ++i) ids[i] = tok->encode(docs[i]);
      };
      const Clock::time_point start = Clock::now();
      std::vector<std::thread> pool;
      for (int t = 1; t < threads; ++t) pool.emplace_back(work);
      work();
      for (std::thread& t : pool) t.join();
      seconds.push_back(since(start));
    }
    size_t bytes = 0, tokens = 0;
    for (size_t i = 0; i < docs.size(); ++i) bytes += docs[i].size(), tokens += ids[i].size();
    if (argc > 6) {
      std::ofstream out(argv[6], std::ios::binary);
      for (const auto& d : ids) out.write(reinterpret_cast<const char*>(d.data()), std::streamsize(d.size() * 4));
      if (!out) throw gt::Error(fmt::format("{}: cannot write", argv[6]));
    }
    std::printf("{\"load_s\": %.4f, \"pass_s\": [%s], \"documents\": %zu, \"bytes\": %zu, \"tokens\": %zu}\n", load_s,
                fmt::format("{:.4f}", fmt::join(seconds, ", ")).c_str(), docs.size(), bytes, tokens);
    return 0;
  });
}
