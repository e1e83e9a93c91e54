// The JSON reader (core/json_read.h): what it accepts, what it refuses and how it says so; and that the writer's
// output reads back.
#include "core/json.h"
#include "core/json_read.h"

#include <catch2/catch.hpp>

#include <string>

using gt::JsonReadError;
using gt::JsonValue;
using Reason = gt::JsonReadError::Reason;

namespace {

// The reason json_read_object refuses `text` for (the test fails when it is accepted).
Reason refusal(const std::string& text, const gt::JsonLimits& limits = {}) {
  try {
    gt::json_read_object(text, limits);
  } catch (const JsonReadError& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).size() > 10);  // a message that says something, not an empty line
    return e.reason();
  }
  FAIL("accepted: " << text);
  return Reason::syntax;
}

}  // namespace

TEST_CASE("json reader: objects keep document order, numbers keep integers exact", "[cpu]") {
  const JsonValue v = gt::json_read_object(
      R"({"z": 1, "a": {"b": [1, 2.5, "x", true, null]}, "big": 9007199254740993, "neg": -4, "e": 1e-05})");
  REQUIRE(v.members.size() == 5);
  CHECK(v.members[0].key == "z");
  CHECK(v.members[1].key == "a");
  const JsonValue* b = v.find("a")->find("b");
  REQUIRE(b);
  REQUIRE(b->items.size() == 5);
  CHECK(b->items[0].integer == 1);
  CHECK(b->items[1].number == 2.5);
  CHECK_FALSE(b->items[1].integer);
  CHECK(b->items[2].string == "x");
  CHECK(b->items[3].boolean);
  CHECK(b->items[4].is_null());
  CHECK(v.find("big")->integer == int64_t{9007199254740993});  // 2^53 + 1: not representable as a double
  CHECK(v.find("neg")->integer == -4);
  CHECK(v.find("e")->number == 1e-05);
  CHECK(v.find("missing") == nullptr);
  CHECK(v.find("z")->find("anything") == nullptr);  // not an object: nothing to find
}

TEST_CASE("json reader: what core/json.h writes reads back, and text() spaces it the same way", "[cpu]") {
  gt::JsonObject inner;
  inner.add("loss", 0.25).add("name", "a \"quoted\"\nline\t\x01").add_null("none").add_bool("ok", true);
  gt::JsonObject outer;
  outer.add("step", int64_t{7}).add("inner", inner).add("rows", std::vector<gt::JsonObject>{inner, inner});
  const JsonValue v = gt::json_read_object(outer.str());
  CHECK(v.find("inner")->find("name")->string == "a \"quoted\"\nline\t\x01");
  CHECK(v.find("rows")->items.size() == 2);
  CHECK(v.text() == outer.str());
}

TEST_CASE("json reader: duplicate keys are refused, at any depth", "[cpu]") {
  CHECK(refusal(R"({"a": 1, "a": 2})") == Reason::duplicate);
  CHECK(refusal(R"({"x": {"b": 1, "c": 2, "b": 3}})") == Reason::duplicate);
  CHECK(refusal(R"({"x": [{"k": 1}, {"k": 2, "k": 2}]})") == Reason::duplicate);
  // The same key in sibling objects is not a duplicate.
  CHECK(gt::json_read_object(R"({"x": [{"k": 1}, {"k": 2}], "y": {"k": 3}})").members.size() == 2);
  try {
    gt::json_read_object(R"({"step": 1, "step": 2})");
  } catch (const JsonReadError& e) {
    CHECK_THAT(e.what(), Catch::Contains("duplicate key \"step\""));
  }
}

TEST_CASE("json reader: truncated and malformed text is refused with where it went wrong", "[cpu]") {
  for (const char* text :
       {"{", "{\"a\": ", "{\"a\": 1", "{\"a\": [1, 2}", "{\"a\": 1,}", "{a: 1}", "{\"a\": 01}", "{\"a\": 1} x",
        "{\"a\": 'x'}", "{\"a\": 1} // no comments", "{\"a\": \"\xff\"}", "{\"a\": NaN}", "{\"a\": \"unterminated}"}) {
    INFO(text);
    CHECK(refusal(text) == Reason::syntax);
  }
  try {
    gt::json_read_object("{\"a\": 1,\n \"b\": }");
    FAIL("accepted");
  } catch (const JsonReadError& e) {
    CHECK_THAT(e.what(), Catch::Contains("line 2"));
  }
}

TEST_CASE("json reader: nesting and size beyond the limits are refused, at the limit accepted", "[cpu]") {
  const std::string deep = std::string(10000, '[') + std::string(10000, ']');
  CHECK(refusal("{\"a\": " + deep + "}") == Reason::limit);  // the default limit (64), with no deep recursion
  const gt::JsonLimits three{1024, 3};
  CHECK(gt::json_read_object(R"({"a": {"b": [1]}})", three).find("a"));  // three levels: allowed
  CHECK(refusal(R"({"a": {"b": [[1]]}})", three) == Reason::limit);
  const gt::JsonLimits small{15, 8};
  CHECK(gt::json_read_object(R"({"a": 12345678})", small).find("a"));  // 15 bytes
  CHECK(refusal(R"({"a": 123456789})", small) == Reason::limit);       // 16 bytes
}

TEST_CASE("json reader: a top level other than an object is refused by json_read_object", "[cpu]") {
  CHECK(refusal("[1, 2]") == Reason::not_object);
  CHECK(refusal("3") == Reason::not_object);
  CHECK(refusal("\"text\"") == Reason::not_object);
  CHECK(refusal("null") == Reason::not_object);
  CHECK(refusal("") == Reason::not_object);
  CHECK(refusal(" \n ") == Reason::not_object);
  CHECK(gt::json_read("[1, 2]").items.size() == 2);  // json_read takes any value
  CHECK(gt::json_read("  {}  ").is_object());
}
