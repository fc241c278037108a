"""The `rulec` command: check, compile --emit, explain, demo, trace, verify, prove, fmt, lsp; `rulec --version`.

Every command takes `--rules PATH` (repeatable): a directory (or file) of .rules layered over the shipped
rules, as RULEC_RULES=PATH does (docs/rules.md, "Your own rules directory").

`check` and `verify` with no path work on rules/ of the current directory when it has .rules files (a checkout,
a project's own copy), else on the installed package's rules, and say which on stderr. A device that cannot be
used (a bad RULEC_DEVICE, the CL device without pyopencl) is one line on stderr and exit status 2. On a terminal,
`verify`, `trace` and `explain` show a progress line on stderr (runtime/progress.py; RULEC_PROGRESS=0: off)."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path


def _missing(cmd: str, paths) -> bool:
  missing = [str(p) for p in paths or () if not Path(p).exists()]
  if missing: print(f"rulec {cmd}: no such file or directory: {', '.join(missing)}", file=sys.stderr)
  return bool(missing)


@contextlib.contextmanager
def _user_rules(rules: list[str] | None):
  """While running a program: RULEC_RULES names the --rules paths, so every default library layers them."""
  if not rules:
    yield
    return
  old = os.environ.get("RULEC_RULES")
  os.environ["RULEC_RULES"] = os.pathsep.join(str(p) for p in rules)
  try: yield
  finally:
    if old is None: os.environ.pop("RULEC_RULES", None)
    else: os.environ["RULEC_RULES"] = old


def _version() -> str:
  """The installed distribution's version, else rulec.__version__ (a checkout that is not installed)."""
  try:
    from importlib.metadata import version
    return version("rulec")
  except Exception:  # noqa: BLE001 - not installed: fall back to what the package says, if anything
    import rulec
    return str(getattr(rulec, "__version__", None) or "(version unknown: not installed)")


class _VersionAction(argparse.Action):
  """`rulec --version`: looked up only when asked for."""
  def __init__(self, option_strings, dest, **kw):
    super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="print rulec's version and exit")

  def __call__(self, parser, namespace, values, option_string=None):
    print(f"rulec {_version()}")
    parser.exit()


def _default_rules() -> tuple[Path, str]:
  """The rules `check` and `verify` work on when given no path, and how to name them: rules/ of the current
  directory when it holds .rules files (a checkout, a project's own copy of the rules), else the installed
  package's."""
  from rulec.engine.lang.loader import default_rules_dir
  here = Path("rules")
  try: found = here.is_dir() and next(here.rglob("*.rules"), None) is not None
  except OSError: found = False
  if found: return here, f"rules/ of the current directory ({here.resolve()})"
  shipped = default_rules_dir()
  return shipped, f"the installed rules ({shipped}; the current directory has no rules/)"


def _device_ready(cmd: str, device: str | None = None) -> int | None:
  """None when kernels can run on `device` (default: RULEC_DEVICE's); else 2, after one line saying why."""
  from rulec.runtime.devices import default_device, device_problem, require_device
  try: require_device(device if device is not None else default_device())
  except Exception as e:  # noqa: BLE001 - only a device's own errors are answered here
    msg = device_problem(e)
    if msg is None: raise
    print(f"rulec {cmd}: {msg}", file=sys.stderr)
    return 2
  return None


def _cmd_check(args) -> int:
  from rulec.engine.lang.diagnostics import render_all
  from rulec.engine.lang.loader import check_paths, user_rules_paths
  if _missing("check", args.paths) or _missing("check", args.rules): return 2
  # explicit PATHS are a library of their own (RULEC_RULES is not layered over them; --rules is)
  user = args.rules or (None if args.paths else [str(p) for p in user_rules_paths()] or None)
  if _missing("check", user): return 2
  paths, where = args.paths, None
  if not paths:
    base, where = _default_rules()
    paths = [base]
  if where is not None and args.format != "human": print(f"rulec check: {where}", file=sys.stderr)
  try:
    lib, sources = check_paths(paths, examples=not args.no_examples, user=user)
  except Exception as e:  # noqa: BLE001 - a bug of rulec's own; say so without a traceback
    print(f"rulec check: internal error: {type(e).__name__}: {e}", file=sys.stderr)
    return 3
  diags = lib.diagnostics
  if args.format == "sarif":
    from rulec.engine.lang.sarif import sarif_log, tool_version
    print(json.dumps(sarif_log(diags, tool_version=tool_version()), indent=2))
  elif args.format == "json":
    print(json.dumps({"files": len(sources), "rulesets": len(lib.rulesets),
                      "rules": sum(len(rs.rules) for rs in lib.rulesets.values()),
                      "errors": len(lib.errors), "warnings": len(diags) - len(lib.errors),
                      "diagnostics": [d.to_json() for d in diags]}, indent=2))
  else:
    if diags: print(render_all(diags, sources))
    n_rules = sum(len(rs.rules) for rs in lib.rulesets.values())
    print(f"{where + ': ' if where else ''}{len(sources)} files, {len(lib.rulesets)} rulesets, {n_rules} rules: "
          f"{len(lib.errors)} errors, {len(diags) - len(lib.errors)} warnings", file=sys.stderr)
  return 1 if diags else 0


def _library_with(cmd: str, rules: list[str] | None, rulesets: list[str], base: list[Path] | None = None):
  """The rule library (`base`, default the shipped rules, with --rules paths or else RULEC_RULES layered over
  them) when it is clean and has every named rule set, else the exit status after saying why: 2 for a missing
  path or an unknown rule set, 1 for rule errors (each located in its file)."""
  from rulec.engine.lang.diagnostics import RuleError
  from rulec.engine.lang.loader import load_library, user_rules_paths
  if _missing(cmd, rules or user_rules_paths()): return 2
  if base is not None: lib = load_library(base, user=rules or user_rules_paths() or None)
  else: lib = load_library(user=rules) if rules else load_library()
  try:
    known = lib.ruleset_names()
    lib.require_clean()
  except RuleError as e:
    print(e, file=sys.stderr)
    return 1
  unknown = [n for n in rulesets if n not in known]
  if unknown:
    print(f"rulec {cmd}: unknown ruleset {', '.join(unknown)}; known: {', '.join(known)}", file=sys.stderr)
    return 2
  return lib


def _cmd_compile(args) -> int:
  lib = _library_with("compile", args.rules, args.ruleset)
  if isinstance(lib, int): return lib
  src = lib.emit(*args.ruleset, stats=args.stats)
  if args.emit: print(src, end="")
  else:
    lib.matcher(*args.ruleset)
    print(f"compiled {'+'.join(args.ruleset)}: {len(lib.rules_of(tuple(args.ruleset)))} rules, {len(src.splitlines())} lines")
  return 0


def _cmd_explain(args) -> int:
  from rulec.engine.lang.explain import explain_program
  from rulec.runtime import progress
  if _missing("explain", args.rules): return 2
  if (bad := _device_ready("explain")) is not None: return bad
  argv = args.args[1:] if args.args[:1] == ["--"] else args.args
  # (the program's scheduler sees the same layered library)
  with _user_rules(args.rules), progress.job("explain", f"running {args.program}"), progress.erasing_stdout():
    return explain_program(args.rule, args.program, argv, None, shown=args.show)


def _cmd_demo(args) -> int:
  from rulec.demo import run_demo
  if (bad := _device_ready("demo", args.device)) is not None: return bad
  lib = _library_with("demo", args.rules, [])
  if isinstance(lib, int): return lib
  with _user_rules(args.rules): return run_demo(args)


def _trace_text() -> str:
  """What `rulec trace` has recorded so far, for the progress line."""
  from rulec.engine import trace as _trace
  t = _trace.ACTIVE[-1] if _trace.ACTIVE else None
  if t is None: return "starting"
  return f"{len(t.schedules)} schedule calls, {len(t.passes)} passes, {t.n_rewrites} rewrites"


def _cmd_trace(args) -> int:
  from rulec.runtime import progress
  from rulec.trace_view import trace_program
  if (bad := _device_ready("trace")) is not None: return bad
  lib = _library_with("trace", args.rules, [])
  if isinstance(lib, int): return lib
  with _user_rules(args.rules), progress.job("trace", text=_trace_text), progress.erasing_stdout():
    return trace_program(args.program, args.args, args.output)


def _sarif_load_failure(cmd: str, rules: list[str] | None, base: Path, verify: bool = False) -> int | None:
  """`rulec verify|prove --format sarif`: the exit code when the rules named are missing (2) or the library does
  not load (1: its errors are printed as the SARIF log, so CI shows where); None when it loads."""
  from rulec.engine.lang.loader import load_library, user_rules_paths
  from rulec.engine.lang.sarif import sarif_log, tool_version
  if _missing(cmd, rules or user_rules_paths()): return 2
  errors = load_library([base], user=rules or user_rules_paths() or None).checked.errors
  if not errors: return None
  print(json.dumps(sarif_log(errors, verify=verify, tool_version=tool_version()), indent=2))
  return 1


def _cmd_verify(args) -> int:
  try:
    from rulec.engine.verify import format_human, format_json, verify_library
  except ImportError as e:
    print(f"rulec verify needs hypothesis ({e}): pip install hypothesis", file=sys.stderr)
    return 2
  base, where = _default_rules()
  print(f"rulec verify: {where}", file=sys.stderr)
  if args.format == "sarif":
    from rulec.engine.lang.sarif import sarif_log, tool_version, verify_findings
    if (code := _sarif_load_failure("verify", args.rules, base, verify=True)) is not None: return code
  lib = _library_with("verify", args.rules, args.ruleset, [base])
  if isinstance(lib, int): return lib
  # with a user's rules and no set named: the sets the user's layer defines, replaces or extends
  names = args.ruleset or lib.user_ruleset_names()
  results = _verify_with_progress(lib, names, args.examples, verify_library)
  if args.format == "sarif":
    print(json.dumps(sarif_log([], verify_findings(lib, results), verify=True, tool_version=tool_version()), indent=2))
  elif args.format == "json": print(json.dumps(format_json(results), indent=2))
  else: print(format_human(results))
  return 1 if any(r.status == "refuted" for rs in results for r in rs.rules) else 0


def _verify_with_progress(lib, names: list[str], examples: int, verify_library):
  """verify_library, with a progress line on stderr on a terminal: the rule set being verified and the rules done."""
  from rulec.engine.verify import expand_rulesets
  from rulec.runtime import progress
  sets = expand_rulesets(lib, list(names))
  counts = [len(lib.checked.rulesets[n].rules) for n in sets]
  total, done = sum(counts), [0]
  starts = {sum(counts[:i]) for i in range(1, len(counts))}   # rules done when each later set begins

  def text() -> str:
    upto = 0
    for i, (n, c) in enumerate(zip(sets, counts)):
      upto += c
      if done[0] < upto or i == len(sets) - 1: return f"ruleset {n} ({i + 1}/{len(sets)}), {done[0]}/{total} rules"
    return f"{done[0]}/{total} rules"

  with progress.job("verify", text=text) as job:
    def step(_result) -> None:
      done[0] += 1
      job.advance(redraw=done[0] in starts)   # each rule set shows as it begins
    return verify_library(lib, names, examples=examples, progress=step)


def _cmd_prove(args) -> int:
  import importlib.util
  if importlib.util.find_spec("z3") is None:
    print("rulec prove needs z3-solver: pip install 'rulec[prove]'", file=sys.stderr)
    return 2
  try:
    from rulec.engine.verify.prove import format_human, format_json, format_sarif, prove_library
  except ImportError as e:   # the verifier's generator, which prove builds its instances with, needs hypothesis
    print(f"rulec prove needs hypothesis ({e}): pip install hypothesis", file=sys.stderr)
    return 2
  if args.timeout <= 0:
    print("rulec prove: --timeout must be a positive number of milliseconds", file=sys.stderr)
    return 2
  base, where = _default_rules()
  print(f"rulec prove: {where}", file=sys.stderr)
  if args.format == "sarif":
    if (code := _sarif_load_failure("prove", args.rules, base)) is not None: return code
  lib = _library_with("prove", args.rules, args.ruleset, [base])
  if isinstance(lib, int): return lib
  names = args.ruleset or lib.user_ruleset_names()
  results = _prove_with_progress(lib, names, args.timeout, prove_library)
  if args.format == "sarif":
    from rulec.engine.lang.sarif import tool_version
    print(json.dumps(format_sarif(lib, results, tool_version=tool_version()), indent=2))
  elif args.format == "json": print(json.dumps(format_json(results), indent=2))
  else: print(format_human(results))
  refuted = any(r.status == "refuted" for rs in results for r in rs.rules)
  cycles = any(rs.termination is not None and rs.termination.cycles for rs in results)
  return 1 if refuted or cycles else 0


def _prove_with_progress(lib, names: list[str], timeout_ms: int, prove_library):
  """prove_library, with a progress line on stderr on a terminal: the rule set being proven and the rules done."""
  from rulec.engine.verify import expand_rulesets
  from rulec.runtime import progress
  sets = expand_rulesets(lib, list(names))
  total, done = sum(len(lib.checked.rulesets[n].rules) for n in sets), [0]
  current = [""]

  def text() -> str: return f"ruleset {current[0]}, {done[0]}/{total} rules"

  with progress.job("prove", text=text) as job:
    def step(result) -> None:
      done[0] += 1
      current[0] = result.ruleset
      job.advance()
    return prove_library(lib, names, timeout_ms=timeout_ms, progress=step)


def _cmd_fmt(args) -> int:
  import difflib
  from rulec.engine.lang.fmt import FormatError, format_source
  from rulec.engine.diskcache import write_replacing
  from rulec.engine.lang.loader import read_rule_file, rule_files, unread_diagnostic
  if args.paths == ["-"]:
    data = sys.stdin.buffer.read()
    try: out = format_source(data, "<stdin>")
    except (FormatError, RuntimeError) as e:
      print(e, file=sys.stderr)
      return 1
    if args.check or args.diff: return 0 if out.encode("utf-8") == data else 1
    sys.stdout.write(out)
    return 0
  if _missing("fmt", args.paths): return 2
  files = rule_files(args.paths or None)
  changed = failed = 0
  for f in files:
    data = read_rule_file(f)
    if isinstance(data, OSError):   # a link, a FIFO, a device, too large, unreadable: never read, never written
      print(unread_diagnostic(str(f), data).render(None), file=sys.stderr)
      failed += 1
      continue
    try: out = format_source(data, str(f))
    except (FormatError, RuntimeError) as e:   # RuntimeError: the formatter's own self-check refused its result
      print(e, file=sys.stderr)
      failed += 1
      continue
    if out.encode("utf-8") == data: continue   # byte for byte: CR line breaks are rewritten too
    changed += 1
    text = data.decode("utf-8", "replace")
    if args.diff: sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), out.splitlines(True), str(f), f"{f} (formatted)"))
    elif args.check: print(f"would reformat {f}")
    else:
      # a new file renamed over the old one, with its permission bits: what was read was a regular file, not a link
      try: write_replacing(f, out.encode("utf-8"), mode=os.stat(f, follow_symlinks=False).st_mode & 0o7777)
      except OSError as e:
        print(f"{f}:1:1: error: cannot write the formatted file: {e.strerror or type(e).__name__}", file=sys.stderr)
        changed, failed = changed - 1, failed + 1
    sys.stdout.flush()
  dry = args.check or args.diff
  print(f"{len(files)} files: {changed} {'would be reformatted' if dry else 'reformatted'}, "
        f"{len(files) - changed - failed} unchanged, {failed} not formatted", file=sys.stderr)
  return 1 if failed or dry and changed else 0


def _cmd_lsp(args) -> int:
  import importlib.util
  if importlib.util.find_spec("pygls") is None:
    print("rulec lsp needs pygls: pip install 'rulec[lsp]'", file=sys.stderr)
    return 2
  from rulec.lsp import serve
  return serve()


def _rules_option(p: argparse.ArgumentParser):
  p.add_argument("--rules", action="append", metavar="PATH",
                 help="a directory (or file) of .rules layered over the shipped rules: its sets replace or extend "
                      "the shipped sets of their names (repeatable; default: RULEC_RULES)")


def main(argv: list[str] | None = None) -> int:
  # diagnostics echo text from rules files: never let an unencodable character end the command with a traceback
  for stream in (sys.stdout, sys.stderr):
    try: stream.reconfigure(errors="backslashreplace")
    except (AttributeError, ValueError): pass
  ap = argparse.ArgumentParser(prog="rulec", description="rulec: a tensor compiler whose rewrites are .rules files")
  ap.add_argument("--version", action=_VersionAction)
  sub = ap.add_subparsers(dest="cmd", required=True)
  c = sub.add_parser("check", help="check .rules files (default: ./rules/, else the installed rules)")
  c.add_argument("paths", nargs="*", help="files or directories (default: rules/ of the current directory when there "
                                          "is one, else the installed rules; the summary line says which)")
  c.add_argument("--format", choices=("human", "json", "sarif"), default="human",
                 help="sarif: a SARIF 2.1.0 log on stdout, for code scanning (docs/editors.md)")
  c.add_argument("--no-examples", action="store_true", help="do not run the rules' examples")
  _rules_option(c)
  c.set_defaults(fn=_cmd_check)
  k = sub.add_parser("compile", help="compile rule sets to matchers")
  k.add_argument("ruleset", nargs="+", help="rule set name(s); several are combined in order")
  k.add_argument("--emit", action="store_true", help="print the generated matcher source")
  k.add_argument("--stats", action="store_true", help="generate the instrumented (RULEC_STATS) variant")
  _rules_option(k)
  k.set_defaults(fn=_cmd_compile)
  e = sub.add_parser("explain", help="run a Python program and explain why a rule never fired on it")
  e.add_argument("rule", help="the rule's name")
  e.add_argument("program", help="the Python program to run (as `python PROGRAM ARGS...`)")
  e.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the program")
  _rules_option(e)
  e.add_argument("--show", type=int, default=5, help="nodes to explain (default: 5)")
  e.set_defaults(fn=_cmd_explain)
  d = sub.add_parser("demo", help="run the demo workload")
  d.add_argument("--count", type=int, default=2000, help="number of random index expressions")
  d.add_argument("--device", default=None, help="device to run on (default: RULEC_DEVICE or CPU)")
  _rules_option(d)
  d.set_defaults(fn=_cmd_demo)
  t = sub.add_parser("trace", help="run a Python program, record every scheduler pass and rewrite, write an HTML viewer")
  t.add_argument("program", help="the Python program to run (as `python PROGRAM ARGS...`)")
  t.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the program (after --: `rulec trace p.py -o t.html -- --n 3`)")
  t.add_argument("-o", "--output", default="trace.html", help="the HTML file to write (default: trace.html)")
  _rules_option(t)
  t.set_defaults(fn=_cmd_trace)
  v = sub.add_parser("verify", help="check every rule's soundness on random graphs that match it (needs hypothesis)")
  v.add_argument("ruleset", nargs="*", help="rule sets to verify, with the sets they include (default: all; with --rules or RULEC_RULES: the sets they define); "
                                            "the rules are ./rules/ when the current directory has one, else the installed rules")
  v.add_argument("--examples", type=int, default=100, help="examples per rule (default: 100)")
  _rules_option(v)
  v.add_argument("--format", choices=("human", "json", "sarif"), default="human")
  v.set_defaults(fn=_cmd_verify)
  pv = sub.add_parser("prove", help="prove every rule with z3 for all values of its leaves, and that each rule set "
                                    "terminates (needs z3-solver: pip install 'rulec[prove]')")
  pv.add_argument("ruleset", nargs="*", help="rule sets to prove, with the sets they include (default: all; with --rules or "
                                             "RULEC_RULES: the sets they define)")
  pv.add_argument("--timeout", type=int, default=3000, metavar="MS", help="z3's time limit per query, in milliseconds "
                                                                         "(default: 3000)")
  _rules_option(pv)
  pv.add_argument("--format", choices=("human", "json", "sarif"), default="human")
  pv.set_defaults(fn=_cmd_prove)
  f = sub.add_parser("fmt", help="rewrite .rules files in the canonical layout (docs/editors.md)")
  f.add_argument("paths", nargs="*", help="files or directories (default: the shipped rules); - reads stdin, writes stdout")
  f.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file would be reformatted")
  f.add_argument("--diff", action="store_true", help="change nothing; print what would change as a unified diff")
  f.set_defaults(fn=_cmd_fmt)
  s = sub.add_parser("lsp", help="run the language server on stdin/stdout (needs pygls: pip install 'rulec[lsp]')")
  s.set_defaults(fn=_cmd_lsp)
  try:
    args = ap.parse_args(argv)
  except SystemExit as e:
    return 2 if e.code not in (0, None) else 0
  try: return args.fn(args)
  except Exception as e:
    # a device that cannot be used, found while working (CL:3 with two OpenCL devices): one line, not a traceback
    from rulec.runtime.devices import device_problem
    msg = device_problem(e)
    if msg is None: raise
    print(f"rulec {args.cmd}: {msg}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
