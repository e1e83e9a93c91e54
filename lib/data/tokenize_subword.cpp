// `gputrain tokenize` with a SentencePiece vocabulary: the trainer's sample, documents cut into pieces that encode
// alike whole or apart, the pieces encoded on every thread, and the ids written in order as llm.c shards.
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/limits.h"
#include "core/ownership.h"
#include "core/parallel.h"
#include "data/tokens.h"
#include "text/byte_tokenizer.h"
#include "text/load.h"
#include "text/sentencepiece.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace gt {
namespace {

constexpr size_t kPieceBytes = size_t{64} << 10;  // a document is cut into pieces of about this many bytes
constexpr size_t kReadBytes = size_t{8} << 20;    // read from a file at a time
constexpr size_t kBatchBytes = size_t{32} << 20;  // pieces encoded together (on every thread)

// The first position at or after `from` where a piece may start: a lone space (a non-space before it and after
// it). Pieces of the models trained here never span one (split_by_whitespace; runs of spaces are pieces of their
// own), and byte-level BPE's pre-tokenizers (GPT-2's and Llama 3's patterns) end a word before a lone space and start
// the next with it, so a BPE model encodes a document to the same ids whole or cut there (a unigram model's Viterbi
// search may break a tie between equally likely segmentations otherwise, its sums of scores being rounded differently).
// npos when there is none (yet) in `text`.
size_t next_cut(std::string_view text, size_t from) {
  for (size_t i = std::max<size_t>(from, 1); i + 1 < text.size(); ++i)
    if (text[i] == ' ' && text[i - 1] != ' ' && text[i + 1] != ' ') return i;
  return std::string_view::npos;
}

struct Piece {
  std::string text;
  bool document_start = false;
  bool validation = false;
};

// Cuts the inputs into documents (files, or parts of one between `sep`s) and the documents into pieces, reading a
// block at a time; `emit` takes each piece in order. A piece starting at or after `split` (a byte offset over all
// inputs) is validation, and the first cut after `split` is taken whatever the piece's size.
template <class Emit>
void cut_inputs(const std::vector<std::string>& inputs, const std::string& sep, int64_t split, Emit&& emit) {
  int64_t offset = 0;  // of pending's first byte, over all inputs
  for (const std::string& path : inputs) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw DataError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
    std::string pending;  // read, not yet cut: [head, size())
    size_t head = 0;
    bool document_start = true, eof = false;
    auto piece = [&](size_t n) {
      if (n > 0) emit(Piece{pending.substr(head, n), document_start, offset >= split});
      document_start = false;
      head += n;
      offset += static_cast<int64_t>(n);
    };
    std::vector<char> block(kReadBytes);
    while (!eof || head < pending.size()) {
      if (!eof) {
        pending.erase(0, head);
        head = 0;
        in.read(block.data(), static_cast<std::streamsize>(block.size()));
        if (in.bad()) throw DataError(fmt::format("{}: cannot read: {}", path, std::strerror(errno)));
        pending.append(block.data(), static_cast<size_t>(in.gcount()));
        eof = !in;
      }
      for (;;) {
        const std::string_view rest = std::string_view(pending).substr(head);
        const size_t end = sep.empty() ? std::string::npos : rest.find(sep);
        // Without a separator in sight, the last bytes may begin one that the next block completes: no cut there.
        const size_t open = end != std::string::npos || eof || sep.empty()
                                ? rest.size()
                                : rest.size() - std::min(rest.size(), sep.size() - 1);
        const std::string_view doc = rest.substr(0, std::min(end, open));
        const int64_t to_split = split - offset;
        const size_t want =
            to_split > 0 && static_cast<size_t>(to_split) < kPieceBytes ? static_cast<size_t>(to_split) : kPieceBytes;
        if (const size_t cut = next_cut(doc, want); cut != std::string_view::npos) {
          piece(cut);
          continue;
        }
        if (end != std::string::npos) {  // the document ends: its last piece, then past the separator
          piece(end);
          head += sep.size();
          offset += static_cast<int64_t>(sep.size());
          document_start = true;
          continue;
        }
        if (eof) piece(rest.size());
        break;
      }
    }
  }
}

// The trainer's sample: from each input its first bytes, in proportion to its size, cut at a line end (and the
// document separators taken out).
std::string training_sample(const std::vector<std::string>& inputs, int64_t total, const SubwordOptions& o) {
  std::string sample;
  for (const std::string& path : inputs) {
    std::error_code ec;
    const auto size = static_cast<int64_t>(std::filesystem::file_size(path, ec));
    const auto share = static_cast<size_t>(std::min<double>(
        static_cast<double>(size), std::ceil(static_cast<double>(o.sample_bytes) * size / static_cast<double>(total))));
    std::ifstream in(path, std::ios::binary);
    std::string text(share, '\0');
    in.read(text.data(), static_cast<std::streamsize>(share));
    text.resize(static_cast<size_t>(in.gcount()));
    if (text.size() < static_cast<size_t>(size))
      if (const size_t nl = text.rfind('\n'); nl != std::string::npos) text.resize(nl + 1);
    size_t from = 0;
    for (size_t at = o.doc_sep.empty() ? std::string::npos : text.find(o.doc_sep); at != std::string::npos;
         at = text.find(o.doc_sep, from)) {
      sample.append(text, from, at - from).push_back('\n');
      from = at + o.doc_sep.size();
    }
    sample.append(text, from, std::string::npos);
  }
  return sample;
}

void check_options(const std::string& out_dir, double val_fraction, int64_t shard_tokens, const SubwordOptions& o) {
  if (out_dir.empty()) throw ConfigError("tokenize --out: an empty path");
  if (!(val_fraction >= 0 && val_fraction < 1))
    throw ConfigError(fmt::format("tokenize --val-fraction {}: expected a number in [0, 1)", val_fraction));
  if (shard_tokens < 1 || shard_tokens > limits::kShardTokens.max)
    throw ConfigError(fmt::format("tokenize --shard-tokens {}: expected a number in [1, {}] ({})", shard_tokens,
                                  limits::kShardTokens.max, limits::kShardTokens.what));
  if (o.vocab_size > 0 && !o.tokenizer.empty())
    throw ConfigError("tokenize --vocab-size and --tokenizer: give one (train a vocabulary, or encode with a model)");
  if (o.tokenizer.empty() && (o.vocab_size < 260 || o.vocab_size > limits::kTokenVocab.max))
    throw ConfigError(
        fmt::format("tokenize --vocab-size {}: expected a number in [260, {}] (the 256 byte pieces, "
                    "<unk> and </s> come first)",
                    o.vocab_size, limits::kTokenVocab.max));
  if (o.model != "bpe" && o.model != "unigram")
    throw ConfigError(fmt::format("tokenize --model {}: expected bpe or unigram", o.model));
  if (!(o.character_coverage > 0 && o.character_coverage <= 1))
    throw ConfigError(
        fmt::format("tokenize --character-coverage {}: expected a number in (0, 1]", o.character_coverage));
  if (o.sample_bytes < 1) throw ConfigError(fmt::format("tokenize --sample-bytes {}: expected ≥ 1", o.sample_bytes));
}

}  // namespace

TokenizeResult tokenize_subword(const std::vector<std::string>& inputs, const std::string& out_dir, double val_fraction,
                                int64_t shard_tokens, bool force, const SubwordOptions& o) {
  if (inputs.empty()) throw ConfigError("tokenize: no input files");
  check_options(out_dir, val_fraction, shard_tokens, o);
  // A given tokenizer encodes: a SentencePiece model, or a Hugging Face byte-level BPE (llm.c's gpt2_tokenizer.bin
  // only decodes, and a byte descriptor is what tokenize does without --tokenizer).
  std::unique_ptr<Tokenizer> tok;
  std::string tok_name = "tokenizer.model", tok_bytes;
  if (!o.tokenizer.empty()) {
    tok = load_tokenizer(o.tokenizer);
    tok_name = tok->file_name();
    if (!tok->encodes() || tok_name == kByteDescriptorName)
      throw ConfigError(
          fmt::format("tokenize --tokenizer {}: a {} tokenizer; tokenize encodes with SentencePiece models and "
                      "tokenizer.json byte-level BPE (without --tokenizer: bytes)",
                      o.tokenizer, tok->kind()));
    if (!dynamic_cast<const SentencePieceTokenizer*>(tok.get())) {  // kept as given (a model is re-serialised below)
      std::ifstream in(o.tokenizer, std::ios::binary);
      tok_bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
  }
  const int64_t total = check_tokenize_inputs(inputs);
  refuse_input_inside("--out", out_dir, inputs);
  if (!o.tokenizer.empty()) refuse_input_inside("--out", out_dir, {o.tokenizer});
  const ClaimedFolder claimed =
      claim_output_folder("--out", out_dir, Owner::tokenization, force ? Reuse::replace : Reuse::never,
                          "--force replaces it (its shards are removed first)");
  if (!tok) {
    SentencePieceTraining t{o.vocab_size, o.model, o.byte_fallback, o.character_coverage, o.seed, num_threads()};
    tok = std::make_unique<SentencePieceTokenizer>(train_sentencepiece(training_sample(inputs, total, o), t),
                                                   "the trained model");
  }
  const auto* spm = dynamic_cast<const SentencePieceTokenizer*>(tok.get());
  if (spm) tok_bytes = spm->serialized();
  TokenizeResult r;
  r.replaced = claimed.removed;
  r.tokenizer_file = tok_name;
  r.tokenizer_kind = tok->kind();
  std::vector<std::string> written{tok_name};
  write_manifest(out_dir, Owner::tokenization, written, false);
  write_file_atomic(out_dir + "/" + tok_name, tok_bytes);

  const bool wide = tok->vocab_size() > limits::kUint16Vocab;
  const std::optional<uint32_t> eot = tok->end_of_text();
  const auto split = static_cast<int64_t>(std::llround(static_cast<double>(total) * (1 - val_fraction)));
  std::vector<uint32_t> shard;
  int shard_no = 0;
  bool in_val = false;
  auto flush = [&] {
    if (shard.empty()) return;
    const std::string name = fmt::format("{}_{:06d}.bin", in_val ? "val" : "train", shard_no++);
    written.push_back(name);
    write_manifest(out_dir, Owner::tokenization, written, false);
    const std::string path = out_dir + "/" + name;
    if (wide) {
      write_token_shard(path, shard.data(), shard.size());
    } else {
      const std::vector<uint16_t> narrow(shard.begin(), shard.end());
      write_token_shard(path, narrow.data(), narrow.size());
    }
    r.files.push_back(path);
    shard.clear();
  };
  auto push = [&](uint32_t id) {
    shard.push_back(id);
    (in_val ? r.val_tokens : r.train_tokens) += 1;
    if (static_cast<int64_t>(shard.size()) == shard_tokens) flush();
  };
  std::vector<Piece> batch;
  size_t batch_bytes = 0;
  auto encode_batch = [&] {
    std::vector<std::vector<uint32_t>> ids(batch.size());
    parallel_for(static_cast<int64_t>(batch.size()), 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        std::string_view text = batch[static_cast<size_t>(i)].text;
        // A model that puts a ▁ before every text gives the space a piece after a cut starts with.
        if (spm && spm->dummy_prefix() && !batch[static_cast<size_t>(i)].document_start && text.starts_with(' '))
          text.remove_prefix(1);
        ids[static_cast<size_t>(i)] = tok->encode(text);
      }
    });
    for (size_t i = 0; i < batch.size(); ++i) {
      if (batch[i].validation && !in_val) {  // the split: the rest is validation, numbered from 0 again
        flush();
        in_val = true;
        shard_no = 0;
      }
      if (batch[i].document_start && eot) push(*eot);
      for (const uint32_t id : ids[i]) push(id);
    }
    batch.clear();
    batch_bytes = 0;
  };
  cut_inputs(inputs, o.doc_sep, val_fraction > 0 ? split : total + 1, [&](Piece p) {
    batch_bytes += p.text.size();
    batch.push_back(std::move(p));
    if (batch_bytes >= kBatchBytes) encode_batch();
  });
  encode_batch();
  flush();
  if (r.train_tokens == 0) throw DataError(fmt::format("{}: no training tokens: the inputs hold no text", out_dir));
  write_manifest(out_dir, Owner::tokenization, written, true);  // only now does the folder read as a tokenization
  return r;
}

}  // namespace gt
