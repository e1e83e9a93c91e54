// report.html: written at the end of a run and by `gputrain report`, one inline-SVG chart per plotted metric, and
// robust to runs that are missing files or hold garbage.
#include "helpers.h"

#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <regex>
#include <vector>

#include <png.h>
#include <sys/wait.h>

using namespace gt::test;
namespace fs = std::filesystem;

namespace {

const std::string kReportConfig =
    "name: rep\nseed: 5\ndevice: cpu\n" +
    synthetic_mlp({.samples = 640, .test_samples = 128, .features = 8, .classes = 2, .batch = 32, .hidden = 8}) +
    R"(optimizer: {type: sgd, lr: 0.1}
train: {epochs: 2, log_every: 3, eval_every: 10}
)";

size_t occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The <svg data-tag="TAG"> element's text.
std::string chart(const std::string& html, const std::string& tag) {
  const size_t a = html.find("<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" data-tag=\"" + tag + "\"");
  if (a == std::string::npos) return "";
  return html.substr(a, html.find("</svg>", a) - a);
}

// Points of each <polyline> in a chart.
std::vector<size_t> polyline_points(const std::string& svg) {
  std::vector<size_t> out;
  const std::regex re("<polyline[^>]* points=\"([^\"]*)\"");
  for (std::sregex_iterator it(svg.begin(), svg.end(), re), end; it != end; ++it) {
    const std::string pts = (*it)[1].str();
    out.push_back(pts.empty() ? 0 : occurrences(pts, " ") + 1);
  }
  return out;
}

size_t rows_of_type(const std::string& metrics, const std::string& type) {
  return occurrences(metrics, "\"type\": \"" + type + "\"");
}

}  // namespace

TEST_CASE("a run writes report.html with a chart per metric, a point per row, and `gputrain report` redoes it",
          "[e2e]") {
  TempDir dir;
  write_text(dir / "rep.yaml", kReportConfig);
  const auto r = run_gputrain("train " + (dir / "rep.yaml") + " --out " + (dir / "run") + " --threads 2");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::string html = read_text(dir / "run/report.html");
  const std::string metrics = read_text(dir / "run/metrics.jsonl");
  const size_t train_rows = rows_of_type(metrics, "train"), eval_rows = rows_of_type(metrics, "eval");
  CHECK(train_rows == 14);  // 40 steps: every 3rd and the last
  CHECK(eval_rows == 4);

  // Train and test loss share a chart; the constant learning rate is a value in the table, not a flat chart.
  CHECK(occurrences(html, "<svg") == 3);  // loss, test accuracy, samples/s (no device memory)
  CHECK(polyline_points(chart(html, "loss")) == std::vector<size_t>{train_rows, eval_rows});
  CHECK(polyline_points(chart(html, "train/samples_per_sec")) == std::vector<size_t>{train_rows});
  CHECK(polyline_points(chart(html, "test/accuracy")) == std::vector<size_t>{eval_rows});
  CHECK(chart(html, "train/lr").empty());
  CHECK(chart(html, "train/device_mem").empty());
  CHECK(html.find("<tr><td>lr</td><td>0.1 (constant over the run)</td></tr>") != std::string::npos);
  // Axes have round ticks and gridlines; numbers are in their shortest form everywhere (config, summary, ticks).
  CHECK(occurrences(chart(html, "loss"), "<line class=\"grid\"") >= 6);
  CHECK(html.find("0.10000000000000001") == std::string::npos);
  CHECK(html.find("lr: 0.1\n") != std::string::npos);
  CHECK(html.find("Finished: <b>completed</b>") != std::string::npos);
  CHECK(html.find("<td>final_train_loss</td>") != std::string::npos);
  CHECK(html.find("<pre class=\"config\">") != std::string::npos);
  CHECK(html.find("type: cross_entropy") != std::string::npos);  // config.resolved.yaml is in it
  CHECK(html.find("<script") == std::string::npos);
  CHECK(html.find("http://") == html.find("http://www.w3.org/2000/svg"));  // the SVG namespace, nothing fetched

  const auto again = run_gputrain("report " + (dir / "run") + " --out " + (dir / "again.html"));
  INFO(again.output);
  REQUIRE(again.exit_code == 0);
  CHECK(read_text(dir / "again.html") == html);
}

TEST_CASE("gputrain report: a running or stopped run, garbage lines, HTML in values, and a missing folder", "[e2e]") {
  TempDir dir;
  fs::create_directories(dir / "run");
  write_text(dir / "run/metrics.jsonl",
             "{\"type\": \"train\", \"step\": 5, \"loss\": 1.5, \"lr\": 0.1, \"samples_per_sec\": 900}\n"
             "not json at all\n"
             "{\"type\": \"train\", \"step\": 10, \"loss\": null, \"lr\": 0.1, \"samples_per_sec\": 950}\n"
             "{\"type\": \"train\", \"step\": 15, \"loss\": 1.1, \"lr\": 0.05, \"samples_per_sec\": 1000}\n"
             "{\"type\": \"train\", \"step\": 20, \"lo");  // a line being written
  write_text(dir / "run/config.resolved.yaml", "name: \"<b>&x</b>\"\n");
  const auto r = run_gputrain("report " + (dir / "run"));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("running or stopped") != std::string::npos);
  const std::string html = read_text(dir / "run/report.html");
  CHECK(html.find("the run is running or stopped") != std::string::npos);
  CHECK(html.find("2 unparsable lines of metrics.jsonl skipped") != std::string::npos);
  CHECK(polyline_points(chart(html, "loss")) == std::vector<size_t>{2});  // the null loss is no point
  CHECK(polyline_points(chart(html, "train/lr")) == std::vector<size_t>{3});
  CHECK(html.find("<b>&x</b>") == std::string::npos);
  CHECK(html.find("&lt;b&gt;&amp;x&lt;/b&gt;") != std::string::npos);

  const auto missing = run_gputrain("report " + (dir / "no_such_run"));
  INFO(missing.output);
  CHECK(missing.exit_code == 2);
  CHECK(lines_of(missing.output).size() == 1);
  CHECK(missing.output.find("no_such_run: not a run directory") != std::string::npos);
}

TEST_CASE("headless Chromium renders report.html with every chart's SVG in the DOM", "[e2e]") {
  if (run_shell("command -v chromium >/dev/null 2>&1").exit_code != 0)
    FAIL("chromium is not installed: run scripts/setup.sh (it installs Debian's chromium)");
  TempDir dir;
  write_text(dir / "rep.yaml", kReportConfig);
  const auto r = run_gputrain("train " + (dir / "rep.yaml") + " --out " + (dir / "run") + " --threads 2");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  // --dump-dom prints the DOM after parsing: what a browser made of the page, not the bytes we wrote. Chromium's
  // stderr (D-Bus complaints in a container) is dropped; its own profile goes into the temporary folder.
  const auto dom =
      run_shell("timeout 120 chromium --headless --disable-gpu --no-sandbox --user-data-dir=" + (dir / "profile") +
                " --dump-dom file://" + (dir / "run/report.html") + " 2>/dev/null");
  REQUIRE(dom.exit_code == 0);
  CHECK(occurrences(dom.output, "<svg") == 3);
  CHECK(occurrences(dom.output, "<polyline") == 4);
  const std::string metrics = read_text(dir / "run/metrics.jsonl");
  CHECK(polyline_points(chart(dom.output, "loss")) ==
        std::vector<size_t>{rows_of_type(metrics, "train"), rows_of_type(metrics, "eval")});
  CHECK(dom.output.find("<pre class=\"config\">") != std::string::npos);
  // A screenshot of a wide window: the charts fill its width (three across), not a fixed 640 pixels each.
  const auto shot = run_shell(
      "timeout 120 chromium --headless --disable-gpu --no-sandbox --hide-scrollbars "
      "--user-data-dir=" +
      (dir / "profile") + " --window-size=1900,900 --screenshot=" + (dir / "shot.png") + " file://" +
      (dir / "run/report.html") + " 2>/dev/null");
  REQUIRE(shot.exit_code == 0);
  png_image img{};
  img.version = PNG_IMAGE_VERSION;
  REQUIRE(png_image_begin_read_from_file(&img, (dir / "shot.png").c_str()) != 0);
  img.format = PNG_FORMAT_GRAY;
  std::vector<uint8_t> px(PNG_IMAGE_SIZE(img));
  REQUIRE(png_image_finish_read(&img, nullptr, px.data(), 0, nullptr) != 0);
  REQUIRE(img.width == 1900);
  // Columns with drawing (anything not white) in the band where the first row of charts is.
  auto drawn = [&](uint32_t x) {
    for (uint32_t y = 150; y < std::min<uint32_t>(img.height, 600); ++y)
      if (px[y * img.width + x] < 200) return true;
    return false;
  };
  int right = 0;
  for (uint32_t x = 1750; x < 1860; ++x) right += drawn(x);
  CHECK(right > 0);  // the third chart's frame and gridlines reach the right edge
}
