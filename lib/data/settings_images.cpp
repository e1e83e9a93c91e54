// data.format images: folders DIR/<class>/<file>.png|.jpg|.jpeg (data/images.h): the keys, parser, YAML writer
// and loader, and its row of data_formats(); each bad value names its path.
#include "data/settings_rows.h"

#include "config/schema.h"
#include "data/batch_stager.h"
#include "data/images.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <tuple>
#include <utility>

namespace gt {
using namespace data_rows;

namespace {

std::string existing_dir(const ConfigNode& n, bool check = true) {
  namespace fs = std::filesystem;
  const std::string path = n.as_string();
  if (!check) return path;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) n.fail(fmt::format("folder not found: {}", path));
  if (!fs::is_directory(st))
    n.fail(fmt::format("{} is not a folder (images reads {}/<class>/<file>.png|.jpg|.jpeg)", path, path));
  if (::access(path.c_str(), R_OK | X_OK) != 0) n.fail(fmt::format("cannot read {}: {}", path, std::strerror(errno)));
  return path;
}

KeySpec pair_key(const char* name, bool required, const char* doc) {
  return {.name = name,
          .kind = KeyKind::list,
          .required = required,
          .min_items = 2,
          .max_items = 2,
          .items = {{.name = "extent", .kind = KeyKind::size, .min = 1, .limit = &limits::kExtent}},
          .doc = doc};
}

const SectionSpec& image_section() {
  static const SectionSpec s = plain_section(
      {pair_key("size", true, "[H, W] of every sample; without resize every file must have it already"),
       {.name = "channels",
        .kind = KeyKind::integer,
        .min = 1,
        .max = 3,
        .fallback = "3",
        .doc = "1: grey, 3: RGB (files of the other kind are converted)",
        .extra_json = R"("enum": [1, 3])"},
       {.name = "resize",
        .kind = KeyKind::any_of,
        .items = {{.name = "shorter side", .kind = KeyKind::size, .min = 1, .limit = &limits::kExtent},
                  pair_key("[H, W]", false, "")},
        .doc = "bilinear, before the crop: H scales the shorter side to H, [H, W] gives exactly that size"},
       pair_key("center_crop", false, "the centre [H, W] after resize; must equal size")},
      "what every image becomes: decode, resize, center crop");
  return s;
}

std::pair<int64_t, int64_t> read_pair(const ConfigNode& n) {
  if (!n.is_sequence() || n.size() != 2) n.fail("expected [H, W], two sizes");
  const std::vector<int64_t> v = n.as_size_list(1, limits::kExtent);
  return {v[0], v[1]};
}

void parse_images(const ConfigNode& d, DataConfig& out) {
  d.require("train");
  d.require("image");
  out.train_dir = existing_dir(d["train"], out.check_files);
  if (d.has("test")) out.test_dir = existing_dir(d["test"], out.check_files);
  const ConfigNode img = d["image"];
  const std::vector<KeySpec>& ik = section_keys(image_section());
  expect_keys(img, ik);
  img.require("size");
  ImageSpec& spec = out.image;
  std::tie(spec.height, spec.width) = read_pair(img["size"]);
  spec.channels = get_int(img, key_spec(ik, "channels"));
  if (spec.channels != 1 && spec.channels != 3) img["channels"].fail("expected 1 (grey) or 3 (RGB), got 2");
  if (img.has("resize")) {
    const ConfigNode r = img["resize"];
    if (r.is_sequence())
      std::tie(spec.resize_h, spec.resize_w) = read_pair(r);
    else
      spec.resize_h = r.as_size(1, limits::kExtent);
  }
  if (img.has("center_crop")) {
    std::tie(spec.crop_h, spec.crop_w) = read_pair(img["center_crop"]);
    if (spec.crop_h != spec.height || spec.crop_w != spec.width)
      img["center_crop"].fail(fmt::format("[{}, {}] differs from size [{}, {}]: the crop is what every sample is",
                                          spec.crop_h, spec.crop_w, spec.height, spec.width));
  }
  const std::vector<KeySpec>& keys = data_format(DataFormat::images).keys;
  read_scale(d, out);
  parse_normalize(d, out, spec.channels);
  const KeySpec& bad = key_spec(keys, "on_bad_file");
  out.bad_file_error = d.get_choice(bad.name, bad.fallback, bad.choices) == "error";
  const ConfigNode cache = d["cache"];
  if (cache.defined()) {
    out.cache = cache.as_string();
    if (out.cache.empty()) cache.fail("expected a file path, got an empty string (null: no cache)");
    if (std::filesystem::is_directory(out.cache)) cache.fail(fmt::format("{} is a folder, not a file", out.cache));
    // The cache is rewritten whenever it is stale: only a file the cache itself wrote may be there.
    std::error_code ec;
    if (std::filesystem::exists(std::filesystem::symlink_status(out.cache, ec)) && !is_image_cache(out.cache))
      cache.fail(fmt::format("{} exists and is not a gputrain image cache; it is not overwritten: name a new file",
                             out.cache));
  }
}

void write_images(const DataConfig& c, YAML::Node& d) {
  d["train"] = c.train_dir;
  if (!c.test_dir.empty()) d["test"] = c.test_dir;
  YAML::Node img = d["image"];
  img["size"] = std::vector<int64_t>{c.image.height, c.image.width};
  img["size"].SetStyle(YAML::EmitterStyle::Flow);
  img["channels"] = c.image.channels;
  if (c.image.resize_h > 0 && c.image.resize_w == 0) img["resize"] = c.image.resize_h;
  if (c.image.resize_w > 0) {
    img["resize"] = std::vector<int64_t>{c.image.resize_h, c.image.resize_w};
    img["resize"].SetStyle(YAML::EmitterStyle::Flow);
  }
  if (c.image.crop_h > 0) {
    img["center_crop"] = std::vector<int64_t>{c.image.crop_h, c.image.crop_w};
    img["center_crop"].SetStyle(YAML::EmitterStyle::Flow);
  }
  d["scale"] = c.scale;
  write_normalize(c, d);
  d["on_bad_file"] = c.bad_file_error ? "error" : "skip";
  if (c.cache.empty())
    d["cache"] = YAML::Node();
  else
    d["cache"] = c.cache;
}

void load_images(const DataConfig& c, uint64_t, Dataset& train, Dataset& test) {
  read_image_folders(
      c.train_dir, c.test_dir,
      {.image = c.image, .scale = static_cast<float>(c.scale), .bad_file_error = c.bad_file_error, .cache = c.cache},
      train, test);
  normalize_inputs(train, c.normalize);
  normalize_inputs(test, c.normalize);
}

}  // namespace

DataFormatSpec data_rows::image_format_row() {
  return {DataFormat::images,
          "images",
          {{.name = "train",
            .kind = KeyKind::string,
            .required = true,
            .doc = "a folder DIR/<class>/<file>.png|.jpg|.jpeg; classes (labels) in name order"},
           {.name = "test",
            .kind = KeyKind::string,
            .nullable = true,
            .doc = "a folder like train's, with the same class folders (null: none)"},
           {.name = "image", .kind = KeyKind::map, .required = true, .section = &image_section()},
           kScaleKey,
           kNormalize,
           {.name = "on_bad_file",
            .kind = KeyKind::choice,
            .choices = {"skip", "error"},
            .fallback = "skip",
            .doc = "a corrupt or unreadable file: skip it (one warning, counted in summary.json) or stop naming it"},
           {.name = "cache",
            .kind = KeyKind::string,
            .nullable = true,
            .fallback = "null",
            .doc = "a file for the decoded set (checksummed), read by later runs while the files and options match"}},
          parse_images,
          write_images,
          load_images};
}

}  // namespace gt
