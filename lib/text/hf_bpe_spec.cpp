// Reading a tokenizer.json (Hugging Face `tokenizers`' serialisation) that holds a byte-level BPE. Everything the
// encoder would otherwise get wrong in silence is refused here: another model or normalizer, pre-tokenizers other
// than Split and ByteLevel, merges naming tokens the vocabulary lacks, holes in the ids.
#include "text/hf_bpe_spec.h"

#include "core/error.h"
#include "core/json_read.h"

#include <fmt/format.h>

#include <algorithm>
#include <unordered_map>

namespace gt {
namespace {

/// Ids beyond this are refused: no real vocabulary comes near, and the id tables are sized by the largest id.
constexpr int64_t kMaxId = int64_t{1} << 24;

class Reader {
 public:
  explicit Reader(std::string name) : m_name(std::move(name)) {}

  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    throw ConfigError(fmt::format("{}: {}: {}", m_name, where, what));
  }

  const JsonValue& object(const JsonValue& v, const std::string& where) const {
    if (!v.is_object()) fail(where, "must be an object");
    return v;
  }
  std::string string(const JsonValue& parent, const std::string& key, const std::string& where) const {
    const JsonValue* v = parent.find(key);
    if (!v || !v->is_string()) fail(where + "." + key, "must be a string");
    return v->string;
  }
  bool flag(const JsonValue& parent, const std::string& key, bool fallback, const std::string& where) const {
    const JsonValue* v = parent.find(key);
    if (!v || v->is_null()) return fallback;
    if (v->type != JsonValue::Type::boolean) fail(where + "." + key, "must be true or false");
    return v->boolean;
  }
  /// An id below `limit`: the number of tokens the file names, so that a larger one would leave ids without a token.
  uint32_t id(const JsonValue& v, const std::string& where, int64_t limit) const {
    if (!v.integer || *v.integer < 0) fail(where, "must be an id (a whole number from 0)");
    if (*v.integer >= std::min(limit, kMaxId))
      fail(where, fmt::format("id {} is past the vocabulary: the file names {} tokens", *v.integer, limit));
    return static_cast<uint32_t>(*v.integer);
  }
  /// A key that must be absent, null or the given "off" value.
  void off(const JsonValue& parent, const std::string& key, const std::string& where, const std::string& why) const {
    const JsonValue* v = parent.find(key);
    if (!v || v->is_null()) return;
    if (v->type == JsonValue::Type::boolean && !v->boolean) return;
    if (v->is_string() && v->string.empty()) return;
    if (v->is_number() && v->number == 0) return;
    fail(where + "." + key, fmt::format("{} is not supported ({})", v->text(), why));
  }

 private:
  std::string m_name;
};

void read_normalizer(const Reader& r, const JsonValue* n, HfBpeSpec& spec) {
  if (!n || n->is_null()) return;
  r.object(*n, "normalizer");
  const std::string type = r.string(*n, "type", "normalizer");
  if (type == "NFC") {
    spec.nfc = true;
    return;
  }
  if (type == "Sequence") {
    const JsonValue* list = n->find("normalizers");
    if (!list || !list->is_array()) r.fail("normalizer.normalizers", "must be a list");
    for (const JsonValue& item : list->items) {
      r.object(item, "normalizer.normalizers[]");
      const std::string t = r.string(item, "type", "normalizer.normalizers[]");
      if (t != "NFC") r.fail("normalizer.normalizers[]", fmt::format("\"{}\" is not supported (only NFC is)", t));
      spec.nfc = true;
    }
    return;
  }
  r.fail("normalizer.type", fmt::format("\"{}\" is not supported (only NFC, or none, is)", type));
}

SplitBehavior split_behavior(const Reader& r, const std::string& s, const std::string& where) {
  if (s == "Removed") return SplitBehavior::removed;
  if (s == "Isolated") return SplitBehavior::isolated;
  if (s == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (s == "MergedWithNext") return SplitBehavior::merged_with_next;
  if (s == "Contiguous") return SplitBehavior::contiguous;
  r.fail(where, fmt::format("behavior \"{}\" is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, "
                            "Contiguous",
                            s));
}

PreTokenizerStep read_step(const Reader& r, const JsonValue& p, const std::string& where) {
  r.object(p, where);
  const std::string type = r.string(p, "type", where);
  PreTokenizerStep step;
  if (type == "ByteLevel") {
    step.kind = PreTokenizerStep::Kind::byte_level;
    step.add_prefix_space = r.flag(p, "add_prefix_space", true, where);
    step.use_regex = r.flag(p, "use_regex", true, where);
    return step;
  }
  if (type != "Split")
    r.fail(where + ".type", fmt::format("\"{}\" is not supported (ByteLevel, or Split before it, is)", type));
  step.kind = PreTokenizerStep::Kind::split;
  const JsonValue* pattern = p.find("pattern");
  if (!pattern || !pattern->is_object()) r.fail(where + ".pattern", "must be {\"Regex\": …} or {\"String\": …}");
  if (const JsonValue* re = pattern->find("Regex"); re && re->is_string()) {
    step.pattern = re->string;
  } else if (const JsonValue* s = pattern->find("String"); s && s->is_string()) {
    step.pattern = s->string;
    step.literal = true;
  } else {
    r.fail(where + ".pattern", "must be {\"Regex\": …} or {\"String\": …}");
  }
  step.behavior = split_behavior(r, r.string(p, "behavior", where), where + ".behavior");
  step.invert = r.flag(p, "invert", false, where);
  return step;
}

void read_pre_tokenizer(const Reader& r, const JsonValue* p, HfBpeSpec& spec) {
  if (!p || p->is_null()) r.fail("pre_tokenizer", "is missing (a byte-level BPE needs ByteLevel)");
  r.object(*p, "pre_tokenizer");
  if (r.string(*p, "type", "pre_tokenizer") == "Sequence") {
    const JsonValue* list = p->find("pretokenizers");
    if (!list || !list->is_array()) r.fail("pre_tokenizer.pretokenizers", "must be a list");
    for (size_t i = 0; i < list->items.size(); ++i)
      spec.pre_tokenizer.push_back(read_step(r, list->items[i], fmt::format("pre_tokenizer.pretokenizers[{}]", i)));
  } else {
    spec.pre_tokenizer.push_back(read_step(r, *p, "pre_tokenizer"));
  }
  if (spec.pre_tokenizer.empty()) r.fail("pre_tokenizer", "is an empty Sequence (a byte-level BPE needs ByteLevel)");
  for (size_t i = 0; i < spec.pre_tokenizer.size(); ++i) {
    const bool last = i + 1 == spec.pre_tokenizer.size();
    if ((spec.pre_tokenizer[i].kind == PreTokenizerStep::Kind::byte_level) != last)
      r.fail("pre_tokenizer", "must end with ByteLevel, with only Split before it");
  }
}

void read_decoder(const Reader& r, const JsonValue* d) {
  if (!d || d->is_null()) r.fail("decoder", "is missing (a byte-level BPE decodes with ByteLevel)");
  r.object(*d, "decoder");
  const std::string type = r.string(*d, "type", "decoder");
  if (type != "ByteLevel") r.fail("decoder.type", fmt::format("\"{}\" is not supported (ByteLevel is)", type));
}

void read_vocab(const Reader& r, const JsonValue& model, int64_t limit, HfBpeSpec& spec,
                std::unordered_map<std::string, uint32_t>& ids) {
  const JsonValue* vocab = model.find("vocab");
  if (!vocab || !vocab->is_object()) r.fail("model.vocab", "must be an object of token: id");
  ids.reserve(vocab->members.size());
  for (const JsonMember& m : vocab->members) {
    const uint32_t id = r.id(m.value, "model.vocab[\"" + m.key + "\"]", limit);
    if (id >= spec.vocab.size()) spec.vocab.resize(id + 1), spec.in_vocab.resize(id + 1);
    if (spec.in_vocab[id])
      r.fail("model.vocab", fmt::format("id {} is given to both \"{}\" and \"{}\"", id, spec.vocab[id], m.key));
    spec.vocab[id] = m.key;
    spec.in_vocab[id] = true;
    ids.emplace(m.key, id);
  }
}

void read_merges(const Reader& r, const JsonValue& model, HfBpeSpec& spec,
                 const std::unordered_map<std::string, uint32_t>& ids) {
  const JsonValue* merges = model.find("merges");
  if (!merges || !merges->is_array()) r.fail("model.merges", "must be a list");
  spec.merges.reserve(merges->items.size());
  const auto token = [&](const std::string& s, const std::string& where) {
    const auto it = ids.find(s);
    if (it == ids.end()) r.fail(where, fmt::format("names \"{}\", which model.vocab lacks", s));
    return it->second;
  };
  for (size_t i = 0; i < merges->items.size(); ++i) {
    const JsonValue& m = merges->items[i];
    const std::string where = fmt::format("model.merges[{}]", i);
    std::string a, b;
    if (m.is_string()) {  // "a b": tokens never hold a space in GPT-2's alphabet
      const size_t space = m.string.find(' ');
      if (space == std::string::npos || m.string.find(' ', space + 1) != std::string::npos)
        r.fail(where, fmt::format("\"{}\" is not two tokens with one space between", m.string));
      a = m.string.substr(0, space), b = m.string.substr(space + 1);
    } else if (m.is_array() && m.items.size() == 2 && m.items[0].is_string() && m.items[1].is_string()) {
      a = m.items[0].string, b = m.items[1].string;
    } else {
      r.fail(where, "must be \"a b\" or [\"a\", \"b\"]");
    }
    spec.merges.push_back({token(a, where), token(b, where), token(a + b, where)});
  }
}

void read_added(const Reader& r, const JsonValue& root, int64_t limit, HfBpeSpec& spec) {
  const JsonValue* added = root.find("added_tokens");
  if (!added || added->is_null()) return;
  if (!added->is_array()) r.fail("added_tokens", "must be a list");
  for (size_t i = 0; i < added->items.size(); ++i) {
    const JsonValue& a = added->items[i];
    const std::string where = fmt::format("added_tokens[{}]", i);
    r.object(a, where);
    const JsonValue* id = a.find("id");
    if (!id) r.fail(where + ".id", "is missing");
    AddedTokenSpec t;
    t.id = r.id(*id, where + ".id", limit);
    t.content = r.string(a, "content", where);
    if (t.content.empty()) r.fail(where + ".content", "is empty");
    t.special = r.flag(a, "special", false, where);
    t.single_word = r.flag(a, "single_word", false, where);
    t.lstrip = r.flag(a, "lstrip", false, where);
    t.rstrip = r.flag(a, "rstrip", false, where);
    t.normalized = r.flag(a, "normalized", !t.special, where);
    spec.added.push_back(std::move(t));
  }
}

void read_model(const Reader& r, const JsonValue& model, int64_t limit, HfBpeSpec& spec) {
  r.object(model, "model");
  const JsonValue* type = model.find("type");
  if (!type || !type->is_string() || type->string != "BPE")
    r.fail("model.type", fmt::format("{} is not supported (BPE is)", type ? type->text() : "missing"));
  r.off(model, "dropout", "model", "encoding would be random");
  r.off(model, "continuing_subword_prefix", "model", "not a byte-level BPE");
  r.off(model, "end_of_word_suffix", "model", "not a byte-level BPE");
  r.off(model, "byte_fallback", "model", "a SentencePiece-style BPE, not a byte-level one");
  spec.fuse_unk = r.flag(model, "fuse_unk", false, "model");
  spec.ignore_merges = r.flag(model, "ignore_merges", false, "model");
  std::unordered_map<std::string, uint32_t> ids;
  read_vocab(r, model, limit, spec, ids);
  read_merges(r, model, spec, ids);
  if (const JsonValue* unk = model.find("unk_token"); unk && !unk->is_null()) {
    const auto it = unk->is_string() ? ids.find(unk->string) : ids.end();
    if (it == ids.end()) r.fail("model.unk_token", fmt::format("{} is not a token of model.vocab", unk->text()));
    spec.unk = it->second;
  }
}

}  // namespace

HfBpeSpec read_hf_bpe_spec(const std::string& json_text, const std::string& name) {
  const Reader r(name);
  JsonValue root;
  try {
    JsonLimits limits;
    limits.max_bytes = size_t{1} << 30;
    root = json_read_object(json_text, limits);
  } catch (const JsonReadError& e) {
    throw ConfigError(fmt::format("{}: not a tokenizer.json: {}", name, e.what()));
  }
  HfBpeSpec spec;
  const JsonValue* model = root.find("model");
  if (!model) r.fail("model", "is missing");
  // Every id must be below the number of tokens named (the vocabulary's and the added ones), or some id has none.
  const JsonValue *vocab = model->find("vocab"), *added = root.find("added_tokens");
  const auto limit = static_cast<int64_t>((vocab ? vocab->members.size() : 0) + (added ? added->items.size() : 0));
  read_model(r, *model, limit, spec);
  read_normalizer(r, root.find("normalizer"), spec);
  read_pre_tokenizer(r, root.find("pre_tokenizer"), spec);
  read_decoder(r, root.find("decoder"));
  read_added(r, root, limit, spec);
  size_t size = spec.vocab.size();
  for (const AddedTokenSpec& a : spec.added) size = std::max<size_t>(size, a.id + size_t{1});
  spec.vocab.resize(size), spec.in_vocab.resize(size);
  std::vector<bool> named = spec.in_vocab;
  for (const AddedTokenSpec& a : spec.added) {
    if (named[a.id] && !spec.in_vocab[a.id])
      r.fail("added_tokens", fmt::format("id {} is given to two added tokens", a.id));
    named[a.id] = true;
  }
  for (size_t id = 0; id < size; ++id)
    if (!named[id]) r.fail("model.vocab", fmt::format("id {} has no token (ids run to {})", id, size - 1));
  spec.vocab_size = static_cast<uint32_t>(size);
  return spec;
}

}  // namespace gt
