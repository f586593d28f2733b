// A base for one-pass checks over JSON text with nlohmann's SAX parser: every
// event is accepted and a syntax error stops the pass, so a check overrides
// only the events it looks at (nlohmann::json_sax declares all of them pure).
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

namespace lockstep {

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
  bool start_object(std::size_t) override { return true; }
  bool key(typename Base::string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
};

}  // namespace lockstep
