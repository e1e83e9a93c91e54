// The data section: the table of data.format rows (written with their formats in settings_formats.cpp and
// settings_images.cpp), the keys every format has, and reading and writing back the section.
#include "data/settings.h"
#include "data/settings_rows.h"

#include "config/choice.h"
#include "config/schema.h"
#include "data/batch_stager.h"

#include <array>
#include <utility>

namespace gt {
namespace {

const std::array<Choice<AutoSwitch>, 3>& auto_switches() {
  static const std::array<Choice<AutoSwitch>, 3> table{{
      {AutoSwitch::automatic, "auto"},
      {AutoSwitch::on, "true"},
      {AutoSwitch::off, "false"},
  }};
  return table;
}

}  // namespace

const std::vector<DataFormatSpec>& data_formats() {
  static const std::vector<DataFormatSpec> table = [] {
    std::vector<DataFormatSpec> rows = data_rows::tensor_format_rows();
    rows.push_back(data_rows::image_format_row());
    return rows;
  }();
  return table;
}

const DataFormatSpec& data_format(DataFormat format) { return choice_row(data_formats(), format); }

namespace {

// The keys every format has: format first, batch_size, shuffle and augment after the format's own.
const KeySpec& format_key() {
  static const KeySpec k{.name = "format",
                         .kind = KeyKind::choice,
                         .required = true,
                         .choices = choice_names(data_formats()),
                         .doc = "the kind of data and its files"};
  return k;
}

const SectionSpec& random_crop_section() {
  static const SectionSpec s = plain_section({{.name = "padding",
                                               .kind = KeyKind::size,
                                               .required = true,
                                               .min = 0,
                                               .limit = &limits::kCropPadding,
                                               .doc = "shift each image by up to this many pixels (zero fill)"}});
  return s;
}

const SectionSpec& augment_section() {
  static const SectionSpec s =
      plain_section({{.name = "random_crop", .kind = KeyKind::map, .section = &random_crop_section()},
                     {.name = "hflip",
                      .kind = KeyKind::boolean,
                      .fallback = "false",
                      .doc = "mirror each image with probability 1/2"}},
                    "training set only, on [C, H, W] images");
  return s;
}

const SectionSpec& tta_section() {
  static const SectionSpec s =
      plain_section({{.name = "hflip",
                      .kind = KeyKind::boolean,
                      .fallback = "false",
                      .doc = "also evaluate each test image mirrored left-right and average the two logits"}},
                    "test-time augmentation of every evaluation, on [C, H, W] images");
  return s;
}

const std::vector<KeySpec>& tail_keys() {
  static const std::vector<KeySpec> keys{
      {.name = "batch_size",
       .kind = KeyKind::size,
       .min = 1,
       .limit = &limits::kBatch,
       .fallback = "64",
       .doc = "samples per micro-batch"},
      {.name = "shuffle",
       .kind = KeyKind::boolean,
       .fallback = "true",
       .doc = "epoch e uses a permutation drawn from (seed, e) alone"},
      {.name = "augment", .kind = KeyKind::map, .section = &augment_section()},
      {.name = "tta", .kind = KeyKind::map, .section = &tta_section()},
      {.name = "workers",
       .kind = KeyKind::integer,
       .min = 0,
       .max = 64,
       .fallback = "0",
       .doc = "threads that prepare training batches ahead of the step (0: the step's thread, when it needs one); "
              "the batches are the same for any number"},
      {.name = "prefetch",
       .kind = KeyKind::integer,
       .min = 1,
       .max = 64,
       .fallback = "2",
       .doc = "with workers: training batches held ready ahead (each one batch of host memory)"},
      {.name = "pin_memory",
       .kind = KeyKind::choice,
       .choices = {"auto", "true", "false"},
       .fallback = "auto",
       .doc = "on a GPU, stage batches in page-locked memory and copy them asynchronously (false: plain memory, "
              "the copy waits); auto: true on a GPU; no effect on the CPU"},
      {.name = "device_resident",
       .kind = KeyKind::choice,
       .choices = {"auto", "true", "false"},
       .fallback = "auto",
       .doc = "on a GPU, copy the training set to the device once and gather each batch there by a kernel from the "
              "epoch's order (uploaded once per epoch), so a step copies no samples; auto: when inputs and targets "
              "take at most " +
              std::to_string(static_cast<int>(kDeviceResidentFraction * 100)) +
              " % of the device's free memory and no batch needs work on the host (augment, token "
              "windows, NPY inputs converted per batch), else staging; true refuses those cases. On the CPU, true "
              "makes the step's thread gather each batch straight into the step's tensors (no loader threads, no "
              "staging copy; what workers: 0 does already), and auto changes nothing. The batches are the same "
              "either way"},
  };
  return keys;
}

}  // namespace

const SectionSpec& data_section() {
  static const SectionSpec s = [] {
    SectionSpec t;
    t.discriminator = "format";
    t.doc = "the data set: its format, files and batches";
    for (const DataFormatSpec& f : data_formats())
      t.variants.push_back({{f.name}, concat_keys({{format_key()}, f.keys, tail_keys()}), f.extra_json});
    return t;
  }();
  return s;
}
const std::string& to_string(DataFormat format) { return data_format(format).name; }
const std::string& to_string(AutoSwitch value) { return choice_name(auto_switches(), value); }

void parse_data(const ConfigNode& d, DataConfig& out) {
  d.require("format");
  out.format = parse_choice(d["format"], data_formats());
  const DataFormatSpec& f = data_format(out.format);
  const std::vector<KeySpec>& keys = section_keys(data_section(), f.name);
  expect_keys(d, keys);
  f.parse(d, out);
  out.batch_size = get_size(d, key_spec(keys, "batch_size"));
  out.shuffle = get_bool(d, key_spec(keys, "shuffle"));
  if (d.has("augment")) {
    const ConfigNode a = d["augment"];
    const std::vector<KeySpec>& ak = section_keys(augment_section());
    expect_keys(a, ak);
    if (a.has("random_crop")) {
      const std::vector<KeySpec>& ck = section_keys(random_crop_section());
      expect_keys(a["random_crop"], ck);
      a["random_crop"].require("padding");
      out.augment.crop_padding = read_size(a["random_crop"]["padding"], key_spec(ck, "padding"));
    }
    out.augment.hflip = get_bool(a, key_spec(ak, "hflip"));
  }
  if (d.has("tta")) {
    const ConfigNode t = d["tta"];
    const std::vector<KeySpec>& tk = section_keys(tta_section());
    expect_keys(t, tk);
    out.tta_hflip = get_bool(t, key_spec(tk, "hflip"));
  }
  out.workers = get_int(d, key_spec(keys, "workers"));
  out.prefetch = get_int(d, key_spec(keys, "prefetch"));
  if (d.has("pin_memory")) out.pin_memory = parse_choice(d["pin_memory"], auto_switches());
  if (d.has("device_resident")) out.device_resident = parse_choice(d["device_resident"], auto_switches());
  // What makes per-sample work on the host is known here; what the files hold (NPY inputs converted per batch) is
  // judged when the data is loaded (BatchStager).
  if (out.device_resident == AutoSwitch::on) {
    if (out.augment.any())
      d["device_resident"].fail(
          "true, but data.augment draws crops and flips per sample on the host; use auto or false");
    if (out.format == DataFormat::tokens)
      d["device_resident"].fail("true, but token windows are cut from the shards on the host; use auto or false");
  }
}

YAML::Node to_yaml(const DataConfig& c) {
  YAML::Node d(YAML::NodeType::Map);
  d["format"] = to_string(c.format);
  data_format(c.format).write(c, d);
  d["batch_size"] = c.batch_size;
  d["shuffle"] = c.shuffle;
  if (c.augment.crop_padding >= 0) d["augment"]["random_crop"]["padding"] = c.augment.crop_padding;
  if (c.augment.hflip) d["augment"]["hflip"] = true;
  if (c.tta_hflip) d["tta"]["hflip"] = true;
  d["workers"] = c.workers;
  d["prefetch"] = c.prefetch;
  d["pin_memory"] = to_string(c.pin_memory);
  d["device_resident"] = to_string(c.device_resident);
  return d;
}

}  // namespace gt