"""A Pygments lexer for .rules files (`pygmentize -l rulec`, Sphinx, mkdocs), registered through the
`pygments.lexers` entry point. Its aliases are `rulec` and `rules`, so the ```rules blocks of docs/rules.md
are highlighted with it.

The module imports nothing of rulec's engine (Pygments may load every plugin lexer, to guess a language): op
names are told by their spelling, as the grammar tells them (an upper-case first letter), not looked up.
Python still imports the `rulec` package around it, about half a second the first time."""
from __future__ import annotations

from pygments.lexer import RegexLexer, bygroups, default, include, words
from pygments.token import Comment, Keyword, Name, Number, Operator, Punctuation, String, Text, Whitespace

_BUILTINS = ("len", "range", "tuple", "list", "dict", "set", "frozenset", "zip", "enumerate", "all", "any", "min", "max",
             "sum", "abs", "int", "float", "bool", "str", "sorted", "reversed", "round", "divmod", "isinstance", "prod",
             "dtypes", "UOp", "Ops", "inf", "nan")
_NAME = r"[a-z_][A-Za-z0-9_]*"


class RulecLexer(RegexLexer):
  name = "rulec"
  aliases = ["rulec", "rules"]
  filenames = ["*.rules"]
  mimetypes = ["text/x-rulec"]

  tokens = {
    "root": [
      # before the rule for spaces, which would take the indentation these look for
      (rf"^([ \t]*)(use)(\s+)({_NAME}(?:\.{_NAME})*)", bygroups(Whitespace, Keyword.Namespace, Whitespace, Name.Namespace)),
      (r"^([ \t]*)(example)(\s*)(:)", bygroups(Whitespace, Keyword.Pseudo, Whitespace, Punctuation)),
      (r"\n", Whitespace),
      (r"[ \t\f]+", Whitespace),
      (r"\\\n", Text),
      (r"#.*$", Comment.Single),
      (rf"\b(ruleset|gradients)(\s+)({_NAME})", bygroups(Keyword.Declaration, Whitespace, Name.Class)),
      (rf"\b(rule)(\s+)({_NAME})(\s*)(:)", bygroups(Keyword.Declaration, Whitespace, Name.Function, Whitespace, Punctuation)),
      (r"\b(includes|extends)\b", Keyword, "setnames"),
      (words(("and", "or", "not", "in", "is"), suffix=r"\b"), Operator.Word),
      (words(("each", "if", "else", "for", "lambda", "rule", "ruleset", "gradients", "use", "includes", "extends"),
             suffix=r"\b"), Keyword),
      (words(("None", "True", "False"), suffix=r"\b"), Keyword.Constant),
      (r"\bunchanged\b", Keyword.Pseudo),
      (r"\bctx\b", Name.Builtin.Pseudo),
      (words(_BUILTINS, prefix=r"(?<![.\w])", suffix=r"\b"), Name.Builtin),
      (r"(?<=[\w)\]])\{", Punctuation, "dtypes"),
      (rf"({_NAME})(:)(?=[A-Z(0-9'\"-]|[a-z_])", bygroups(Name.Variable, Punctuation)),
      include("literals"),
      (r"=>", Operator),
      (r"\.\.", Punctuation),
      (r":=|\*\*|//|<<|>>|<=|>=|==|!=|[-+*/%@<>&|^~=]", Operator),
      (r"[()\[\]{},.:]", Punctuation),
      (r"[A-Z][A-Za-z0-9_]*", Name.Constant),
      (_NAME, Name),
    ],
    "literals": [
      (r"0[xX][0-9a-fA-F_]+", Number.Hex),
      (r"0[bB][01_]+", Number.Bin),
      (r"(\d[\d_]*)?\.\d[\d_]*([eE][-+]?\d+)?|\d[\d_]*\.([eE][-+]?\d+)?|\d[\d_]*[eE][-+]?\d+", Number.Float),
      (r"\d[\d_]*", Number.Integer),
      (r"'([^'\\\n]|\\.)*'|\"([^\"\\\n]|\\.)*\"", String),
    ],
    # a dtype constraint: x{ints}, CAST(x){float32, float64}
    "dtypes": [
      (r"\s+", Whitespace),
      (r",", Punctuation),
      (_NAME, Keyword.Type),
      (r"\}", Punctuation, "#pop"),
      default("#pop"),
    ],
    # the rule sets after `includes` / `extends`
    "setnames": [
      (r"[ \t]+", Whitespace),
      (r",", Punctuation),
      (_NAME, Name.Class),
      default("#pop"),
    ],
  }
