// Catch2's main for the whole suite, with a log sink that fails a test for every warning it did not expect
// (tests/helpers.h, ExpectWarnings): a warning nobody looks at is how a regression hides in a passing suite.
#define CATCH_CONFIG_RUNNER
#include "helpers.h"

#include <catch2/catch.hpp>

namespace {

// At the end of every section (the test case's own included), on the test's thread, while its assertions still
// count: the unexpected warnings logged since the last check fail it, each named.
class UnexpectedWarnings : public Catch::TestEventListenerBase {
 public:
  using TestEventListenerBase::TestEventListenerBase;
  void sectionEnded(Catch::SectionStats const& stats) override {
    for (const std::string& w : gt::test::take_unexpected_warnings())
      FAIL_CHECK("unexpected log line: \"" << w
                                           << "\" (if the test means it, declare it with "
                                              "gt::test::ExpectWarnings guard{\"<part of the message>\"})");
    TestEventListenerBase::sectionEnded(stats);
  }
};

}  // namespace

CATCH_REGISTER_LISTENER(UnexpectedWarnings)

int main(int argc, char* argv[]) {
  gt::test::install_warning_sink();
  return Catch::Session().run(argc, argv);
}
