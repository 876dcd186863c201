// An independent port of three ops, written in C++ against the mlx C++ API
// of the pinned wheel (its headers and libmlx), served through the
// conformance suite's candidate protocol (docs/src/guide/candidate.md; the
// ops' signatures are in docs/ops.md). It shows the protocol is
// language-neutral: nothing here is Python or Rust.
//
//     quantized_matmul   mlx.core.quantized_matmul(transpose=True)
//     quantized_linear   mlx.nn.QuantizedLinear.__call__
//     inv_freq           mlx_vlm rope_utils.compute_inv_freq, per dim, concatenated
//
// `--wrong` is a deliberately wrong variant: the last inv_freq element is
// moved by one ulp (as an exponent rounded the other way would move it),
// so the inv_freq cases FAIL naming that element.
//
// The hello names the libmlx file this process loaded (`"libmlx"`); the
// runner refuses a candidate whose file is not the reference's, by sha256.
//
// Build: sh candidates/cpp/build.sh MLX_DIR OUT (MLX_DIR: the wheel's
// `mlx` package directory, `.reference/fingerprint.json`'s `mlx_dir`).
// Usage: conformance --candidate "OUT" (or "OUT --wrong").

#include <dlfcn.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mlx/mlx.h"

namespace mx = mlx::core;

// --- a small JSON value, parser and writer (no JSON library is available
// offline here; the protocol needs only this much) ------------------------

// A request this candidate cannot read (not a refusal of the maths).
struct BadRequest : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Json {
  enum Kind { Null, Bool, Int, Float, String, Array, Object } kind = Null;
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  std::string s;
  std::vector<Json> items;                           // Array
  std::vector<std::pair<std::string, Json>> fields;  // Object, in order

  const Json* get(const std::string& key) const {
    for (auto& [k, v] : fields) {
      if (k == key) return &v;
    }
    return nullptr;
  }
  const Json& at(const std::string& key) const {
    if (kind != Object) throw BadRequest("not a JSON object: no key " + key);
    if (auto v = get(key)) return *v;
    throw BadRequest("JSON object has no key " + key);
  }
  static Json str(std::string v) {
    Json j;
    j.kind = String;
    j.s = std::move(v);
    return j;
  }
  static Json integer(int64_t v) {
    Json j;
    j.kind = Int;
    j.i = v;
    return j;
  }
  static Json object(std::vector<std::pair<std::string, Json>> f) {
    Json j;
    j.kind = Object;
    j.fields = std::move(f);
    return j;
  }
};

class Parser {
 public:
  explicit Parser(const std::string& text) : t_(text) {}
  Json parse() {
    Json v = value();
    ws();
    if (p_ != t_.size()) fail("trailing characters");
    return v;
  }

 private:
  const std::string& t_;
  size_t p_ = 0;

  [[noreturn]] void fail(const std::string& what) {
    throw BadRequest("bad JSON at byte " + std::to_string(p_) + ": " + what);
  }
  void ws() {
    while (p_ < t_.size() && (t_[p_] == ' ' || t_[p_] == '\t' || t_[p_] == '\n' || t_[p_] == '\r')) ++p_;
  }
  bool eat(const char* word) {
    size_t n = std::char_traits<char>::length(word);
    if (t_.compare(p_, n, word) == 0) {
      p_ += n;
      return true;
    }
    return false;
  }
  Json value() {
    ws();
    if (p_ >= t_.size()) fail("unexpected end");
    char c = t_[p_];
    Json j;
    if (c == '{') {
      j.kind = Json::Object;
      ++p_;
      ws();
      if (p_ < t_.size() && t_[p_] == '}') return ++p_, j;
      while (true) {
        ws();
        if (p_ >= t_.size() || t_[p_] != '"') fail("expected a key");
        std::string key = string();
        ws();
        if (p_ >= t_.size() || t_[p_++] != ':') fail("expected ':'");
        j.fields.emplace_back(std::move(key), value());
        ws();
        if (p_ < t_.size() && t_[p_] == ',') { ++p_; continue; }
        if (p_ < t_.size() && t_[p_] == '}') { ++p_; return j; }
        fail("expected ',' or '}'");
      }
    }
    if (c == '[') {
      j.kind = Json::Array;
      ++p_;
      ws();
      if (p_ < t_.size() && t_[p_] == ']') return ++p_, j;
      while (true) {
        j.items.push_back(value());
        ws();
        if (p_ < t_.size() && t_[p_] == ',') { ++p_; continue; }
        if (p_ < t_.size() && t_[p_] == ']') { ++p_; return j; }
        fail("expected ',' or ']'");
      }
    }
    if (c == '"') return Json::str(string());
    if (eat("null")) return j;
    if (eat("true")) { j.kind = Json::Bool; j.b = true; return j; }
    if (eat("false")) { j.kind = Json::Bool; return j; }
    return number();
  }
  Json number() {
    size_t start = p_;
    bool fraction = false;
    if (p_ < t_.size() && t_[p_] == '-') ++p_;
    while (p_ < t_.size()) {
      char c = t_[p_];
      if (c >= '0' && c <= '9') { ++p_; continue; }
      if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') { fraction = true; ++p_; continue; }
      break;
    }
    std::string text = t_.substr(start, p_ - start);
    if (text.empty() || text == "-") fail("expected a value");
    Json j;
    try {
      if (fraction) {
        j.kind = Json::Float;
        j.f = std::stod(text);  // round-to-nearest, as Python's float()
      } else {
        j.kind = Json::Int;
        j.i = std::stoll(text);
      }
    } catch (const std::exception&) {
      fail("bad number " + text);
    }
    return j;
  }
  static void utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3F));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    }
  }
  uint32_t hex4() {
    if (p_ + 4 > t_.size()) fail("short \\u escape");
    uint32_t v = std::stoul(t_.substr(p_, 4), nullptr, 16);
    p_ += 4;
    return v;
  }
  std::string string() {
    ++p_;  // the opening quote
    std::string out;
    while (true) {
      if (p_ >= t_.size()) fail("unterminated string");
      char c = t_[p_++];
      if (c == '"') return out;
      if (c != '\\') { out += c; continue; }
      if (p_ >= t_.size()) fail("unterminated escape");
      char e = t_[p_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && eat("\\u")) {
            uint32_t low = hex4();
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          utf8(out, cp);
          break;
        }
        default: fail("bad escape");
      }
    }
  }
};

void write_json(std::ostream& out, const Json& j) {
  switch (j.kind) {
    case Json::Null: out << "null"; break;
    case Json::Bool: out << (j.b ? "true" : "false"); break;
    case Json::Int: out << j.i; break;
    case Json::Float: {
      std::ostringstream s;
      s.precision(17);
      s << j.f;
      std::string text = s.str();
      if (text.find_first_of(".eE") == std::string::npos) text += ".0";
      out << text;
      break;
    }
    case Json::String: {
      out << '"';
      for (unsigned char c : j.s) {
        if (c == '"' || c == '\\') {
          out << '\\' << c;
        } else if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out << buf;
        } else {
          out << c;
        }
      }
      out << '"';
      break;
    }
    case Json::Array: {
      out << '[';
      for (size_t n = 0; n < j.items.size(); ++n) {
        if (n) out << ',';
        write_json(out, j.items[n]);
      }
      out << ']';
      break;
    }
    case Json::Object: {
      out << '{';
      for (size_t n = 0; n < j.fields.size(); ++n) {
        if (n) out << ',';
        write_json(out, Json::str(j.fields[n].first));
        out << ':';
        write_json(out, j.fields[n].second);
      }
      out << '}';
      break;
    }
  }
}

// --- the arguments, as the protocol sends them ----------------------------

using Arrays = std::unordered_map<std::string, mx::array>;

struct Args {
  const Json& tree;
  const Arrays& arrays;

  // An array leaf `{"$tensor": KEY}`, or nothing for `null`.
  std::optional<mx::array> tensor_or_none(const std::string& name) const {
    const Json& v = tree.at(name);
    if (v.kind == Json::Null) return std::nullopt;
    const Json* key = v.kind == Json::Object ? v.get("$tensor") : nullptr;
    if (!key || key->kind != Json::String) throw BadRequest("argument " + name + " is not a tensor");
    auto found = arrays.find(key->s);
    if (found == arrays.end()) throw BadRequest("inputs file has no tensor " + key->s);
    return found->second;
  }
  mx::array tensor(const std::string& name) const {
    auto v = tensor_or_none(name);
    if (!v) throw BadRequest("argument " + name + " is None");
    return *v;
  }
  int64_t integer(const std::string& name) const {
    const Json& v = tree.at(name);
    if (v.kind != Json::Int) throw BadRequest("argument " + name + " is not an int");
    return v.i;
  }
  static double as_float(const Json& v, const std::string& name) {
    if (v.kind == Json::Float || v.kind == Json::Int) return v.kind == Json::Float ? v.f : double(v.i);
    if (const Json* special = v.kind == Json::Object ? v.get("$float") : nullptr) {
      return std::stod(special->s);  // "nan", "inf", "-inf"
    }
    throw BadRequest("argument " + name + " is not a float");
  }
  double floating(const std::string& name) const { return as_float(tree.at(name), name); }
  std::string string(const std::string& name) const {
    const Json& v = tree.at(name);
    if (v.kind != Json::String) throw BadRequest("argument " + name + " is not a str");
    return v.s;
  }
  std::vector<int64_t> int_list(const std::string& name) const {
    const Json& v = tree.at(name);
    if (v.kind != Json::Array) throw BadRequest("argument " + name + " is not a list");
    std::vector<int64_t> out;
    for (auto& item : v.items) {
      if (item.kind != Json::Int) throw BadRequest("argument " + name + " holds a non-int");
      out.push_back(item.i);
    }
    return out;
  }
};

bool WRONG = false;

// --- the ops ----------------------------------------------------------------

// mx.quantized_matmul(x, w, scales, biases, transpose=True, group_size, bits)
mx::array quantized_matmul(const Args& a) {
  return mx::quantized_matmul(a.tensor("x"), a.tensor("w"), a.tensor("scales"), a.tensor_or_none("biases"),
                              /*transpose=*/true, int(a.integer("group_size")), int(a.integer("bits")));
}

// QuantizedLinear.__call__: quantized_matmul(transpose=True), then `+ bias`.
mx::array quantized_linear(const Args& a) {
  mx::array y = mx::quantized_matmul(a.tensor("x"), a.tensor("weight"), a.tensor("scales"),
                                     a.tensor_or_none("biases"), /*transpose=*/true,
                                     int(a.integer("group_size")), int(a.integer("bits")), a.string("mode"));
  if (auto bias = a.tensor_or_none("bias")) y = mx::add(y, *bias);
  return y;
}

// compute_inv_freq(dim, base) = 1.0 / (base ** (arange(0, dim, 2).astype(float32) / dim)),
// with Python's scalars taking the array's dtype (float32), for each dim.
mx::array inv_freq(const Args& a) {
  float base = float(a.floating("base"));
  std::vector<mx::array> parts;
  for (int64_t dim : a.int_list("dims")) {
    mx::array exponents = mx::divide(mx::astype(mx::arange(0, int(dim), 2), mx::float32),
                                     mx::array(float(dim), mx::float32));
    parts.push_back(mx::divide(mx::array(1.0f, mx::float32), mx::power(mx::array(base, mx::float32), exponents)));
  }
  mx::array out = mx::concatenate(parts);
  if (WRONG && out.size() > 0) {
    // The deliberate bug: the last element one ulp up.
    out.eval();
    std::vector<float> values(out.data<float>(), out.data<float>() + out.size());
    values.back() = std::nextafter(values.back(), INFINITY);
    out = mx::array(values.begin(), out.shape(), mx::float32);
  }
  return out;
}

using Op = mx::array (*)(const Args&);
const std::map<std::string, std::pair<int, Op>> OPS = {
    {"quantized_matmul", {1, quantized_matmul}},
    {"quantized_linear", {1, quantized_linear}},
    {"inv_freq", {1, inv_freq}},
};

// --- the protocol: line-JSON on stdin/stdout, arrays in safetensors --------

// The libmlx file this process loaded (where the code of mx::version lives).
std::string loaded_libmlx() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&mx::version), &info) && info.dli_fname) return info.dli_fname;
  return "";
}

void answer(const Json& message) {
  write_json(std::cout, message);
  std::cout << '\n' << std::flush;
}

Json error(const Json& id, const std::string& kind, const std::string& message) {
  return Json::object({{"type", Json::str("error")}, {"id", id}, {"kind", Json::str(kind)},
                       {"message", Json::str(message)}});
}

void serve(const Json& request) {
  const std::string type = request.at("type").s;
  if (type == "hello") {
    mx::set_default_device(request.at("backend").s == "cpu" ? mx::Device::cpu : mx::Device::gpu);
    std::vector<std::pair<std::string, Json>> ops;
    for (auto& [name, op] : OPS) ops.emplace_back(name, Json::integer(op.first));
    answer(Json::object({{"type", Json::str("hello")},
                         {"protocol", Json::integer(1)},
                         {"name", Json::str(WRONG ? "mlx-cpp-candidate-wrong" : "mlx-cpp-candidate")},
                         {"ops", Json::object(std::move(ops))},
                         {"libmlx", Json::str(loaded_libmlx())}}));
    return;
  }
  const Json& id = request.at("id");
  const std::string op = request.at("op").s;
  auto found = OPS.find(op);
  if (found == OPS.end() || found->second.first != request.at("version").i) {
    answer(error(id, "unsupported", "op " + op + " v" + std::to_string(request.at("version").i)));
    return;
  }
  Arrays arrays;
  if (const Json* inputs = request.get("inputs"); inputs && inputs->kind == Json::String) {
    arrays = mx::load_safetensors(inputs->s).first;
  }
  std::optional<mx::array> result;
  try {
    result = found->second.second(Args{request.at("args"), arrays});
    result->eval();  // mlx is lazy: a refusal may come only now
  } catch (const BadRequest&) {
    throw;
  } catch (const std::exception& e) {
    // The reference may raise too (a refusal): say so, with its message.
    answer(error(id, "raised", e.what()));
    return;
  }
  mx::save_safetensors(request.at("outputs").s, {{"value", *result}});
  Json tensor = Json::object({{"$tensor", Json::str("value")}});
  answer(Json::object({{"type", Json::str("result")}, {"id", id}, {"value", tensor}}));
}

int main(int argc, char** argv) {
  for (int n = 1; n < argc; ++n) {
    if (std::string(argv[n]) == "--wrong") {
      WRONG = true;
    } else {
      std::cerr << "usage: " << argv[0] << " [--wrong]\n";
      return 2;
    }
  }
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    try {
      serve(Parser(line).parse());
    } catch (const std::exception& e) {
      // A request this candidate cannot read: the runner reports the
      // missing reply (and this line on stderr) as an ERROR.
      std::cerr << "mlx-cpp-candidate: " << e.what() << '\n';
      return 1;
    }
  }
  return 0;
}
