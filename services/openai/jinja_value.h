// Jinja values as Python sees them (internal to jinja*.cc): truthiness,
// str() and repr(), and the string helpers the filters and methods share.
#ifndef MOECACHE_SERVICES_OPENAI_JINJA_VALUE_H_
#define MOECACHE_SERVICES_OPENAI_JINJA_VALUE_H_

#include <cstdint>
#include <string>

#include "services/openai/jinja_ast.h"

namespace moe::jinja {

inline Json Undefined() { return Json(Json::value_t::discarded); }
inline bool IsUndef(const Json& v) { return v.is_discarded(); }

bool Truthy(const Json& v);
std::string Str(const Json& v);   // Python's str(); undefined is ""
std::string Repr(const Json& v);  // Python's repr()

inline const std::string kSpace = " \t\n\r\f\v";
std::string Strip(const std::string& s, const std::string& chars, bool left, bool right);
std::string Title(const std::string& s);
std::string Lower(std::string s);
std::string Upper(std::string s);
// Python's str.replace (count < 0: all).
std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count = -1);

}  // namespace moe::jinja

#endif  // MOECACHE_SERVICES_OPENAI_JINJA_VALUE_H_
