// The JSON files of a checkpoint directory (manifest.json, trainer_state.json, index.json) read as untrusted input:
// a damaged or hand-edited file must be refused naming the file and the key, never trusted after a silent
// conversion (nlohmann's get<uint32_t> truncates 2^32 + x to x, get<int64_t> wraps 2^64 + 5 to a small number
// and turns 3.7 into 3) and never reported as a raw "[json.exception...]". Values must have exactly the JSON
// type the writer gives them. Errors are RuntimeError (exit 3): these are files the program wrote. Internal to
// src/checkpoint.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace primus {

// The file's JSON value, which must be an object. RuntimeError naming the file when it cannot be read (a FIFO is
// refused without blocking), is not JSON, or is not an object.
nlohmann::json read_json_object(const std::string& path);

// Typed fields of one JSON object of `file`; errors name the file and the key, after `prefix` (e.g. "files.x.").
class JsonFields {
 public:
  JsonFields(const nlohmann::json& object, const std::string& file, std::string prefix = "");

  const nlohmann::json& required(const std::string& key) const;
  // An exact JSON integer (not 3.0, not "3", not beyond int64) in [min, max]; `why` (optional) explains the range.
  int64_t integer(const std::string& key, int64_t min, int64_t max, const std::string& why = "") const;
  std::string string(const std::string& key) const;
  const nlohmann::json& object(const std::string& key) const;

  [[noreturn]] void fail(const std::string& key, const std::string& what) const;

 private:
  const nlohmann::json& object_;
  std::string file_;
  std::string prefix_;
};

}  // namespace primus
