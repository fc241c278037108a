"""A corpus of malformed and hostile .rules files, built in a directory (tests/lang/test_untrusted_rules.py runs it).

Every payload that would run code tries to create the file MARKER, and every payload that would read a file
tries to read SECRET (whose contents are a random token) into a diagnostic, so running code, writing files and
reading files are all detectable. `build(directory, marker, secret)` writes the files and returns their list.

Categories:
  helper      calling the project's unmarked or private functions, re-exported library functions, modules
  attribute   reaching the interpreter through attributes of the values rules can reach
  direct      payloads written in the rule itself: dunders, builtins, lambdas, walrus, f-strings, format,
              statements, imports
  injection   code in strings, comments, rule and file names, aimed at the generated matcher's source (they may
              check clean: what matters is that nothing in them runs)
  lexical     numbers and escapes Python rejects, NUL bytes, non-UTF-8 bytes, binary files, keywords as names,
              control characters, odd line ends, truncated files
  nesting     deep brackets, operators, patterns, calls, attribute chains
  dos         commutative expansion, include diamonds and chains, many rules, slow or huge examples, huge files
"""
from __future__ import annotations

import random
from pathlib import Path

KEYWORDS = ["class", "from", "def", "import", "return", "while", "with", "yield", "try", "except", "finally", "raise",
            "del", "global", "nonlocal", "pass", "break", "continue", "assert", "async", "await", "elif", "as"]

# project functions that must never be callable from rules: (module, name)
UNMARKED = [
  ("rulec.engine.lang.loader", "_exec"), ("rulec.engine.lang.loader", "_write_cache"), ("rulec.engine.lang.loader", "_read_cache"),
  ("rulec.engine.lang.loader", "default_rules_dir"), ("rulec.engine.lang.loader", "rule_files"), ("rulec.engine.lang.loader", "check_paths"),
  ("rulec.engine.lang.loader", "load_library"), ("rulec.engine.lang.loader", "check_sources"), ("rulec.engine.lang.loader", "_cache_dir"),
  ("rulec.engine.lang.loader", "read_rule_file"), ("rulec.engine.lang.runtime", "import_helper"), ("rulec.engine.lang.runtime", "rule_failed"),
  ("rulec.engine.lang.names", "resolve_helper_module"), ("rulec.engine.lang.names", "resolve_helper"),
  ("rulec.engine.lang.names", "helper_packages"), ("rulec.engine.lang.capability", "rule_attr"),
  ("rulec.engine.lang.capability", "rule_helper"), ("rulec.engine.lang.explain", "explain_program"), ("rulec.cli", "main"),
  ("rulec.trace_view", "trace_program"), ("rulec.demo", "run_demo"), ("rulec.engine.lang.parser", "parse_rules"),
  ("rulec.engine.lang.compiler", "generate"), ("rulec.engine.lang.examples", "run_examples"), ("rangeify", "_c"),
  ("rangeify", "strides_of"), ("early", "is_buffer_view"), ("symbolic", "_conjuncts"), ("rulec.engine.ir.uop", "render"),
  # what helper libraries import for their own use is no helper either
  ("symbolic", "load_library"), ("symbolic", "graph_rewrite"), ("decomp", "load_library"), ("multi", "load_library"),
  ("rulec.engine.lang.libraries", "resolve_library"), ("rulec.engine.diskcache", "store_text"),
]
# names modules re-export from the standard library or other packages, or that are not functions at all
REEXPORTED = [
  ("rulec.engine.verify.core", "given"), ("rulec.engine.verify.core", "settings"), ("rulec.engine.lang.parser", "v_args"),
  ("rulec.engine.lang.parser", "Lark"), ("rulec.engine.lang.loader", "Path"), ("rulec.engine.lang.loader", "os"),
  ("rulec.engine.lang.loader", "tempfile"), ("rulec.engine.lang.loader", "importlib"), ("early", "os"), ("early", "math"),
  ("rulec.engine.lang.names", "importlib"), ("rulec.engine.lang.names", "os"), ("rulec.engine.lang.examples", "os"),
  ("rulec.engine.lang.examples", "signal"), ("rulec.engine.lang.capability", "RULE_HELPERS"), ("rulec.engine.lang.loader", "hashlib"),
  ("rulec.engine.lang.loader", "atexit"), ("rulec.engine.lang.loader", "sys"),
]
BAD_MODULES = ["os", "subprocess", "builtins", "rulec.engine.lang.__init__", "engine.__main__", "rulec.__main__",
               "engine._private", "importlib", "shutil", "pathlib", "engine..lang", "tests.helpers"]


def _call_for(name: str, m: str, s: str) -> str:
  """An expression calling `name` so that, if it ran, it would create the marker (m) or read the secret (s)."""
  return {
    "_exec": f"_exec('import os; os.system(\"touch \" + {m})', ('x',))",
    "_write_cache": f"_write_cache(__import_path__, 'k', 'x')".replace("__import_path__", f"default_rules_dir().joinpath({m})"),
    "_read_cache": f"_read_cache(default_rules_dir().joinpath({s}), 'k')",
    "default_rules_dir": f"default_rules_dir().joinpath({m}).write_text('x')",
    "rule_files": f"rule_files([{m}])[0].touch()",
    "check_paths": f"check_paths([{s}])",
    "load_library": f"load_library([{s}])",
    "check_sources": f"check_sources({{{m}: 'x'}})",
    "read_rule_file": f"read_rule_file(rule_files([{s}])[0])",
    "import_helper": f"import_helper('rulec.engine.lang.loader', '_exec')('open(' + repr({m}) + ', \"w\")', ('x',))",
    "resolve_helper_module": f"resolve_helper_module('rulec.engine.lang.loader')[0].os.system('touch ' + {m})",
    "resolve_library": f"resolve_library('rulec.engine.lang.loader')[0].os.system('touch ' + {m})",
    "main": f"main(['trace', {m}])",
    "explain_program": f"explain_program('r', {m}, [], None)",
    "trace_program": f"trace_program({s}, [], {m})",
  }.get(name, f"{name}({m})")


def _helper_files(m: str, s: str) -> dict[str, tuple[str, bytes]]:
  out: dict[str, tuple[str, bytes]] = {}
  for i, (mod, name) in enumerate(UNMARKED + REEXPORTED):
    extra = {"_exec": "", "_write_cache": ", default_rules_dir", "_read_cache": ", default_rules_dir",
             "rule_files": "", "check_paths": "", "load_library": "", "read_rule_file": ", rule_files",
             "import_helper": ""}.get(name, "")
    use = f"use {mod} ({name}{extra})\n"
    call = _call_for(name, m, s)
    variants = {
      "guard": f"ruleset s:\n  rule r{i}: x + 0 if {call} => x\n    example: RANGE(3) + 0 => RANGE(3)\n",
      "replacement": f"ruleset s:\n  rule r{i}: x + 0 => {call}\n    example: RANGE(3) + 0 => RANGE(3)\n",
      "comprehension": f"ruleset s:\n  rule r{i}: s:SINK => UOp.sink(*[{call} for _u in s.src])\n"
                       "    example: SINK(1) => SINK(1)\n",
    }
    for v, body in variants.items():
      out[f"helper-{mod.replace('.', '_')}-{name}-{v}"] = ("helper", (use + body).encode())
  for j, mod in enumerate(BAD_MODULES):
    out[f"helper-module-{j}"] = ("helper", f"use {mod} (system, open)\nruleset s:\n  rule r: x + 0 => system('touch ' + {m})\n"
                                            "    example: RANGE(3) + 0 => RANGE(3)\n".encode())
  # a marked helper's module reached as a value, and helpers used as values
  for j, expr in enumerate([f"fold_constants.__globals__['os'].system('touch ' + {m})",
                            f"fold_constants.__module__", "fold_constants.exec_alu", f"bounds_const.__code__",
                            f"fold_constants(x).__class__.__init__.__globals__['os'].system('touch ' + {m})",
                            f"fold_constants.x"]):
    out[f"helper-value-{j}"] = ("helper", (
      "use symbolic (fold_constants, bounds_const)\n"
      f"ruleset s:\n  rule r: x + 0 => x if {expr} else x\n    example: RANGE(3) + 0 => RANGE(3)\n").encode())
  return out


# attribute chains from values rules can reach; each ends in writing the marker or reading the secret
ATTRIBUTE_CHAINS = [
  "x.__class__", "x._memo", "x._get_memo()", "x._derive", "x._bounds()", "x.__reduce__()", "x.toposort.__self__",
  "x.replace.__func__", "x.replace.__globals__", "x.op.__class__", "x.op._value_", "x.op._name_", "x.dtype.__reduce__",
  "x.dtype.__class__", "x.dtype.fields", "x.src.__class__", "x.src.index.__self__", "x.arg.f_globals", "x.arg.encode",
  "x.arg.upper.__self__", "x.arg.zfill.__call__", "UOp.__init__", "UOp.replace", "UOp._derive", "UOp.__dict__",
  "UOp.const.__globals__", "Ops._member_map_", "Ops.__members__", "Ops.ADD.__class__", "dtypes.__dict__",
  "dtypes.by_name.__globals__", "dtypes.all.__code__", "str.maketrans", "len.__self__", "sorted.__module__",
  "range.__init__", "int.from_bytes", "dict.fromkeys", "tuple.__new__", "zip.__call__", "prod.__globals__",
  "ctx.__class__", "ctx._private", "ctx.__dict__", "(1).__class__", "'a'.__class__", "'a'.format", "'{0}'.format_map",
  "(x,).__class__", "[x].__class__", "{1: x}.__class__", "{x}.__class__", "x.src.count.__self__",
  "x.const_like.__code__", "(u for u in x.src).gi_frame", "(u for u in x.src).gi_code", "(u for u in x.src).close",
  "x.vmin.__class__", "x.shape.__class__", "x.base.__init_subclass__", "None.__class__", "inf.__class__",
  "ALU.__class__", "ALU.union.__self__", "ADD.__class__", "ADD.name.__class__", "x.src[0].__class__",
  "x.tag.__class__", "x.arg.mro", "x.arg.im_func", "x.arg.co_code", "x.arg.tb_frame",
]


def _attribute_files(m: str, s: str) -> dict[str, tuple[str, bytes]]:
  out: dict[str, tuple[str, bytes]] = {}
  for i, chain in enumerate(ATTRIBUTE_CHAINS):
    write = f"{chain}.system('touch ' + {m})"
    read = f"x.const_like({chain}.open({s}).read())"
    out[f"attribute-{i}-write"] = ("attribute", f"ruleset s:\n  rule r: x + 0 => x if {write} else x\n"
                                                "    example: RANGE(3) + 0 => RANGE(3)\n".encode())
    out[f"attribute-{i}-read"] = ("attribute", f"ruleset s:\n  rule r: x + 0 => {read}\n"
                                               "    example: RANGE(3) + 0 => RANGE(3)\n".encode())
  # attributes refused only when the rule runs: the checker cannot type these values
  runtime = [f"c.arg.encode({m})", f"c.arg.__class__", f"s.arg.__init__", f"s.arg.encode", f"s.arg.translate({m})",
             f"s.arg.format({m})", f"s.arg.splitlines.__self__", f"c.arg.real.__class__", f"[u.arg for u in s.src][0].hex",
             f"s.arg[0].__class__", f"{{'k': s.arg}}['k'].encode", f"(s.arg or c.arg).encode", f"max(s.arg, 'a').encode",
             f"s.arg.__len__", f"s.arg.strip.__name__"]
  for i, expr in enumerate(runtime):
    out[f"attribute-runtime-{i}"] = ("attribute", (
      f"ruleset s:\n  rule r: s:SINK(c:CONST) => s if {expr} else None\n"
      f"    example: SINK(1.5{{float32}})[\"payload\"] => unchanged\n").encode())
  return out


def _direct_files(m: str, s: str) -> dict[str, tuple[str, bytes]]:
  exprs = [
    f"__import__('os').system('touch ' + {m})", f"open({m}, 'w')", f"eval('open(' + repr({m}) + ', \"w\")')",
    f"exec('open(' + repr({m}) + ', \"w\")')", f"compile('1', {m}, 'exec')", f"getattr(x, '__class__')",
    f"globals()['__builtins__']", f"vars(x)", f"type(x).__subclasses__()", f"breakpoint()", f"print(open({s}).read())",
    f"(lambda: open({m}, 'w'))()", f"sorted(x.src, key=lambda u: open({m}, 'w'))", f"(y := open({m}, 'w'))",
    f"f'{{open({m}, \"w\")}}'", f"'{{0.__init__.__globals__}}'.format(x)", f"'%s' % open({m}, 'w')",
    f"x.__class__.__base__.__subclasses__()", f"__builtins__['open']({m}, 'w')", f"os.system('touch ' + {m})",
    f"sys.modules['os'].system('touch ' + {m})", f"importlib.import_module('os')", f"dir(x)", f"id(x)",
    f"object.__subclasses__()", f"super()", f"memoryview(b'x')", f"input()", f"exit()", f"quit()", f"help()",
    f"iter(x.src).__next__()", f"next(iter(x.src))", f"callable(x)", f"bytearray(10)", f"__loader__", f"__spec__",
    f"__file__", f"__name__", f"b'x'",
  ]
  out: dict[str, tuple[str, bytes]] = {}
  for i, e in enumerate(exprs):
    out[f"direct-expr-{i}"] = ("direct", f"ruleset s:\n  rule r: x + 0 => x if {e} else x\n"
                                         "    example: RANGE(3) + 0 => RANGE(3)\n".encode())
  statements = [
    f"import os\nos.system('touch ' + {m})\n", f"from os import system\n", f"def f(): open({m}, 'w')\n",
    f"class C: pass\n", f"x = open({m}, 'w')\n", f"ruleset s:\n  rule r: x + 0 => x; open({m}, 'w')\n",
    f"ruleset s:\n  rule r: x + 0 => x\n  import os\n", f"ruleset s:\n  rule r: x + 0 => x\nwith open({m}, 'w'): pass\n",
    f"ruleset s:\n  rule r: x + 0 => x\n  del x\n", f"ruleset s:\n  rule r: x + 0 => x\n  global x\n",
    f"ruleset s:\n  rule r: x + 0 => x\n  assert open({m}, 'w')\n", f"ruleset s:\n  rule r: x + 0 => x\n  raise SystemExit\n",
    f"ruleset s:\n  rule r: x + 0 => x\n  try: open({m}, 'w')\n", f"ruleset s:\n  rule r: x + 0 => x\n  while 1: pass\n",
    f"ruleset s:\n  rule r: x + 0 => x\n  return open({m}, 'w')\n", f"ruleset s:\n  rule r: x + 0 => x\n  yield 1\n",
  ]
  for i, text in enumerate(statements): out[f"direct-statement-{i}"] = ("direct", text.encode())
  # injection into the generated matcher: strings, comments and names end up in its source
  injections = [
    "ruleset s:\n  rule r: x + 0 => x if x.arg == '\\n  open(' + " + repr(m) + " + ', \"w\")\\n' else x\n"
    "    example: RANGE(3) + 0 => RANGE(3)\n",
    f"ruleset s:\n  rule r: x + 0 => x  # \\\n open({m}, 'w')\n    example: RANGE(3) + 0 => RANGE(3)\n",
    f"ruleset s:\n  rule r: x + 0 => x # ''')\\nopen({m}, 'w')#\n    example: RANGE(3) + 0 => RANGE(3)\n",
    f"ruleset s:\n  rule r: x + 0 if x.arg != \"\\\"); open({m}, 'w'); (\\\"\" => x\n    example: RANGE(3) + 0 => RANGE(3)\n",
    f"ruleset s:\n  rule r: x + 0 => x if 'a' \"b\" '\\x00' else x\n    example: RANGE(3) + 0 => RANGE(3)\n",
    f"ruleset s:\n  rule r: x + 0 => x\n    example: SINK(1)[\"\\\")\\nopen({m}, 'w')#\"] => unchanged\n",
    f"ruleset s:\n  rule r: x + 0 => x\n    example: SINK(1)[\"\\u2028open({m}, 'w')\"] => unchanged\n",
    f"ruleset s\u2028open({m}, 'w'):\n  rule r: x + 0 => x\n",
    f"ruleset s:\n  rule r\u2029open: x + 0 => x\n",
    f"ruleset s:\n  rule r: x + 0 => x.const_like(\"\"\"\n\"\"\")\n",
    f"ruleset s:\n  rule r: x:CONST[\"')\\nopen({m}, 'w')\\n('\"] + 0 => x\n    example: RANGE(3) + 0 => unchanged\n",
    f"ruleset s:\n  rule r: x + 0 => x\n# {m}\n\n\n#\x0bopen({m}, 'w')\n",
    f"ruleset s:\n  rule r_{'a' * 5000}: x + 0 => x\n    example: RANGE(3) + 0 => RANGE(3)\n",
  ]
  for i, text in enumerate(injections): out[f"injection-{i}"] = ("injection", text.encode())
  return out


def _lexical_files(m: str, s: str, rng: random.Random) -> dict[str, tuple[str, bytes]]:
  out: dict[str, tuple[str, bytes]] = {}
  numbers = ["01", "00", "1__0", "0x_", ".5_", "1_", "0b2", "0o8", "0x", "1e", "1e+", "1_e5", "0_0", "1._5", "1.e_1",
             "0xg", "1" * 5000, "9" * 101, "0" * 200 + "1", "1" + "_1" * 60, "0b" + "1" * 500, "1e999999", "1.5e-999999"]
  for i, n in enumerate(numbers):
    out[f"lexical-number-{i}"] = ("lexical", f"ruleset s:\n  rule r: x + {n} => x + {n}\n".encode())
    out[f"lexical-number-arg-{i}"] = ("lexical", f"ruleset s:\n  rule r: x:CONST[{n}] => x\n".encode())
  escapes = [r'"\x1"', r'"\N{NOPE}"', r'"\u12"', r'"\U0011ffff"', r'"\d"', r"'\8'", '"a\x00b"', r'"\N{"', r'"\777"',
             r"'\U00110000'", r'"\ud800"', '"' + "a" * 20000 + '"', r"'\N{LATIN SMALL LETTER A}'", '"\\', "'abc"]
  for i, e in enumerate(escapes):
    out[f"lexical-string-{i}"] = ("lexical", f"ruleset s:\n  rule r: x + 0 if x.arg == {e} => x\n".encode())
    out[f"lexical-string-example-{i}"] = ("lexical", f"ruleset s:\n  rule r: x + 0 => x\n    example: SINK(1)[{e}] => unchanged\n".encode())
  for i, kw in enumerate(KEYWORDS):
    out[f"lexical-keyword-attr-{kw}"] = ("lexical", f"ruleset s:\n  rule r: x + 0 => x.{kw}\n".encode())
    out[f"lexical-keyword-arg-{kw}"] = ("lexical", f"ruleset s:\n  rule r: x + 0 => x.replace({kw}=None)\n".encode())
  for i, kw in enumerate(KEYWORDS[:8]):
    out[f"lexical-keyword-name-{kw}"] = ("lexical", f"ruleset {kw}:\n  rule {kw}: {kw} + 0 => [{kw} for {kw}_ in {kw}.src]\n".encode())
  raw = [b"\xff\xfe\x00r\x00u", b"ruleset s:\n  rule r: x + 0 => x \xff\n", b"ruleset s:\n  rule r: x + 0 => '\xc3'\n",
         b"\xef\xbb\xbfruleset s:\n  rule r: x + 0 => x\n", b"ruleset s:\n  rule r: x + 0 => x\x00\n", b"\x00" * 100,
         b"ruleset s:\r\n  rule r: x + 0 => x\r\n", b"ruleset s:\r  rule r: x + 0 => x\r", b"ruleset s:\n\trule r: x + 0 => x\n",
         b"ruleset s:\n  rule r: x + 0 => x\n\x0c\n", b"ruleset s:\n  rule r: x + 0 =>", b"ruleset", b"", b"   \n\n\t\n",
         b"ruleset s:\n  rule r: x + 0 => (x\n", b"ruleset s:\n  rule r: x + 0 => x \\\n", b"\x1b[2J\x1b[31mruleset s:\n",
         b"ruleset s:\n  rule r: x + 0 => x  # \x1b]0;pwned\x07 \x1b[2J\n  rule q: x * 1 => \x1b[31m\n",
         b"ruleset s:\n  rule r: x + 0 => x if x.arg == '\x1b[2J' else \xe2\x80\xae x\n",
         b"ruleset s\xe2\x80\xae:\n  rule r: x + 0 => x\n", b"ruleset \xed\xa0\x80:\n", b"ruleset s:\n  rule r: x + 0 => '\xf4\x90\x80\x80'\n",
         b"ruleset s:\n  rule r: \xc2\x85x + 0 => x\n", b"ruleset s:\n  rule r: x + 0 => x\n" + b"\xc0\xaf" * 3]
  for i, data in enumerate(raw): out[f"lexical-raw-{i}"] = ("lexical", data)
  for i in range(12):
    out[f"lexical-binary-{i}"] = ("lexical", bytes(rng.randrange(256) for _ in range(rng.choice([16, 300, 4000]))))
  good = b"ruleset s:\n  rule r: x + 0 => x\n    example: RANGE(3) + 0 => RANGE(3)\n"
  for i in range(10):
    cut = rng.randrange(1, len(good))
    out[f"lexical-truncated-{i}"] = ("lexical", good[:cut])
    pos = rng.randrange(len(good))
    out[f"lexical-flipped-{i}"] = ("lexical", good[:pos] + bytes([rng.randrange(256)]) + good[pos + 1:])
  return out


def _nesting_files(m: str, s: str) -> dict[str, tuple[str, bytes]]:
  out: dict[str, tuple[str, bytes]] = {}
  out["nesting-parens-huge"] = ("nesting", f"ruleset s:\n  rule r: x + 0 => {'(' * 100000}x{')' * 100000}\n".encode())
  for n in (30, 70, 150, 400, 3000):
    out[f"nesting-parens-{n}"] = ("nesting", f"ruleset s:\n  rule r: x + 0 => {'(' * n}x{')' * n}\n".encode())
    out[f"nesting-lists-{n}"] = ("nesting", f"ruleset s:\n  rule r: x + 0 => {'[' * n}x{']' * n}\n".encode())
    out[f"nesting-neg-pattern-{n}"] = ("nesting", f"ruleset s:\n  rule r: {'NEG(' * n}x{')' * n} => x\n".encode())
    out[f"nesting-sugar-pattern-{n}"] = ("nesting", f"ruleset s:\n  rule r: {'-(' * n}x{')' * n} => x\n".encode())
    out[f"nesting-chain-{n}"] = ("nesting", f"ruleset s:\n  rule r: x + 0 => x{' + 1' * n}\n".encode())
    out[f"nesting-calls-{n}"] = ("nesting", f"ruleset s:\n  rule r: x + 0 => {'abs(' * n}x.arg{')' * n}\n".encode())
    out[f"nesting-attrs-{n}"] = ("nesting", f"ruleset s:\n  rule r: x + 0 => x{'.base' * n}\n".encode())
    out[f"nesting-not-{n}"] = ("nesting", f"ruleset s:\n  rule r: x + 0 if {'not ' * n}x => x\n".encode())
    out[f"nesting-unary-{n}"] = ("nesting", f"ruleset s:\n  rule r: x + 0 => x if {'-' * n}1 else x\n".encode())
    out[f"nesting-arg-{n}"] = ("nesting", f"ruleset s:\n  rule r: x:CONST[{'(' * n}1,{'),' * (n - 1)})] => x\n".encode())
    out[f"nesting-example-{n}"] = ("nesting", f"ruleset s:\n  rule r: x + 0 => x\n    example: {'NEG(' * n}RANGE(3){')' * n} + 0 => unchanged\n".encode())
    out[f"nesting-comprehension-{n}"] = ("nesting", ("ruleset s:\n  rule r: s:SINK => " + "[" * n + "u" + "".join(
      f" for u in s.src]" for _ in range(n)) + "\n").encode())
  # many tests in one pattern, wide patterns, and tails
  out["nesting-wide-sink"] = ("nesting", ("ruleset s:\n  rule r: SINK(" + ", ".join(["0"] * 600) + ") => UOp.sink()\n"
                                          "    example: SINK(" + ", ".join(["0"] * 600) + ") => SINK()\n").encode())
  out["nesting-deep-63"] = ("nesting", ("ruleset s:\n  rule r: " + "NEG(" * 60 + "x{int32}" + ")" * 60 + " => x\n"
                                        "  rule q: " + "NEG(" * 60 + "c:CONST" + ")" * 60 + " => c\n").encode())
  out["nesting-non-node-sources"] = ("nesting", ("ruleset s:\n  rule r: x + 0 => x.replace(src=(1, 2))\n"
                                                 "    example: RANGE(3) + 0 => RANGE(3)\n").encode())
  out["nesting-non-node-deep"] = ("nesting", ("ruleset s:\n  rule r: x + 0 => UOp.sink(x.replace(src=(None,)))\n"
                                              "    example: RANGE(3) + 0 => RANGE(3)\n").encode())
  out["nesting-not-a-node"] = ("nesting", ("ruleset s:\n  rule r: x + 0 => (x,)\n    example: RANGE(3) + 0 => RANGE(3)\n").encode())
  return out


def _dos_files(m: str, s: str) -> dict[str, tuple[str, bytes]]:
  out: dict[str, tuple[str, bytes]] = {}
  for n in (9, 12, 20, 24, 40):
    out[f"dos-commutative-{n}"] = ("dos", ("ruleset s:\n  rule r: " + " + ".join(f"a{i}" for i in range(n + 1))
                                           + " => " + " + ".join(f"a{i}" for i in range(n + 1)) + "\n").encode())
    out[f"dos-commutative-mul-{n}"] = ("dos", ("ruleset s:\n  rule r: " + "MAX(" * n + "_" + ", _)" * n + " => None\n").encode())
  for levels in (10, 40, 200):
    text = []
    for i in range(levels):
      text.append(f"ruleset a{i} includes b{i + 1}, c{i + 1}:\n  rule ra{i}: x + {i} => x\n"
                  f"ruleset b{i} includes a{i + 1}:\nruleset c{i} includes a{i + 1}:\n")
    text.append(f"ruleset a{levels}:\n  rule z: x // 1 => x\n    example: RANGE(3) // 1 => RANGE(3)\nruleset b{levels}:\nruleset c{levels}:\n")
    out[f"dos-include-diamond-{levels}"] = ("dos", "".join(text).encode())
  for levels in (33, 2000):
    out[f"dos-include-chain-{levels}"] = ("dos", ("".join(f"ruleset a{i} includes a{i + 1}:\n" for i in range(levels))
                                                  + f"ruleset a{levels}:\n").encode())
  out["dos-include-cycle-long"] = ("dos", ("".join(f"ruleset a{i} includes a{(i + 1) % 3000}:\n" for i in range(3000))).encode())
  out["dos-include-fanout"] = ("dos", ("ruleset top includes " + ", ".join(f"a{i}" for i in range(500)) + ":\n"
                                       + "".join(f"ruleset a{i}:\n  rule r{i}: x + {i} => x\n" for i in range(500))).encode())
  out["dos-many-rules"] = ("dos", ("ruleset s:\n" + "".join(f"  rule r{i}: ADD(x, {i}) => x\n" for i in range(1500))).encode())
  out["dos-many-shadowed"] = ("dos", ("ruleset s:\n" + "".join(f"  rule r{i}: x + _ => x\n" for i in range(1500))).encode())
  out["dos-many-rulesets"] = ("dos", "".join(f"ruleset s{i}:\n  x + {i} => x\n" for i in range(1500)).encode())
  out["dos-huge-file"] = ("dos", b"ruleset s:\n  rule r: x + 0 => x\n" + b"#" * (1 << 21) + b"\n")
  out["dos-huge-line"] = ("dos", b"ruleset s:\n  rule r: x + 0 => x" + b" + 0" * 200000 + b"\n")
  slow = ["9 ** 9 ** 9", "sum(range(10 ** 12))", "len([1 for a in range(10 ** 5) for b in range(10 ** 5)])",
          "len('ab' * 10 ** 10)", "max(range(10 ** 13))", "sorted(range(10 ** 9))", "len(str(10 ** 10 ** 6))"]
  for i, e in enumerate(slow):
    out[f"dos-example-{i}"] = ("dos", (f"ruleset s:\n  rule r: x + 0 => x if {e} else x\n"
                                       "    example: RANGE(3) + 0 => RANGE(3)\n"
                                       "  rule q: x * 1 => x\n    example: RANGE(3) * 1 => RANGE(3)\n").encode())
  out["dos-rewrite-loop"] = ("dos", b"ruleset s:\n  rule r: x + y => y + x\n    example: RANGE(3) + 1 => unchanged\n")
  out["dos-growing-graph"] = ("dos", b"ruleset s:\n  rule r: x + 0 => (x + 0) + 0\n    example: RANGE(3) + 0 => RANGE(3)\n")
  return out


def build(directory: Path, marker: Path, secret: Path, seed: int = 19) -> list[tuple[Path, str]]:
  """Write the corpus into `directory`; (file, category) for each file."""
  m, s = repr(str(marker)), repr(str(secret))
  rng = random.Random(seed)
  files: dict[str, tuple[str, bytes]] = {}
  for part in (_helper_files(m, s), _attribute_files(m, s), _direct_files(m, s), _lexical_files(m, s, rng),
               _nesting_files(m, s), _dos_files(m, s)):
    files.update(part)
  directory.mkdir(parents=True, exist_ok=True)
  out = []
  for name, (category, data) in files.items():
    path = directory / f"{name}.rules"
    path.write_bytes(data)
    out.append((path, category))
  # a file name that tries to inject code into the generated matcher, and one a terminal would act on
  # (a relative marker: a file appearing in the working directory is caught as a file written)
  for name in ("x\n        open('PWNED', 'w')#.rules", "\x1b[2J\x1b]0;title\x07.rules"):
    path = directory / name
    path.write_bytes(b"ruleset s:\n  x + 0 => x\n    example: RANGE(3) + 0 => RANGE(3)\n")
    out.append((path, "injection"))
  # a directory named like a rules file
  (directory / "dir.rules").mkdir(exist_ok=True)
  out.append((directory / "dir.rules", "lexical"))
  return out


# *** the driver: runs in a subprocess (tests/lang/test_untrusted_rules.py), one shard of the corpus ***

FLAGGED_EVENTS = ("os.system", "subprocess.Popen", "os.exec", "os.spawn", "os.posix_spawn", "os.startfile", "pty.spawn")


def _audit(marker: str, secret: str):
  """Flag (on fd 2, also from forked example processes) any attempt to open the marker or the secret, or to run a command."""
  import os
  import sys
  watched = {marker, secret}
  def hook(event, args):
    if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
      p = os.fsdecode(args[0]) if not isinstance(args[0], str) else args[0]
      if p in watched or os.path.basename(p) in {os.path.basename(w) for w in watched}:
        os.write(2, f"AUDIT-FLAG open {p!r}\n".encode())
    elif event.startswith(FLAGGED_EVENTS):
      os.write(2, f"AUDIT-FLAG {event}\n".encode())
  sys.addaudithook(hook)


SAMPLE_NODES = None


def _sample_nodes():
  from rulec.engine.ir.dtypes import dtypes
  from rulec.engine.ir.uop import UOp
  x = UOp.variable("x", 0, 10)
  one = UOp.const(dtypes.index, 1)
  return [x + 0, x * 1, (x + 1) + 0, UOp.sink(UOp.const(dtypes.float32, 1.5), arg="payload"), UOp.sink(one), x - 0,
          UOp.range(UOp.const(dtypes.index, 3), 0) + 0, -(-x), x // 1]


def check_one(path, category: str, marker, token: str) -> dict:
  """Run one file through `rulec check`, `rulec check --format json` and the loader API; what went wrong, if anything."""
  import io
  import json
  import re
  import signal
  import time
  from contextlib import redirect_stderr, redirect_stdout
  from pathlib import Path

  from rulec.engine.lang.diagnostics import CODES, RuleError, escape_text
  from rulec.engine.lang.loader import RuleLibrary
  from rulec.engine.lang.runtime import RuleAbort, RuleRuntimeError
  from rulec.engine.ir.rewrite import RewriteLoopError, graph_rewrite
  from rulec.cli import main

  problems: list[str] = []
  res = {"path": str(path), "category": category, "problems": problems, "errors": None}
  head = re.compile(r"^(?P<file>.*):(?P<line>\d+):(?P<col>\d+): (error|warning) (?P<code>R\d{3}): ", re.M)
  def timeout(*_): raise TimeoutError("no answer in 60 s")
  signal.signal(signal.SIGALRM, timeout)
  t0 = time.monotonic()
  signal.alarm(60)
  try:
    outputs = {}
    for fmt in ("human", "json"):
      out, err = io.StringIO(), io.StringIO()
      try:
        with redirect_stdout(out), redirect_stderr(err):
          rc = main(["check", str(path), "--format", fmt])
      except BaseException as e:  # noqa: BLE001 - that is what we are looking for
        problems.append(f"rulec check --format {fmt} raised {type(e).__name__}: {e}")
        continue
      text = out.getvalue() + err.getvalue()
      outputs[fmt] = out.getvalue()
      if rc not in (0, 1): problems.append(f"--format {fmt}: exit status {rc}")
      if "Traceback" in text: problems.append(f"--format {fmt}: a traceback")
      if token in text: problems.append(f"--format {fmt}: the secret file's contents are in the output")
      if re.search(r"[\x00-\x08\x0b-\x1f\x7f]", text): problems.append(f"--format {fmt}: a raw control character in the output")
    if "json" in outputs:
      try: data = json.loads(outputs["json"])
      except ValueError as e: problems.append(f"--format json does not parse: {e}"); data = None
      if data is not None:
        res["errors"] = data["errors"]
        res["codes"] = sorted({d["code"] for d in data["diagnostics"]})
        # lines end at \r\n, a lone \r or \n (engine/lang/diagnostics.py's LINE_BREAK)
        n_lines = max(1, len(re.split(rb"\r\n?|\n", Path(path).read_bytes()))) if Path(path).is_file() else 1
        for d in data["diagnostics"]:
          if d["file"] != str(path) or d["code"] not in CODES or not (1 <= d["line"] <= n_lines) or d["col"] < 1:
            problems.append(f"not located: {d}")
        if "human" in outputs:
          heads = [m for m in head.finditer(outputs["human"])]
          # (an example's time limit, R706, can stop an example in one run and not in the other on a loaded
          # machine, which changes what the rest of that example reports: the counts are compared where no time
          # limit was involved)
          timed = "R706" in outputs["human"] or any(d["code"] == "R706" for d in data["diagnostics"])
          if not timed and len(heads) != len(data["diagnostics"]):
            problems.append(f"{len(heads)} diagnostics in human output, {len(data['diagnostics'])} in JSON")
          for m in heads:
            if m["file"] != escape_text(str(path)): problems.append(f"human output names {m['file']!r}")
    try:
      lib = RuleLibrary([Path(path)])
      names = lib.ruleset_names()
      lib.require_clean()
    except RuleError as e:
      if token in str(e): problems.append("loader: the secret is in the RuleError")
      for d in e.diagnostics:
        if d.span.file != str(path) or d.span.line < 1 or d.span.col < 1: problems.append(f"loader: not located: {d}")
    except BaseException as e:  # noqa: BLE001
      problems.append(f"loader raised {type(e).__name__}: {e}")
    else:
      if category != "dos":
        for name in names:
          try: m = lib.matcher(name)
          except BaseException as e:  # noqa: BLE001
            problems.append(f"matcher({name!r}) raised {type(e).__name__}: {e}"); continue
          for node in _sample_nodes():
            try: graph_rewrite(node, m, max_steps=200)
            except (RuleRuntimeError, RewriteLoopError, RuleAbort): pass
            except BaseException as e:  # noqa: BLE001
              problems.append(f"graph_rewrite raised {type(e).__name__} outside the rules' error handling: {e}")
  except TimeoutError as e:
    problems.append(f"hang: {e}")
  finally:
    signal.alarm(0)
  res["seconds"] = round(time.monotonic() - t0, 2)
  if Path(marker).exists():
    problems.append("EXECUTED: the marker file was written")
    Path(marker).unlink()
  return res


def drive(list_path: str, out_path: str, marker: str, secret: str):
  """Check every file listed in list_path (one `category<TAB>path` a line, paths as repr()), results to out_path."""
  import ast
  import json
  with open(secret) as f: token = f.read()     # read before the audit hook is installed: the driver knows the token
  _audit(marker, secret)
  results = []
  for line in open(list_path).read().splitlines():
    category, path = line.split("\t", 1)
    results.append(check_one(ast.literal_eval(path), category, marker, token))
  with open(out_path + ".tmp", "w") as f: json.dump(results, f)
  import os
  os.replace(out_path + ".tmp", out_path)
