// data.format: images — PNG and JPEG folders written here from the first Fashion-MNIST images (and generated
// patterns), decoded against the IDX tensor, bad files, class lists, data.normalize, data.cache and config errors.
#include "core/json_read.h"
#include "data/images.h"
#include "data/settings.h"
#include "helpers.h"
#include "train/experiment.h"
#include "train/setup.h"

#include <jpeglib.h>
#include <omp.h>
#include <png.h>
#include <sys/stat.h>
#include <yaml-cpp/yaml.h>
#include <zlib.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <thread>

using namespace gt;
using gt::test::TempDir;
namespace fs = std::filesystem;

namespace {

const std::string kFashionImages = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";
const std::string kFashionLabels = "/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz";

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// (H, W, C) bytes as a PNG, with libpng's simplified writer.
std::vector<uint8_t> encode_png(const uint8_t* pixels, int h, int w, int c) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(w);
  image.height = static_cast<png_uint_32>(h);
  image.format = c == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  REQUIRE(png_image_write_to_memory(&image, nullptr, &size, 0, pixels, 0, nullptr));
  std::vector<uint8_t> out(size);
  REQUIRE(png_image_write_to_memory(&image, out.data(), &size, 0, pixels, 0, nullptr));
  out.resize(size);
  return out;
}

// (H, W, C) bytes as a baseline JPEG of `quality`.
std::vector<uint8_t> encode_jpeg(const uint8_t* pixels, int h, int w, int c, int quality) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr err;
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_compress(&cinfo);
  unsigned char* mem = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &mem, &size);
  cinfo.image_width = static_cast<JDIMENSION>(w);
  cinfo.image_height = static_cast<JDIMENSION>(h);
  cinfo.input_components = c;
  cinfo.in_color_space = c == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(pixels + static_cast<size_t>(cinfo.next_scanline) * w * c);
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  std::vector<uint8_t> out(mem, mem + size);
  jpeg_destroy_compress(&cinfo);
  std::free(mem);
  return out;
}

// The first `n` Fashion-MNIST training images as DIR/png/<label>/<i>.png, DIR/jpg/<label>/<i>.jpg and, in the
// folders' order (by class, then by index), the IDX files DIR/subset-images and DIR/subset-labels.
struct FashionFolders {
  std::string png, jpg, idx_images, idx_labels;
};
FashionFolders write_fashion(const TempDir& dir, int64_t n) {
  const IdxArray images = read_idx_file(kFashionImages), labels = read_idx_file(kFashionLabels);
  REQUIRE(images.dims.size() == 3);
  const int h = static_cast<int>(images.dims[1]), w = static_cast<int>(images.dims[2]);
  const size_t per = static_cast<size_t>(h * w);
  std::map<int, std::vector<int64_t>> by_class;
  for (int64_t i = 0; i < n; ++i) by_class[labels.data[static_cast<size_t>(i)]].push_back(i);
  REQUIRE(by_class.size() == 10);  // every class is among the first few hundred
  FashionFolders f{dir / "png", dir / "jpg", dir / "subset-images", dir / "subset-labels"};
  std::vector<uint8_t> idx_images{0, 0, 8, 3}, idx_labels{0, 0, 8, 1};
  for (int64_t d : {n, int64_t{h}, int64_t{w}})
    for (int s = 24; s >= 0; s -= 8) idx_images.push_back(static_cast<uint8_t>(d >> s));
  for (int s = 24; s >= 0; s -= 8) idx_labels.push_back(static_cast<uint8_t>(n >> s));
  for (const auto& [label, indices] : by_class) {
    for (const std::string& root : {f.png, f.jpg}) fs::create_directories(root + "/" + std::to_string(label));
    for (int64_t i : indices) {
      const uint8_t* px = images.data.data() + static_cast<size_t>(i) * per;
      char name[32];
      std::snprintf(name, sizeof name, "/%05lld", static_cast<long long>(i));
      write_bytes(f.png + "/" + std::to_string(label) + name + ".png", encode_png(px, h, w, 1));
      write_bytes(f.jpg + "/" + std::to_string(label) + name + ".jpg", encode_jpeg(px, h, w, 1, 95));
      idx_images.insert(idx_images.end(), px, px + per);
      idx_labels.push_back(static_cast<uint8_t>(label));
    }
  }
  write_bytes(f.idx_images, idx_images);
  write_bytes(f.idx_labels, idx_labels);
  return f;
}

ImageFolderOptions grey28(float scale = 1.0f / 255) {
  ImageFolderOptions o;
  o.image.height = o.image.width = 28;
  o.image.channels = 1;
  o.scale = scale;
  return o;
}

std::string images_config(const std::string& train, const std::string& extra = "", const std::string& test = "") {
  return "name: images\nseed: 5\ndevice: cpu\ndata:\n  format: images\n  train: " + train + "\n" +
         (test.empty() ? "" : "  test: " + test + "\n") +
         "  image: {size: [28, 28], channels: 1}\n  scale: 0.00392156862745098\n  batch_size: 32\n" + extra +
         "model:\n  layers:\n    - flatten\n    - {type: linear, out_features: 32}\n    - relu\n"
         "    - {type: linear, out_features: 10}\nloss: cross_entropy\noptimizer: {type: sgd, lr: 0.1}\n"
         "train: {epochs: 2, log_every: 1}\n";
}

// The loss of every step logged in a run's metrics.jsonl, as written (17 significant digits).
std::vector<std::string> step_losses(const std::string& run_dir) {
  std::vector<std::string> out;
  for (const std::string& line : test::lines_of(test::read_text(run_dir + "/metrics.jsonl"))) {
    const size_t at = line.find("\"loss\":");
    if (line.find("\"type\": \"train\"") == std::string::npos || at == std::string::npos) continue;
    out.push_back(line.substr(at, line.find_first_of(",}", at) - at));
  }
  return out;
}

std::string config_error(const std::string& yaml) {
  try {
    parse_experiment(ConfigNode::load_string(yaml, "t.yaml"));
  } catch (const ConfigError& e) {
    return e.what();
  }
  FAIL("no ConfigError for:\n" << yaml);
  return "";
}

}  // namespace

TEST_CASE("a PNG folder decodes to exactly the IDX tensor, a JPEG folder within a stated tolerance",
          "[data][images][cpu]") {
  TempDir dir;
  const FashionFolders f = write_fashion(dir, 300);
  const Dataset idx = read_idx(f.idx_images, f.idx_labels, 1.0f / 255);
  Dataset png, none;
  read_image_folders(f.png, "", grey28(), png, none);
  REQUIRE(png.inputs.shape() == idx.inputs.shape());
  CHECK(png.num_classes == 10);
  CHECK(png.class_names == std::vector<std::string>{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"});
  CHECK(png.bad_files == 0);
  CHECK(std::memcmp(png.inputs.raw(), idx.inputs.raw(), idx.inputs.bytes()) == 0);
  CHECK(std::memcmp(png.targets.raw(), idx.targets.raw(), idx.targets.bytes()) == 0);

  // JPEG at quality 95 is lossy: a mean absolute error under 1.5 grey levels, none past 32 (of 255). Measured with
  // Debian's libjpeg-turbo 2.1.5: 0.92 and 10.
  Dataset jpg;
  read_image_folders(f.jpg, "", grey28(1.0f), jpg, none);
  REQUIRE(jpg.inputs.shape() == idx.inputs.shape());
  CHECK(std::memcmp(jpg.targets.raw(), idx.targets.raw(), idx.targets.bytes()) == 0);
  const Dataset idx255 = read_idx(f.idx_images, f.idx_labels, 1.0f);
  double sum = 0, worst = 0;
  for (int64_t i = 0; i < idx255.inputs.numel(); ++i) {
    const double d = std::fabs(jpg.inputs.data<float>()[i] - idx255.inputs.data<float>()[i]);
    sum += d;
    worst = std::max(worst, d);
  }
  const double mean = sum / static_cast<double>(idx255.inputs.numel());
  INFO("mean " << mean << " worst " << worst);
  CHECK(mean < 1.5);
  CHECK(worst <= 32);
  CHECK(mean > 0);  // it is JPEG: something was lost
}

TEST_CASE("training on the PNG folder gives the losses of the same images as IDX", "[data][images][e2e]") {
  TempDir dir;
  const FashionFolders f = write_fashion(dir, 256);
  test::write_text(dir / "png.yaml", images_config(f.png));
  std::string idx_cfg = images_config(f.png);
  const std::string from = "  format: images\n  train: " + f.png + "\n";
  idx_cfg.replace(idx_cfg.find(from), from.size(),
                  "  format: idx\n  train: {images: " + f.idx_images + ", labels: " + f.idx_labels + "}\n");
  const std::string image_line = "  image: {size: [28, 28], channels: 1}\n";
  idx_cfg.replace(idx_cfg.find(image_line), image_line.size(), "");
  test::write_text(dir / "idx.yaml", idx_cfg);
  for (const char* name : {"png", "idx"}) {
    const auto r =
        test::run_gputrain(fmt::format("train {} --threads 2 --no-progress --out {} 2>&1",
                                       dir / (std::string(name) + ".yaml"), dir / (std::string(name) + "-run")));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
  }
  const std::vector<std::string> png = step_losses(dir / "png-run"), idx = step_losses(dir / "idx-run");
  CHECK(png.size() == 16);  // 2 epochs of 256 / 32
  CHECK(png == idx);
  CHECK(test::json_number(test::read_text(dir / "png-run/summary.json"), "bad_files") == 0);
}

TEST_CASE("bad image files are skipped with one warning and counted, or stop the run", "[data][images][cpu]") {
  TempDir dir;
  const FashionFolders f = write_fashion(dir, 200);
  const std::string good = f.png + "/0/" + fs::directory_iterator(f.png + "/0")->path().filename().string();
  const std::vector<uint8_t> bytes = read_bytes(good);
  write_bytes(f.png + "/0/zz-truncated.png", std::vector<uint8_t>(bytes.begin(), bytes.begin() + bytes.size() / 2));
  std::vector<uint8_t> noise(700);
  for (size_t i = 0; i < noise.size(); ++i) noise[i] = static_cast<uint8_t>(i * 7919 % 251);
  write_bytes(f.png + "/3/random.jpg", noise);
  write_bytes(f.png + "/5/empty.png", {});
  std::vector<uint8_t> cut_jpeg =
      read_bytes(f.jpg + "/1/" + fs::directory_iterator(f.jpg + "/1")->path().filename().string());
  cut_jpeg.resize(cut_jpeg.size() * 2 / 3);
  write_bytes(f.png + "/1/cut.jpeg", cut_jpeg);

  const Dataset clean = read_idx(f.idx_images, f.idx_labels, 1.0f / 255);
  Dataset ds, none;
  {
    test::ExpectWarnings warned("skipped a bad file");
    read_image_folders(f.png, "", grey28(), ds, none);
    CHECK(warned.count() == 1);
  }
  CHECK(ds.bad_files == 4);
  REQUIRE(ds.size() == clean.size());
  // One thread decodes the same set: each file has its own slot, and bad ones are squeezed out in file order.
  Dataset one;
  {
    test::ExpectWarnings warned("skipped a bad file");
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    read_image_folders(f.png, "", grey28(), one, none);
    omp_set_num_threads(threads);
  }
  REQUIRE(one.size() == ds.size());
  CHECK(std::memcmp(one.inputs.raw(), ds.inputs.raw(), ds.inputs.bytes()) == 0);
  CHECK(std::memcmp(ds.inputs.raw(), clean.inputs.raw(), clean.inputs.bytes()) == 0);
  CHECK(std::memcmp(ds.targets.raw(), clean.targets.raw(), clean.targets.bytes()) == 0);

  // The command line: one warning naming the first bad file, the count in `data inspect` and summary.json.
  test::write_text(dir / "bad.yaml", images_config(f.png));
  auto r = test::run_gputrain(fmt::format("data inspect {} 2>&1", dir / "bad.yaml"));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("bad files skipped: 4") != std::string::npos);
  // The first bad file in the folders' order (class 0 comes first; in it, names after the digits), and no other.
  CHECK(r.output.find(f.png + "/0/zz-truncated.png") != std::string::npos);
  CHECK(r.output.find("cut.jpeg") == std::string::npos);
  CHECK(r.output.find("random.jpg") == std::string::npos);
  CHECK(r.output.find("3 more bad files") != std::string::npos);
  CHECK(r.output.find("  normalize: {mean: [0.") != std::string::npos);  // the line to paste into data.normalize
  r = test::run_gputrain(
      fmt::format("train {} --threads 2 --no-progress --max-steps 2 --out {} 2>&1", dir / "bad.yaml", dir / "run"));
  CHECK(r.exit_code == 0);
  CHECK(test::json_number(test::read_text(dir / "run/summary.json"), "bad_files") == 4);

  r = test::run_gputrain(
      fmt::format("train {} --no-progress --set data.on_bad_file=error --out {} 2>&1", dir / "bad.yaml", dir / "run2"));
  CHECK(r.exit_code == 1);
  CHECK(r.output.find(f.png + "/0/zz-truncated.png") != std::string::npos);
  CHECK(r.output.find("corrupt PNG") != std::string::npos);
  CHECK(r.output.find("data.on_bad_file: error") != std::string::npos);
}

TEST_CASE("hostile image bytes are refused, never crash", "[data][images][cpu]") {
  // A PNG header claiming 2^30 × 2^30 pixels, a JPEG that stops after its start marker, a PNG signature alone.
  std::vector<uint8_t> png_header{0x89, 'P',  'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13, 'I', 'H', 'D',
                                  'R',  0x40, 0,   0,   0,    0x40, 0,    0,    0, 8, 0, 0,  0,   0};
  for (const std::vector<uint8_t>& bytes :
       {png_header, std::vector<uint8_t>{0xFF, 0xD8, 0xFF},
        std::vector<uint8_t>(png_header.begin(), png_header.begin() + 8), std::vector<uint8_t>{'G', 'I', 'F', '8'}}) {
    for (int64_t channels : {1, 3})
      CHECK_THROWS_AS(decode_image(bytes.data(), bytes.size(), channels, "hostile"), DataError);
  }
}

TEST_CASE("resize, center crop and colour conversion", "[data][images][cpu]") {
  // A 6 × 8 RGB pattern.
  const int h = 6, w = 8;
  std::vector<uint8_t> px(static_cast<size_t>(h * w * 3));
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(i * 13 % 256);
  const std::vector<uint8_t> file = encode_png(px.data(), h, w, 3);
  const DecodedImage img = decode_image(file.data(), file.size(), 3, "pattern.png");
  REQUIRE(img.pixels == px);
  // Halving with pixel centres aligned is the mean of each 2 × 2 block.
  ImageSpec spec{.height = 3, .width = 4, .channels = 3, .resize_h = 3, .resize_w = 4};
  std::vector<float> out(3 * 3 * 4);
  image_to_sample(img, spec, 1.0f, "pattern.png", out.data());
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 3; ++y)
      for (int x = 0; x < 4; ++x) {
        auto p = [&](int yy, int xx) { return static_cast<double>(px[static_cast<size_t>((yy * w + xx) * 3 + c)]); };
        const double want = (p(2 * y, 2 * x) + p(2 * y, 2 * x + 1) + p(2 * y + 1, 2 * x) + p(2 * y + 1, 2 * x + 1)) / 4;
        REQUIRE(out[static_cast<size_t>((c * 3 + y) * 4 + x)] == Approx(want).margin(1e-4));
      }
  // The shorter side to 3 gives 3 × 4; a center crop of [3, 2] takes columns 1 and 2.
  spec = {.height = 3, .width = 2, .channels = 3, .resize_h = 3, .crop_h = 3, .crop_w = 2};
  std::vector<float> crop(3 * 3 * 2);
  image_to_sample(img, spec, 1.0f, "pattern.png", crop.data());
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 3; ++y)
      for (int x = 0; x < 2; ++x)
        REQUIRE(crop[static_cast<size_t>((c * 3 + y) * 2 + x)] == out[static_cast<size_t>((c * 3 + y) * 4 + x + 1)]);
  // Without resize a file of another size is an error naming it and saying what fits it.
  spec = {.height = 4, .width = 4, .channels = 3};
  CHECK_THROWS_WITH(image_to_sample(img, spec, 1.0f, "pattern.png", out.data()),
                    Catch::Contains("pattern.png: the image is 6 × 8, not data.image.size [4, 4]") &&
                        Catch::Contains("data.image.resize"));
  // RGB to grey and grey to RGB.
  const DecodedImage grey = decode_image(file.data(), file.size(), 1, "pattern.png");
  CHECK(grey.channels == 1);
  CHECK(grey.pixels.size() == static_cast<size_t>(h * w));
  const std::vector<uint8_t> g(static_cast<size_t>(h * w), 77);
  const std::vector<uint8_t> jpeg = encode_jpeg(g.data(), h, w, 1, 90);
  const DecodedImage rgb = decode_image(jpeg.data(), jpeg.size(), 3, "grey.jpg");
  CHECK(rgb.channels == 3);
  CHECK(rgb.pixels == std::vector<uint8_t>(static_cast<size_t>(h * w * 3), 77));
}

TEST_CASE("the test folder must have the training folder's classes", "[data][images][cpu]") {
  TempDir dir;
  const FashionFolders f = write_fashion(dir, 100);
  fs::create_directories(dir / "test/0");
  fs::create_directories(dir / "test/shoes");
  fs::copy_file(f.png + "/0/" + fs::directory_iterator(f.png + "/0")->path().filename().string(), dir / "test/0/a.png");
  Dataset train, test;
  CHECK_THROWS_WITH(read_image_folders(f.png, dir / "test", grey28(), train, test),
                    Catch::Contains("the test folder " + (dir / "test") + " has the classes [0, shoes]") &&
                        Catch::Contains("training folder " + f.png + " has [0, 1, 2"));
}

TEST_CASE("data.normalize: per channel after scale, and its errors name the key", "[data][images][config][cpu]") {
  TempDir dir;
  const FashionFolders f = write_fashion(dir, 100);
  // idx too: every image format.
  const std::string idx_cfg = "name: n\ndevice: cpu\ndata:\n  format: idx\n  train: {images: " + f.idx_images +
                              ", labels: " + f.idx_labels +
                              "}\n  scale: 0.5\n  normalize: {mean: [20], std: [40]}\nmodel:\n  layers: [flatten, "
                              "{type: linear, out_features: 10}]\nloss: cross_entropy\noptimizer: {type: sgd, lr: "
                              "0.1}\ntrain: {epochs: 1}\n";
  const Experiment exp = parse_experiment(ConfigNode::load_string(idx_cfg, "t.yaml"));
  const LoadedData data = load_data(exp);
  const Dataset raw = read_idx(f.idx_images, f.idx_labels, 0.5f);
  for (int64_t i = 0; i < raw.inputs.numel(); ++i)
    REQUIRE(data.train.inputs.data<float>()[i] ==
            static_cast<float>((static_cast<double>(raw.inputs.data<float>()[i]) - 20) / 40));

  // The channel count of an IDX file is known when it is read; of a folder, from data.image.channels.
  std::string three = idx_cfg;
  three.replace(three.find("mean: [20], std: [40]"), 21, "mean: [1, 2, 3], std: [1, 1, 1]");
  const Experiment bad = parse_experiment(ConfigNode::load_string(three, "t.yaml"));
  CHECK_THROWS_WITH(load_data(bad), Catch::Contains("data.normalize.mean (t.yaml:7:") &&
                                        Catch::Contains("3 values, but the samples of"));
  auto with = [&](const std::string& extra) { return images_config(f.png, extra); };
  CHECK_THAT(config_error(with("  normalize: {mean: [0.5, 0.5], std: [1, 1]}\n")),
             Catch::Contains("data.normalize.mean: 2 values but the samples have 1 channel") &&
                 Catch::Contains("(t.yaml:10:"));
  CHECK_THAT(config_error(with("  normalize: {mean: [0.5], std: [0]}\n")),
             Catch::Contains("data.normalize.std[0]") && Catch::Contains("t.yaml:10:"));
  CHECK_THAT(config_error(with("  normalize: {mean: [0.5], std: [1, 2]}\n")),
             Catch::Contains("data.normalize.std: 2 values but mean has 1"));
  CHECK_THAT(config_error(with("  normalize: {mean: [0.5]}\n")),
             Catch::Contains("data.normalize") && Catch::Contains("std"));
}

TEST_CASE("data.image and the folders: config errors name the key and the line", "[data][images][config][cpu]") {
  TempDir dir;
  const FashionFolders f = write_fashion(dir, 100);
  std::string cfg = images_config(f.png);
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string s = cfg;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  CHECK_THAT(config_error(replaced("channels: 1", "channels: 2")),
             Catch::Contains("data.image.channels") && Catch::Contains("(t.yaml:7:"));
  CHECK_THAT(config_error(replaced("channels: 1}", "channels: 1, center_crop: [20, 20]}")),
             Catch::Contains("data.image.center_crop: [20, 20] differs from size [28, 28]"));
  CHECK_THAT(config_error(replaced("size: [28, 28]", "size: [28]")), Catch::Contains("data.image.size"));
  CHECK_THAT(config_error(replaced("train: " + f.png, "train: " + f.png + "/nothing")),
             Catch::Contains("data.train: folder not found") && Catch::Contains("(t.yaml:6:"));
  CHECK_THAT(config_error(replaced("train: " + f.png, "train: " + f.idx_images)), Catch::Contains("is not a folder"));
  CHECK_THAT(config_error(replaced("channels: 1}", "channels: 1, rezise: 4}")), Catch::Contains("did you mean"));
  CHECK_THAT(config_error(replaced("  batch_size", "  on_bad_file: stop\n  batch_size")),
             Catch::Contains("data.on_bad_file"));
  // The resolved config writes it back the same.
  const Experiment exp =
      parse_experiment(ConfigNode::load_string(replaced("channels: 1}", "channels: 1, resize: 28}"), "t.yaml"));
  const YAML::Node y = to_yaml(exp.data);
  CHECK(y["image"]["resize"].as<int64_t>() == 28);
  CHECK(y["on_bad_file"].as<std::string>() == "skip");
  CHECK(y["cache"].IsNull());
  // A process: exit 2.
  test::write_text(dir / "bad.yaml", replaced("channels: 1", "channels: 2"));
  CHECK(test::run_gputrain(fmt::format("check {} 2>&1", dir / "bad.yaml")).exit_code == 2);
}

TEST_CASE("data.cache: written once, read back while the key matches, rewritten when stale", "[data][images][cpu]") {
  TempDir dir;
  const FashionFolders f = write_fashion(dir, 150);
  const std::string cache = dir / "decoded.cache";
  test::write_text(dir / "c.yaml", images_config(f.png, "  cache: " + cache + "\n", f.jpg));
  auto inspect = [&] {
    const auto r = test::run_gputrain(fmt::format("data inspect {} 2>&1", dir / "c.yaml"));
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    return r.output;
  };
  std::string out = inspect();
  CHECK(out.find("decoding, not reading the cache " + cache + ": there is none yet") != std::string::npos);
  REQUIRE(fs::exists(cache));
  const std::string first_stats = out.substr(out.find("train: "));
  out = inspect();
  CHECK(out.find("images: 300 from cache " + cache) != std::string::npos);
  // Commands whose stdout is YAML or JSON keep the decode and cache lines out of it.
  auto r = test::run_gputrain(fmt::format("config print {}", dir / "c.yaml"));
  CHECK(r.exit_code == 0);
  CHECK(r.output.rfind("name: images\n", 0) == 0);
  r = test::run_gputrain(fmt::format("data inspect --json {}", dir / "c.yaml"));
  CHECK(r.output.rfind("{\"config\": ", 0) == 0);
  CHECK(r.output.find("\"bad_files\": 0") != std::string::npos);
  CHECK(out.substr(out.find("train: ")) == first_stats);  // the same numbers from the mapped file

  // Touching one file (a new modification time) makes it stale.
  const std::string one = f.jpg + "/4/" + fs::directory_iterator(f.jpg + "/4")->path().filename().string();
  fs::last_write_time(one, fs::last_write_time(one) + std::chrono::seconds(5));
  out = inspect();
  CHECK(out.find("files in the folders were added, removed, changed or touched") != std::string::npos);
  out = inspect();
  CHECK(out.find("from cache") != std::string::npos);
  // Other options: decode again.
  const std::string other = images_config(f.png, "  cache: " + cache + "\n", f.jpg);
  test::write_text(dir / "c.yaml",
                   other.substr(0, other.find("  scale:")) + "  scale: 1\n" + other.substr(other.find("  batch_size")));
  out = inspect();
  CHECK(out.find("it was made with other options") != std::string::npos);

  // In process: the cached tensors equal the decoded ones; a damaged cache is decoded again, not trusted.
  ImageFolderOptions o = grey28();
  o.cache = dir / "inproc.cache";
  Dataset a, at, b, bt, c, ct;
  read_image_folders(f.png, f.jpg, o, a, at);
  read_image_folders(f.png, f.jpg, o, b, bt);
  REQUIRE(b.inputs.shape() == a.inputs.shape());
  CHECK(std::memcmp(a.inputs.raw(), b.inputs.raw(), a.inputs.bytes()) == 0);
  CHECK(std::memcmp(at.inputs.raw(), bt.inputs.raw(), at.inputs.bytes()) == 0);
  CHECK(std::memcmp(at.targets.raw(), bt.targets.raw(), at.targets.bytes()) == 0);
  CHECK(bt.class_names == at.class_names);
  fs::resize_file(o.cache, fs::file_size(o.cache) / 2);
  {
    const test::ExpectWarnings damaged("is damaged (its contents do not match their checksum");
    read_image_folders(f.png, f.jpg, o, c, ct);
  }
  CHECK(std::memcmp(a.inputs.raw(), c.inputs.raw(), a.inputs.bytes()) == 0);
}

TEST_CASE("data.cache: a flipped bit or a NaN in the cache is caught, warned once, and decoded again",
          "[data][images][cpu]") {
  TempDir dir;
  const FashionFolders f = write_fashion(dir, 60);
  ImageFolderOptions o = grey28();
  o.cache = dir / "c.cache";
  Dataset a, at;
  read_image_folders(f.png, f.jpg, o, a, at);
  const std::string good = test::read_text(o.cache);
  // The payload (each split's labels and inputs, 64-byte aligned) ends the file; the header holds its CRC-32 after
  // the magic, the version, the options string and the digest.
  auto a64 = [](size_t n) { return (n + 63) / 64 * 64; };
  const size_t payload =
      good.size() - a64(a.targets.bytes()) - a64(a.inputs.bytes()) - a64(at.targets.bytes()) - a64(at.inputs.bytes());
  uint64_t options_bytes = 0;
  std::memcpy(&options_bytes, good.data() + 16, 8);
  const size_t crc_at = 24 + options_bytes + 8;
  const size_t first_input = payload + a64(a.targets.bytes());
  auto expect_decoded_again = [&](const std::string& bytes, const std::string& why) {
    test::write_text(o.cache, bytes);
    Dataset b, bt;
    {
      const test::ExpectWarnings warned("the cache " + o.cache + " is damaged (" + why);
      read_image_folders(f.png, f.jpg, o, b, bt);
      CHECK(warned.count() == 1);
    }
    CHECK(std::memcmp(a.inputs.raw(), b.inputs.raw(), a.inputs.bytes()) == 0);
    CHECK(test::read_text(o.cache) == good);  // rewritten whole
  };
  // One bit of one pixel: the checksum no longer matches.
  std::string flipped = good;
  flipped[first_input + 4 * 300 + 2] ^= 0x10;
  expect_decoded_again(flipped, "its contents do not match their checksum");
  // A NaN written with a checksum to match: the values are checked as decoded ones are.
  std::string nan = good;
  const float q = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(nan.data() + first_input + 4 * 7, &q, 4);
  const auto crc =
      static_cast<uint64_t>(crc32_z(0, reinterpret_cast<const Bytef*>(nan.data()) + payload, nan.size() - payload));
  std::memcpy(nan.data() + crc_at, &crc, 8);
  expect_decoded_again(nan, o.cache + ": value nan at sample 0 (element 7 of it) is not finite");
  // data.cache naming a file that is not a cache: refused before anything is written, the file kept.
  test::write_text(dir / "notes.txt", "not a cache");
  test::write_text(dir / "c.yaml", images_config(f.png, "  cache: " + (dir / "notes.txt") + "\n", f.jpg));
  const auto r = test::run_gputrain("check " + (dir / "c.yaml"));
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains("data.cache: " + (dir / "notes.txt") +
                                       " exists and is not a gputrain image cache; it is not overwritten"));
  CHECK(test::read_text(dir / "notes.txt") == "not a cache");
}

// Every rank of a data-parallel run decodes the folders and writes the cache: writers at once (threads here, as the
// thread communicator's ranks are) each write a temporary of their own, so none fails or leaves one behind, and the
// file they leave serves the next read.
TEST_CASE("data.cache: several writers at once all succeed and leave one good cache", "[data][images][cpu]") {
  TempDir dir;
  const FashionFolders f = write_fashion(dir, 60);
  ImageFolderOptions o = grey28();
  o.cache = dir / "shared.cache";
  constexpr int kWriters = 4;
  std::vector<Dataset> train(kWriters), test(kWriters);
  std::vector<std::string> errors(kWriters);
  {
    std::vector<std::thread> writers;
    for (int i = 0; i < kWriters; ++i)
      writers.emplace_back([&, i] {
        try {
          read_image_folders(f.png, f.jpg, o, train[i], test[i]);
        } catch (const std::exception& e) {
          errors[i] = e.what();
        }
      });
    for (std::thread& t : writers) t.join();
  }
  for (int i = 0; i < kWriters; ++i) {
    INFO("writer " << i << ": " << errors[i]);
    REQUIRE(errors[i].empty());
    CHECK(std::memcmp(train[i].inputs.raw(), train[0].inputs.raw(), train[0].inputs.bytes()) == 0);
  }
  for (const auto& e : fs::directory_iterator(dir.path())) CHECK(e.path().extension() != ".tmp");
  test::write_text(dir / "c.yaml", images_config(f.png, "  cache: " + o.cache + "\n", f.jpg));
  const auto r = test::run_gputrain(fmt::format("data inspect {} 2>&1", dir / "c.yaml"));
  INFO(r.output);
  CHECK(r.output.find("images: 120 from cache " + o.cache) != std::string::npos);
}

// Every machine output (JSON, JSON lines, CSV, YAML) read by a strict parser while bad input makes warnings: the
// warnings go to stderr, and stdout is nothing but the output.
TEST_CASE("machine output stays parsable while bad inputs make warnings, and train.log keeps those warnings",
          "[e2e][images]") {
  TempDir dir;
  const FashionFolders f = write_fashion(dir, 60);
  test::write_text(f.png + "/3/broken.png", "\x89PNG\r\n\x1a\n not really");
  // A class whose every file is bad: its folder has one, broken.
  fs::create_directories(dir / "odd/x");
  fs::create_directories(dir / "odd/y");
  for (const auto& e : fs::directory_iterator(f.png + "/0")) fs::copy(e.path(), dir / "odd/x" / e.path().filename());
  test::write_text(dir / "odd/y/broken.png", "not an image");
  test::write_text(dir / "c.yaml", images_config(f.png, "", f.jpg));
  REQUIRE(
      test::run_gputrain("train " + (dir / "c.yaml") + " --quiet --max-steps 2 --out " + (dir / "runs/a")).exit_code ==
      0);
  REQUIRE(test::run_gputrain("train " + (dir / "c.yaml") + " --quiet --max-steps 3 --out " + (dir / "runs/b") +
                             " --set optimizer.lr=0.05")
              .exit_code == 0);
  // The skipped file's warning came before train.log existed; it is in train.log all the same.
  CHECK_THAT(test::read_text(dir / "runs/a/train.log"),
             Catch::Contains("[warning] images: skipped a bad file: " + f.png + "/3/broken.png"));
  fs::create_directories(dir / "runs/c");
  test::write_text(dir / "runs/c/summary.json", "{\"name\": \"cut sh");  // an unreadable run among good ones
  test::write_text(dir / "runs/c/config.resolved.yaml", "name: x\n");
  const std::string bin = test::gputrain_binary();
  auto stdout_of = [&](const std::string& args) {
    const auto r = test::run_shell(bin + " " + args + " 2>" + (dir / "err.txt"));
    INFO(args << "\n" << r.output << "\nstderr: " << test::read_text(dir / "err.txt"));
    CHECK(r.exit_code == 0);
    return r.output;
  };
  auto warned = [&](const std::string& text) { CHECK_THAT(test::read_text(dir / "err.txt"), Catch::Contains(text)); };
  for (const std::string& args : {"check --json " + (dir / "c.yaml"), "data inspect --json " + (dir / "c.yaml"),
                                  "eval --json " + (dir / "c.yaml") + " --checkpoint " + (dir / "runs/a")}) {
    CHECK_NOTHROW(json_read_object(stdout_of(args)));
    warned("skipped a bad file");
  }
  const YAML::Node printed = YAML::Load(stdout_of("config print " + (dir / "c.yaml")));
  CHECK(printed.IsMap());
  CHECK(printed["data"]["format"].as<std::string>() == "images");
  warned("skipped a bad file");
  const std::vector<std::string> jsonl = test::lines_of(stdout_of("runs --json " + (dir / "runs")));
  CHECK(jsonl.size() == 3);
  for (const std::string& row : jsonl) CHECK_NOTHROW(json_read_object(row));
  warned("runs/c: summary.json");
  const std::vector<std::string> csv = test::lines_of(stdout_of("runs --csv " + (dir / "runs")));
  REQUIRE(csv.size() == 4);
  const auto columns = std::count(csv[0].begin(), csv[0].end(), ',');
  for (const std::string& row : csv) CHECK(std::count(row.begin(), row.end(), ',') == columns);
  warned("runs/c: summary.json");
  CHECK_NOTHROW(json_read_object(stdout_of("config schema")));
  // The class with no readable file: named, in train.log too.
  std::string odd_config = images_config(dir / "odd");
  odd_config.replace(odd_config.find("out_features: 10"), 16, "out_features: 2");
  test::write_text(dir / "odd.yaml", odd_config);
  const auto odd = test::run_gputrain("train " + (dir / "odd.yaml") + " --max-steps 1 --out " + (dir / "odd_run"));
  INFO(odd.output);
  CHECK(odd.exit_code == 0);
  const std::string want = "images: in " + (dir / "odd") + ", every file of class y (1 file) was bad";
  CHECK_THAT(odd.output, Catch::Contains(want));
  CHECK_THAT(test::read_text(dir / "odd_run/train.log"), Catch::Contains(want));
}
