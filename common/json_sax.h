// One-pass checks over JSON text with nlohmann's SAX parser, and the nesting
// limit every JSON file lockstep reads is held to.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace lockstep {

// The deepest nesting read from a JSON file or line. nlohmann parses without
// recursion but copies and prints values recursively, so a value nested 10^5
// deep would overflow the stack where an error quotes it; real files nest a
// few levels (tokenizer.json about six).
inline constexpr std::size_t kMaxJsonDepth = 512;

// A base for SAX passes: every event is accepted, a syntax error stops the
// pass (the parse that follows names it), and a container opened past
// kMaxJsonDepth throws through too_deep(). A check overrides only the events it looks
// at (nlohmann::json_sax declares all of them pure); containers through the
// on_* hooks.
template <typename BasicJson>
class JsonSaxPass : public nlohmann::json_sax<BasicJson> {
 public:
  using Base = nlohmann::json_sax<BasicJson>;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(typename Base::number_integer_t) override { return true; }
  bool number_unsigned(typename Base::number_unsigned_t) override { return true; }
  bool number_float(typename Base::number_float_t, const typename Base::string_t&) override { return true; }
  bool string(typename Base::string_t&) override { return true; }
  bool binary(typename Base::binary_t&) override { return true; }
  bool key(typename Base::string_t&) override { return true; }
  bool start_object(std::size_t n) final { return enter() && on_start_object(n); }
  bool end_object() final { return --depth_, on_end_object(); }
  bool start_array(std::size_t n) final { return enter() && on_start_array(n); }
  bool end_array() final { return --depth_, on_end_array(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 protected:
  virtual bool on_start_object(std::size_t) { return true; }
  virtual bool on_end_object() { return true; }
  virtual bool on_start_array(std::size_t) { return true; }
  virtual bool on_end_array() { return true; }
  // A container opens past kMaxJsonDepth: throws the check's error.
  [[noreturn]] virtual void too_deep() = 0;

 private:
  bool enter() {
    if (++depth_ > kMaxJsonDepth) too_deep();
    return true;
  }
  std::size_t depth_ = 0;
};

// Fails with `kind` and "<what> nests values deeper than 512 levels" when
// `text` does; syntax errors are left to the parse that follows.
inline void require_json_depth(std::string_view text, ErrorKind kind, const std::string& what) {
  class DepthCheck : public JsonSaxPass<nlohmann::json> {
   public:
    DepthCheck(ErrorKind kind, const std::string& what) : kind_(kind), what_(what) {}
    [[noreturn]] void too_deep() override {
      LS_FAIL(kind_, "{} nests values deeper than {} levels", what_, kMaxJsonDepth);
    }

   private:
    ErrorKind kind_;
    const std::string& what_;
  };
  DepthCheck check(kind, what);
  nlohmann::json::sax_parse(text.begin(), text.end(), &check);
}

}  // namespace lockstep
