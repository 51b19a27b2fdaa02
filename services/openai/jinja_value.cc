#include "services/openai/jinja_value.h"

#include <charconv>
#include <cmath>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "services/openai/jinja.h"

namespace moe::jinja {
namespace {

std::string PyFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), d);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) out += absl::StrFormat("\\u%04x", c);
        else out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

void Dump(const Json& v, int indent, int depth, std::string* out) {
  const std::string nl = indent >= 0 ? "\n" + std::string((depth + 1) * indent, ' ') : "";
  const std::string nl_end = indent >= 0 ? "\n" + std::string(depth * indent, ' ') : "";
  const char* sep = indent >= 0 ? "," : ", ";
  if (v.is_object()) {
    if (v.empty()) { *out += "{}"; return; }
    *out += "{";
    bool first = true;
    for (const auto& [k, x] : v.items()) {
      if (!first) *out += sep;
      first = false;
      *out += nl + JsonString(k) + ": ";
      Dump(x, indent, depth + 1, out);
    }
    *out += nl_end + "}";
  } else if (v.is_array()) {
    if (v.empty()) { *out += "[]"; return; }
    *out += "[";
    for (size_t i = 0; i < v.size(); ++i) {
      if (i > 0) *out += sep;
      *out += nl;
      Dump(v[i], indent, depth + 1, out);
    }
    *out += nl_end + "]";
  } else if (v.is_string()) {
    *out += JsonString(v.get<std::string>());
  } else if (v.is_number_float()) {
    *out += PyFloat(v.get<double>());
  } else if (IsUndef(v)) {
    *out += "null";
  } else {
    *out += v.dump();
  }
}

}  // namespace

bool Truthy(const Json& v) {
  if (IsUndef(v) || v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number_integer()) return v.get<int64_t>() != 0;
  if (v.is_number()) return v.get<double>() != 0;
  if (v.is_string()) return !v.get_ref<const std::string&>().empty();
  return !v.empty();
}

std::string Str(const Json& v) {
  if (IsUndef(v)) return "";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "None";
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_number_float()) return PyFloat(v.get<double>());
  if (v.is_number()) return v.dump();
  if (v.is_array()) {
    std::vector<std::string> parts;
    for (const Json& x : v) parts.push_back(Repr(x));
    return "[" + absl::StrJoin(parts, ", ") + "]";
  }
  std::vector<std::string> parts;
  for (const auto& [k, x] : v.items()) parts.push_back(Repr(Json(k)) + ": " + Repr(x));
  return "{" + absl::StrJoin(parts, ", ") + "}";
}

std::string Repr(const Json& v) {
  if (!v.is_string()) return Str(v);
  const std::string& s = v.get_ref<const std::string&>();
  const char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    if (c == q || c == '\\') out += '\\';
    if (c == '\n') { out += "\\n"; continue; }
    out += c;
  }
  return out + q;
}


std::string Strip(const std::string& s, const std::string& chars, bool left, bool right) {
  size_t b = 0, n = s.size();
  auto in = [&](char c) { return chars.find(c) != std::string::npos; };
  if (left) while (b < n && in(s[b])) ++b;
  if (right) while (n > b && in(s[n - 1])) --n;
  return s.substr(b, n - b);
}

std::string Title(const std::string& s) {
  std::string out = s;
  bool start = true;
  for (char& c : out) {
    if (std::isalpha(static_cast<unsigned char>(c))) {
      c = start ? std::toupper(c) : std::tolower(c);
      start = false;
    } else {
      start = true;
    }
  }
  return out;
}

std::string Lower(std::string s) {
  for (char& c : s) c = std::tolower(static_cast<unsigned char>(c));
  return s;
}
std::string Upper(std::string s) {
  for (char& c : s) c = std::toupper(static_cast<unsigned char>(c));
  return s;
}
std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count) {
  if (from.empty()) return s;
  std::string out;
  size_t pos = 0;
  for (int64_t done = 0; count < 0 || done < count; ++done) {
    size_t f = s.find(from, pos);
    if (f == std::string::npos) break;
    out += s.substr(pos, f - pos) + to;
    pos = f + from.size();
  }
  return out + s.substr(pos);
}


std::string PythonJsonDumps(const nlohmann::ordered_json& value, int indent) {
  std::string out;
  Dump(value, indent, 0, &out);
  return out;
}

}  // namespace moe::jinja
