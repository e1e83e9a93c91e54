// Fuzz target: the CSV reader (gt::read_csv) with every option.
// Input: one flag byte (header = auto/true/false by byte % 3, targets = values when bit 7 is set), the `label:`
// setting up to the first newline, then the CSV file.
#include "data/dataset.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static gt::fuzz::ScratchFile file("data.csv");
  if (size < 1) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t eol = rest.find('\n');
  gt::CsvSpec spec;
  spec.header = data[0] % 3 == 0 ? "auto" : data[0] % 3 == 1 ? "true" : "false";
  spec.classes = (data[0] & 0x80) == 0;
  spec.label = std::string(rest.substr(0, eol));
  file.write(eol == std::string_view::npos ? std::string_view() : rest.substr(eol + 1));
  try {
    gt::read_csv(file.path(), spec);
  } catch (const gt::Error&) {
  }
  return 0;
}
