// A strict little JSON reader for tests: farmemctl --json output is parsed,
// not string-compared. Numbers keep their text so that u64 values compare
// exactly.
//
//   auto v = minijson::parse(R"({"a":[1,2],"b":"x"})");
//   ASSERT_TRUE(v.has_value());
//   uint64_t two = (*v)["a"][1].u64();
#pragma once

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace minijson {

struct Value {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject } type = Type::kNull;
  bool b = false;
  std::string text;  // number text or string value
  std::vector<Value> array;
  std::map<std::string, Value> object;

  bool is_null() const { return type == Type::kNull; }
  bool has(const std::string& k) const { return type == Type::kObject && object.count(k) != 0; }
  const Value& operator[](const std::string& k) const {
    static const Value kNull;
    auto it = object.find(k);
    return it == object.end() ? kNull : it->second;
  }
  const Value& operator[](size_t i) const {
    static const Value kNull;
    return i < array.size() ? array[i] : kNull;
  }
  uint64_t u64() const { return type == Type::kNumber ? strtoull(text.c_str(), nullptr, 10) : 0; }
  double num() const { return type == Type::kNumber ? strtod(text.c_str(), nullptr) : 0; }
  const std::string& str() const { return text; }
};

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}
  std::optional<Value> parse_all() {
    Value v;
    if (!value(&v)) return std::nullopt;
    ws();
    if (i_ != s_.size()) return std::nullopt;
    return v;
  }

 private:
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r'))
      ++i_;
  }
  bool lit(std::string_view w) {
    if (s_.substr(i_, w.size()) != w) return false;
    i_ += w.size();
    return true;
  }
  bool string(std::string* out) {
    if (i_ >= s_.size() || s_[i_] != '"') return false;
    ++i_;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c != '\\') {
        *out += c;
        continue;
      }
      if (i_ >= s_.size()) return false;
      char e = s_[i_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          *out += e;
          break;
        case 'n':
          *out += '\n';
          break;
        case 't':
          *out += '\t';
          break;
        case 'r':
          *out += '\r';
          break;
        case 'b':
          *out += '\b';
          break;
        case 'f':
          *out += '\f';
          break;
        case 'u': {
          if (i_ + 4 > s_.size()) return false;
          unsigned v =
              static_cast<unsigned>(strtoul(std::string(s_.substr(i_, 4)).c_str(), nullptr, 16));
          i_ += 4;
          if (v >= 0x80) return false;  // enough for these tests
          *out += static_cast<char>(v);
          break;
        }
        default:
          return false;
      }
    }
    if (i_ >= s_.size()) return false;
    ++i_;
    return true;
  }
  bool number(std::string* out) {
    size_t st = i_;
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    size_t digits = i_;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
    if (i_ == digits) return false;
    if (s_[digits] == '0' && i_ - digits > 1) return false;
    if (i_ < s_.size() && s_[i_] == '.') {
      ++i_;
      size_t f = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      if (i_ == f) return false;
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      size_t e = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      if (i_ == e) return false;
    }
    *out = std::string(s_.substr(st, i_ - st));
    return true;
  }
  bool value(Value* v) {
    if (++depth_ > 64) return false;
    ws();
    if (i_ >= s_.size()) return false;
    bool ok = true;
    char c = s_[i_];
    if (c == '{') {
      v->type = Value::Type::kObject;
      ++i_;
      ws();
      if (i_ < s_.size() && s_[i_] == '}') {
        ++i_;
      } else {
        while (true) {
          ws();
          std::string k;
          if (!string(&k)) return false;
          ws();
          if (!lit(":")) return false;
          Value e;
          if (!value(&e)) return false;
          if (v->object.count(k)) return false;  // duplicate keys are a bug in the writer
          v->object.emplace(std::move(k), std::move(e));
          ws();
          if (lit(",")) continue;
          if (lit("}")) break;
          return false;
        }
      }
    } else if (c == '[') {
      v->type = Value::Type::kArray;
      ++i_;
      ws();
      if (i_ < s_.size() && s_[i_] == ']') {
        ++i_;
      } else {
        while (true) {
          Value e;
          if (!value(&e)) return false;
          v->array.push_back(std::move(e));
          ws();
          if (lit(",")) continue;
          if (lit("]")) break;
          return false;
        }
      }
    } else if (c == '"') {
      v->type = Value::Type::kString;
      ok = string(&v->text);
    } else if (lit("true")) {
      v->type = Value::Type::kBool;
      v->b = true;
    } else if (lit("false")) {
      v->type = Value::Type::kBool;
    } else if (lit("null")) {
      v->type = Value::Type::kNull;
    } else {
      v->type = Value::Type::kNumber;
      ok = number(&v->text);
    }
    --depth_;
    return ok;
  }

  std::string_view s_;
  size_t i_ = 0;
  int depth_ = 0;
};

inline std::optional<Value> parse(std::string_view s) {
  return Parser(s).parse_all();
}

}  // namespace minijson
