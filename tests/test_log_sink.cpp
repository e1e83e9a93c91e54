// The suite's warning sink (tests/main.cpp, ExpectWarnings in helpers.h): the [!shouldfail] cases pass only when the
// sink does fail them, so a sink that stopped working fails the suite.
#include "helpers.h"

#include <spdlog/spdlog.h>
#include <catch2/catch.hpp>

#include <thread>

using gt::test::ExpectWarnings;

TEST_CASE("log sink: expected warnings are allowed and counted, nested guards by the innermost match", "[cpu]") {
  ExpectWarnings outer{"disk"};
  {
    ExpectWarnings inner{"slow"};
    spdlog::warn("the disk is slow");  // both match: the innermost counts it
    spdlog::error("the disk is full");
    CHECK(inner.count() == 1);
    CHECK(outer.count() == 1);
  }
  std::thread([] { spdlog::warn("disk again, from another thread"); }).join();
  CHECK(outer.count() == 2);
  spdlog::info("info lines are never a failure");
}

TEST_CASE("log sink: an unexpected warning fails the test", "[cpu][!shouldfail]") {
  spdlog::warn("nobody expects this warning");
}

TEST_CASE("log sink: an unexpected warning from another thread fails the test", "[cpu][!shouldfail]") {
  std::thread([] { spdlog::warn("a worker thread warns"); }).join();
}

TEST_CASE("log sink: a warning that does not match the guard fails the test", "[cpu][!shouldfail]") {
  ExpectWarnings guard{"something else"};
  spdlog::warn("this one");
  spdlog::warn("something else");
}

TEST_CASE("log sink: a guard that sees no warning fails the test", "[cpu][!shouldfail]") {
  ExpectWarnings guard{"never logged"};
}
