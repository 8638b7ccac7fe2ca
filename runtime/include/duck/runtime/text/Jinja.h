//===- Jinja.h - the Jinja subset that chat templates use -------*- C++ -*-===//
//
// A checkpoint's tokenizer_config.json carries its chat template as Jinja
// source; transformers renders it with jinja2 (trim_blocks, lstrip_blocks,
// its own tojson and raise_exception), transformers.js with
// @huggingface/jinja. This is the subset those templates use, rendered the
// way jinja2 does, over JSON values (members kept in their order):
//  - {{ expr }}, {# comments #}, {% if/elif/else %}, {% for a[, b] in xs
//    [if cond] %} with loop.index/index0/first/last/length/revindex and
//    {% else %}, {% break %}/{% continue %}, {% set x = ... %} and
//    {% set ns.attr = ... %} on a namespace(...); whitespace control with
//    "-" and "+", trim_blocks and lstrip_blocks always on;
//  - literals (strings, numbers, true/false/none in either case, lists,
//    dicts), attribute and item access, slices ([::-1], [1:]), "not",
//    "and", "or", "in", "not in", comparisons, + - * / // % **, "~",
//    "a if c else b";
//  - filters: tojson (Python's json.dumps, as transformers registers it),
//    trim, length/count, string, items, list, first, last, join, upper,
//    lower, default/d, reverse, int, float, abs, capitalize, safe,
//    dictsort; tests: defined, undefined, none, string, number, integer,
//    float, boolean, true, false, mapping, iterable, sequence, odd, even;
//  - string methods startswith, endswith, split, strip, lstrip, rstrip,
//    replace, upper, lower, title, capitalize; dict methods items, keys,
//    values, get; functions namespace, range, raise_exception.
// Anything else (macros, call blocks, block sets, other filters) is an
// error naming the construct and its line:column, at parse time where the
// syntax shows it, else when the template is rendered.
//===----------------------------------------------------------------------===//
#ifndef DUCK_RUNTIME_TEXT_JINJA_H
#define DUCK_RUNTIME_TEXT_JINJA_H

#include "absl/status/statusor.h"

#include <nlohmann/json.hpp>

#include <memory>
#include <set>
#include <string>
#include <string_view>

namespace duck::runtime::jinja {

struct Stmt;

class Template {
public:
  /// Parses `source`. Errors (InvalidArgument) say what was found or not
  /// supported and where ("line L, column C").
  static absl::StatusOr<Template> Parse(std::string_view source);

  /// Renders with the members of the object `vars` as the variables.
  /// Errors (InvalidArgument): raise_exception's message, or what could
  /// not be evaluated and where.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json &vars) const;

  /// Whether the template reads the variable `name` anywhere.
  bool Reads(const std::string &name) const { return names_->count(name); }

private:
  std::shared_ptr<const Stmt> root_;
  std::shared_ptr<const std::set<std::string>> names_;
  std::shared_ptr<const std::string> source_; // for line:column
};

/// Python's json.dumps(v, ensure_ascii=False, indent=indent) (indent < 0:
/// none): ", " and ": " between items, members in their order; what
/// transformers' tojson writes.
std::string PythonJsonDumps(const nlohmann::ordered_json &v, int indent = -1);

} // namespace duck::runtime::jinja

#endif // DUCK_RUNTIME_TEXT_JINJA_H
