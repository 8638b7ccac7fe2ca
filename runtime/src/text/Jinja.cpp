//===- Jinja.cpp - the Jinja subset that chat templates use ---------------===//
//
// Lexer (text and tags, whitespace control applied there), a recursive
// descent parser to statements and expressions, and an evaluator over
// ordered JSON values, written to render as jinja2 does. See Jinja.h for
// the subset.
//===----------------------------------------------------------------------===//
#include "duck/runtime/text/Jinja.h"

#include "absl/strings/str_cat.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <vector>

namespace duck::runtime::jinja {

using Json = nlohmann::ordered_json;

namespace {

// An error at a byte offset of the source; Parse/Render turn it into
// "line L, column C".
struct Error {
  std::string message;
  size_t pos;
};

[[noreturn]] void Fail(size_t pos, std::string message) {
  throw Error{std::move(message), pos};
}

//===----------------------------------------------------------------------===//
// Lexer
//===----------------------------------------------------------------------===//

enum class Tok {
  kText,
  kExprOpen,  // {{
  kExprClose, // }}
  kStmtOpen,  // {%
  kStmtClose, // %}
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEnd,
};

struct Token {
  Tok kind;
  std::string text;
  size_t pos;
};

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' ||
         c == '\f';
}

class Lexer {
public:
  explicit Lexer(std::string_view src) : src_(src) {}
  std::vector<Token> Run();

private:
  void Text(size_t at);
  void Tag(size_t at);
  bool TagClose(char kind, size_t *i);
  void ExprToken(size_t *i);
  void StringToken(size_t *i);

  std::string_view src_;
  std::vector<Token> out_;
  bool strip_left_ = false; // the last tag ended with "-"
  bool trim_nl_ = false;    // the last tag was a block or comment
  size_t pos_ = 0;
};

std::vector<Token> Lexer::Run() {
  while (pos_ <= src_.size()) {
    size_t at = pos_;
    while (
        (at = src_.find('{', at)) != std::string_view::npos &&
        (at + 1 >= src_.size() ||
         (src_[at + 1] != '{' && src_[at + 1] != '%' && src_[at + 1] != '#')))
      ++at;
    Text(at == std::string_view::npos ? src_.size() : at);
    if (at == std::string_view::npos)
      break;
    Tag(at);
  }
  out_.push_back({Tok::kEnd, "", src_.size()});
  return out_;
}

// The text up to `at` (a tag's "{", or the end), with whitespace control:
// "-" strips all whitespace on its side; trim_blocks drops the newline
// after a block tag; lstrip_blocks drops spaces and tabs before a block
// tag at the start of a line.
void Lexer::Text(size_t at) {
  std::string_view text = src_.substr(pos_, at - pos_);
  if (strip_left_) {
    while (!text.empty() && IsSpace(text.front()))
      text.remove_prefix(1);
  } else if (trim_nl_ && !text.empty() && text.front() == '\n') {
    text.remove_prefix(1);
  } else if (trim_nl_ && text.substr(0, 2) == "\r\n") {
    text.remove_prefix(2);
  }
  if (at < src_.size()) {
    const char kind = src_[at + 1];
    const char mod = at + 2 < src_.size() ? src_[at + 2] : 0;
    if (mod == '-') {
      while (!text.empty() && IsSpace(text.back()))
        text.remove_suffix(1);
    } else if (kind != '{' && mod != '+') {
      const size_t nl = src_.rfind('\n', at == 0 ? 0 : at - 1);
      const size_t line = nl == std::string_view::npos || at == 0 ? 0 : nl + 1;
      bool blank = line >= pos_;
      for (size_t k = line; blank && k < at; ++k)
        blank = src_[k] == ' ' || src_[k] == '\t';
      if (blank)
        text.remove_suffix(std::min(text.size(), at - line));
    }
  }
  if (!text.empty())
    out_.push_back({Tok::kText, std::string(text), pos_});
  pos_ = at;
}

void Lexer::Tag(size_t at) {
  const char kind = src_[at + 1];
  size_t i = at + 2;
  if (i < src_.size() && (src_[i] == '-' || src_[i] == '+'))
    ++i;
  if (kind == '#') {
    const size_t end = src_.find("#}", i);
    if (end == std::string_view::npos)
      Fail(at, "a comment '{#' without its '#}'");
    strip_left_ = end > i && src_[end - 1] == '-';
    trim_nl_ = !(end > i && src_[end - 1] == '+');
    pos_ = end + 2;
    return;
  }
  out_.push_back({kind == '{' ? Tok::kExprOpen : Tok::kStmtOpen,
                  kind == '{' ? "{{" : "{%", at});
  while (!TagClose(kind, &i))
    ExprToken(&i);
  pos_ = i;
}

// At a tag's close ("}}" or "%}", "-" or "+" before it): emits it.
bool Lexer::TagClose(char kind, size_t *i) {
  while (*i < src_.size() && IsSpace(src_[*i]))
    ++*i;
  if (*i >= src_.size())
    Fail(*i, kind == '{' ? "'{{' without its '}}'" : "'{%' without its '%}'");
  const char want = kind == '{' ? '}' : '%';
  size_t k = *i;
  const char mod = src_[k];
  if (mod == '-' || mod == '+')
    ++k;
  if (k + 1 >= src_.size() || src_[k] != want || src_[k + 1] != '}')
    return false;
  strip_left_ = mod == '-';
  trim_nl_ = kind == '%' && mod != '+';
  out_.push_back({kind == '{' ? Tok::kExprClose : Tok::kStmtClose,
                  kind == '{' ? "}}" : "%}", *i});
  *i = k + 2;
  return true;
}

void Lexer::ExprToken(size_t *i) {
  const size_t start = *i;
  const char c = src_[start];
  auto isAlnum = [](char ch) {
    return std::isalnum((unsigned char)ch) || ch == '_';
  };
  if (std::isalpha((unsigned char)c) || c == '_') {
    while (*i < src_.size() && isAlnum(src_[*i]))
      ++*i;
    out_.push_back(
        {Tok::kName, std::string(src_.substr(start, *i - start)), start});
  } else if (std::isdigit((unsigned char)c)) {
    bool dot = false;
    while (*i < src_.size() &&
           (std::isdigit((unsigned char)src_[*i]) ||
            (!dot && src_[*i] == '.' && *i + 1 < src_.size() &&
             std::isdigit((unsigned char)src_[*i + 1])))) {
      dot |= src_[*i] == '.';
      ++*i;
    }
    out_.push_back({dot ? Tok::kFloat : Tok::kInt,
                    std::string(src_.substr(start, *i - start)), start});
  } else if (c == '\'' || c == '"') {
    StringToken(i);
  } else {
    static const char *const kTwo[] = {"==", "!=", "<=", ">=", "//", "**"};
    for (const char *op : kTwo)
      if (src_.substr(start, 2) == op) {
        out_.push_back({Tok::kOp, op, start});
        *i += 2;
        return;
      }
    if (std::string_view("+-*/%~<>=.,:()[]{}|").find(c) ==
        std::string_view::npos)
      Fail(start, absl::StrCat("unexpected character '", std::string(1, c),
                               "' in a tag"));
    out_.push_back({Tok::kOp, std::string(1, c), start});
    ++*i;
  }
}

// A quoted string with Python's escapes (\n \t \r \\ \' \" \uXXXX).
void Lexer::StringToken(size_t *i) {
  const size_t start = *i;
  const char quote = src_[(*i)++];
  std::string s;
  while (*i < src_.size() && src_[*i] != quote) {
    char c = src_[(*i)++];
    if (c != '\\' || *i >= src_.size()) {
      s += c;
      continue;
    }
    c = src_[(*i)++];
    switch (c) {
    case 'n':
      s += '\n';
      break;
    case 't':
      s += '\t';
      break;
    case 'r':
      s += '\r';
      break;
    case 'b':
      s += '\b';
      break;
    case 'f':
      s += '\f';
      break;
    case '0':
      s += '\0';
      break;
    case 'u': {
      if (*i + 4 > src_.size())
        Fail(*i - 2, "a \\u escape needs four hex digits");
      const unsigned cp =
          std::stoul(std::string(src_.substr(*i, 4)), nullptr, 16);
      *i += 4;
      if (cp < 0x80) {
        s += char(cp);
      } else if (cp < 0x800) {
        s += char(0xC0 | (cp >> 6));
        s += char(0x80 | (cp & 0x3F));
      } else {
        s += char(0xE0 | (cp >> 12));
        s += char(0x80 | ((cp >> 6) & 0x3F));
        s += char(0x80 | (cp & 0x3F));
      }
      break;
    }
    case '\\':
    case '\'':
    case '"':
      s += c;
      break;
    default:
      s += '\\';
      s += c; // Python keeps unknown escapes
    }
  }
  if (*i >= src_.size())
    Fail(start, "a string without its closing quote");
  ++*i;
  out_.push_back({Tok::kString, std::move(s), start});
}

//===----------------------------------------------------------------------===//
// AST
//===----------------------------------------------------------------------===//

struct Expr;
using ExprP = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral, // value
    kName,    // name
    kList,    // args
    kDict,    // args: key, value, key, value...
    kAttr,    // args[0].name
    kIndex,   // args[0][args[1]]
    kSlice,   // args[0][args[1]:args[2]:args[3]] (null: left out)
    kCall,    // args[0](args[1..]); kwnames name the last args
    kFilter,  // args[0] | name(args[1..])
    kTest,    // args[0] is [not] name(args[1..])
    kUnary,   // name args[0]: "not", "-", "+"
    kBinary,  // args[0] name args[1]
    kTernary, // args[0] if args[1] else args[2] (null: undefined)
  };
  Kind kind;
  size_t pos;
  std::string name;
  Json value;
  std::vector<ExprP> args;
  std::vector<std::string> kwnames;
  bool negated = false;
  int depth = 1; // of the tree below, bounded by the parser
};

} // namespace

struct Stmt {
  enum class Kind { kBody, kText, kOutput, kIf, kFor, kSet, kBreak, kContinue };
  Kind kind;
  size_t pos = 0;
  std::string text;                 // kText
  ExprP expr;                       // kOutput, kSet's value, kFor's list
  std::vector<std::string> targets; // kFor: the names; kSet: name [, attr]
  ExprP cond;                       // kFor's "if"
  std::vector<std::pair<ExprP, std::vector<Stmt>>> branches; // kIf
  std::vector<Stmt> body, else_body; // kBody, kFor; else: kIf, kFor
};

namespace {

//===----------------------------------------------------------------------===//
// Parser
//===----------------------------------------------------------------------===//

class Parser {
public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}
  Stmt Template();
  std::set<std::string> names; // every variable read

private:
  const Token &Peek(size_t k = 0) const {
    return t_[std::min(i_ + k, t_.size() - 1)];
  }
  bool IsOp(const char *op, size_t k = 0) const {
    return Peek(k).kind == Tok::kOp && Peek(k).text == op;
  }
  bool IsName(const char *name, size_t k = 0) const {
    return Peek(k).kind == Tok::kName && Peek(k).text == name;
  }
  const Token &Next() { return t_[std::min(i_++, t_.size() - 1)]; }
  void ExpectOp(const char *op);
  std::string ExpectName(const char *what);
  void ExpectClose(Tok kind);

  std::vector<Stmt> Body(std::initializer_list<const char *> ends,
                         std::string *out_end);
  Stmt Statement(size_t pos);
  Stmt If(size_t pos);
  Stmt For(size_t pos);
  Stmt Set(size_t pos);

  ExprP Expression();
  ExprP Or();
  ExprP And();
  ExprP Not();
  ExprP Compare();
  ExprP Concat();
  ExprP Sum();
  ExprP Product();
  ExprP Power();
  ExprP Unary();
  ExprP FilterAndTests(ExprP e);
  ExprP Postfix(ExprP e);
  ExprP Primary();
  ExprP Subscript(ExprP obj, size_t pos);
  void Arguments(Expr *call);
  ExprP Make(Expr::Kind kind, size_t pos, std::string name = "") {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->pos = pos;
    e->name = std::move(name);
    return e;
  }
  ExprP Binary(ExprP a, const Token &op, ExprP b) {
    ExprP e = Make(Expr::Kind::kBinary, op.pos, op.text);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return Done(std::move(e));
  }
  // A node with its operands: its depth, bounded (evaluating and freeing
  // the tree recurse through it).
  ExprP Done(ExprP e) {
    for (const ExprP &a : e->args)
      if (a)
        e->depth = std::max(e->depth, a->depth + 1);
    if (e->depth > kMaxDepth)
      Fail(e->pos,
           absl::StrCat("an expression nested deeper than ", kMaxDepth));
    return e;
  }

  // How deep expressions and blocks nest: a bound, so that a hostile
  // template is an error rather than a stack overflow.
  struct Nest {
    Nest(Parser *p, size_t pos) : p(p) {
      if (++p->depth_ > kMaxDepth)
        Fail(pos, absl::StrCat("expressions or blocks nested deeper than ",
                               kMaxDepth));
    }
    ~Nest() { --p->depth_; }
    Parser *p;
  };
  static constexpr int kMaxDepth = 200;

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
};

void Parser::ExpectOp(const char *op) {
  if (!IsOp(op))
    Fail(Peek().pos,
         absl::StrCat("expected '", op, "', found '", Peek().text, "'"));
  ++i_;
}

std::string Parser::ExpectName(const char *what) {
  if (Peek().kind != Tok::kName)
    Fail(Peek().pos,
         absl::StrCat("expected ", what, ", found '", Peek().text, "'"));
  return Next().text;
}

void Parser::ExpectClose(Tok kind) {
  if (Peek().kind != kind)
    Fail(Peek().pos,
         absl::StrCat("expected '", kind == Tok::kStmtClose ? "%}" : "}}",
                      "', found '", Peek().text, "'"));
  ++i_;
}

Stmt Parser::Template() {
  std::string end;
  Stmt root;
  root.kind = Stmt::Kind::kBody;
  root.body = Body({}, &end);
  return root;
}

// Statements up to one of `ends` ({% end... %} and the like, consumed up
// to the keyword) or the end of the template (only when `ends` is empty).
std::vector<Stmt> Parser::Body(std::initializer_list<const char *> ends,
                               std::string *out_end) {
  std::vector<Stmt> body;
  for (;;) {
    const Token &tok = Peek();
    if (tok.kind == Tok::kEnd) {
      if (ends.size())
        Fail(tok.pos, absl::StrCat("the template ends before '{% ",
                                   *ends.begin(), " %}'"));
      return body;
    }
    ++i_;
    if (tok.kind == Tok::kText) {
      Stmt s;
      s.kind = Stmt::Kind::kText;
      s.pos = tok.pos;
      s.text = tok.text;
      body.push_back(std::move(s));
    } else if (tok.kind == Tok::kExprOpen) {
      Stmt s;
      s.kind = Stmt::Kind::kOutput;
      s.pos = tok.pos;
      s.expr = Expression();
      ExpectClose(Tok::kExprClose);
      body.push_back(std::move(s));
    } else {
      for (const char *end : ends)
        if (IsName(end)) {
          *out_end = Next().text;
          return body;
        }
      body.push_back(Statement(tok.pos));
    }
  }
}

Stmt Parser::Statement(size_t pos) {
  Nest nest(this, pos);
  const Token &kw = Peek();
  if (kw.kind != Tok::kName)
    Fail(kw.pos, absl::StrCat("expected a statement, found '", kw.text, "'"));
  if (kw.text == "if")
    return If(pos);
  if (kw.text == "for")
    return For(pos);
  if (kw.text == "set")
    return Set(pos);
  if (kw.text == "break" || kw.text == "continue") {
    Stmt s;
    s.kind = kw.text == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
    s.pos = pos;
    ++i_;
    ExpectClose(Tok::kStmtClose);
    return s;
  }
  Fail(kw.pos, absl::StrCat("'{% ", kw.text,
                            " %}' is not in the Jinja subset Duck renders"));
}

Stmt Parser::If(size_t pos) {
  Stmt s;
  s.kind = Stmt::Kind::kIf;
  s.pos = pos;
  ++i_; // if
  std::string end = "elif";
  while (end == "elif") {
    ExprP cond = Expression();
    ExpectClose(Tok::kStmtClose);
    std::vector<Stmt> body = Body({"elif", "else", "endif"}, &end);
    s.branches.emplace_back(std::move(cond), std::move(body));
  }
  if (end == "else") {
    ExpectClose(Tok::kStmtClose);
    s.else_body = Body({"endif"}, &end);
  }
  ExpectClose(Tok::kStmtClose);
  return s;
}

Stmt Parser::For(size_t pos) {
  Stmt s;
  s.kind = Stmt::Kind::kFor;
  s.pos = pos;
  ++i_; // for
  s.targets.push_back(ExpectName("a loop variable"));
  while (IsOp(",")) {
    ++i_;
    s.targets.push_back(ExpectName("a loop variable"));
  }
  if (!IsName("in"))
    Fail(Peek().pos, absl::StrCat("expected 'in', found '", Peek().text, "'"));
  ++i_;
  s.expr = Or(); // not Expression(): a trailing "if" filters the loop
  if (IsName("if")) {
    ++i_;
    s.cond = Or();
  }
  if (IsName("recursive"))
    Fail(Peek().pos, "recursive loops are not in the Jinja subset Duck "
                     "renders");
  ExpectClose(Tok::kStmtClose);
  std::string end;
  s.body = Body({"else", "endfor"}, &end);
  if (end == "else") {
    ExpectClose(Tok::kStmtClose);
    s.else_body = Body({"endfor"}, &end);
  }
  ExpectClose(Tok::kStmtClose);
  return s;
}

Stmt Parser::Set(size_t pos) {
  Stmt s;
  s.kind = Stmt::Kind::kSet;
  s.pos = pos;
  ++i_; // set
  s.targets.push_back(ExpectName("a variable to set"));
  if (IsOp(".")) {
    ++i_;
    s.targets.push_back(ExpectName("an attribute to set"));
  }
  if (!IsOp("="))
    Fail(Peek().pos, IsOp(",") ? "'{% set a, b = ... %}' is not in the Jinja "
                                 "subset Duck renders"
                               : "'{% set x %}...{% endset %}' is not in the "
                                 "Jinja subset Duck renders");
  ++i_;
  s.expr = Expression();
  ExpectClose(Tok::kStmtClose);
  return s;
}

ExprP Parser::Expression() {
  Nest nest(this, Peek().pos);
  ExprP e = Or();
  if (!IsName("if"))
    return e;
  const size_t pos = Next().pos;
  ExprP t = Make(Expr::Kind::kTernary, pos);
  t->args.push_back(std::move(e));
  t->args.push_back(Or());
  if (IsName("else")) {
    ++i_;
    t->args.push_back(Expression());
  } else {
    t->args.push_back(nullptr);
  }
  return Done(std::move(t));
}

ExprP Parser::Or() {
  ExprP e = And();
  while (IsName("or")) {
    const Token &op = Next();
    e = Binary(std::move(e), op, And());
  }
  return e;
}

ExprP Parser::And() {
  ExprP e = Not();
  while (IsName("and")) {
    const Token &op = Next();
    e = Binary(std::move(e), op, Not());
  }
  return e;
}

ExprP Parser::Not() {
  if (!IsName("not"))
    return Compare();
  ExprP e = Make(Expr::Kind::kUnary, Next().pos, "not");
  Nest nest(this, e->pos);
  e->args.push_back(Not());
  return Done(std::move(e));
}

ExprP Parser::Compare() {
  ExprP e = Concat();
  for (;;) {
    static const char *const kOps[] = {"==", "!=", "<", "<=", ">", ">="};
    bool cmp = false;
    for (const char *op : kOps)
      cmp |= IsOp(op);
    if (cmp || IsName("in")) {
      const Token &op = Next();
      e = Binary(std::move(e), op, Concat());
    } else if (IsName("not") && IsName("in", 1)) {
      Token op = Next();
      ++i_;
      op.text = "not in";
      e = Binary(std::move(e), op, Concat());
    } else {
      return e;
    }
  }
}

ExprP Parser::Concat() {
  ExprP e = Sum();
  while (IsOp("~")) {
    const Token &op = Next();
    e = Binary(std::move(e), op, Sum());
  }
  return e;
}

ExprP Parser::Sum() {
  ExprP e = Product();
  while (IsOp("+") || IsOp("-")) {
    const Token &op = Next();
    e = Binary(std::move(e), op, Product());
  }
  return e;
}

ExprP Parser::Product() {
  ExprP e = Power();
  while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
    const Token &op = Next();
    e = Binary(std::move(e), op, Power());
  }
  return e;
}

ExprP Parser::Power() {
  ExprP e = Unary();
  while (IsOp("**")) {
    const Token &op = Next();
    e = Binary(std::move(e), op, Unary());
  }
  return e;
}

ExprP Parser::Unary() {
  Nest nest(this, Peek().pos);
  if (IsOp("-") || IsOp("+")) {
    const Token &op = Next();
    ExprP e = Make(Expr::Kind::kUnary, op.pos, op.text);
    e->args.push_back(Unary());
    return Done(std::move(e));
  }
  return FilterAndTests(Postfix(Primary()));
}

// "| filter(args)" and "is [not] test(args)", left to right.
ExprP Parser::FilterAndTests(ExprP e) {
  for (;;) {
    if (IsOp("|")) {
      ++i_;
      const size_t pos = Peek().pos;
      ExprP f = Make(Expr::Kind::kFilter, pos, ExpectName("a filter name"));
      f->args.push_back(std::move(e));
      if (IsOp("("))
        Arguments(f.get());
      e = Postfix(Done(std::move(f)));
    } else if (IsName("is")) {
      ++i_;
      const bool negated = IsName("not");
      if (negated)
        ++i_;
      const size_t pos = Peek().pos;
      // "none", "true", "false" are names here, not literals.
      ExprP t = Make(Expr::Kind::kTest, pos, ExpectName("a test name"));
      t->negated = negated;
      t->args.push_back(std::move(e));
      if (IsOp("("))
        Arguments(t.get());
      else if (Peek().kind == Tok::kString || Peek().kind == Tok::kInt)
        t->args.push_back(Primary()); // "is divisibleby 3" style
      e = Done(std::move(t));
    } else {
      return e;
    }
  }
}

ExprP Parser::Postfix(ExprP e) {
  for (;;) {
    if (IsOp(".")) {
      const size_t pos = Next().pos;
      ExprP a = Make(Expr::Kind::kAttr, pos, ExpectName("an attribute name"));
      a->args.push_back(std::move(e));
      e = Done(std::move(a));
    } else if (IsOp("[")) {
      e = Subscript(std::move(e), Next().pos);
    } else if (IsOp("(")) {
      ExprP c = Make(Expr::Kind::kCall, Peek().pos);
      c->args.push_back(std::move(e));
      Arguments(c.get());
      e = Done(std::move(c));
    } else {
      return e;
    }
  }
}

// After "[": an index or a slice, up to "]".
ExprP Parser::Subscript(ExprP obj, size_t pos) {
  ExprP first = IsOp(":") ? nullptr : Expression();
  if (IsOp("]")) {
    ++i_;
    ExprP e = Make(Expr::Kind::kIndex, pos);
    e->args.push_back(std::move(obj));
    e->args.push_back(std::move(first));
    return Done(std::move(e));
  }
  ExprP e = Make(Expr::Kind::kSlice, pos);
  e->args.push_back(std::move(obj));
  e->args.push_back(std::move(first));
  for (int part = 0; part < 2; ++part) {
    if (!IsOp(":")) {
      e->args.push_back(nullptr);
      continue;
    }
    ++i_;
    e->args.push_back(IsOp(":") || IsOp("]") ? nullptr : Expression());
  }
  ExpectOp("]");
  return Done(std::move(e));
}

// "(" positional args, then name=value ones, ")".
void Parser::Arguments(Expr *call) {
  ExpectOp("(");
  while (!IsOp(")")) {
    if (Peek().kind == Tok::kName && IsOp("=", 1)) {
      call->kwnames.push_back(Next().text);
      ++i_;
    } else if (!call->kwnames.empty()) {
      Fail(Peek().pos, "a positional argument after a keyword argument");
    }
    call->args.push_back(Expression());
    if (!IsOp(")"))
      ExpectOp(",");
  }
  ++i_;
}

ExprP Parser::Primary() {
  const Token &tok = Next();
  if (tok.kind == Tok::kString) {
    ExprP e = Make(Expr::Kind::kLiteral, tok.pos);
    e->value = tok.text;
    while (Peek().kind == Tok::kString) // adjacent literals join
      e->value = e->value.get<std::string>() + Next().text;
    return e;
  }
  if (tok.kind == Tok::kInt || tok.kind == Tok::kFloat) {
    ExprP e = Make(Expr::Kind::kLiteral, tok.pos);
    if (tok.kind == Tok::kInt)
      e->value = std::stoll(tok.text);
    else
      e->value = std::stod(tok.text);
    return e;
  }
  if (tok.kind == Tok::kName) {
    ExprP e = Make(Expr::Kind::kLiteral, tok.pos);
    if (tok.text == "true" || tok.text == "True")
      e->value = true;
    else if (tok.text == "false" || tok.text == "False")
      e->value = false;
    else if (tok.text == "none" || tok.text == "None")
      e->value = nullptr;
    else
      e = Make(Expr::Kind::kName, tok.pos, tok.text);
    if (e->kind == Expr::Kind::kName)
      names.insert(tok.text);
    return e;
  }
  if (tok.kind == Tok::kOp && (tok.text == "(" || tok.text == "[")) {
    const char *close = tok.text == "(" ? ")" : "]";
    ExprP list = Make(Expr::Kind::kList, tok.pos);
    bool comma = false;
    while (!IsOp(close)) {
      list->args.push_back(Expression());
      if (!IsOp(close)) {
        ExpectOp(",");
        comma = true;
      }
    }
    ++i_;
    if (tok.text == "(" && list->args.size() == 1 && !comma)
      return std::move(list->args[0]); // parentheses, not a tuple
    return Done(std::move(list));
  }
  if (tok.kind == Tok::kOp && tok.text == "{") {
    ExprP dict = Make(Expr::Kind::kDict, tok.pos);
    while (!IsOp("}")) {
      dict->args.push_back(Expression());
      ExpectOp(":");
      dict->args.push_back(Expression());
      if (!IsOp("}"))
        ExpectOp(",");
    }
    ++i_;
    return Done(std::move(dict));
  }
  Fail(tok.pos,
       absl::StrCat("expected a value, found '",
                    tok.kind == Tok::kEnd ? "the end" : tok.text, "'"));
}

//===----------------------------------------------------------------------===//
// Values
//===----------------------------------------------------------------------===//

// A JSON value, or jinja2's Undefined, or a namespace() (changed in place
// by "set ns.attr", so shared by every variable that holds it).
struct Value {
  Json j;
  bool undefined = false;
  std::shared_ptr<Json> ns;

  static Value Undefined() {
    Value v;
    v.undefined = true;
    return v;
  }
  const Json &json() const { return ns ? *ns : j; }
};

// UTF-8 code points, as Python's str counts and slices them.
std::vector<std::string_view> CodePoints(std::string_view s) {
  std::vector<std::string_view> out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = s[i];
    size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    n = std::min(n, s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

std::string PyFloat(double d) {
  if (std::isnan(d))
    return "nan";
  if (std::isinf(d))
    return d > 0 ? "inf" : "-inf";
  std::string s = Json(d).dump(); // shortest round trip, as repr
  if (s.find_first_of(".eninf") == std::string::npos)
    s += ".0";
  return s;
}

std::string PyRepr(const Json &v);

// How deep `v` nests, without recursing: what tojson and printing walk
// recursively, refused past a bound (Python stops near 1000 too).
constexpr size_t kMaxJsonDepth = 512;
size_t JsonDepth(const Json &v) {
  size_t deepest = 0;
  std::vector<std::pair<const Json *, size_t>> todo = {{&v, 1}};
  while (!todo.empty()) {
    auto [j, d] = todo.back();
    todo.pop_back();
    deepest = std::max(deepest, d);
    if (j->is_structured() && d <= kMaxJsonDepth)
      for (const Json &c : *j)
        todo.push_back({&c, d + 1});
  }
  return deepest;
}

// What {{ v }} and "~" and |string write: Python's str().
std::string ToStr(const Value &v) {
  if (v.undefined)
    return "";
  const Json &j = v.json();
  if (v.ns)
    return "<Namespace " + PyRepr(j) + ">";
  if (j.is_string())
    return j.get<std::string>();
  return PyRepr(j);
}

std::string PyRepr(const Json &v) {
  switch (v.type()) {
  case Json::value_t::null:
    return "None";
  case Json::value_t::boolean:
    return v.get<bool>() ? "True" : "False";
  case Json::value_t::number_float:
    return PyFloat(v.get<double>());
  case Json::value_t::string: {
    const std::string s = v.get<std::string>();
    const char q =
        s.find('\'') != std::string::npos && s.find('"') == std::string::npos
            ? '"'
            : '\'';
    std::string out(1, q);
    for (char c : s)
      out += c == q || c == '\\' ? std::string{'\\', c}
             : c == '\n'         ? std::string("\\n")
                                 : std::string(1, c);
    return out + q;
  }
  case Json::value_t::array: {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i)
      absl::StrAppend(&out, i ? ", " : "", PyRepr(v[i]));
    return out + "]";
  }
  case Json::value_t::object: {
    std::string out = "{";
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it, first = false)
      absl::StrAppend(&out, first ? "" : ", ", PyRepr(it.key()), ": ",
                      PyRepr(it.value()));
    return out + "}";
  }
  default:
    return v.dump();
  }
}

bool Truthy(const Value &v) {
  if (v.undefined)
    return false;
  if (v.ns)
    return true;
  const Json &j = v.j;
  switch (j.type()) {
  case Json::value_t::null:
    return false;
  case Json::value_t::boolean:
    return j.get<bool>();
  case Json::value_t::number_integer:
  case Json::value_t::number_unsigned:
    return j.get<int64_t>() != 0;
  case Json::value_t::number_float:
    return j.get<double>() != 0;
  case Json::value_t::string: // (json's empty() is false for any string)
    return !j.get_ref<const std::string &>().empty();
  case Json::value_t::array:
  case Json::value_t::object:
    return !j.empty();
  default:
    return true;
  }
}

Value Of(Json j) {
  Value v;
  v.j = std::move(j);
  return v;
}

bool IsInt(const Json &j) { return j.is_number_integer(); }

std::string PyJsonString(const std::string &s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
    case '"':
      out += "\\\"";
      break;
    case '\\':
      out += "\\\\";
      break;
    case '\n':
      out += "\\n";
      break;
    case '\r':
      out += "\\r";
      break;
    case '\t':
      out += "\\t";
      break;
    case '\b':
      out += "\\b";
      break;
    case '\f':
      out += "\\f";
      break;
    default:
      if (c < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
        out += buf;
      } else {
        out += char(c);
      }
    }
  }
  return out + "\"";
}

void PyDump(const Json &v, int indent, int depth, std::string *out) {
  const bool pretty = indent >= 0;
  const std::string nl =
      pretty ? "\n" + std::string(size_t(indent) * (depth + 1), ' ') : "";
  const std::string nlEnd =
      pretty ? "\n" + std::string(size_t(indent) * depth, ' ') : "";
  const char *sep = pretty ? "," : ", ";
  if (v.is_array() && !v.empty()) {
    *out += "[";
    for (size_t i = 0; i < v.size(); ++i) {
      absl::StrAppend(out, i ? sep : "", nl);
      PyDump(v[i], indent, depth + 1, out);
    }
    absl::StrAppend(out, nlEnd, "]");
  } else if (v.is_object() && !v.empty()) {
    *out += "{";
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it, first = false) {
      absl::StrAppend(out, first ? "" : sep, nl, PyJsonString(it.key()), ": ");
      PyDump(it.value(), indent, depth + 1, out);
    }
    absl::StrAppend(out, nlEnd, "}");
  } else if (v.is_string()) {
    *out += PyJsonString(v.get<std::string>());
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    *out += std::isnan(d)   ? "NaN"
            : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                            : PyFloat(d);
  } else {
    *out += v.dump(); // null, true, false, integers, [] and {}
  }
}

} // namespace

std::string PythonJsonDumps(const Json &v, int indent) {
  std::string out;
  PyDump(v, indent, 0, &out);
  return out;
}

namespace {

//===----------------------------------------------------------------------===//
// Evaluator
//===----------------------------------------------------------------------===//

enum class Flow { kNormal, kBreak, kContinue };

// What one rendering may do: a template that loops or grows without end
// is an error, not a hang or an exhausted memory.
constexpr uint64_t kMaxSteps = 10'000'000; // statements run
constexpr size_t kMaxSize = 64u << 20;     // bytes of a string, items of a list

void CheckSize(size_t pos, size_t size) {
  if (size > kMaxSize)
    Fail(pos, absl::StrCat("a value over ", kMaxSize, " bytes or items"));
}

class Renderer {
public:
  explicit Renderer(const Json &vars) {
    frames_.emplace_back();
    for (auto it = vars.begin(); it != vars.end(); ++it)
      frames_.back()[it.key()] = Of(it.value());
  }
  Flow Exec(const std::vector<Stmt> &body);
  std::string out;

private:
  Flow ExecOne(const Stmt &s);
  std::string Str(size_t pos, const Value &v);
  Flow For(const Stmt &s);
  void Set(const Stmt &s);
  Value Eval(const Expr &e);
  Value Lookup(const std::string &name) const;
  Value Attr(const Value &obj, const std::string &name);
  Value Index(const Expr &e, const Value &obj, const Value &key);
  Value Slice(const Expr &e);
  Value Binary(const Expr &e);
  Value Arith(const Expr &e, const Value &a, const Value &b);
  bool Compare(const Expr &e, const Value &a, const Value &b);
  bool In(const Expr &e, const Value &item, const Value &seq);
  Value Call(const Expr &e);
  Value Method(const Expr &e, const Value &obj, const std::string &name,
               const std::vector<Value> &args);
  Value StringMethod(const Expr &e, const std::string &s,
                     const std::string &name, const std::vector<Value> &args);
  Value Filter(const Expr &e);
  Value ApplyFilter(const Expr &e, const Value &v, const std::string &name,
                    const std::vector<Value> &args,
                    const std::map<std::string, Value> &kw);
  Value SequenceFilter(const Expr &e, const Value &v, const std::string &name,
                       const std::vector<Value> &args);
  bool Test(const Expr &e);
  std::vector<Value> Positional(const Expr &e, size_t from);
  std::map<std::string, Value> Keywords(const Expr &e);
  std::vector<Value> Items(const Expr &e, const Value &seq);
  const Json &Need(const Expr &e, const Value &v, const char *what);

  std::vector<std::map<std::string, Value>> frames_;
  uint64_t steps_ = 0;
};

Flow Renderer::Exec(const std::vector<Stmt> &body) {
  for (const Stmt &s : body)
    if (Flow f = ExecOne(s); f != Flow::kNormal)
      return f;
  return Flow::kNormal;
}

Flow Renderer::ExecOne(const Stmt &s) {
  if (++steps_ > kMaxSteps)
    Fail(s.pos,
         absl::StrCat("the template ran over ", kMaxSteps, " statements"));
  CheckSize(s.pos, out.size());
  switch (s.kind) {
  case Stmt::Kind::kBody:
    return Exec(s.body);
  case Stmt::Kind::kText:
    out += s.text;
    return Flow::kNormal;
  case Stmt::Kind::kOutput:
    out += Str(s.pos, Eval(*s.expr));
    return Flow::kNormal;
  case Stmt::Kind::kIf:
    for (const auto &[cond, body] : s.branches)
      if (Truthy(Eval(*cond)))
        return Exec(body);
    return Exec(s.else_body);
  case Stmt::Kind::kFor:
    return For(s);
  case Stmt::Kind::kSet:
    Set(s);
    return Flow::kNormal;
  case Stmt::Kind::kBreak:
    return Flow::kBreak;
  case Stmt::Kind::kContinue:
    return Flow::kContinue;
  }
  return Flow::kNormal;
}

Flow Renderer::For(const Stmt &s) {
  const std::vector<Value> all = Items(*s.expr, Eval(*s.expr));
  frames_.emplace_back();
  std::vector<Value> items;
  for (const Value &v : all) { // "for x in xs if cond" filters first
    if (s.cond) {
      if (s.targets.size() == 1)
        frames_.back()[s.targets[0]] = v;
      if (!Truthy(Eval(*s.cond)))
        continue;
    }
    items.push_back(v);
  }
  const int64_t n = (int64_t)items.size();
  for (int64_t i = 0; i < n; ++i) {
    auto &frame = frames_.back();
    if (s.targets.size() == 1) {
      frame[s.targets[0]] = items[i];
    } else {
      const Json &tuple = items[i].json();
      if (!tuple.is_array() || tuple.size() != s.targets.size())
        Fail(s.pos, absl::StrCat("cannot unpack ", PyRepr(tuple), " into ",
                                 s.targets.size(), " loop variables"));
      for (size_t k = 0; k < s.targets.size(); ++k)
        frame[s.targets[k]] = Of(tuple[k]);
    }
    frame["loop"] = Of(Json{{"index", i + 1},
                            {"index0", i},
                            {"first", i == 0},
                            {"last", i == n - 1},
                            {"length", n},
                            {"revindex", n - i},
                            {"revindex0", n - i - 1}});
    if (Exec(s.body) == Flow::kBreak)
      break;
  }
  frames_.pop_back();
  if (n == 0)
    return Exec(s.else_body);
  return Flow::kNormal;
}

void Renderer::Set(const Stmt &s) {
  Value v = Eval(*s.expr);
  if (s.targets.size() == 1) {
    frames_.back()[s.targets[0]] = std::move(v);
    return;
  }
  Value ns = Lookup(s.targets[0]);
  if (!ns.ns)
    Fail(s.pos, absl::StrCat("'", s.targets[0],
                             "' is not a namespace(): cannot set its "
                             "attribute '",
                             s.targets[1], "'"));
  if (v.ns || v.undefined)
    Fail(s.pos, "a namespace attribute holds a JSON value");
  (*ns.ns)[s.targets[1]] = std::move(v.j);
}

// ToStr, refusing values too deep to print without deep recursion.
std::string Renderer::Str(size_t pos, const Value &v) {
  if (v.json().is_structured() && JsonDepth(v.json()) > kMaxJsonDepth)
    Fail(pos, absl::StrCat("printing a value nested deeper than ",
                           kMaxJsonDepth, " levels"));
  return ToStr(v);
}

Value Renderer::Lookup(const std::string &name) const {
  for (auto it = frames_.rbegin(); it != frames_.rend(); ++it)
    if (auto f = it->find(name); f != it->end())
      return f->second;
  return Value::Undefined();
}

const Json &Renderer::Need(const Expr &e, const Value &v, const char *what) {
  if (v.undefined)
    Fail(e.pos, absl::StrCat("an undefined value where ", what, " is needed"));
  return v.json();
}

Value Renderer::Eval(const Expr &e) {
  switch (e.kind) {
  case Expr::Kind::kLiteral:
    return Of(e.value);
  case Expr::Kind::kName:
    return Lookup(e.name);
  case Expr::Kind::kList: {
    Json list = Json::array();
    for (const ExprP &a : e.args)
      list.push_back(Need(*a, Eval(*a), "a list item"));
    return Of(std::move(list));
  }
  case Expr::Kind::kDict: {
    Json dict = Json::object();
    for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
      const Json &k = Need(*e.args[i], Eval(*e.args[i]), "a dict key");
      dict[k.is_string() ? k.get<std::string>() : PyRepr(k)] =
          Need(*e.args[i + 1], Eval(*e.args[i + 1]), "a dict value");
    }
    return Of(std::move(dict));
  }
  case Expr::Kind::kAttr:
    return Attr(Eval(*e.args[0]), e.name);
  case Expr::Kind::kIndex:
    return Index(e, Eval(*e.args[0]), Eval(*e.args[1]));
  case Expr::Kind::kSlice:
    return Slice(e);
  case Expr::Kind::kCall:
    return Call(e);
  case Expr::Kind::kFilter:
    return Filter(e);
  case Expr::Kind::kTest:
    return Of(Test(e));
  case Expr::Kind::kUnary: {
    Value v = Eval(*e.args[0]);
    if (e.name == "not")
      return Of(!Truthy(v));
    const Json &j = Need(e, v, "a number");
    if (!j.is_number() || j.is_boolean())
      Fail(e.pos, absl::StrCat("unary '", e.name, "' of ", PyRepr(j)));
    if (e.name == "+")
      return v;
    if (IsInt(j) && j.get<int64_t>() == INT64_MIN)
      Fail(e.pos, "'-' overflows 64-bit integers");
    return IsInt(j) ? Of(-j.get<int64_t>()) : Of(-j.get<double>());
  }
  case Expr::Kind::kBinary:
    return Binary(e);
  case Expr::Kind::kTernary:
    if (Truthy(Eval(*e.args[1])))
      return Eval(*e.args[0]);
    return e.args[2] ? Eval(*e.args[2]) : Value::Undefined();
  }
  return Value::Undefined();
}

Value Renderer::Attr(const Value &obj, const std::string &name) {
  const Json &j = obj.json();
  if (!obj.undefined && j.is_object())
    if (auto it = j.find(name); it != j.end())
      return Of(*it);
  return Value::Undefined();
}

int64_t PyIndex(int64_t i, int64_t n) { return i < 0 ? i + n : i; }

Value Renderer::Index(const Expr &e, const Value &obj, const Value &key) {
  if (obj.undefined)
    return Value::Undefined();
  const Json &j = obj.json(), &k = Need(e, key, "an index");
  if (j.is_object()) {
    if (!k.is_string())
      return Value::Undefined();
    auto it = j.find(k.get<std::string>());
    return it == j.end() ? Value::Undefined() : Of(*it);
  }
  if (!IsInt(k))
    Fail(e.pos, absl::StrCat("index ", PyRepr(k), " of a ", j.type_name(),
                             " is not an integer"));
  if (j.is_array()) {
    const int64_t i = PyIndex(k.get<int64_t>(), (int64_t)j.size());
    return i < 0 || i >= (int64_t)j.size() ? Value::Undefined() : Of(j[i]);
  }
  if (j.is_string()) {
    const auto cps = CodePoints(j.get_ref<const std::string &>());
    const int64_t i = PyIndex(k.get<int64_t>(), (int64_t)cps.size());
    return i < 0 || i >= (int64_t)cps.size() ? Value::Undefined()
                                             : Of(std::string(cps[i]));
  }
  Fail(e.pos, absl::StrCat("cannot index a ", j.type_name()));
}

// Python's slice indices for a sequence of n.
std::vector<int64_t> SliceIndices(std::optional<int64_t> start,
                                  std::optional<int64_t> stop, int64_t step,
                                  int64_t n) {
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v)
      return dflt;
    int64_t i = *v < 0 ? *v + n : *v;
    if (step > 0)
      return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  std::vector<int64_t> out;
  const int64_t b = clamp(start, step > 0 ? 0 : n - 1);
  const int64_t e = clamp(stop, step > 0 ? n : -1);
  for (int64_t i = b; step > 0 ? i < e : i > e; i += step) {
    out.push_back(i);
    if (step > 0 ? i > INT64_MAX - step : i < INT64_MIN - step)
      break;
  }
  return out;
}

Value Renderer::Slice(const Expr &e) {
  const Value obj = Eval(*e.args[0]);
  const Json &j = Need(e, obj, "a sequence to slice");
  std::optional<int64_t> part[3];
  for (int k = 0; k < 3; ++k) {
    if (!e.args[k + 1])
      continue;
    const Value v = Eval(*e.args[k + 1]);
    if (v.undefined || v.j.is_null())
      continue;
    if (!IsInt(v.j))
      Fail(e.pos, "slice indices must be integers");
    part[k] = v.j.get<int64_t>();
  }
  const int64_t step = part[2].value_or(1);
  if (step == 0)
    Fail(e.pos, "slice step cannot be zero");
  if (j.is_array()) {
    Json out = Json::array();
    for (int64_t i : SliceIndices(part[0], part[1], step, (int64_t)j.size()))
      out.push_back(j[i]);
    return Of(std::move(out));
  }
  if (!j.is_string())
    Fail(e.pos, absl::StrCat("cannot slice a ", j.type_name()));
  const auto cps = CodePoints(j.get_ref<const std::string &>());
  std::string out;
  for (int64_t i : SliceIndices(part[0], part[1], step, (int64_t)cps.size()))
    out += cps[i];
  return Of(std::move(out));
}

Value Renderer::Binary(const Expr &e) {
  const std::string &op = e.name;
  if (op == "and" || op == "or") {
    Value a = Eval(*e.args[0]);
    if (Truthy(a) == (op == "or"))
      return a;
    return Eval(*e.args[1]);
  }
  const Value a = Eval(*e.args[0]), b = Eval(*e.args[1]);
  if (op == "~") {
    const std::string left = Str(e.pos, a), right = Str(e.pos, b);
    CheckSize(e.pos, left.size() + right.size());
    return Of(left + right);
  }
  if (op == "in" || op == "not in")
    return Of(In(e, a, b) == (op == "in"));
  if (op == "==" || op == "!=" || op == "<" || op == "<=" || op == ">" ||
      op == ">=")
    return Of(Compare(e, a, b));
  return Arith(e, a, b);
}

bool Renderer::Compare(const Expr &e, const Value &a, const Value &b) {
  const std::string &op = e.name;
  if (op == "==" || op == "!=") {
    bool eq = a.undefined || b.undefined ? a.undefined == b.undefined
                                         : a.json() == b.json();
    if (!a.undefined && !b.undefined &&
        a.json().is_boolean() != b.json().is_boolean())
      eq = false; // JSON true is not 1 here; Python says True == 1 (rare)
    return eq == (op == "==");
  }
  const Json &x = Need(e, a, "a value to compare"),
             &y = Need(e, b, "a value to compare");
  const bool nums = x.is_number() && y.is_number();
  if (!nums && !(x.is_string() && y.is_string()))
    Fail(e.pos, absl::StrCat("'", op, "' between ", x.type_name(), " and ",
                             y.type_name()));
  if (op == "<")
    return x < y;
  if (op == "<=")
    return x <= y;
  if (op == ">")
    return x > y;
  return x >= y;
}

bool Renderer::In(const Expr &e, const Value &item, const Value &seq) {
  const Json &s = Need(e, seq, "a container for 'in'");
  if (s.is_string()) {
    const Json &x = Need(e, item, "a string for 'in'");
    if (!x.is_string())
      Fail(e.pos, "'in <string>' needs a string on its left");
    return s.get_ref<const std::string &>().find(
               x.get_ref<const std::string &>()) != std::string::npos;
  }
  if (item.undefined)
    return false;
  if (s.is_object())
    return item.j.is_string() && s.contains(item.j.get<std::string>());
  if (s.is_array())
    return std::find(s.begin(), s.end(), item.json()) != s.end();
  Fail(e.pos, absl::StrCat("'in' a ", s.type_name()));
}

Value Renderer::Arith(const Expr &e, const Value &a, const Value &b) {
  const std::string &op = e.name;
  const Json &x = Need(e, a, "an operand"), &y = Need(e, b, "an operand");
  if (op == "+" && x.is_string() && y.is_string()) {
    CheckSize(e.pos, x.get_ref<const std::string &>().size() +
                         y.get_ref<const std::string &>().size());
    return Of(x.get<std::string>() + y.get<std::string>());
  }
  if (op == "+" && x.is_array() && y.is_array()) {
    CheckSize(e.pos, x.size() + y.size());
    Json out = x;
    out.insert(out.end(), y.begin(), y.end());
    return Of(std::move(out));
  }
  if (op == "*" && x.is_string() && IsInt(y)) {
    const size_t unit = x.get_ref<const std::string &>().size();
    const int64_t times = y.get<int64_t>();
    if (times > 0 && unit > 0)
      CheckSize(e.pos, times > int64_t(kMaxSize) ? kMaxSize + 1
                                                 : unit * size_t(times));
    std::string out;
    for (int64_t i = 0; i < y.get<int64_t>(); ++i)
      out += x.get_ref<const std::string &>();
    return Of(std::move(out));
  }
  if (!x.is_number() || !y.is_number())
    Fail(e.pos, absl::StrCat("'", op, "' between ", x.type_name(), " and ",
                             y.type_name()));
  const bool ints = IsInt(x) && IsInt(y);
  if (ints && op != "/" && op != "**") {
    const int64_t p = x.get<int64_t>(), q = y.get<int64_t>();
    if ((op == "//" || op == "%") && q == 0)
      Fail(e.pos, "integer division by zero");
    int64_t r = 0; // Python's integers do not overflow; these would
    if ((op == "+" && __builtin_add_overflow(p, q, &r)) ||
        (op == "-" && __builtin_sub_overflow(p, q, &r)) ||
        (op == "*" && __builtin_mul_overflow(p, q, &r)) ||
        ((op == "//" || op == "%") && q == -1 && p == INT64_MIN))
      Fail(e.pos, absl::StrCat("'", op, "' overflows 64-bit integers"));
    if (op == "+" || op == "-" || op == "*")
      return Of(r);
    const int64_t d = p / q - ((p % q != 0) && ((p < 0) != (q < 0)));
    return op == "//" ? Of(d) : Of(p - d * q);
  }
  const double p = x.get<double>(), q = y.get<double>();
  if (op == "+")
    return Of(p + q);
  if (op == "-")
    return Of(p - q);
  if (op == "*")
    return Of(p * q);
  if (op == "**")
    return ints && q >= 0 ? Of((int64_t)std::llround(std::pow(p, q)))
                          : Of(std::pow(p, q));
  if (q == 0)
    Fail(e.pos, "division by zero");
  if (op == "/")
    return Of(p / q);
  if (op == "//")
    return Of(std::floor(p / q));
  return Of(p - std::floor(p / q) * q);
}

std::vector<Value> Renderer::Positional(const Expr &e, size_t from) {
  std::vector<Value> out;
  for (size_t i = from; i < e.args.size() - e.kwnames.size(); ++i)
    out.push_back(Eval(*e.args[i]));
  return out;
}

std::map<std::string, Value> Renderer::Keywords(const Expr &e) {
  std::map<std::string, Value> out;
  const size_t first = e.args.size() - e.kwnames.size();
  for (size_t k = 0; k < e.kwnames.size(); ++k)
    out[e.kwnames[k]] = Eval(*e.args[first + k]);
  return out;
}

// What "for" walks: a list's items, a dict's keys, a string's characters.
std::vector<Value> Renderer::Items(const Expr &e, const Value &seq) {
  std::vector<Value> out;
  if (seq.undefined)
    return out; // jinja2 loops over an undefined as over nothing
  const Json &j = seq.json();
  if (j.is_array())
    for (const Json &v : j)
      out.push_back(Of(v));
  else if (j.is_object())
    for (auto it = j.begin(); it != j.end(); ++it)
      out.push_back(Of(it.key()));
  else if (j.is_string())
    for (std::string_view cp : CodePoints(j.get_ref<const std::string &>()))
      out.push_back(Of(std::string(cp)));
  else
    Fail(e.pos, absl::StrCat("cannot loop over a ", j.type_name()));
  return out;
}

Value Renderer::Call(const Expr &e) {
  const Expr &callee = *e.args[0];
  if (callee.kind == Expr::Kind::kAttr) {
    const Value obj = Eval(*callee.args[0]);
    return Method(e, obj, callee.name, Positional(e, 1));
  }
  if (callee.kind != Expr::Kind::kName)
    Fail(e.pos, "only named functions and methods can be called");
  const std::vector<Value> args = Positional(e, 1);
  if (callee.name == "namespace") {
    auto ns = std::make_shared<Json>(Json::object());
    const size_t first = e.args.size() - e.kwnames.size();
    for (size_t k = 0; k < e.kwnames.size(); ++k) // in the call's order
      (*ns)[e.kwnames[k]] =
          Need(e, Eval(*e.args[first + k]), "a namespace attribute");
    Value v;
    v.ns = std::move(ns);
    return v;
  }
  if (callee.name == "raise_exception")
    Fail(callee.pos,
         absl::StrCat("the template raised: ",
                      args.empty() ? "" : Str(callee.pos, args[0])));
  if (callee.name == "range") {
    std::vector<int64_t> n;
    for (const Value &a : args) {
      if (a.undefined || !IsInt(a.j))
        Fail(e.pos, "range() takes integers");
      n.push_back(a.j.get<int64_t>());
    }
    if (n.empty() || n.size() > 3)
      Fail(e.pos, "range() takes 1 to 3 integers");
    const int64_t lo = n.size() > 1 ? n[0] : 0, hi = n.size() > 1 ? n[1] : n[0],
                  step = n.size() > 2 ? n[2] : 1;
    if (step == 0)
      Fail(e.pos, "range() step cannot be zero");
    Json out = Json::array();
    for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) {
      out.push_back(i);
      CheckSize(e.pos, out.size());
      if ((step > 0 && i > INT64_MAX - step) ||
          (step < 0 && i < INT64_MIN - step))
        break;
    }
    return Of(std::move(out));
  }
  Fail(callee.pos, absl::StrCat("function '", callee.name,
                                "' is not in the Jinja subset Duck renders"));
}

Value Renderer::Method(const Expr &e, const Value &obj, const std::string &name,
                       const std::vector<Value> &args) {
  const Json &j =
      Need(e, obj, absl::StrCat("an object for '.", name, "()'").c_str());
  if (j.is_string())
    return StringMethod(e, j.get<std::string>(), name, args);
  if (j.is_object() && !obj.ns) {
    if (name == "items" || name == "keys" || name == "values") {
      Json out = Json::array();
      for (auto it = j.begin(); it != j.end(); ++it)
        out.push_back(name == "items"  ? Json::array({it.key(), it.value()})
                      : name == "keys" ? Json(it.key())
                                       : it.value());
      return Of(std::move(out));
    }
    if (name == "get" && !args.empty()) {
      Value v = args[0].j.is_string() ? Attr(obj, args[0].j.get<std::string>())
                                      : Value::Undefined();
      if (v.undefined)
        return args.size() > 1 ? args[1] : Of(nullptr);
      return v;
    }
  }
  Fail(e.pos, absl::StrCat("method '", name, "' of a ", j.type_name(),
                           " is not in the Jinja subset Duck renders"));
}

bool InSet(std::string_view cp, const std::vector<std::string_view> *chars) {
  if (!chars) // Python's default: whitespace
    return cp.size() == 1 &&
           (IsSpace(cp[0]) || (cp[0] >= 0x1c && cp[0] <= 0x1f));
  return std::find(chars->begin(), chars->end(), cp) != chars->end();
}

std::string Strip(const std::string &s, const Value *chars, bool left,
                  bool right) {
  std::optional<std::vector<std::string_view>> set;
  std::string setText;
  if (chars && !chars->undefined && chars->j.is_string()) {
    setText = chars->j.get<std::string>();
    set = CodePoints(setText);
  }
  const auto cps = CodePoints(s);
  size_t b = 0, e = cps.size();
  while (left && b < e && InSet(cps[b], set ? &*set : nullptr))
    ++b;
  while (right && e > b && InSet(cps[e - 1], set ? &*set : nullptr))
    --e;
  std::string out;
  for (size_t i = b; i < e; ++i)
    out += cps[i];
  return out;
}

Json Split(const std::string &s, const Value *sep) {
  Json out = Json::array();
  if (!sep || sep->undefined || sep->j.is_null()) { // runs of whitespace
    size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && IsSpace(s[i]))
        ++i;
      size_t k = i;
      while (k < s.size() && !IsSpace(s[k]))
        ++k;
      if (k > i)
        out.push_back(s.substr(i, k - i));
      i = k;
    }
    return out;
  }
  const std::string d = sep->j.get<std::string>();
  size_t from = 0, at;
  while (!d.empty() && (at = s.find(d, from)) != std::string::npos) {
    out.push_back(s.substr(from, at - from));
    from = at + d.size();
  }
  out.push_back(s.substr(from));
  return out;
}

std::string Cased(std::string s, int how) { // 0 lower, 1 upper, 2 capitalize
  for (size_t i = 0; i < s.size(); ++i) {
    const bool up = how == 1 || (how == 2 && i == 0);
    s[i] = up ? (char)std::toupper((unsigned char)s[i])
              : (char)std::tolower((unsigned char)s[i]);
  }
  return s;
}

Value Renderer::StringMethod(const Expr &e, const std::string &s,
                             const std::string &name,
                             const std::vector<Value> &args) {
  const Value *a0 = args.empty() ? nullptr : &args[0];
  auto str = [&](size_t i) {
    if (i >= args.size() || args[i].undefined || !args[i].j.is_string())
      Fail(e.pos, absl::StrCat("'.", name, "()' takes a string argument"));
    return args[i].j.get<std::string>();
  };
  if (name == "startswith" || name == "endswith") {
    const std::string x = str(0);
    const bool start = name == "startswith";
    return Of(s.size() >= x.size() &&
              s.compare(start ? 0 : s.size() - x.size(), x.size(), x) == 0);
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return Of(Strip(s, a0, name != "rstrip", name != "lstrip"));
  if (name == "split")
    return Of(Split(s, a0));
  if (name == "replace") {
    const std::string from = str(0), to = str(1);
    if (from.empty())
      Fail(e.pos, "'.replace()' of an empty string");
    std::string out;
    size_t at = 0, next;
    while ((next = s.find(from, at)) != std::string::npos) {
      absl::StrAppend(&out, s.substr(at, next - at), to);
      at = next + from.size();
    }
    return Of(out + s.substr(at));
  }
  if (name == "upper" || name == "lower" || name == "capitalize")
    return Of(Cased(s, name == "lower" ? 0 : name == "upper" ? 1 : 2));
  if (name == "title") {
    std::string out = s;
    bool start = true;
    for (char &c : out) {
      const bool alpha = std::isalpha((unsigned char)c);
      c = alpha ? (start ? std::toupper((unsigned char)c)
                         : std::tolower((unsigned char)c))
                : c;
      start = !alpha;
    }
    return Of(out);
  }
  Fail(e.pos, absl::StrCat("string method '", name,
                           "' is not in the Jinja subset Duck renders"));
}

Value Renderer::Filter(const Expr &e) {
  const Value v = Eval(*e.args[0]);
  return ApplyFilter(e, v, e.name, Positional(e, 1), Keywords(e));
}

int64_t Length(const Json &j) {
  return j.is_string()
             ? (int64_t)CodePoints(j.get_ref<const std::string &>()).size()
             : (int64_t)j.size();
}

Value Renderer::ApplyFilter(const Expr &e, const Value &v,
                            const std::string &name,
                            const std::vector<Value> &args,
                            const std::map<std::string, Value> &kw) {
  if (name == "default" || name == "d") {
    const bool boolean = args.size() > 1 && Truthy(args[1]);
    if (v.undefined || (boolean && !Truthy(v)))
      return args.empty() ? Of("") : args[0];
    return v;
  }
  if (name == "string")
    return Of(Str(e.pos, v));
  if (name == "safe")
    return v;
  const Json &j = Need(e, v, absl::StrCat("a value for '|", name, "'").c_str());
  if (name == "tojson" && JsonDepth(j) > kMaxJsonDepth)
    Fail(e.pos, absl::StrCat("'|tojson' of a value nested deeper than ",
                             kMaxJsonDepth, " levels"));
  if (name == "tojson") {
    const Value *indent = kw.count("indent") ? &kw.at("indent")
                          : args.empty()     ? nullptr
                                             : &args[0];
    const int n =
        indent && IsInt(indent->j) ? (int)indent->j.get<int64_t>() : -1;
    return Of(PythonJsonDumps(j, n));
  }
  if (name == "length" || name == "count")
    return Of(Length(j));
  if (name == "trim")
    return Of(
        Strip(Str(e.pos, v), args.empty() ? nullptr : &args[0], true, true));
  if (name == "upper" || name == "lower" || name == "capitalize")
    return Of(Cased(Str(e.pos, v), name == "lower"   ? 0
                                   : name == "upper" ? 1
                                                     : 2));
  if (name == "items" || name == "dictsort") {
    if (!j.is_object())
      Fail(e.pos, absl::StrCat("'|", name, "' of a ", j.type_name()));
    Json out = Json::array();
    for (auto it = j.begin(); it != j.end(); ++it)
      out.push_back(Json::array({it.key(), it.value()}));
    if (name == "dictsort")
      std::sort(out.begin(), out.end(),
                [](const Json &a, const Json &b) { return a[0] < b[0]; });
    return Of(std::move(out));
  }
  if (name == "list" || name == "first" || name == "last" ||
      name == "reverse" || name == "join")
    return SequenceFilter(e, v, name, args);
  if (name == "int" || name == "float" || name == "abs") {
    double d = j.is_number() ? j.get<double>()
               : j.is_string()
                   ? std::strtod(j.get<std::string>().c_str(), nullptr)
                   : 0;
    if (name == "abs")
      return IsInt(j) && j.get<int64_t>() != INT64_MIN
                 ? Of(std::llabs(j.get<int64_t>()))
                 : Of(std::fabs(d));
    if (name == "int" && IsInt(j))
      return Of(j.get<int64_t>());
    if (name == "int" && !(std::fabs(d) < 9.2e18)) // NaN too
      Fail(e.pos, "'|int' of a number beyond 64-bit integers");
    return name == "int" ? Of((int64_t)d) : Of(d);
  }
  Fail(e.pos, absl::StrCat("filter '", name,
                           "' is not in the Jinja subset Duck renders"));
}

// The filters that walk a sequence as "for" does.
Value Renderer::SequenceFilter(const Expr &e, const Value &v,
                               const std::string &name,
                               const std::vector<Value> &args) {
  Json list = Json::array();
  for (const Value &x : Items(e, v))
    list.push_back(x.j);
  if (name == "first" || name == "last")
    return list.empty() ? Value::Undefined()
                        : Of(name == "first" ? list.front() : list.back());
  if (name == "reverse" && v.json().is_string()) {
    std::string out;
    for (const Json &c : list)
      out.insert(0, c.get<std::string>());
    return Of(std::move(out));
  }
  if (name == "reverse")
    std::reverse(list.begin(), list.end());
  if (name == "join") {
    std::string out, sep = args.empty() ? "" : Str(e.pos, args[0]);
    for (size_t i = 0; i < list.size(); ++i)
      absl::StrAppend(&out, i ? sep : "", Str(e.pos, Of(list[i])));
    return Of(std::move(out));
  }
  return Of(std::move(list));
}

bool Renderer::Test(const Expr &e) {
  const Value v = Eval(*e.args[0]);
  const std::string &t = e.name;
  const Json &j = v.json();
  bool r;
  if (t == "defined" || t == "undefined")
    r = v.undefined == (t == "undefined");
  else if (v.undefined)
    r = false;
  else if (t == "none")
    r = j.is_null();
  else if (t == "string")
    r = j.is_string();
  else if (t == "number")
    r = j.is_number();
  else if (t == "integer")
    r = IsInt(j);
  else if (t == "float")
    r = j.is_number_float();
  else if (t == "boolean")
    r = j.is_boolean();
  else if (t == "true" || t == "false")
    r = j.is_boolean() && j.get<bool>() == (t == "true");
  else if (t == "mapping")
    r = j.is_object();
  else if (t == "iterable")
    r = j.is_array() || j.is_object() || j.is_string();
  else if (t == "sequence")
    r = j.is_array() || j.is_string() || j.is_object();
  else if (t == "odd" || t == "even")
    r = IsInt(j) && (j.get<int64_t>() % 2 != 0) == (t == "odd");
  else
    Fail(e.pos, absl::StrCat("test '", t,
                             "' is not in the Jinja subset Duck renders"));
  return r != e.negated;
}

// "line L, column C" of a byte offset.
std::string Where(std::string_view src, size_t pos) {
  pos = std::min(pos, src.size());
  size_t line = 1, col = 1;
  for (size_t i = 0; i < pos; ++i) {
    if (src[i] == '\n') {
      ++line;
      col = 1;
    } else if (((unsigned char)src[i] & 0xC0) != 0x80) {
      ++col;
    }
  }
  return absl::StrCat("line ", line, ", column ", col);
}

} // namespace

absl::StatusOr<Template> Template::Parse(std::string_view source) {
  Template t;
  // jinja2 drops the source's last newline (keep_trailing_newline=False).
  if (!source.empty() && source.back() == '\n')
    source.remove_suffix(
        source.size() > 1 && source[source.size() - 2] == '\r' ? 2 : 1);
  t.source_ = std::make_shared<const std::string>(source);
  try {
    Parser p(Lexer(*t.source_).Run());
    t.root_ = std::make_shared<const Stmt>(p.Template());
    t.names_ =
        std::make_shared<const std::set<std::string>>(std::move(p.names));
  } catch (const Error &e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chat template, ", Where(*t.source_, e.pos), ": ", e.message));
  } catch (const std::exception &e) { // a number literal out of range
    return absl::InvalidArgumentError(
        absl::StrCat("chat template: ", e.what()));
  }
  return t;
}

absl::StatusOr<std::string> Template::Render(const Json &vars) const {
  if (!vars.is_object())
    return absl::InvalidArgumentError("a template's variables are an object");
  try {
    Renderer r(vars);
    r.Exec(root_->body);
    return std::move(r.out);
  } catch (const Error &e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chat template, ", Where(*source_, e.pos), ": ", e.message));
  } catch (const std::exception &e) {
    return absl::InvalidArgumentError(
        absl::StrCat("chat template: ", e.what()));
  }
}

} // namespace duck::runtime::jinja
